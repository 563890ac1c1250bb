// cuda_mamba.cu - Mamba2 on the GPU: causal conv1d (varlen prefill and
// decode update), the SSD chunked scan for varlen prefill, the selective
// state update for decode and the gated grouped RMSNorm (mamba_decode runs
// the last three in a row: backend_mamba_decode). State is fp32.
//
// zxbcdt rows (ld floats): z [I] | x [H*P] | B [G*N] | C [G*N] | dt [H].
#include <algorithm>

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
// to halo [conv_halo_at][K-1][C]; then the tiles run independently.
#define CONV_TT 32
// A tile's place in the halo: (its sequence's first row - seq0's) / CONV_TT +
// its sequence's index + j. Distinct for distinct tiles (a sequence of L rows
// from row t0 has ceil(L/CONV_TT) tiles, and floor((t0 + L)/CONV_TT) + 1 is
// past floor(t0/CONV_TT) + ceil(L/CONV_TT) - 1), and below T/CONV_TT + S for
// T rows in S sequences: sized at load, where [S sequences][longest's tiles]
// grew to gigabytes with one long prompt among many short ones.
__device__ __forceinline__ int64_t conv_halo_at(const conv_meta &m, int seq0, int s, int j) {
    return (m.qsl[s] - m.qsl[seq0]) / CONV_TT + (s - seq0) + j;
}
static size_t conv_halo_bytes(int K, int C, int64_t T, int64_t S) {
    return sizeof(float) * (size_t)(T / CONV_TT + S + 1) * (K - 1) * C;
}
template <int K>
__global__ void k_conv_halo(const float *zxbcdt, int ld, int I, int C, const float *conv_state, conv_meta m, int seq0,
                            float *halo) {
    int s = seq0 + blockIdx.y, j = blockIdx.z, c = blockIdx.x * blockDim.x + threadIdx.x;
    int t0 = m.qsl[s], L = m.qsl[s + 1] - t0;
    if (c >= C || j * CONV_TT >= L) return;
    const float *sst = conv_state + (int64_t)max(m.src[s], 0) * (K - 1) * C + c;
    float *h = halo + conv_halo_at(m, seq0, s, j) * (K - 1) * C + c;
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
                              conv_meta m, int seq0, const float *halo) {
    int s = seq0 + blockIdx.y, j = blockIdx.z, c = blockIdx.x * blockDim.x + threadIdx.x;
    int t0 = m.qsl[s], L = m.qsl[s + 1] - t0, a = j * CONV_TT;
    if (c >= C || a >= L) return;
    int n = min(CONV_TT, L - a), p0 = m.ctx[s] + a; // position of the tile's first token
    float x[CONV_TT], win[K - 1], wc[K];
    float *col = zxbcdt + (int64_t)(t0 + a) * ld + I + c;
#pragma unroll
    for (int i = 0; i < CONV_TT; i++) x[i] = i < n ? col[(int64_t)i * ld] : 0.0f;
    const float *h = halo + conv_halo_at(m, seq0, s, j) * (K - 1) * C + c;
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
    int64_t rows = b->h_query_start_loc[seq1] - b->h_query_start_loc[seq0];
    float *halo = (float *)cuda_scratch(be, conv_halo_bytes(K, C, rows, seq1 - seq0));
    dim3 grid(cdiv(C, 128), seq1 - seq0, cdiv(maxlen, CONV_TT));
    k_conv_halo<K><<<grid, 128, 0, st>>>(zxbcdt, ld, I, C, conv_state, m, seq0, halo);
    k_conv1d_tile<K><<<grid, 128, 0, st>>>(zxbcdt, ld, I, C, w, bias, conv_state, m, seq0, halo);
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

// The SSD chunked scan as batched matrix products over the chunks of every
// prefill sequence at once (cuBLAS strided-batched GEMMs): bf16 inputs with
// fp32 accumulation on tensor cores, or fp32 throughout in the fp32 mode
// (weight_dtype float32, the exactness gates). Chunks end at absolute multiples of
// chunk_size and are padded to L rows. Per chunk c, head h (group g; the
// group's hpg = H/G heads side by side make [., hpg*P] products per (c, g)):
//   CB = C B^T                                    [L, L]        per (c, g)
//   M  = CB * exp(acum_i - acum_j) dt_j, j <= i   [L, L]        causal decay
//   Yd = M X                                      [L, P]        per (c, h)
//   Sc = Xs^T B, Xs_j = exp(acum_L - acum_j) dt_j X_j   [hpg*P, N] per (c, g)
//   S_in(c+1) = exp(acum_L) S_in(c) + Sc          fp32, in turn over a sequence's chunks
//   Yo = C S_in^T                                 [L, hpg*P]    per (c, g)
//   y  = Yd + exp(acum_i) Yo + D x
// Buffers (E: the products' inputs, bf16 or fp32) are laid out so that one
// stride steps each product's batch: x, Yd [c][h][L][P]; B, C [c][g][L][N];
// Xs, Yo [c][g][L][hpg*P]; Sc, S_in [c][h][P][N]; M [c][h][L][L]; dt and
// acum [c][L][H]. The chunk
// table is made on the device from the batch's arrays (the host counts the
// chunks from its mirrors for launch sizes): no copy, no wait for the stream.
// The chunks run in passes of at most ssd_cap (the scratch is bounded: a
// batch of short prompts can have a chunk per token); a sequence split
// between passes carries its state in its slot.
struct ssd_chunk {
    int seq, t, len; // sequence, first token row, tokens (<= L)
};

template <typename E> struct ssd_bufs {
    E *x, *b, *c, *m, *xs, *sin;
    float *dt, *ac, *cb, *sc, *yd, *yo;
};

#define SSD_PASS_BYTES ((size_t)1 << 30) // a pass's buffers (at least one chunk's)

// Carving of the scratch, 256-byte aligned pieces (base NULL: sizes only).
struct ssd_carver {
    char *base;
    size_t off;
};
static void *ssd_take(ssd_carver *cv, size_t bytes) {
    void *p = cv->base ? cv->base + cv->off : NULL;
    cv->off += (bytes + 255) & ~(size_t)255;
    return p;
}

// The buffers of nb chunks from cv; M is dead once Yd is made, so Yo takes its place.
template <typename E>
static void ssd_carve(ssd_carver *cv, int64_t nb, const struct mamba_dims *d, ssd_bufs<E> *s) {
    int64_t L = d->chunk_size, H = d->heads, P = d->head_dim, G = d->groups, N = d->state;
    int64_t hlp = nb * H * L * P, gln = nb * G * L * N, hpn = nb * H * P * N, hl = nb * H * L;
    s->x = (E *)ssd_take(cv, sizeof(E) * hlp);
    s->b = (E *)ssd_take(cv, sizeof(E) * gln);
    s->c = (E *)ssd_take(cv, sizeof(E) * gln);
    s->xs = (E *)ssd_take(cv, sizeof(E) * hlp);
    s->sin = (E *)ssd_take(cv, sizeof(E) * hpn);
    s->dt = (float *)ssd_take(cv, sizeof(float) * hl);
    s->ac = (float *)ssd_take(cv, sizeof(float) * hl);
    s->cb = (float *)ssd_take(cv, sizeof(float) * nb * G * L * L);
    s->sc = (float *)ssd_take(cv, sizeof(float) * hpn);
    s->yd = (float *)ssd_take(cv, sizeof(float) * hlp);
    void *my = ssd_take(cv, std::max(sizeof(E) * nb * H * L * L, sizeof(float) * hlp));
    s->m = (E *)my, s->yo = (float *)my;
}

// Chunks of a pass, for a step of nc chunks.
template <typename E> static int64_t ssd_cap(const struct mamba_dims *d, int64_t nc) {
    ssd_carver cv = {NULL, 0};
    ssd_bufs<E> s;
    ssd_carve(&cv, 1, d, &s);
    return std::min(nc, std::max<int64_t>(1, (int64_t)(SSD_PASS_BYTES / cv.off)));
}

// Scratch of a step of nc chunks over ns sequences: the chunk table, the
// sequences' first chunks, one pass's buffers.
template <typename E>
static size_t ssd_layout(char *base, const struct mamba_dims *d, int64_t nc, int64_t ns, ssd_chunk **ch,
                         int32_t **first, ssd_bufs<E> *s) {
    ssd_carver cv = {base, 0};
    *ch = (ssd_chunk *)ssd_take(&cv, sizeof(ssd_chunk) * nc);
    *first = (int32_t *)ssd_take(&cv, sizeof(int32_t) * (ns + 1));
    ssd_carve(&cv, ssd_cap<E>(d, nc), d, s);
    return cv.off;
}

// The prefill's conv halo and then its SSD take the scratch in turn.
size_t cuda_ssd_scratch(struct backend *be, const struct mamba_dims *d, int max_tokens, int max_seqs) {
    int64_t T = std::max(max_tokens, 1); // a chunk holds a token at least, and so does a sequence
    int64_t S = max_seqs > 0 ? std::min<int64_t>(max_seqs, T) : T;
    ssd_chunk *ch;
    int32_t *first;
    size_t halo = conv_halo_bytes(d->conv_kernel, d->conv_dim, T, S);
    if (be->weight_dtype == WF_F32) {
        ssd_bufs<float> s;
        return std::max(halo, ssd_layout(NULL, d, T, T, &ch, &first, &s));
    }
    ssd_bufs<__nv_bfloat16> s;
    return std::max(halo, ssd_layout(NULL, d, T, T, &ch, &first, &s));
}

// Chunks of a prompt of len tokens after p0 (chunk boundaries at multiples of L)
__host__ __device__ __forceinline__ int ssd_nchunks(int p0, int len, int L) {
    return len > 0 ? (p0 + len - 1) / L - p0 / L + 1 : 0;
}

// The chunk table, from the batch's device arrays: first[i], the first chunk
// of sequence seq0 + i (an exclusive prefix sum of the chunk counts; first[ns]:
// all of them), and each chunk's sequence, first row and length. One block of
// 1024 threads, a sequence a thread, in rounds of 1024 sequences.
__global__ void __launch_bounds__(1024) k_ssd_chunks(ssd_args a, int ns, int32_t *first, ssd_chunk *ch) {
    __shared__ int wsum[32], carry;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, L = a.chunk;
    if (threadIdx.x == 0) carry = 0;
    for (int r0 = 0; r0 < ns; r0 += blockDim.x) {
        int i = r0 + threadIdx.x, s = a.seq0 + i, t0 = 0, len = 0, p0 = 0, n = 0;
        if (i < ns) t0 = a.qsl[s], len = a.qsl[s + 1] - t0, p0 = a.ctx[s], n = ssd_nchunks(p0, len, L);
        int v = n; // inclusive sum over the warp
        for (int o = 1; o < 32; o <<= 1) {
            int u = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += u;
        }
        __syncthreads(); // carry set, the last round's wsum read
        if (lane == 31) wsum[w] = v;
        __syncthreads();
        if (w == 0) {
            int x = wsum[lane];
            for (int o = 1; o < 32; o <<= 1) {
                int u = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += u;
            }
            wsum[lane] = x;
        }
        __syncthreads();
        int at = carry + (w ? wsum[w - 1] : 0) + v - n;
        if (i < ns) {
            first[i] = at;
            for (int j = 0; j < n; j++) {
                int c0 = (p0 / L + j) * L - p0; // the chunk's absolute start, from the prompt's first token
                int lo = max(c0, 0), hi = min(c0 + L, len);
                ch[at + j] = ssd_chunk{s, t0 + lo, hi - lo};
            }
        }
        __syncthreads(); // carry read
        if (threadIdx.x == blockDim.x - 1) carry = at + n;
    }
    if (threadIdx.x == blockDim.x - 1) first[ns] = carry;
}

// x, B, C of each chunk in the products' type (zero rows past its length)
template <typename E> __global__ void k_ssd_gather(ssd_args a, const ssd_chunk *ch, E *x, E *bm, E *cm) {
    int c = blockIdx.x, i = blockIdx.y, L = a.chunk, P = a.P, N = a.N, GN = a.G * a.N;
    ssd_chunk k = ch[c];
    const float *row = a.zx + (int64_t)(k.t + i) * a.ld;
    bool in = i < k.len;
    for (int j = threadIdx.x; j < a.I; j += blockDim.x)
        x[(((int64_t)c * a.H + j / P) * L + i) * P + j % P] = (E)(in ? row[a.I + j] : 0.0f);
    for (int j = threadIdx.x; j < GN; j += blockDim.x) {
        int64_t o = (((int64_t)c * a.G + j / N) * L + i) * N + j % N;
        bm[o] = (E)(in ? row[2 * a.I + j] : 0.0f);
        cm[o] = (E)(in ? row[2 * a.I + GN + j] : 0.0f);
    }
}

// dt and its running sum times A, [c][L][H]: a thread per (chunk, head)
// sums in row order as the reference does (the fp32 gates need its bits),
// 8 rows' loads issued before their sums; zero past the length
__global__ void k_ssd_dt(ssd_args a, const ssd_chunk *ch, int nc, float *dt, float *ac) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= nc * a.H) return;
    int c = idx / a.H, h = idx % a.H, L = a.chunk;
    ssd_chunk k = ch[c];
    float run = 0, A = a.A[h];
    for (int i0 = 0; i0 < L; i0 += 8) {
        float d[8];
#pragma unroll
        for (int u = 0; u < 8; u++) d[u] = i0 + u < k.len ? dt_of(a, a.zx + (int64_t)(k.t + i0 + u) * a.ld, h) : 0.0f;
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (i0 + u < L) {
                run += d[u] * A;
                dt[((int64_t)c * L + i0 + u) * a.H + h] = d[u];
                ac[((int64_t)c * L + i0 + u) * a.H + h] = run;
            }
    }
}

