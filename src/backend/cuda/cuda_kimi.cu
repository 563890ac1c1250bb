// cuda_kimi.cu - Kimi-Linear's ops on the GPU, each the CPU reference op of
// the same name (cpu_kimi.c) on the device: the KDA gated delta rule (one
// recurrence for prefill and decode), its forget gate and gated output norm,
// and multi-head latent attention over a cache of latents (fp32 or bf16).
#include <float.h>

#include "backend/cuda/cuda_common.cuh"

// ------------------------------------------------------------------ KDA --

struct kda_args {
    float *y;
    const float *proj, *g;
    float *state;
    int ld, H, K, seq0, decode;
    const int32_t *qsl, *ctx, *slots, *src, *ck_start, *ck_pos, *ck_slot;
};

// One block per (sequence, head); thread j owns value column j of the head's
// state [K, K], kept in shared memory for the whole sequence (read once from
// its source slot, written once to its own slot and to each checkpoint).
__global__ void k_kda(kda_args a) {
    extern __shared__ float sm[];
    __shared__ float red[32];
    int K = a.K, H = a.H, HK = H * K, j = threadIdx.x, s = a.seq0 + blockIdx.x, h = blockIdx.y;
    float *S = sm, *qs = S + K * K, *ks = qs + K, *as = ks + K;
    int t0 = a.qsl[s], L = a.qsl[s + 1] - t0, p0 = a.ctx[s], own = a.slots[s];
    int src = a.decode ? own : a.src[s];
    int64_t hs = (int64_t)K * K;
    for (int i = 0; i < K && j < K; i++)
        S[i * K + j] = src < 0 ? 0.0f : a.state[((int64_t)src * H + h) * hs + i * K + j];
    int k = a.decode ? 0 : a.ck_start[s], k1 = a.decode ? 0 : a.ck_start[s + 1];
    float rk = rsqrtf((float)K);
    for (int i = 0; i < L; i++) {
        int64_t t = t0 + i;
        const float *row = a.proj + t * a.ld;
        float qv = j < K ? row[h * K + j] : 0.0f, kv = j < K ? row[HK + h * K + j] : 0.0f;
        float nq = block_sum(qv * qv, red), nk = block_sum(kv * kv, red);
        if (j < K) {
            qs[j] = qv * (rk / sqrtf(nq + 1e-6f));
            ks[j] = kv / sqrtf(nk + 1e-6f);
            as[j] = expf(a.g[t * HK + h * K + j]);
        }
        __syncthreads();
        if (j < K) {
            float beta = 1.0f / (1.0f + expf(-row[3 * HK + h])), mem = 0.0f, out = 0.0f;
            for (int r = 0; r < K; r++) {
                float v = S[r * K + j] * as[r];
                S[r * K + j] = v;
                mem += v * ks[r];
            }
            float delta = beta * (row[2 * HK + h * K + j] - mem);
            for (int r = 0; r < K; r++) {
                float v = S[r * K + j] + ks[r] * delta;
                S[r * K + j] = v;
                out += v * qs[r];
            }
            a.y[t * HK + h * K + j] = out;
        }
        for (; k < k1 && a.ck_pos[k] <= p0 + i + 1; k++) // the state after position ckpt_pos - 1
            if (a.ck_pos[k] == p0 + i + 1 && j < K)
                for (int r = 0; r < K; r++) a.state[((int64_t)a.ck_slot[k] * H + h) * hs + r * K + j] = S[r * K + j];
        __syncthreads(); // qs, ks, as are the next token's
    }
    for (int i = 0; i < K && j < K; i++) a.state[((int64_t)own * H + h) * hs + i * K + j] = S[i * K + j];
}

size_t cuda_kda_smem(int K) { return sizeof(float) * ((size_t)K * K + 3 * K); }

