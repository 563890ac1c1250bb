// cuda_mamba.cu - Mamba2 on the GPU: causal conv1d (varlen prefill and
// decode update), the SSD chunked scan for varlen prefill, the selective
// state update for decode, and the gated grouped RMSNorm. State is fp32.
//
// zxbcdt rows (ld floats): z [I] | x [H*P] | B [G*N] | C [G*N] | dt [H].
#include "backend/cuda/cuda_common.cuh"

// One thread per (sequence, channel) walks the sequence's tokens with a
// register window of the K-1 previous inputs. force_init: decode rows, whose
// state always exists.
template <int K>
__global__ void k_conv1d(float *zxbcdt, int ld, int I, int C, const float *w, const float *bias, float *conv_state,
                         const int32_t *qsl, const int32_t *slots, const int32_t *has_init, int seq0, int force_init) {
    int s = seq0 + blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int t0 = qsl[s], L = qsl[s + 1] - t0;
    int init = force_init || has_init[s];
    float *st = conv_state + (int64_t)slots[s] * (K - 1) * C + c;
    float win[K - 1], wc[K];
#pragma unroll
    for (int j = 0; j < K - 1; j++) win[j] = init ? st[(int64_t)j * C] : 0.0f; // a fresh slot reads as zeros
#pragma unroll
    for (int j = 0; j < K; j++) wc[j] = w[(int64_t)c * K + j];
    float b = bias ? bias[c] : 0.0f;
    for (int t = 0; t < L; t++) {
        float *p = zxbcdt + (int64_t)(t0 + t) * ld + I + c;
        float xin = *p, acc = b;
#pragma unroll
        for (int j = 0; j < K - 1; j++) acc += wc[j] * win[j];
        acc += wc[K - 1] * xin;
        *p = silu_f(acc);
#pragma unroll
        for (int j = 0; j < K - 2; j++) win[j] = win[j + 1];
        win[K - 2] = xin;
    }
#pragma unroll
    for (int j = 0; j < K - 1; j++) st[(int64_t)j * C] = win[j];
}

static void launch_conv(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias, float *conv_state,
                        const struct batch *b, int seq0, int seq1, int force_init, const struct mamba_dims *d) {
    int n = seq1 - seq0;
    if (n <= 0) return;
    int I = d->heads * d->head_dim, C = d->conv_dim;
    dim3 grid(cdiv(C, 128), n);
    cudaStream_t s = cu(be)->stream;
#define CONV(KK)                                                                                                  \
    k_conv1d<KK><<<grid, 128, 0, s>>>(zxbcdt, ld, I, C, w, bias, conv_state, b->query_start_loc, b->state_slots, \
                                      b->has_initial_state, seq0, force_init)
    switch (d->conv_kernel) {
    case 2: CONV(2); break;
    case 3: CONV(3); break;
    case 4: CONV(4); break;
    case 5: CONV(5); break;
    case 6: CONV(6); break;
    default:
        fprintf(stderr, "vllm: conv kernel size %d is not built for CUDA (2..6)\n", d->conv_kernel);
        abort();
    }
#undef CONV
    LAUNCH_CHECK();
}

void cuda_conv1d_fwd(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias, float *conv_state,
                     const struct batch *b, int seq0, int seq1, const struct mamba_dims *d) {
    launch_conv(be, zxbcdt, ld, w, bias, conv_state, b, seq0, seq1, 0, d);
}

void cuda_conv1d_update(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias, float *conv_state,
                        const struct batch *b, const struct mamba_dims *d) {
    launch_conv(be, zxbcdt, ld, w, bias, conv_state, b, 0, b->num_decodes, 1, d);
}

struct ssd_args {
    float *y;
    const float *zx;
    int ld, H, P, G, N, chunk, I, conv_dim;
    const float *dt_bias, *A, *D;
    float *ssm;
    const int32_t *qsl, *ctx, *slots, *has_init;
    int seq0;
    float dt_min, dt_max;
};

