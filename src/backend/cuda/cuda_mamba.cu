// cuda_mamba.cu - Mamba2 on the GPU: causal conv1d (varlen prefill and
// decode update), the SSD chunked scan for varlen prefill, the selective
// state update for decode, and the gated grouped RMSNorm. State is fp32.
//
// zxbcdt rows (ld floats): z [I] | x [H*P] | B [G*N] | C [G*N] | dt [H].
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

// Causal conv1d, in place on the x | B | C columns of zxbcdt.
struct conv_meta {
    const int32_t *qsl, *ctx, *slots, *src, *ck_start, *ck_pos, *ck_slot, *ck_dst;
};

// Decode: a thread per (decode row, channel) continues its own slot's window
// of the K-1 previous inputs and stores the new window there, and to the
// row's checkpoint when it has one (ck_dst >= 0).
template <int K>
__global__ void k_conv1d(float *zxbcdt, int ld, int I, int C, const float *w, const float *bias, float *conv_state,
                         conv_meta m) {
    pdl_wait();
    pdl_trigger();
    int s = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float *st = conv_state + (int64_t)m.slots[s] * (K - 1) * C + c;
    float win[K - 1], wc[K], b = bias ? bias[c] : 0.0f;
#pragma unroll
    for (int j = 0; j < K - 1; j++) win[j] = st[(int64_t)j * C];
#pragma unroll
    for (int j = 0; j < K; j++) wc[j] = w[(int64_t)c * K + j];
    for (int t = m.qsl[s]; t < m.qsl[s + 1]; t++) { // one token a decode row
        float *p = zxbcdt + (int64_t)t * ld + I + c;
        float xin = *p, acc = b;
#pragma unroll
        for (int j = 0; j < K - 1; j++) acc += wc[j] * win[j];
        *p = silu_f(acc + wc[K - 1] * xin);
#pragma unroll
        for (int j = 0; j < K - 2; j++) win[j] = win[j + 1];
        win[K - 2] = xin;
    }
    int dst = m.ck_dst ? m.ck_dst[s] : -1;
    float *ck = conv_state + (int64_t)max(dst, 0) * (K - 1) * C + c;
#pragma unroll
    for (int j = 0; j < K - 1; j++) {
        st[(int64_t)j * C] = win[j];
        if (dst >= 0) ck[(int64_t)j * C] = win[j];
    }
}

// Prefill runs in tiles of CONV_TT tokens so that one long sequence still
// fills the GPU (a thread walking all of a sequence's tokens in series, its
// loads and in-place stores one after another, read ~35 GB/s on one 8k
// prompt). A tile's outputs overwrite inputs the next tile's first K-1
// outputs read, so k_conv_halo first copies each tile's K-1 preceding inputs
// (the slot's window state_src, or zeros, before a sequence's first token)
// to halo [seq][tile][K-1][C]; then the tiles run independently.
#define CONV_TT 32
template <int K>
__global__ void k_conv_halo(const float *zxbcdt, int ld, int I, int C, const float *conv_state, conv_meta m, int seq0,
                            float *halo, int tiles) {
    int s = seq0 + blockIdx.y, j = blockIdx.z, c = blockIdx.x * blockDim.x + threadIdx.x;
    int t0 = m.qsl[s], L = m.qsl[s + 1] - t0;
    if (c >= C || j * CONV_TT >= L) return;
    const float *sst = conv_state + (int64_t)max(m.src[s], 0) * (K - 1) * C + c;
    float *h = halo + ((int64_t)blockIdx.y * tiles + j) * (K - 1) * C + c;
#pragma unroll
    for (int i = 0; i < K - 1; i++) {
        int t = j * CONV_TT - (K - 1) + i; // token of the sequence; < 0: the window before it
        h[(int64_t)i * C] = t >= 0 ? zxbcdt[(int64_t)(t0 + t) * ld + I + c] : m.src[s] >= 0 ? sst[(int64_t)(K - 1 + t) * C] : 0.0f;
    }
}