static void kda_launch(struct backend *be, kda_args a, int nseq) {
    if (nseq <= 0) return;
    size_t sm = cuda_kda_smem(a.K);
    CUDA_CHECK(cudaFuncSetAttribute(k_kda, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    k_kda<<<dim3(nseq, a.H), (a.K + 31) / 32 * 32, sm, cu(be)->stream>>>(a);
    LAUNCH_CHECK();
}

void cuda_kda_prefill(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                      const struct batch *b, int seq0, int seq1, const struct kda_dims *d) {
    kda_args a = {y, proj, g, state, ld, d->heads, d->head_dim, seq0, 0, b->query_start_loc, b->context_lens,
                  b->state_slots, b->state_src, b->ckpt_start, b->ckpt_pos, b->ckpt_slot};
    kda_launch(be, a, seq1 - seq0);
}

void cuda_kda_decode(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                     const struct batch *b, const struct kda_dims *d) {
    kda_args a = {y, proj, g, state, ld, d->heads, d->head_dim, 0, 1, b->query_start_loc, b->context_lens,
                  b->state_slots, b->state_src, b->ckpt_start, b->ckpt_pos, b->ckpt_slot};
    kda_launch(be, a, b->num_decodes);
}

__global__ void k_kda_gate(float *g, const float *A_log, const float *dt_bias, int64_t n, int H, int K) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c = (int)(i % ((int64_t)H * K)), h = c / K;
    g[i] = -expf(A_log[h]) * softplus_th(g[i] + dt_bias[c]);
}

void cuda_kda_gate(struct backend *be, float *g, const float *A_log, const float *dt_bias, int n,
                   const struct kda_dims *d) {
    int64_t total = (int64_t)n * d->heads * d->head_dim;
    if (total <= 0) return;
    k_kda_gate<<<cdiv(total, 256), 256, 0, cu(be)->stream>>>(g, A_log, dt_bias, total, d->heads, d->head_dim);
    LAUNCH_CHECK();
}

// One block per (row, head): y = rmsnorm(y) * w * sigmoid(gate).
__global__ void k_head_norm_gate(float *y, const float *gate, const float *w, int D, float eps) {
    __shared__ float red[32];
    int64_t off = ((int64_t)blockIdx.x * gridDim.y + blockIdx.y) * D;
    float *x = y + off;
    const float *z = gate + off;
    float ss = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) x[i] = w[i] * (x[i] * inv) / (1.0f + expf(-z[i]));
}

void cuda_head_norm_gate(struct backend *be, float *y, const float *gate, const float *w, int n, int heads,
                         int head_dim, float eps) {
    if (n <= 0) return;
    k_head_norm_gate<<<dim3(n, heads), 128, 0, cu(be)->stream>>>(y, gate, w, head_dim, eps);
    LAUNCH_CHECK();
}

// ------------------------------------------------------------------ MLA --

template <typename T> __device__ __forceinline__ void store_f(T *dst, float v);
template <> __device__ __forceinline__ void store_f<float>(float *dst, float v) { *dst = v; }
template <> __device__ __forceinline__ void store_f<__nv_bfloat16>(__nv_bfloat16 *dst, float v) {
    *dst = __float2bfloat16(v);
}

template <typename T> __global__ void k_mla_kv_write(T *cache, const float *lat, int ld, const int32_t *slot_mapping, int W) {
    int t = blockIdx.x, slot = slot_mapping[t];
    if (slot < 0) return;
    for (int i = threadIdx.x; i < W; i += blockDim.x) store_f(cache + (int64_t)slot * W + i, lat[(int64_t)t * ld + i]);
}

void cuda_mla_kv_write(struct backend *be, void *cache, const float *lat, int ld, const struct batch *b,
                       const struct mla_dims *d) {
    if (b->num_tokens <= 0) return;
    int W = d->rank + d->rope;
    cudaStream_t s = cu(be)->stream;
    if (be->kv_dtype == DT_BF16)
        k_mla_kv_write<<<b->num_tokens, 128, 0, s>>>((__nv_bfloat16 *)cache, lat, ld, b->slot_mapping, W);
    else k_mla_kv_write<<<b->num_tokens, 128, 0, s>>>((float *)cache, lat, ld, b->slot_mapping, W);
    LAUNCH_CHECK();
}

#define MLA_THREADS 256
#define MLA_CHUNK 32
#define MLA_ACC (CUDA_MLA_MAX_RANK / MLA_THREADS)

struct mla_args {
    float *out;
    const float *q, *kv_b;
    int H, N, P, V, R, bs, mbps, seq0, seq1, tok0;
    float scale;
    const int32_t *qsl, *ctx, *btab;
};