__device__ __forceinline__ float dt_of(const ssd_args &a, const float *row, int h) {
    float v = softplus_th(row[a.I + a.conv_dim + h] + a.dt_bias[h]);
    return fminf(fmaxf(v, a.dt_min), a.dt_max);
}

// One block per (sequence, head) walks the sequence chunk by chunk; chunk
// boundaries fall on absolute multiples of chunk_size. Shared memory: dt and
// its running sum [L], M = (C_i . B_j) exp(acum_i - acum_j) dt_j [L, L], the
// state S [P, N], and x of the chunk [L, P].
__global__ void k_ssd_prefill(ssd_args a) {
    extern __shared__ float sm[];
    int L = a.chunk, P = a.P, N = a.N, H = a.H;
    int s = a.seq0 + blockIdx.x, h = blockIdx.y, g = h / (H / a.G), tid = threadIdx.x, nt = blockDim.x;
    float *dt = sm, *acum = dt + L, *M = acum + L, *S = M + L * L, *X = S + P * N;
    int t0 = a.qsl[s], len = a.qsl[s + 1] - t0, p0 = a.ctx[s];
    float *gst = a.ssm + ((int64_t)a.slots[s] * H + h) * P * N;
    int init = a.has_init[s];
    for (int k = tid; k < P * N; k += nt) S[k] = init ? gst[k] : 0.0f; // a fresh slot reads as zeros
    int xoff = a.I + h * P, boff = 2 * a.I + g * N, coff = 2 * a.I + a.G * N + g * N;
    float Ah = a.A[h], Dh = a.D[h];
    for (int i0 = 0; i0 < len;) {
        int lc = min(len - i0, L - (p0 + i0) % L);
        __syncthreads();
        for (int i = tid; i < lc; i += nt) dt[i] = dt_of(a, a.zx + (int64_t)(t0 + i0 + i) * a.ld, h);
        __syncthreads();
        if (tid == 0) {
            float run = 0;
            for (int i = 0; i < lc; i++) acum[i] = run += dt[i] * Ah;
        }
        for (int k = tid; k < lc * P; k += nt) X[k] = a.zx[(int64_t)(t0 + i0 + k / P) * a.ld + xoff + k % P];
        __syncthreads();
        for (int k = tid; k < lc * lc; k += nt) {
            int i = k / lc, j = k % lc;
            float v = 0;
            if (j <= i) {
                const float *ci = a.zx + (int64_t)(t0 + i0 + i) * a.ld + coff, *bj = a.zx + (int64_t)(t0 + i0 + j) * a.ld + boff;
                for (int n = 0; n < N; n++) v += ci[n] * bj[n];
                v *= expf(acum[i] - acum[j]) * dt[j];
            }
            M[i * L + j] = v;
        }
        __syncthreads();
        for (int k = tid; k < lc * P; k += nt) {
            int i = k / P, p = k % P;
            const float *ci = a.zx + (int64_t)(t0 + i0 + i) * a.ld + coff;
            float off = 0, diag = 0;
            for (int n = 0; n < N; n++) off += S[p * N + n] * ci[n];
            for (int j = 0; j <= i; j++) diag += M[i * L + j] * X[j * P + p];
            a.y[(int64_t)(t0 + i0 + i) * a.I + h * P + p] = expf(acum[i]) * off + diag + Dh * X[i * P + p];
        }
        __syncthreads();
        float last = acum[lc - 1], dall = expf(last);
        for (int k = tid; k < P * N; k += nt) {
            int p = k / N, n = k % N;
            float v = S[k] * dall;
            for (int j = 0; j < lc; j++)
                v += expf(last - acum[j]) * dt[j] * X[j * P + p] * a.zx[(int64_t)(t0 + i0 + j) * a.ld + boff + n];
            S[k] = v;
        }
        i0 += lc;
    }
    __syncthreads();
    for (int k = tid; k < P * N; k += nt) gst[k] = S[k];
}