// M (causal, decayed, dt-weighted) from CB, and the scaled x of the chunk
// states (from zxbcdt's fp32 x), per (chunk, head)
template <typename E>
__global__ void k_ssd_mask(ssd_args a, const ssd_chunk *ch, const float *cb, const float *dt, const float *ac, E *m,
                           E *xs) {
    extern __shared__ float sh[]; // dt, acum: [2][L]
    int c = blockIdx.x, h = blockIdx.y, L = a.chunk, P = a.P, hpg = a.H / a.G, g = h / hpg;
    ssd_chunk k = ch[c];
    float *d = sh, *q = sh + L;
    for (int i = threadIdx.x; i < L; i += blockDim.x) {
        d[i] = dt[((int64_t)c * L + i) * a.H + h];
        q[i] = ac[((int64_t)c * L + i) * a.H + h];
    }
    __syncthreads();
    const float *cbc = cb + ((int64_t)c * a.G + g) * L * L;
    E *mc = m + ((int64_t)c * a.H + h) * L * L;
    for (int e = threadIdx.x; e < L * L; e += blockDim.x) {
        int i = e / L, j = e % L;
        mc[e] = (E)((j <= i && i < k.len) ? cbc[e] * expf(q[i] - q[j]) * d[j] : 0.0f);
    }
    float last = q[k.len - 1];
    E *xc = xs + ((int64_t)c * a.G + g) * L * hpg * P + (h % hpg) * P;
    for (int e = threadIdx.x; e < L * P; e += blockDim.x) {
        int j = e / P, p = e % P;
        float v = j < k.len ? expf(last - q[j]) * d[j] * a.zx[(int64_t)(k.t + j) * a.ld + a.I + h * P + p] : 0.0f;
        xc[(int64_t)j * hpg * P + p] = (E)v;
    }
}