// One block per (query token, head): q absorbed into the latent (W_kb^T
// q_nope | q_r), an online softmax over the context's cached rows in chunks
// of 32 (a warp per key for the scores, a thread per latent channel for the
// sum), then W_vb on the weighted latent.
template <typename T> __global__ void __launch_bounds__(MLA_THREADS) k_mla(mla_args a, const T *cache) {
    extern __shared__ float sm[];
    __shared__ float sc[MLA_CHUNK];
    int R = a.R, W = R + a.P, N = a.N, V = a.V, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int t = a.tok0 + blockIdx.x, h = blockIdx.y;
    int lo = a.seq0, hi = a.seq1 - 1; // the sequence of token t
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (a.qsl[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    int s = lo, n = a.ctx[s] + (t - a.qsl[s]) + 1;
    float *ql = sm, *ol = ql + W;
    const float *qh = a.q + ((int64_t)t * a.H + h) * (N + a.P);
    const float *wk = a.kv_b + (int64_t)h * (N + V) * R, *wv = wk + (int64_t)N * R;
    for (int r = tid; r < R; r += MLA_THREADS) {
        float acc = 0;
        for (int e = 0; e < N; e++) acc += qh[e] * wk[(int64_t)e * R + r];
        ql[r] = acc;
    }
    for (int e = tid; e < a.P; e += MLA_THREADS) ql[R + e] = qh[N + e];
    __syncthreads();
    const int32_t *bt = a.btab + (int64_t)s * a.mbps;
    float m = -INFINITY, l = 0, acc[MLA_ACC];
#pragma unroll
    for (int q = 0; q < MLA_ACC; q++) acc[q] = 0;
    for (int c0 = 0; c0 < n; c0 += MLA_CHUNK) {
        for (int jj = warp; jj < MLA_CHUNK; jj += MLA_THREADS / 32) {
            int j = c0 + jj;
            float dot = 0;
            if (j < n) {
                const T *kv = cache + ((int64_t)bt[j / a.bs] * a.bs + j % a.bs) * W;
                for (int e = lane; e < W; e += 32) dot += ql[e] * load_f(kv + e);
            }
            dot = warp_sum(dot);
            if (lane == 0) sc[jj] = j < n ? dot * a.scale : -INFINITY;
        }
        __syncthreads();
        float cm = m;
        for (int jj = 0; jj < MLA_CHUNK; jj++) cm = fmaxf(cm, sc[jj]);
        float corr = expf(m - cm), ps = 0;
        m = cm;
#pragma unroll
        for (int q = 0; q < MLA_ACC; q++) acc[q] *= corr;
        for (int jj = 0; jj < MLA_CHUNK && c0 + jj < n; jj++) {
            int j = c0 + jj;
            float p = expf(sc[jj] - m);
            ps += p;
            const T *kv = cache + ((int64_t)bt[j / a.bs] * a.bs + j % a.bs) * W;
#pragma unroll
            for (int q = 0; q < MLA_ACC; q++) {
                int r = tid + q * MLA_THREADS;
                if (r < R) acc[q] += p * load_f(kv + r);
            }
        }
        l = l * corr + ps;
        __syncthreads(); // sc is the next chunk's
    }
#pragma unroll
    for (int q = 0; q < MLA_ACC; q++) {
        int r = tid + q * MLA_THREADS;
        if (r < R) ol[r] = acc[q] / l;
    }
    __syncthreads();
    for (int e = warp; e < V; e += MLA_THREADS / 32) {
        float o = 0;
        for (int r = lane; r < R; r += 32) o += wv[(int64_t)e * R + r] * ol[r];
        o = warp_sum(o);
        if (lane == 0) a.out[((int64_t)t * a.H + h) * V + e] = o;
    }
}

size_t cuda_mla_smem(const struct mla_dims *d) { return sizeof(float) * ((size_t)2 * d->rank + d->rope); }

void cuda_mla_attn(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                   const struct batch *b, int seq0, int seq1, const struct mla_dims *d) {
    if (seq1 <= seq0) return;
    int tok0 = b->h_query_start_loc[seq0], ntok = b->h_query_start_loc[seq1] - tok0;
    if (ntok <= 0) return;
    mla_args a = {out, q, kv_b, d->heads, d->nope, d->rope, d->v_dim, d->rank, d->block_size, b->max_blocks_per_seq,
                  seq0, seq1, tok0, d->scale, b->query_start_loc, b->context_lens, b->block_tables};
    size_t sm = cuda_mla_smem(d);
    cudaStream_t s = cu(be)->stream;
    dim3 grid(ntok, d->heads);
    if (be->kv_dtype == DT_BF16) {
        CUDA_CHECK(cudaFuncSetAttribute(k_mla<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        k_mla<__nv_bfloat16><<<grid, MLA_THREADS, sm, s>>>(a, (const __nv_bfloat16 *)cache);
    } else {
        CUDA_CHECK(cudaFuncSetAttribute(k_mla<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        k_mla<float><<<grid, MLA_THREADS, sm, s>>>(a, (const float *)cache);
    }
    LAUNCH_CHECK();
}