void cuda_ssd_prefill(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                      const float *D, float *ssm_state, const struct batch *b, int seq0, int seq1,
                      const struct mamba_dims *d) {
    int n = seq1 - seq0;
    if (n <= 0) return;
    int L = d->chunk_size, P = d->head_dim, N = d->state;
    size_t smem = sizeof(float) * ((size_t)2 * L + (size_t)L * L + (size_t)P * N + (size_t)L * P);
    if (smem > cu(be)->smem_optin) {
        fprintf(stderr, "vllm: SSD chunk %d x head %d x state %d needs %zu bytes of shared memory (max %zu)\n", L, P, N,
                smem, cu(be)->smem_optin);
        abort();
    }
    CUDA_CHECK(cudaFuncSetAttribute(k_ssd_prefill, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    ssd_args a = {y, zxbcdt, ld, d->heads, P, d->groups, N, L, d->heads * P, d->conv_dim, dt_bias, A, D, ssm_state,
                  b->query_start_loc, b->context_lens, b->state_slots, b->has_initial_state, seq0, d->dt_min, d->dt_max};
    k_ssd_prefill<<<dim3(n, d->heads), 256, smem, cu(be)->stream>>>(a);
    LAUNCH_CHECK();
}

// One block per (decode sequence, head); a warp per row p of the state,
// lanes over n: the state is read and written once, in place.
__global__ void k_ssd_decode(ssd_args a) {
    int s = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int P = a.P, N = a.N, g = h / (a.H / a.G);
    int t = a.qsl[s];
    const float *row = a.zx + (int64_t)t * a.ld;
    const float *B = row + 2 * a.I + g * N, *C = row + 2 * a.I + a.G * N + g * N;
    float dt = dt_of(a, row, h), dA = expf(dt * a.A[h]);
    float *st = a.ssm + ((int64_t)a.slots[s] * a.H + h) * P * N;
    for (int p = warp; p < P; p += nw) {
        float xv = row[a.I + h * P + p], dx = dt * xv, acc = 0;
        for (int n = lane; n < N; n += 32) {
            float v = st[p * N + n] * dA + dx * B[n];
            st[p * N + n] = v;
            acc += v * C[n];
        }
        acc = warp_sum(acc);
        if (lane == 0) a.y[(int64_t)t * a.I + h * P + p] = acc + a.D[h] * xv;
    }
}

void cuda_ssd_decode(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                     const float *D, float *ssm_state, const struct batch *b, const struct mamba_dims *d) {
    if (b->num_decodes <= 0) return;
    ssd_args a = {y, zxbcdt, ld, d->heads, d->head_dim, d->groups, d->state, d->chunk_size, d->heads * d->head_dim,
                  d->conv_dim, dt_bias, A, D, ssm_state, b->query_start_loc, b->context_lens, b->state_slots,
                  b->has_initial_state, 0, d->dt_min, d->dt_max};
    k_ssd_decode<<<dim3(b->num_decodes, d->heads), 256, 0, cu(be)->stream>>>(a);
    LAUNCH_CHECK();
}

// One block per (row, group): out = rmsnorm_group(y * silu(z)) * w.
__global__ void k_gated_rmsnorm(float *out, const float *y, const float *z, int zld, const float *w, int dim, int gs,
                                float eps) {
    __shared__ float red[32];
    int t = blockIdx.x, g0 = blockIdx.y * gs;
    const float *yt = y + (int64_t)t * dim, *zt = z + (int64_t)t * zld;
    float *ot = out + (int64_t)t * dim;
    float ss = 0;
    for (int i = g0 + threadIdx.x; i < g0 + gs; i += blockDim.x) {
        float v = yt[i] * silu_f(zt[i]);
        ot[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    float r = rsqrtf(ss / gs + eps);
    for (int i = g0 + threadIdx.x; i < g0 + gs; i += blockDim.x) ot[i] = w[i] * (ot[i] * r);
}

void cuda_gated_rmsnorm(struct backend *be, float *out, const float *y, const float *z, int zld, const float *w, int n,
                        int dim, int group_size, float eps) {
    if (n <= 0) return;
    k_gated_rmsnorm<<<dim3(n, dim / group_size), 256, 0, cu(be)->stream>>>(out, y, z, zld, w, dim, group_size, eps);
    LAUNCH_CHECK();
}