// The states entering chunks [c0, c1) (this pass), in turn over each
// sequence's chunks, a thread per (sequence, head, state element): a
// sequence's first chunk starts from slot state_src (zeros for -1), a later
// pass from what the last one left in its slot; a chunk's exit state goes to
// each checkpoint at its end, and the last one's to the state slot.
template <typename E>
__global__ void k_ssd_pass(ssd_args a, const ssd_chunk *ch, const int32_t *first, int c0, int c1, const float *sc,
                           const float *ac, E *sin) {
    int i = blockIdx.x, s = a.seq0 + i, h = blockIdx.y, PN = a.P * a.N, L = a.chunk;
    int k = blockIdx.z * blockDim.x + threadIdx.x, lo = max(first[i], c0), hi = min(first[i + 1], c1);
    if (k >= PN || lo >= hi) return;
    float *gst = a.ssm + ((int64_t)a.slots[s] * a.H + h) * PN + k;
    float v = lo > first[i] ? *gst : a.src[s] >= 0 ? a.ssm[((int64_t)a.src[s] * a.H + h) * PN + k] : 0.0f;
    int q = a.ck_start[s], k1 = a.ck_start[s + 1], pos0 = a.ctx[s] - a.qsl[s]; // position of token row t: pos0 + t
    for (int c = lo; c < hi; c += 4) { // 4 chunks' loads issued, then their steps in turn
        float dec[4], add[4];
        int end[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int cu = min(c + u, hi - 1);
            ssd_chunk kc = ch[cu];
            dec[u] = ac[((int64_t)(cu - c0) * L + kc.len - 1) * a.H + h];
            add[u] = sc[((int64_t)(cu - c0) * a.H + h) * PN + k];
            end[u] = pos0 + kc.t + kc.len;
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (c + u < hi) {
                sin[((int64_t)(c + u - c0) * a.H + h) * PN + k] = (E)v;
                v = expf(dec[u]) * v + add[u];
                for (; q < k1 && a.ck_pos[q] <= end[u]; q++)
                    if (a.ck_pos[q] == end[u]) a.ssm[((int64_t)a.ck_slot[q] * a.H + h) * PN + k] = v;
            }
    }
    *gst = v;
}

__global__ void k_ssd_out(ssd_args a, const ssd_chunk *ch, const float *yd, const float *yo, const float *ac) {
    int c = blockIdx.x, i = blockIdx.y, L = a.chunk, P = a.P, hpg = a.H / a.G;
    ssd_chunk k = ch[c];
    if (i >= k.len) return;
    const float *x = a.zx + (int64_t)(k.t + i) * a.ld + a.I;
    for (int j = threadIdx.x; j < a.I; j += blockDim.x) {
        int h = j / P, g = h / hpg;
        float e = expf(ac[((int64_t)c * L + i) * a.H + h]);
        float vd = yd[(((int64_t)c * a.H + h) * L + i) * P + j % P];
        float vo = yo[(((int64_t)c * a.G + g) * L + i) * hpg * P + j - g * hpg * P];
        a.y[(int64_t)(k.t + i) * a.I + j] = vd + e * vo + a.D[h] * x[j];
    }
}

// C = op(A) op(B) for batch matrices a stride apart (cuBLAS column-major
// terms), inputs of type t, fp32 output and accumulation.
static void ssd_gemm(struct backend *be, cudaDataType_t t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                     int k, const void *A, int lda, int64_t sa, const void *B, int ldb, int64_t sb, float *C, int ldc,
                     int64_t sc, int batch) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cu(be)->blas, ta, tb, m, n, k, &one, A, t, lda, sa, B, t, ldb, sb, &zero, C,
                                            CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

template <typename E>
static void ssd_run(struct backend *be, const ssd_args &a, int ns, int64_t nc, const struct mamba_dims *d,
                    cudaDataType_t et) {
    const cublasOperation_t T_ = CUBLAS_OP_T, N_ = CUBLAS_OP_N;
    int L = a.chunk, H = a.H, P = a.P, G = a.G, N = a.N, hp = H / G * P;
    int64_t cap = ssd_cap<E>(d, nc);
    ssd_chunk *ch;
    int32_t *first;
    ssd_bufs<E> s;
    char *base = (char *)cuda_scratch(be, ssd_layout(NULL, d, nc, ns, &ch, &first, &s)); // reserved at load
    ssd_layout(base, d, nc, ns, &ch, &first, &s);
    cudaStream_t st = cu(be)->stream;
    k_ssd_chunks<<<1, 1024, 0, st>>>(a, ns, first, ch);
    LAUNCH_CHECK();
    for (int64_t c0 = 0; c0 < nc; c0 += cap) {
        int nb = (int)std::min(cap, nc - c0);
        const ssd_chunk *pc = ch + c0;
        k_ssd_gather<E><<<dim3(nb, L), 256, 0, st>>>(a, pc, s.x, s.b, s.c);
        k_ssd_dt<<<cdiv(nb * H, 128), 128, 0, st>>>(a, pc, nb, s.dt, s.ac);
        LAUNCH_CHECK();
        ssd_gemm(be, et, T_, N_, L, L, N, s.b, N, (int64_t)L * N, s.c, N, (int64_t)L * N, s.cb, L, (int64_t)L * L,
                 nb * G); // CB^T = B C^T: [L, L] per (c, g)
        k_ssd_mask<E><<<dim3(nb, H), 256, 2 * L * sizeof(float), st>>>(a, pc, s.cb, s.dt, s.ac, s.m, s.xs);
        LAUNCH_CHECK();
        ssd_gemm(be, et, N_, N_, P, L, L, s.x, P, (int64_t)L * P, s.m, L, (int64_t)L * L, s.yd, P, (int64_t)L * P,
                 nb * H); // Yd^T = X^T M^T: [P, L] per (c, h)
        ssd_gemm(be, et, N_, T_, N, hp, L, s.b, N, (int64_t)L * N, s.xs, hp, (int64_t)L * hp, s.sc, N,
                 (int64_t)hp * N, nb * G); // Sc^T = B^T Xs: [N, hpg*P] per (c, g)
        k_ssd_pass<E><<<dim3(ns, H, cdiv(P * N, 256)), 256, 0, st>>>(a, ch, first, (int)c0, (int)c0 + nb, s.sc, s.ac,
                                                                      s.sin);
        LAUNCH_CHECK();
        ssd_gemm(be, et, T_, N_, hp, L, N, s.sin, N, (int64_t)hp * N, s.c, N, (int64_t)L * N, s.yo, hp,
                 (int64_t)L * hp, nb * G); // Yo^T = S_in C^T: [hpg*P, L] per (c, g)
        k_ssd_out<<<dim3(nb, L), 256, 0, st>>>(a, pc, s.yd, s.yo, s.ac);
        LAUNCH_CHECK();
    }
}

void cuda_ssd_prefill(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                      const float *D, float *ssm_state, const struct batch *b, int seq0, int seq1,
                      const struct mamba_dims *d) {
    int ns = seq1 - seq0;
    int64_t nc = 0; // from the host mirrors, for launch sizes
    for (int s = seq0; s < seq1; s++)
        nc += ssd_nchunks(b->h_context_lens[s], b->h_query_start_loc[s + 1] - b->h_query_start_loc[s], d->chunk_size);
    if (nc == 0) return;
    ssd_args a = {y, zxbcdt, ld, d->heads, d->head_dim, d->groups, d->state, d->chunk_size, d->heads * d->head_dim,
                  d->conv_dim, dt_bias, A, D, ssm_state, b->query_start_loc, b->context_lens, b->state_slots,
                  b->state_src, b->ckpt_start, b->ckpt_pos, b->ckpt_slot, seq0, d->dt_min, d->dt_max, NULL};
    if (be->weight_dtype == WF_F32) ssd_run<float>(be, a, ns, nc, d, CUDA_R_32F); // the fp32 mode: fp32 products
    else ssd_run<__nv_bfloat16>(be, a, ns, nc, d, CUDA_R_16BF);
}

// One block per (decode sequence, head, slice of SSD_SPLIT of the P rows):
// the state [P, N] is read and written once, in place; the slices give a
// step of few sequences 4x the blocks of its heads. A warp takes R rows at a
// time, a lane 4 consecutive n of each of NQ pieces of 128 (16-byte loads
// and stores: N % 4 == 0, checked at load), every load of the R rows issued
// before use: R = 8 where a block has 8 rows a warp (the slices of few
// sequences leave it 2). x, B and C are read convolved from the row
// (conv1d_update ran first).
#define SSD_SPLIT 4
template <int R, int NQ>
__global__ void __launch_bounds__(256) k_ssd_decode(ssd_args a) {
    pdl_wait();
    pdl_trigger();
    int s = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int P = a.P, N = a.N, N4 = N / 4, g = h / (a.H / a.G);
    int t = a.qsl[s], rpb = (P + gridDim.z - 1) / gridDim.z, p_lo = blockIdx.z * rpb, p_hi = min(P, p_lo + rpb);
    const float *row = a.zx + (int64_t)t * a.ld;
    const float *X = row + a.I + h * P, *B = row + 2 * a.I + g * N, *C = row + 2 * a.I + a.G * N + g * N;
    float dt = dt_of(a, row, h), dA = expf(dt * a.A[h]), Dh = a.D[h];
    float4 *st = (float4 *)(a.ssm + ((int64_t)a.slots[s] * a.H + h) * P * N);
    int dst = a.ck_dst ? a.ck_dst[s] : -1;
    float4 *ck = dst >= 0 ? (float4 *)(a.ssm + ((int64_t)dst * a.H + h) * P * N) : NULL; // the new state there too
    float4 b[NQ], c[NQ]; // B and C rows may be unaligned (ld): scalar loads
#pragma unroll
    for (int q = 0; q < NQ; q++) {
        int n = 4 * (lane + 32 * q);
        bool in = n < N;
        b[q] = in ? make_float4(B[n], B[n + 1], B[n + 2], B[n + 3]) : make_float4(0, 0, 0, 0);
        c[q] = in ? make_float4(C[n], C[n + 1], C[n + 2], C[n + 3]) : make_float4(0, 0, 0, 0);
    }
    for (int p0 = p_lo + R * warp; p0 < p_hi; p0 += R * nw) {
        float4 v[R][NQ];
        float xv[R], acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int p = min(p0 + r, p_hi - 1);
            xv[r] = X[p];
#pragma unroll
            for (int q = 0; q < NQ; q++) {
                int n4 = lane + 32 * q;
                v[r][q] = n4 < N4 ? st[(int64_t)p * N4 + n4] : make_float4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            int p = p0 + r;
            float dx = dt * xv[r];
            acc[r] = 0;
#pragma unroll
            for (int q = 0; q < NQ; q++) {
                int n4 = lane + 32 * q;
                if (n4 < N4) {
                    float4 o = v[r][q], nv;
                    nv.x = o.x * dA + dx * b[q].x, nv.y = o.y * dA + dx * b[q].y;
                    nv.z = o.z * dA + dx * b[q].z, nv.w = o.w * dA + dx * b[q].w;
                    if (p < p_hi) {
                        st[(int64_t)p * N4 + n4] = nv;
                        if (ck) ck[(int64_t)p * N4 + n4] = nv;
                    }
                    acc[r] += nv.x * c[q].x + nv.y * c[q].y + nv.z * c[q].z + nv.w * c[q].w;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
        if (lane < R && p0 + lane < p_hi) {
            float y = 0;
#pragma unroll
            for (int r = 0; r < R; r++)
                if (r == lane) y = acc[r] + Dh * xv[r];
            a.y[(int64_t)t * a.I + h * P + p0 + lane] = y;
        }
    }
}

static ssd_args ssd_decode_args(float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                                const float *D, float *ssm_state, const struct batch *b, const struct mamba_dims *d) {
    return {y, zxbcdt, ld, d->heads, d->head_dim, d->groups, d->state, d->chunk_size, d->heads * d->head_dim,
            d->conv_dim, dt_bias, A, D, ssm_state, b->query_start_loc, b->context_lens, b->state_slots,
            NULL, NULL, NULL, NULL, 0, d->dt_min, d->dt_max, b->ckpt_dst}; // a decode continues its own slot
}

// slices only while (sequence, head) blocks are too few to fill the SMs: at 64 sequences they cost more
static int ssd_decode_split(struct backend *be, const struct batch *b, const struct mamba_dims *d) {
    return d->head_dim >= 64 && (int64_t)b->num_decodes * d->heads < 2 * cu(be)->num_sms ? SSD_SPLIT : 1;
}

void cuda_ssd_decode(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                     const float *D, float *ssm_state, const struct batch *b, const struct mamba_dims *d) {
    if (b->num_decodes <= 0) return;
    ssd_args a = ssd_decode_args(y, zxbcdt, ld, dt_bias, A, D, ssm_state, b, d);
    int split = ssd_decode_split(be, b, d), rows = cdiv(d->head_dim, split); // a block's rows: 8 a warp, or fewer
    dim3 grid(b->num_decodes, d->heads, split);
    cudaStream_t st = cu(be)->stream;
    if (rows >= 64) {
        if (d->state <= 128) launch_pdl(k_ssd_decode<8, 1>, grid, 256, 0, st, a);
        else launch_pdl(k_ssd_decode<8, 2>, grid, 256, 0, st, a);
    } else {
        if (d->state <= 128) launch_pdl(k_ssd_decode<2, 1>, grid, 256, 0, st, a);
        else launch_pdl(k_ssd_decode<2, 2>, grid, 256, 0, st, a);
    }
}

// One block per (row, group): out = rmsnorm_group(y * silu(z)) * w.
#define GN_R 4 // elements a thread per pass
__global__ void k_gated_rmsnorm(float *out, const float *y, const float *z, int zld, const float *w, int dim, int gs,
                                float eps) {
    pdl_wait();
    pdl_trigger();
    __shared__ float red[32];
    int t = blockIdx.x, g0 = blockIdx.y * gs, g1 = g0 + gs, nt = blockDim.x;
    const float *yt = y + (int64_t)t * dim, *zt = z + (int64_t)t * zld;
    float *ot = out + (int64_t)t * dim;
    // Two passes over the group, each with GN_R loads a thread in flight
    // (out may be y: a loop of load, store, load waited a memory latency an
    // element); the second recomputes y * silu(z) rather than rereading out.
    float ss = 0;
    for (int i0 = g0 + threadIdx.x; i0 < g1; i0 += GN_R * nt) {
        float yv[GN_R], zv[GN_R];
#pragma unroll
        for (int k = 0; k < GN_R; k++) {
            int i = i0 + k * nt;
            yv[k] = i < g1 ? yt[i] : 0.0f, zv[k] = i < g1 ? zt[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < GN_R; k++) {
            float v = yv[k] * silu_f(zv[k]);
            ss += v * v;
        }
    }
    ss = block_sum(ss, red);
    float r = rsqrtf(ss / gs + eps);
    for (int i0 = g0 + threadIdx.x; i0 < g1; i0 += GN_R * nt) {
        float yv[GN_R], zv[GN_R], wv[GN_R];
#pragma unroll
        for (int k = 0; k < GN_R; k++) {
            int i = i0 + k * nt;
            yv[k] = i < g1 ? yt[i] : 0.0f, zv[k] = i < g1 ? zt[i] : 0.0f, wv[k] = i < g1 ? w[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < GN_R; k++)
            if (i0 + k * nt < g1) ot[i0 + k * nt] = wv[k] * ((yv[k] * silu_f(zv[k])) * r);
    }
}

void cuda_gated_rmsnorm(struct backend *be, float *out, const float *y, const float *z, int zld, const float *w, int n,
                        int dim, int group_size, float eps) {
    if (n <= 0) return;
    launch_pdl(k_gated_rmsnorm, dim3(n, dim / group_size), 256, 0, cu(be)->stream, out, y, z, zld, w, dim, group_size, eps);
}