// A thread per (channel, sequence, tile): its CONV_TT inputs loaded at once,
// the window stored at each checkpoint position inside the tile, and the
// last tile's window to the live slot.
template <int K>
__global__ void k_conv1d_tile(float *zxbcdt, int ld, int I, int C, const float *w, const float *bias, float *conv_state,
                              conv_meta m, int seq0, const float *halo, int tiles) {
    int s = seq0 + blockIdx.y, j = blockIdx.z, c = blockIdx.x * blockDim.x + threadIdx.x;
    int t0 = m.qsl[s], L = m.qsl[s + 1] - t0, a = j * CONV_TT;
    if (c >= C || a >= L) return;
    int n = min(CONV_TT, L - a), p0 = m.ctx[s] + a; // position of the tile's first token
    float x[CONV_TT], win[K - 1], wc[K];
    float *col = zxbcdt + (int64_t)(t0 + a) * ld + I + c;
#pragma unroll
    for (int i = 0; i < CONV_TT; i++) x[i] = i < n ? col[(int64_t)i * ld] : 0.0f;
    const float *h = halo + ((int64_t)blockIdx.y * tiles + j) * (K - 1) * C + c;
#pragma unroll
    for (int i = 0; i < K - 1; i++) win[i] = h[(int64_t)i * C];
#pragma unroll
    for (int i = 0; i < K; i++) wc[i] = w[(int64_t)c * K + i];
    float b = bias ? bias[c] : 0.0f;
    int k = m.ck_start[s], k1 = m.ck_start[s + 1];
    while (k < k1 && m.ck_pos[k] <= p0) k++; // checkpoints of earlier tiles
#pragma unroll
    for (int i = 0; i < CONV_TT; i++) {
        if (i < n) {
            float xin = x[i], acc = b;
#pragma unroll
            for (int q = 0; q < K - 1; q++) acc += wc[q] * win[q];
            acc += wc[K - 1] * xin;
            x[i] = silu_f(acc);
#pragma unroll
            for (int q = 0; q < K - 2; q++) win[q] = win[q + 1];
            win[K - 2] = xin;
            if (k < k1 && m.ck_pos[k] == p0 + i + 1) { // the K-1 inputs before a checkpoint position
                float *ck = conv_state + (int64_t)m.ck_slot[k++] * (K - 1) * C + c;
#pragma unroll
                for (int q = 0; q < K - 1; q++) ck[(int64_t)q * C] = win[q];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < CONV_TT; i++)
        if (i < n) col[(int64_t)i * ld] = x[i];
    if (a + n == L) {
        float *st = conv_state + (int64_t)m.slots[s] * (K - 1) * C + c;
#pragma unroll
        for (int q = 0; q < K - 1; q++) st[(int64_t)q * C] = win[q];
    }
}

template <int K>
static void launch_conv_k(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                          float *conv_state, const struct batch *b, int seq0, int seq1, int decode, int I, int C) {
    cudaStream_t st = cu(be)->stream;
    conv_meta m = {b->query_start_loc, b->context_lens, b->state_slots, b->state_src, b->ckpt_start, b->ckpt_pos,
                   b->ckpt_slot, b->ckpt_dst};
    if (decode) {
        launch_pdl(k_conv1d<K>, dim3(cdiv(C, 128), seq1 - seq0), 128, 0, st, zxbcdt, ld, I, C, w, bias, conv_state, m);
        return;
    }
    int maxlen = 0; // from the host mirrors: prefill steps are never recorded into graphs
    for (int s = seq0; s < seq1; s++) maxlen = std::max(maxlen, b->h_query_start_loc[s + 1] - b->h_query_start_loc[s]);
    if (maxlen <= 0) return;
    int tiles = cdiv(maxlen, CONV_TT);
    float *halo = (float *)cuda_scratch(be, sizeof(float) * (size_t)(seq1 - seq0) * tiles * (K - 1) * C);
    dim3 grid(cdiv(C, 128), seq1 - seq0, tiles);
    k_conv_halo<K><<<grid, 128, 0, st>>>(zxbcdt, ld, I, C, conv_state, m, seq0, halo, tiles);
    k_conv1d_tile<K><<<grid, 128, 0, st>>>(zxbcdt, ld, I, C, w, bias, conv_state, m, seq0, halo, tiles);
}

static void launch_conv(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias, float *conv_state,
                        const struct batch *b, int seq0, int seq1, int decode, const struct mamba_dims *d) {
    if (seq1 <= seq0) return;
    int I = d->heads * d->head_dim, C = d->conv_dim;
#define CONV(KK) launch_conv_k<KK>(be, zxbcdt, ld, w, bias, conv_state, b, seq0, seq1, decode, I, C)
    switch (d->conv_kernel) {
    case 2: CONV(2); break;
    case 3: CONV(3); break;
    case 4: CONV(4); break;
    case 5: CONV(5); break;
    case 6: CONV(6); break;
    default: break; // 2..6, checked at load (cu_supports)
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
    const int32_t *qsl, *ctx, *slots, *src; // src: state_src (prefill)
    const int32_t *ck_start, *ck_pos, *ck_slot; // checkpoint writes (prefill)
    int seq0;
    float dt_min, dt_max;
    const int32_t *ck_dst; // decode: batch.ckpt_dst, the checkpoint that also gets the new state (NULL: none)
};

__device__ __forceinline__ float dt_of(const ssd_args &a, const float *row, int h) {
    float v = softplus_th(row[a.I + a.conv_dim + h] + a.dt_bias[h]);
    return fminf(fmaxf(v, a.dt_min), a.dt_max);
}

// The SSD chunked scan as batched matrix products (fp32, cuBLAS), over the
// chunks of every prefill sequence at once. Chunks end at absolute multiples
// of chunk_size and are padded to L rows. Per chunk c, head h (group g):
//   CB = C B^T                         [L, L]   per (c, g)
//   M  = CB * exp(acum_i - acum_j) dt_j, j <= i  (causal decay)
//   Yd = M X                            [L, P]   intra-chunk
//   Sc = (exp(acum_L - acum_j) dt_j X)^T B       [P, N]   the chunk's own state
//   S_in(c+1) = exp(acum_L) S_in(c) + Sc          sequential over chunks
//   Yo = C S_in^T                       [L, P];  y = Yd + exp(acum_i) Yo + D x
struct ssd_chunk {
    int seq, t, len; // sequence, first token row, tokens (<= L)
};

struct ssd_bufs {
    float *xp, *bp, *cp, *dt, *ac, *cb, *m, *xs, *sc, *sin, *yd, *yo;
    struct ssd_chunk *chunks;
    int32_t *first; // [nseq + 1] first chunk of each sequence
    const float **ptr;
};

// padded copies of x, B, C of each chunk (zero rows past its length)
__global__ void k_ssd_gather(ssd_args a, const ssd_chunk *ch, float *xp, float *bp, float *cp) {
    int c = blockIdx.x, i = blockIdx.y, L = a.chunk, HP = a.I, GN = a.G * a.N;
    ssd_chunk k = ch[c];
    const float *row = a.zx + (int64_t)(k.t + i) * a.ld;
    bool in = i < k.len;
    for (int j = threadIdx.x; j < HP; j += blockDim.x) xp[((int64_t)c * L + i) * HP + j] = in ? row[a.I + j] : 0.0f;
    for (int j = threadIdx.x; j < GN; j += blockDim.x) {
        bp[((int64_t)c * L + i) * GN + j] = in ? row[2 * a.I + j] : 0.0f;
        cp[((int64_t)c * L + i) * GN + j] = in ? row[2 * a.I + GN + j] : 0.0f;
    }
}

// dt and its running sum times A, per (chunk, head); zero past the length
__global__ void k_ssd_dt(ssd_args a, const ssd_chunk *ch, int nc, float *dt, float *ac) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= nc * a.H) return;
    int c = idx / a.H, h = idx % a.H, L = a.chunk;
    ssd_chunk k = ch[c];
    float run = 0, A = a.A[h];
    for (int i = 0; i < L; i++) {
        float d = i < k.len ? dt_of(a, a.zx + (int64_t)(k.t + i) * a.ld, h) : 0.0f;
        run += d * A;
        dt[(int64_t)idx * L + i] = d;
        ac[(int64_t)idx * L + i] = run;
    }
}

// M (causal, decayed, dt-weighted) and the scaled x for the chunk states
__global__ void k_ssd_mask(ssd_args a, const ssd_chunk *ch, const float *cb, const float *dt, const float *ac,
                           const float *xp, float *m, float *xs) {
    int c = blockIdx.x, h = blockIdx.y, L = a.chunk, P = a.P, g = h / (a.H / a.G);
    int len = ch[c].len;
    const float *d = dt + ((int64_t)c * a.H + h) * L, *q = ac + ((int64_t)c * a.H + h) * L;
    const float *cbc = cb + ((int64_t)c * a.G + g) * L * L;
    float *mc = m + ((int64_t)c * a.H + h) * L * L;
    float last = q[len - 1];
    for (int k = threadIdx.x; k < L * L; k += blockDim.x) {
        int i = k / L, j = k % L;
        mc[k] = (j <= i && i < len) ? cbc[k] * expf(q[i] - q[j]) * d[j] : 0.0f;
    }
    for (int k = threadIdx.x; k < L * P; k += blockDim.x) {
        int j = k / P, p = k % P;
        int64_t o = ((int64_t)c * L + j) * a.I + h * P + p;
        xs[o] = j < len ? expf(last - q[j]) * d[j] * xp[o] : 0.0f;
    }
}

// states entering each chunk, sequentially over a sequence's chunks; slot
// state_src's state (zeros for -1) enters the first, a chunk's exit state
// goes to each checkpoint at its end, and the last one's to the state slot
__global__ void k_ssd_pass(ssd_args a, const ssd_chunk *ch, const int32_t *first, const float *sc, const float *ac,
                           float *sin) {
    int s = a.seq0 + blockIdx.x, h = blockIdx.y, PN = a.P * a.N, L = a.chunk;
    float *gst = a.ssm + ((int64_t)a.slots[s] * a.H + h) * PN;
    const float *sst = a.ssm + ((int64_t)max(a.src[s], 0) * a.H + h) * PN;
    int init = a.src[s] >= 0, c0 = first[blockIdx.x], c1 = first[blockIdx.x + 1];
    int k1 = a.ck_start[s + 1], pos0 = a.ctx[s] - a.qsl[s]; // position of token row t: pos0 + t
    for (int k = threadIdx.x; k < PN; k += blockDim.x) {
        float v = init ? sst[k] : 0.0f; // a fresh slot reads as zeros
        int q = a.ck_start[s];
        for (int c = c0; c < c1; c++) {
            int64_t o = ((int64_t)c * a.H + h) * PN + k;
            sin[o] = v;
            v = expf(ac[((int64_t)c * a.H + h) * L + ch[c].len - 1]) * v + sc[o];
            int end = pos0 + ch[c].t + ch[c].len;
            for (; q < k1 && a.ck_pos[q] <= end; q++)
                if (a.ck_pos[q] == end) a.ssm[((int64_t)a.ck_slot[q] * a.H + h) * PN + k] = v;
        }
        gst[k] = v;
    }
}

__global__ void k_ssd_out(ssd_args a, const ssd_chunk *ch, const float *yd, const float *yo, const float *ac,
                          const float *xp) {
    int c = blockIdx.x, i = blockIdx.y, L = a.chunk, P = a.P;
    ssd_chunk k = ch[c];
    if (i >= k.len) return;
    for (int j = threadIdx.x; j < a.I; j += blockDim.x) {
        int h = j / P;
        int64_t o = ((int64_t)c * L + i) * a.I + j;
        float e = expf(ac[((int64_t)c * a.H + h) * L + i]);
        a.y[(int64_t)(k.t + i) * a.I + j] = yd[o] + e * yo[o] + a.D[h] * xp[o];
    }
}

static void sgemm_batched(struct backend *be, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                          const float **A, int lda, const float **B, int ldb, float **C, int ldc, int batch) {
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = cublasSgemmBatched(cu(be)->blas, ta, tb, m, n, k, &one, A, lda, B, ldb, &zero, C, ldc, batch);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "vllm: cublasSgemmBatched failed (%d)\n", (int)st);
        abort();
    }
}

void cuda_ssd_prefill(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                      const float *D, float *ssm_state, const struct batch *b, int seq0, int seq1,
                      const struct mamba_dims *d) {
    int ns = seq1 - seq0;
    if (ns <= 0) return;
    int L = d->chunk_size, H = d->heads, P = d->head_dim, G = d->groups, N = d->state, HP = H * P, GN = G * N;
    // the chunks, from the host mirrors of the batch
    int nc = 0;
    for (int s = seq0; s < seq1; s++) {
        int len = b->h_query_start_loc[s + 1] - b->h_query_start_loc[s], p0 = b->h_context_lens[s];
        for (int i0 = 0; i0 < len;) nc++, i0 += std::min(len - i0, L - (p0 + i0) % L);
    }
    std::vector<ssd_chunk> ch(nc);
    std::vector<int32_t> first(ns + 1);
    nc = 0;
    for (int s = seq0; s < seq1; s++) {
        int t0 = b->h_query_start_loc[s], len = b->h_query_start_loc[s + 1] - t0, p0 = b->h_context_lens[s];
        first[s - seq0] = nc;
        for (int i0 = 0; i0 < len;) {
            int lc = std::min(len - i0, L - (p0 + i0) % L);
            ch[nc++] = {s, t0 + i0, lc};
            i0 += lc;
        }
    }
    first[ns] = nc;
    // one scratch allocation, carved
    size_t f_xp = (size_t)nc * L * HP, f_bc = (size_t)nc * L * GN, f_dt = (size_t)nc * H * L;
    size_t f_cb = (size_t)nc * G * L * L, f_m = (size_t)nc * H * L * L, f_st = (size_t)nc * H * P * N;
    size_t nptr = (size_t)nc * (G + 3 * H) * 3;
    size_t floats = 4 * f_xp + 2 * f_bc + 2 * f_dt + f_cb + f_m + 2 * f_st;
    size_t bytes = floats * 4 + sizeof(ssd_chunk) * nc + 4 * (ns + 1) + sizeof(void *) * nptr + 1024;
    char *base = (char *)cuda_scratch(be, bytes);
    ssd_bufs s;
    float *f = (float *)base;
    s.xp = f, f += f_xp;
    s.xs = f, f += f_xp;
    s.yd = f, f += f_xp;
    s.yo = f, f += f_xp;
    s.bp = f, f += f_bc;
    s.cp = f, f += f_bc;
    s.dt = f, f += f_dt;
    s.ac = f, f += f_dt;
    s.cb = f, f += f_cb;
    s.m = f, f += f_m;
    s.sc = f, f += f_st;
    s.sin = f, f += f_st;
    char *tail = (char *)f;
    tail = (char *)(((uintptr_t)tail + 255) & ~(uintptr_t)255);
    s.ptr = (const float **)tail;
    tail += sizeof(void *) * nptr;
    s.chunks = (ssd_chunk *)tail;
    tail += sizeof(ssd_chunk) * nc;
    s.first = (int32_t *)tail;
    // pointer arrays of the four batched products
    std::vector<const float *> hp(nptr);
    const float **pa = hp.data();
    size_t o = 0;
    int nb1 = nc * G, nbh = nc * H;
    size_t cbA = o, cbB = o + nb1, cbC = o + 2 * nb1;
    o += 3 * nb1;
    size_t ydA = o, ydB = o + nbh, ydC = o + 2 * nbh;
    o += 3 * nbh;
    size_t scA = o, scB = o + nbh, scC = o + 2 * nbh;
    o += 3 * nbh;
    size_t yoA = o, yoB = o + nbh, yoC = o + 2 * nbh;
    for (int c = 0; c < nc; c++) {
        for (int g = 0; g < G; g++) { // CB[c,g] (row-major [i][j]) = C_i . B_j
            int q = c * G + g;
            pa[cbA + q] = s.bp + (size_t)c * L * GN + g * N;
            pa[cbB + q] = s.cp + (size_t)c * L * GN + g * N;
            pa[cbC + q] = s.cb + (size_t)q * L * L;
        }
        for (int h = 0; h < H; h++) {
            int q = c * H + h, g = h / (H / G);
            pa[ydA + q] = s.xp + (size_t)c * L * HP + h * P; // Yd^T = X^T M^T
            pa[ydB + q] = s.m + (size_t)q * L * L;
            pa[ydC + q] = s.yd + (size_t)c * L * HP + h * P;
            pa[scA + q] = s.bp + (size_t)c * L * GN + g * N; // Sc^T = B^T Xs
            pa[scB + q] = s.xs + (size_t)c * L * HP + h * P;
            pa[scC + q] = s.sc + (size_t)q * P * N;
            pa[yoA + q] = s.sin + (size_t)q * P * N; // Yo^T = S_in C^T
            pa[yoB + q] = s.cp + (size_t)c * L * GN + g * N;
            pa[yoC + q] = s.yo + (size_t)c * L * HP + h * P;
        }
    }
    cudaStream_t st = cu(be)->stream;
    CUDA_CHECK(cudaMemcpyAsync(s.ptr, hp.data(), sizeof(void *) * nptr, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(s.chunks, ch.data(), sizeof(ssd_chunk) * nc, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(s.first, first.data(), 4 * (ns + 1), cudaMemcpyHostToDevice, st));
    ssd_args a = {y, zxbcdt, ld, H, P, G, N, L, HP, d->conv_dim, dt_bias, A, D, ssm_state,
                  b->query_start_loc, b->context_lens, b->state_slots, b->state_src, b->ckpt_start, b->ckpt_pos,
                  b->ckpt_slot, seq0, d->dt_min, d->dt_max, NULL};
    k_ssd_gather<<<dim3(nc, L), 256, 0, st>>>(a, s.chunks, s.xp, s.bp, s.cp);
    k_ssd_dt<<<cdiv(nbh, 128), 128, 0, st>>>(a, s.chunks, nc, s.dt, s.ac);
    LAUNCH_CHECK();
    float **P_ = (float **)s.ptr;
    sgemm_batched(be, CUBLAS_OP_T, CUBLAS_OP_N, L, L, N, s.ptr + cbA, GN, s.ptr + cbB, GN, P_ + cbC, L, nb1);
    k_ssd_mask<<<dim3(nc, H), 256, 0, st>>>(a, s.chunks, s.cb, s.dt, s.ac, s.xp, s.m, s.xs);
    LAUNCH_CHECK();
    sgemm_batched(be, CUBLAS_OP_N, CUBLAS_OP_N, P, L, L, s.ptr + ydA, HP, s.ptr + ydB, L, P_ + ydC, HP, nbh);
    sgemm_batched(be, CUBLAS_OP_N, CUBLAS_OP_T, N, P, L, s.ptr + scA, GN, s.ptr + scB, HP, P_ + scC, N, nbh);
    k_ssd_pass<<<dim3(ns, H), 256, 0, st>>>(a, s.chunks, s.first, s.sc, s.ac, s.sin);
    LAUNCH_CHECK();
    sgemm_batched(be, CUBLAS_OP_T, CUBLAS_OP_N, P, L, N, s.ptr + yoA, N, s.ptr + yoB, GN, P_ + yoC, HP, nbh);
    k_ssd_out<<<dim3(nc, L), 256, 0, st>>>(a, s.chunks, s.yd, s.yo, s.ac, s.xp);
    LAUNCH_CHECK();
}

// One block per (decode sequence, head, slice of SSD_SPLIT of the P rows):
// the state [P, N] is read and written once, in place; the slices give a
// step of few sequences 4x the blocks of its heads. A warp owns two rows at a
// time; lanes cover n (coalesced 128-byte rows), and all of a row's loads
// are issued before use.
#define SSD_NMAX (CUDA_MAX_STATE / 32) // N <= 256, checked at load
#define SSD_SPLIT 4
__global__ void __launch_bounds__(256) k_ssd_decode(ssd_args a) {
    pdl_wait();
    pdl_trigger();
    int s = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int P = a.P, N = a.N, g = h / (a.H / a.G), nq = (N + 31) / 32;
    int t = a.qsl[s], rpb = (P + gridDim.z - 1) / gridDim.z, p_lo = blockIdx.z * rpb, p_hi = min(P, p_lo + rpb);
    const float *row = a.zx + (int64_t)t * a.ld;
    const float *B = row + 2 * a.I + g * N, *C = row + 2 * a.I + a.G * N + g * N;
    float dt = dt_of(a, row, h), dA = expf(dt * a.A[h]);
    float *st = a.ssm + ((int64_t)a.slots[s] * a.H + h) * P * N;
    int dst = a.ck_dst ? a.ck_dst[s] : -1;
    float *ck = dst >= 0 ? a.ssm + ((int64_t)dst * a.H + h) * P * N : NULL; // the new state there too
    float b[SSD_NMAX], c[SSD_NMAX];
#pragma unroll
    for (int q = 0; q < SSD_NMAX; q++) {
        int n = lane + 32 * q;
        b[q] = q < nq && n < N ? B[n] : 0.0f;
        c[q] = q < nq && n < N ? C[n] : 0.0f;
    }
    for (int p0 = p_lo + 2 * warp; p0 < p_hi; p0 += 2 * nw) {
        float v[2][SSD_NMAX], xv[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int p = min(p0 + r, p_hi - 1);
            xv[r] = row[a.I + h * P + p];
#pragma unroll
            for (int q = 0; q < SSD_NMAX; q++) {
                int n = lane + 32 * q;
                v[r][q] = q < nq && n < N ? st[(int64_t)p * N + n] : 0.0f;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int p = p0 + r;
            float dx = dt * xv[r], acc = 0;
#pragma unroll
            for (int q = 0; q < SSD_NMAX; q++) {
                int n = lane + 32 * q;
                if (q < nq && n < N) {
                    float nv = v[r][q] * dA + dx * b[q];
                    if (p < p_hi) st[(int64_t)p * N + n] = nv;
                    if (ck && p < p_hi) ck[(int64_t)p * N + n] = nv;
                    acc += nv * c[q];
                }
            }
            acc = warp_sum(acc);
            if (lane == 0 && p < p_hi) a.y[(int64_t)t * a.I + h * P + p] = acc + a.D[h] * xv[r];
        }
    }
}

void cuda_ssd_decode(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                     const float *D, float *ssm_state, const struct batch *b, const struct mamba_dims *d) {
    if (b->num_decodes <= 0) return;
    ssd_args a = {y, zxbcdt, ld, d->heads, d->head_dim, d->groups, d->state, d->chunk_size, d->heads * d->head_dim,
                  d->conv_dim, dt_bias, A, D, ssm_state, b->query_start_loc, b->context_lens, b->state_slots,
                  NULL, NULL, NULL, NULL, 0, d->dt_min, d->dt_max, b->ckpt_dst}; // a decode continues its own slot
    // slices only while (sequence, head) blocks are too few to fill the SMs: at 64 sequences they cost more
    int split = d->head_dim >= 64 && (int64_t)b->num_decodes * d->heads < 2 * cu(be)->num_sms ? SSD_SPLIT : 1;
    launch_pdl(k_ssd_decode, dim3(b->num_decodes, d->heads, split), 256, 0, cu(be)->stream, a);
}

// One block per (row, group): out = rmsnorm_group(y * silu(z)) * w.
__global__ void k_gated_rmsnorm(float *out, const float *y, const float *z, int zld, const float *w, int dim, int gs,
                                float eps) {
    pdl_wait();
    pdl_trigger();
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
    launch_pdl(k_gated_rmsnorm, dim3(n, dim / group_size), 256, 0, cu(be)->stream, out, y, z, zld, w, dim, group_size, eps);
}
