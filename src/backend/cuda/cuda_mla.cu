// cuda_mla.cu - multi-head latent attention (Kimi-Linear, DeepSeek-V2/V3)
// over a paged cache of latents, fp32 or bf16: the mla_kv_write and mla_attn
// ops, each the CPU reference op of the same name (cpu_kimi.c) on the device.
//
// The cache holds per token c [R] | k_r [P] (W = R + P). Absorbed, every
// head is an MQA head over the shared rows: score = (W_kb_h^T q_nope | q_r)
// . row, output W_vb_h (sum p row[0:R]). One call, decode rows first:
//   1. lat = W_kb_h^T q_nope for every (token, head): for passes of up to
//      MLA_ABSORB_TOK tokens k_mla_absorb_q (kv_b streamed at the memory's
//      rate), above a cuBLAS GEMM strided over heads ([T, N] x [N, R] per
//      head, fp32, no TF32);
//   2. k_mla_split: a block per (token, group of 32 heads, key split), or
//      of 8 heads for a pass of few tokens at short contexts (mla_hpw: 4x
//      the blocks where one group of 32 would leave a decode latency-bound
//      on a few SMs).
//      Every cached row of the split is read from memory once for the
//      group's heads (the old kernel, a block per (token, head), read it 32
//      times and walked the context one block per head: 32 blocks for a
//      decode);
//   3. k_mla_merge: the splits of each (token, head), as k_attn_merge;
//   4. out = W_vb_h lat: k_mla_absorb_v or the second strided GEMM, as 1.
// Decode rows always take this kernel, and so do prefill rows in the fp32
// mode (weight_dtype float32: the exactness gates): a prefill token is one
// tile of rows like a decode's, its context rows re-read once per query
// token from L2 (a 32k context is 38 MB of bf16 latents). A key is 1152
// bytes (bf16) and 32 x 1088 MACs: 60 FLOP a byte, so even decode is
// compute-bound on fp32 SIMT (docs/BENCHMARKS.md).
//
// In 16-bit mode prefill rows take the expanded form on tensor cores
// instead (vLLM's split; "prefill on tensor cores" below): K_nope and V per
// head from the cached latents by one GEMM, then cuda_flash.cu's kernel with
// K rows of N + P = 192 (the rope part k_r shared by the heads) and V rows
// of 128: per (query, key, head) (N + P) + V = 320 MACs on tensor cores
// against the absorbed W + R = 1,088 on SIMT, plus the expansion, (N + V) R
// MACs per (key, head), once per step. Shapes it does not run (N != 128,
// N + P != 192, V != 128) and contexts over MLA_FLASH_MAX_KEYS keep this
// kernel.
#include "backend/cuda/cuda_common.cuh"

template <typename T> __device__ __forceinline__ void store_f(T *dst, float v);
template <> __device__ __forceinline__ void store_f<float>(float *dst, float v) { *dst = v; }
template <> __device__ __forceinline__ void store_f<__nv_bfloat16>(__nv_bfloat16 *dst, float v) {
    *dst = __float2bfloat16(v);
}

template <typename T>
__global__ void k_mla_kv_write(T *cache, const float *lat, int ld, const int32_t *slot_mapping, int W) {
    pdl_wait();
    pdl_trigger();
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
        launch_pdl(k_mla_kv_write<__nv_bfloat16>, b->num_tokens, 128, 0, s, (__nv_bfloat16 *)cache, lat, ld,
                   (const int32_t *)b->slot_mapping, W);
    else launch_pdl(k_mla_kv_write<float>, b->num_tokens, 128, 0, s, (float *)cache, lat, ld,
                    (const int32_t *)b->slot_mapping, W);
}

#define MLA_THREADS 256
#define MLA_WARPS (MLA_THREADS / 32)
#define MLA_KC 32                            // keys a chunk: a lane each for the scores
#define MLA_RQ (CUDA_MLA_MAX_RANK / 128)     // float4 columns of the output a lane owns per row
#define MLA_KQ (MLA_KC * CUDA_MLA_MAX_W / 4 / MLA_THREADS) // float4 of a chunk a thread loads
#define MLA_QLD 8                            // q loads a thread keeps in flight while staging
#define MLA_MAX_SPLITS 256
#define MLA_PASS_ROWS 32768                  // (token, head) rows of one pass: its scratch
static_assert(CUDA_MLA_MAX_RANK % 128 == 0 && CUDA_MLA_MAX_W % 4 == 0, "MLA limits");

// A shared row of W floats, padded to 4 words past a multiple of 32: the
// lanes' 16-byte reads of eight different rows fall on different banks.
__host__ __device__ __forceinline__ int mla_pitch(int W) { return ((W + 31) & ~31) + 4; }

struct mla_args {
    float *lat;        // [T, H, R] rows (token - tok0, head): W_kb^T q_nope in, the attention's latent out
    float *part;       // [T, H, nsplit, R + 4] partial acc [R], m, l (nsplit > 1)
    const float *q;    // [T, H*(N+P)] q_nope | q_r per head
    int H, N, P, R, bs, mbps, nsplit, seq0, seq1, tok0;
    float scale;
    const int32_t *qsl, *ctx, *btab;
};

__device__ __forceinline__ int mla_cdiv(int a, int b) { return (a + b - 1) / b; }
// Keys per split of a context of n: a multiple of 32, so that the splits in
// use (those starting before n) are cdiv(n, range); the merge counts them so.
__device__ __forceinline__ int mla_range(int n, int nsplit) { return (mla_cdiv(n, nsplit) + 31) & ~31; }

// The sequence of token t in [seq0, seq1), and its context length: the keys
// it attends to are positions [0, n).
__device__ __forceinline__ int mla_seq(const mla_args &a, int t, int *n) {
    int lo = a.seq0, hi = a.seq1 - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (a.qsl[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    *n = a.ctx[lo] + (t - a.qsl[lo]) + 1;
    return lo;
}

// Four cache elements in one load, and as floats.
template <typename T> struct raw4;
template <> struct raw4<float> { typedef float4 t; };
template <> struct raw4<__nv_bfloat16> { typedef uint2 t; };
__device__ __forceinline__ float4 to_f4(float4 v) { return v; }
__device__ __forceinline__ float4 to_f4(uint2 u) {
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x), b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

// The chunk of keys [c0, c0 + MLA_KC) into registers (past j1: zeros), so
// that its loads are in flight while the chunk before is computed.
// W is a constant where the caller's WT is (its divisions by W / 4 then
// multiplications); blocks of 16 keys take shifts.
template <typename T>
__device__ __forceinline__ void mla_fetch(typename raw4<T>::t (&pre)[MLA_KQ], const T *cache, const int32_t *bt,
                                          int bs, int W, int c0, int j1) {
    int wq = W / 4, nq = MLA_KC * wq;
#pragma unroll
    for (int c = 0; c < MLA_KQ; c++) {
        int i = threadIdx.x + c * MLA_THREADS, j = c0 + i / wq;
        typename raw4<T>::t v = {};
        if (i < nq && j < j1) {
            int64_t slot = bs == 16 ? (int64_t)bt[j >> 4] * 16 + (j & 15) : (int64_t)bt[j / bs] * bs + j % bs;
            v = *(const typename raw4<T>::t *)(cache + slot * W + i % wq * 4);
        }
        pre[c] = v;
    }
}

// The q rows of a block's group into qs [MLA_WARPS * HPW][QP], scaled: per
// head lat [R] (W_kb^T q_nope) | q_r [P]; heads past the group zeros. Quads
// of 4 elements, MLA_QLD a thread loaded before any is stored (a load-store
// loop would wait one memory latency a quad). q_r as floats: q's rows of
// N + P need not be 16-byte aligned.
template <int HPW>
__device__ __forceinline__ void mla_stage_q(float *qs, const mla_args &a, int t, int h0, int nh, int W, int QP) {
    const int R = a.R, QW = a.N + a.P, wq = W / 4, nq = MLA_WARPS * HPW * wq;
    const float *lr = a.lat + ((int64_t)(t - a.tok0) * a.H + h0) * R, *qr = a.q + ((int64_t)t * a.H + h0) * QW + a.N;
    for (int i0 = threadIdx.x; i0 < nq; i0 += MLA_QLD * MLA_THREADS) {
        float4 v[MLA_QLD];
#pragma unroll
        for (int u = 0; u < MLA_QLD; u++) {
            int i = i0 + u * MLA_THREADS, r = i / wq, e = i % wq * 4;
            v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < nq && r < nh) {
                if (e < R) v[u] = *(const float4 *)(lr + (int64_t)r * R + e);
                else {
                    const float *p = qr + (int64_t)r * QW + e - R;
                    v[u] = make_float4(p[0], p[1], p[2], p[3]);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < MLA_QLD; u++) {
            int i = i0 + u * MLA_THREADS;
            if (i < nq)
                *(float4 *)(qs + i / wq * QP + i % wq * 4) =
                    make_float4(v[u].x * a.scale, v[u].y * a.scale, v[u].z * a.scale, v[u].w * a.scale);
        }
    }
}

// One block per (token, group of up to MLA_WARPS * HPW heads, split of the
// token's context); warp w owns the group's heads HPW w .. HPW w + HPW - 1
// from the scores to the output. HPW 4: groups of 32 heads, each cached row
// read once for 32 heads (many tokens); HPW 1: groups of 8, 4x the blocks
// (and splits) for a decode of few tokens, which one group of 32 leaves
// latency-bound on a few SMs (mla_hpw). The first chunk's cache loads are
// issued before the q rows are staged. Per chunk of 32 keys (staged in
// shared memory as fp32, the next chunk's loads in flight in registers):
//   scores: lane j takes key j for the warp's HPW heads (the q rows are
//     broadcast reads, the key rows 16-byte reads on distinct banks);
//   online softmax of each head across the warp (shuffles, no barrier);
//   acc[HPW heads][R] += p V: lane owns the float4 columns lane + 32 i, the
//     warp's p of key j through a shuffle.
// WT: W = R + P as a constant (Kimi-Linear's and DeepSeek's 576), or 0.
template <typename T, int WT, int HPW>
__global__ void __launch_bounds__(MLA_THREADS, 1) k_mla_split(mla_args a, const T *cache) {
    pdl_wait();
    pdl_trigger();
    extern __shared__ __align__(16) float msm[];
    constexpr int ROWS = MLA_WARPS * HPW;
    const int R = a.R, W = WT ? WT : R + a.P, QP = mla_pitch(W), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int t = a.tok0 + blockIdx.x, h0 = blockIdx.y * ROWS, nh = min(ROWS, a.H - h0), n;
    int s = mla_seq(a, t, &n), L = mla_range(n, a.nsplit), j0 = blockIdx.z * L, j1 = min(n, j0 + L);
    if (j0 >= j1) return; // a split past this token's context: the merge skips it
    float *qs = msm, *ks = qs + ROWS * QP;
    const int64_t row0 = (int64_t)(t - a.tok0) * a.H + h0;
    const int32_t *bt = a.btab + (int64_t)s * a.mbps;
    typename raw4<T>::t pre[MLA_KQ];
    mla_fetch<T>(pre, cache, bt, a.bs, W, j0, j1);
    mla_stage_q<HPW>(qs, a, t, h0, nh, W, QP);
    float m[HPW], l[HPW], acc[HPW][MLA_RQ][4];
#pragma unroll
    for (int r = 0; r < HPW; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < MLA_RQ; i++) acc[r][i][0] = acc[r][i][1] = acc[r][i][2] = acc[r][i][3] = 0.0f;
    }
    const bool busy = warp * HPW < nh; // the warp has heads of the group
    const float *qw = qs + warp * HPW * QP;
    for (int c0 = j0; c0 < j1; c0 += MLA_KC) {
        __syncthreads(); // the chunk before is read (and, the first time, the q rows are written)
        int wq = W / 4;
#pragma unroll
        for (int c = 0; c < MLA_KQ; c++) {
            int i = tid + c * MLA_THREADS;
            if (i < MLA_KC * wq) *(float4 *)(ks + i / wq * QP + i % wq * 4) = to_f4(pre[c]);
        }
        __syncthreads();
        if (c0 + MLA_KC < j1) mla_fetch<T>(pre, cache, bt, a.bs, W, c0 + MLA_KC, j1);
        if (!busy) continue;
        float sc[HPW];
#pragma unroll
        for (int r = 0; r < HPW; r++) sc[r] = 0.0f;
        const float *kr = ks + lane * QP;
#pragma unroll 4
        for (int e = 0; e < W; e += 4) {
            float4 k = *(const float4 *)(kr + e);
#pragma unroll
            for (int r = 0; r < HPW; r++) {
                float4 qv = *(const float4 *)(qw + r * QP + e);
                sc[r] += qv.x * k.x + qv.y * k.y + qv.z * k.z + qv.w * k.w;
            }
        }
        bool valid = c0 + lane < j1;
#pragma unroll
        for (int r = 0; r < HPW; r++) { // every chunk has a valid key: m is finite from the first on
            float x = valid ? sc[r] : -INFINITY, mx = x;
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mn = fmaxf(m[r], mx), corr = expf(m[r] - mn), p = expf(x - mn);
            l[r] = l[r] * corr + warp_sum(p);
            m[r] = mn, sc[r] = p;
#pragma unroll
            for (int i = 0; i < MLA_RQ; i++)
                acc[r][i][0] *= corr, acc[r][i][1] *= corr, acc[r][i][2] *= corr, acc[r][i][3] *= corr;
        }
        int nk = min(MLA_KC, j1 - c0);
        for (int j = 0; j < nk; j++) {
            float p[HPW];
#pragma unroll
            for (int r = 0; r < HPW; r++) p[r] = __shfl_sync(0xffffffffu, sc[r], j);
            const float *vr = ks + j * QP;
#pragma unroll
            for (int i = 0; i < MLA_RQ; i++) {
                int col = 4 * (lane + 32 * i);
                if (col >= R) break;
                float4 v = *(const float4 *)(vr + col);
#pragma unroll
                for (int r = 0; r < HPW; r++)
                    acc[r][i][0] += p[r] * v.x, acc[r][i][1] += p[r] * v.y, acc[r][i][2] += p[r] * v.z,
                        acc[r][i][3] += p[r] * v.w;
            }
        }
    }
    if (!busy) return;
#pragma unroll
    for (int r = 0; r < HPW; r++) {
        int hr = warp * HPW + r;
        if (hr >= nh) break;
        int64_t row = row0 + hr;
        float inv = a.nsplit == 1 ? 1.0f / l[r] : 1.0f;
        float *o = a.nsplit == 1 ? a.lat + row * R : a.part + (row * a.nsplit + blockIdx.z) * (R + 4);
#pragma unroll
        for (int i = 0; i < MLA_RQ; i++) {
            int col = 4 * (lane + 32 * i);
            if (col >= R) break;
            *(float4 *)(o + col) = make_float4(acc[r][i][0] * inv, acc[r][i][1] * inv, acc[r][i][2] * inv,
                                               acc[r][i][3] * inv);
        }
        if (a.nsplit > 1 && lane == 0) o[R] = m[r], o[R + 1] = l[r];
    }
}

// The splits of one (token, head), each weighed by exp(m_i - max m), into
// its lat row. Only the splits that hold keys of the token's context.
__global__ void k_mla_merge(mla_args a) {
    pdl_wait();
    pdl_trigger();
    __shared__ float wt[MLA_MAX_SPLITS + 1];
    int t = a.tok0 + blockIdx.x, h = blockIdx.y, n, R = a.R, PS = R + 4;
    mla_seq(a, t, &n);
    int ns = min(a.nsplit, mla_cdiv(n, mla_range(n, a.nsplit)));
    int64_t row = (int64_t)(t - a.tok0) * a.H + h;
    const float *pp = a.part + row * a.nsplit * PS;
    if (threadIdx.x < 32) {
        int lane = threadIdx.x;
        float mx = -INFINITY, l = 0.0f;
        for (int i = lane; i < ns; i += 32) mx = fmaxf(mx, pp[i * PS + R]);
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        for (int i = lane; i < ns; i += 32) {
            float w = expf(pp[i * PS + R] - mx);
            wt[i] = w, l += w * pp[i * PS + R + 1];
        }
        l = warp_sum(l);
        if (lane == 0) wt[MLA_MAX_SPLITS] = 1.0f / l;
    }
    __syncthreads();
    float inv = wt[MLA_MAX_SPLITS];
    for (int e = threadIdx.x * 4; e < R; e += blockDim.x * 4) {
        float4 o = make_float4(0, 0, 0, 0);
        for (int i = 0; i < ns; i++) {
            float4 v = *(const float4 *)(pp + i * PS + e);
            float w = wt[i];
            o.x += w * v.x, o.y += w * v.y, o.z += w * v.z, o.w += w * v.w;
        }
        *(float4 *)(a.lat + row * R + e) = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
    }
}

// ---- the absorbs of a pass of few tokens ----
//
// At a decode of 1 to MLA_ABSORB_TOK tokens the absorbs are weight reads:
// kv_b in fp32 (the model loads it so in every mode: layers_kimi.c), H (N +
// V) R floats, 16.8 MB at 48B's shapes, read once a pass. The kernels below
// read it at the memory's rate: every thread's weight loads (16 bytes each)
// issued before the dependency wait, as the GEMVs' (they are weights), fp32
// accumulation, sums in a fixed order. cuBLAS's strided GEMMs take larger
// passes. TT: the most tokens a kernel is built for (1, 4 or 16), ntok <= TT.
#define MLA_ABSORB_TOK 16 // tokens of a pass up to which the absorbs take the kernels below
#define MLA_AB_LD 16      // k_mla_absorb_q: weight float4 a thread keeps in flight
#define MLA_AB_ROWS 4     // k_mla_absorb_v: V rows a warp

// One warp's weight rows n = n0 + MLA_WARPS u of W_kb_h at its 4 columns.
__device__ __forceinline__ void mla_ab_load(float4 (&w)[MLA_AB_LD], const float *wk, int R, int N, int n0, bool on) {
#pragma unroll
    for (int u = 0; u < MLA_AB_LD; u++) {
        int n = n0 + u * MLA_WARPS;
        w[u] = on && n < N ? __ldg((const float4 *)(wk + (int64_t)n * R)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// lat [ntok, H, R] = per head q_nope_h [ntok, N] W_kb_h [N, R], W_kb_h the
// first N of head h's N + V kv_b rows ([N, R] row-major); q [ntok, H*(N+P)].
// Block (head, 128 columns of R): a lane owns 4 columns, warp w the rows n
// = w + 8u (its weight rows coalesced 512-byte reads), q_nope of the tokens
// in shared memory; the 8 warps' partial sums added in warp order.
// Shared: red [MLA_WARPS][TT][128], then qn [ntok][N].
template <int TT>
__global__ void __launch_bounds__(MLA_THREADS) k_mla_absorb_q(float *lat, const float *q, const float *kv_b, int ntok,
                                                             int H, int N, int P, int V, int R) {
    extern __shared__ __align__(16) float abs_q[];
    float *red = abs_q, *qn = abs_q + MLA_WARPS * TT * 128;
    const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, col = blockIdx.y * 128 + lane * 4;
    const float *wk = kv_b + (int64_t)h * (N + V) * R + col;
    float4 w[MLA_AB_LD];
    mla_ab_load(w, wk, R, N, warp, col < R);
    pdl_wait();
    pdl_trigger();
    const int nq = ntok * N, QW = N + P;
    for (int i0 = tid; i0 < nq; i0 += MLA_QLD * MLA_THREADS) {
        float v[MLA_QLD];
#pragma unroll
        for (int u = 0; u < MLA_QLD; u++) {
            int i = i0 + u * MLA_THREADS;
            v[u] = i < nq ? q[((int64_t)(i / N) * H + h) * QW + i % N] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < MLA_QLD; u++)
            if (i0 + u * MLA_THREADS < nq) qn[i0 + u * MLA_THREADS] = v[u];
    }
    __syncthreads();
    float acc[TT][4];
#pragma unroll
    for (int t = 0; t < TT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    for (int n0 = warp; n0 < N; n0 += MLA_AB_LD * MLA_WARPS) {
        if (n0 != warp) mla_ab_load(w, wk, R, N, n0, col < R);
#pragma unroll
        for (int u = 0; u < MLA_AB_LD; u++) {
            int n = n0 + u * MLA_WARPS;
            if (n >= N) break;
#pragma unroll
            for (int t = 0; t < TT; t++) {
                if (t >= ntok) break;
                float x = qn[t * N + n];
                acc[t][0] += x * w[u].x, acc[t][1] += x * w[u].y, acc[t][2] += x * w[u].z, acc[t][3] += x * w[u].w;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TT; t++)
        *(float4 *)(red + (warp * TT + t) * 128 + lane * 4) = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    __syncthreads();
    for (int i = tid; i < ntok * 128; i += MLA_THREADS) {
        int t = i / 128, cc = blockIdx.y * 128 + i % 128;
        if (cc >= R) continue;
        float sum = 0.0f;
        for (int u = 0; u < MLA_WARPS; u++) sum += red[(u * TT + t) * 128 + i % 128];
        lat[((int64_t)t * H + h) * R + cc] = sum;
    }
}

// out [ntok, H*V] = per head lat_h [ntok, R] W_vb_h^T, W_vb_h [V, R] the last
// V of head h's kv_b rows; lat [ntok, H, R]. Block (head, 32 rows of V):
// warp w the rows 4w .. 4w + 3, a lane the float4 columns lane + 32k of each
// (MLA_AB_ROWS x MLA_RQ loads a thread in flight), the tokens' lat rows of
// the head in shared memory (ls [ntok][R]), each dot product a warp sum.
template <int TT>
__global__ void __launch_bounds__(MLA_THREADS) k_mla_absorb_v(float *out, const float *lat, const float *kv_b, int ntok,
                                                             int H, int N, int V, int R) {
    extern __shared__ __align__(16) float ls[];
    const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int v0 = (blockIdx.y * MLA_WARPS + warp) * MLA_AB_ROWS;
    const float *wv = kv_b + ((int64_t)h * (N + V) + N) * R;
    float4 w[MLA_AB_ROWS][MLA_RQ];
#pragma unroll
    for (int r = 0; r < MLA_AB_ROWS; r++)
#pragma unroll
        for (int k = 0; k < MLA_RQ; k++) {
            int c = 4 * (lane + 32 * k);
            w[r][k] = v0 + r < V && c < R ? __ldg((const float4 *)(wv + (int64_t)(v0 + r) * R + c))
                                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    pdl_wait();
    pdl_trigger();
    const int rq = R / 4, nq = ntok * rq;
    for (int i0 = tid; i0 < nq; i0 += MLA_QLD * MLA_THREADS) {
        float4 x[MLA_QLD];
#pragma unroll
        for (int u = 0; u < MLA_QLD; u++) {
            int i = i0 + u * MLA_THREADS;
            x[u] = i < nq ? *(const float4 *)(lat + ((int64_t)(i / rq) * H + h) * R + i % rq * 4)
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < MLA_QLD; u++)
            if (i0 + u * MLA_THREADS < nq) *(float4 *)(ls + (i0 + u * MLA_THREADS) * 4) = x[u];
    }
    __syncthreads();
    float acc[MLA_AB_ROWS][TT];
#pragma unroll
    for (int r = 0; r < MLA_AB_ROWS; r++)
#pragma unroll
        for (int t = 0; t < TT; t++) acc[r][t] = 0.0f;
#pragma unroll
    for (int k = 0; k < MLA_RQ; k++) {
        int c = 4 * (lane + 32 * k);
        if (c >= R) break;
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t >= ntok) break;
            float4 x = *(const float4 *)(ls + t * R + c);
#pragma unroll
            for (int r = 0; r < MLA_AB_ROWS; r++)
                acc[r][t] += w[r][k].x * x.x + w[r][k].y * x.y + w[r][k].z * x.z + w[r][k].w * x.w;
        }
    }
#pragma unroll
    for (int r = 0; r < MLA_AB_ROWS; r++)
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t >= ntok) break;
            float sum = warp_sum(acc[r][t]);
            if (lane == (r * TT + t) % 32 && v0 + r < V) out[((int64_t)t * H + h) * V + v0 + r] = sum;
        }
}

// Tokens the absorb kernels are built for, for a pass of ntok (<= MLA_ABSORB_TOK).
static int mla_absorb_tt(int ntok) { return ntok <= 1 ? 1 : ntok <= 4 ? 4 : 16; }
static size_t mla_absorb_q_smem(int tt, int N) { return sizeof(float) * ((size_t)MLA_WARPS * tt * 128 + (size_t)tt * N); }
// 1 when a pass of ntok tokens takes the kernels above (else cuBLAS).
static int mla_absorb_own(struct backend *be, int ntok, const struct mla_dims *d) {
    return ntok <= MLA_ABSORB_TOK && mla_absorb_q_smem(mla_absorb_tt(ntok), d->nope) <= cu(be)->smem_optin;
}

template <int TT>
static void mla_absorb_launch(struct backend *be, int q_side, float *dst, const float *src, const float *kv_b, int ntok,
                              const struct mla_dims *d) {
    cudaStream_t s = cu(be)->stream;
    int H = d->heads, N = d->nope, V = d->v_dim, R = d->rank;
    if (q_side) {
        size_t sm = mla_absorb_q_smem(TT, N);
        CUDA_CHECK(cudaFuncSetAttribute(k_mla_absorb_q<TT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        launch_pdl(k_mla_absorb_q<TT>, dim3(H, cdiv(R, 128)), MLA_THREADS, sm, s, dst, src, kv_b, ntok, H, N, d->rope,
                   V, R);
    } else
        launch_pdl(k_mla_absorb_v<TT>, dim3(H, cdiv(V, MLA_WARPS * MLA_AB_ROWS)), MLA_THREADS,
                   sizeof(float) * (size_t)ntok * R, s, dst, src, kv_b, ntok, H, N, V, R);
}

// q_side 1: lat [ntok, H, R] from q [ntok, H*(N+P)]; 0: out [ntok, H*V] from lat.
static void mla_absorb(struct backend *be, int q_side, float *dst, const float *src, const float *kv_b, int ntok,
                       const struct mla_dims *d) {
    switch (mla_absorb_tt(ntok)) {
    case 1: mla_absorb_launch<1>(be, q_side, dst, src, kv_b, ntok, d); break;
    case 4: mla_absorb_launch<4>(be, q_side, dst, src, kv_b, ntok, d); break;
    default: mla_absorb_launch<16>(be, q_side, dst, src, kv_b, ntok, d); break;
    }
}

// ---- the split kernel's launch ----

// Shared bytes of k_mla_split: the group's q rows and a chunk of keys.
static size_t mla_smem(int hpw, int W) { return sizeof(float) * (size_t)(MLA_WARPS * hpw + MLA_KC) * mla_pitch(W); }
size_t cuda_mla_smem(const struct mla_dims *d) { return mla_smem(4, d->rank + d->rope); } // the larger (HPW 4)


// Splits of a context of up to maxlen keys for `tiles` blocks: at most one
// wave of blocks (a block fills an SM: 256 threads of ~250 registers, 145 KB
// of shared memory; 64 sequences take 2 splits, 128 blocks on 132 SMs, not
// 3 in 1.5 waves), at least 32 keys a split, at most MLA_MAX_SPLITS.
static int mla_splits(struct backend *be, int tiles, int maxlen) {
    int ns = cu(be)->num_sms / tiles;
    ns = MIN(ns, MLA_MAX_SPLITS);
    ns = MIN(ns, cdiv(maxlen, 32));
    return MAX(ns, 1);
}

// Heads a warp of k_mla_split for a pass of ntok tokens over contexts of up
// to maxlen keys: 1 (groups of 8 heads, each key read once a group) where
// groups of 32, split as far as maxlen allows, fill under half the SMs (a
// decode of few sequences at a short context: one group of 32 heads x 32
// splits is latency-bound), else 4 (each key read once for 32 heads). At
// one sequence of Kimi-Linear-48B on the H100, `cuda_mla step`: context
// 1,024, HPW 1, 47.99 -> 28.98 us a step; at 8,192 HPW 1 took 95.71 us
// against HPW 4's 78.87 (4 reads of each key), so HPW 4 stays there.
static int mla_hpw(struct backend *be, int ntok, int H, int maxlen) {
    int g4 = cdiv(H, 32);
    return (int64_t)ntok * g4 * mla_splits(be, ntok * g4, maxlen) * 2 <= cu(be)->num_sms ? 1 : 4;
}

template <typename T, int WT, int HPW>
static void mla_launch(const mla_args &a, dim3 grid, cudaStream_t s, const void *cache) {
    size_t sm = mla_smem(HPW, a.R + a.P);
    CUDA_CHECK(cudaFuncSetAttribute(k_mla_split<T, WT, HPW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    launch_pdl(k_mla_split<T, WT, HPW>, grid, MLA_THREADS, sm, s, a, (const T *)cache);
}
template <typename T, int WT>
static void mla_launch_hpw(const mla_args &a, int hpw, dim3 grid, cudaStream_t s, const void *cache) {
    if (hpw == 1) mla_launch<T, WT, 1>(a, grid, s, cache);
    else mla_launch<T, WT, 4>(a, grid, s, cache);
}

static size_t mla_part_offset(size_t rows, int R) { return (rows * R * sizeof(float) + 255) & ~(size_t)255; }

// One pass: tokens [ta, tb) of sequences [seq0, seq1), splits for contexts
// of up to maxlen.
static void mla_pass(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                     const struct batch *b, int seq0, int seq1, int ta, int tb, int maxlen, const struct mla_dims *d) {
    cuda_impl *c = cu(be);
    int H = d->heads, N = d->nope, P = d->rope, V = d->v_dim, R = d->rank, ntok = tb - ta;
    int hpw = mla_hpw(be, ntok, H, maxlen), groups = cdiv(H, MLA_WARPS * hpw), own = mla_absorb_own(be, ntok, d);
    int nsplit = mla_splits(be, ntok * groups, maxlen);
    size_t rows = (size_t)ntok * H, off = mla_part_offset(rows, R);
    char *scr = (char *)cuda_scratch(be, off + (nsplit > 1 ? rows * nsplit * (R + 4) * sizeof(float) : 0));
    mla_args a = {(float *)scr, (float *)(scr + off), q, H, N, P, R, d->block_size, b->max_blocks_per_seq, nsplit,
                  seq0, seq1, ta, d->scale, b->query_start_loc, b->context_lens, b->block_tables};
    const float one = 1.0f, zero = 0.0f, *qt = q + (int64_t)ta * H * (N + P);
    float *ot = out + (int64_t)ta * H * V;
    long long per = (long long)(N + V) * R; // one head's kv_b rows
    // lat_h [ntok, R] = q_nope_h [ntok, N] W_kb_h [N, R] (column-major: R x ntok)
    if (own) mla_absorb(be, 1, a.lat, qt, kv_b, ntok, d);
    else CUBLAS_CHECK(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, R, ntok, N, &one, kv_b, CUDA_R_32F,
                                                 R, per, qt, CUDA_R_32F, H * (N + P), N + P, &zero, a.lat, CUDA_R_32F,
                                                 H * R, R, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    dim3 grid(ntok, groups, nsplit);
    if (be->kv_dtype == DT_BF16) {
        if (R + P == 576) mla_launch_hpw<__nv_bfloat16, 576>(a, hpw, grid, c->stream, cache);
        else mla_launch_hpw<__nv_bfloat16, 0>(a, hpw, grid, c->stream, cache);
    } else {
        if (R + P == 576) mla_launch_hpw<float, 576>(a, hpw, grid, c->stream, cache);
        else mla_launch_hpw<float, 0>(a, hpw, grid, c->stream, cache);
    }
    if (nsplit > 1) launch_pdl(k_mla_merge, dim3(ntok, H), 128, 0, c->stream, a);
    // out_h [ntok, V] = lat_h [ntok, R] W_vb_h^T (column-major: V x ntok)
    if (own) mla_absorb(be, 0, ot, a.lat, kv_b, ntok, d);
    else CUBLAS_CHECK(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, V, ntok, R, &one,
                                                 kv_b + (int64_t)N * R, CUDA_R_32F, R, per, a.lat, CUDA_R_32F, H * R, R,
                                                 &zero, ot, CUDA_R_32F, H * V, V, H, CUBLAS_COMPUTE_32F,
                                                 CUBLAS_GEMM_DEFAULT));
}

// Prefill tokens of sequences [p0, p1) on k_mla_split, in passes of at most
// MLA_PASS_ROWS (token, head) rows.
static void mla_prefill_split(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                              const struct batch *b, int p0, int p1, const struct mla_dims *d) {
    int pass = MAX(1, MLA_PASS_ROWS / d->heads), maxlen = 0;
    int ta = b->h_query_start_loc[p0], te = b->h_query_start_loc[p1];
    for (int s = p0; s < p1; s++) maxlen = MAX(maxlen, b->h_seq_lens[s]);
    for (int t = ta; t < te; t += pass) mla_pass(be, out, q, cache, kv_b, b, p0, p1, t, MIN(te, t + pass), maxlen, d);
}

// ---- prefill on tensor cores: K_nope, V expanded per head, flash ----
//
// In 16-bit mode (not the fp32 mode of the exactness gates) a prefill
// sequence's context is expanded as vLLM does: per (query, key, head) the
// absorbed form costs W + R = 1,088 MACs at 48B's shapes, the expanded one
// (N + P) + V = 320 on tensor cores. For a group of prefill sequences, one
// after another (their contexts back to back, at most what the scratch holds):
//   1. k_mla_gather: every cached latent of their contexts (this step's
//      included) -> lat16 [keys, W] bf16, contiguous;
//   2. kv16 [keys, H*(N+V)] = lat16[:, :R] kv_b^T: one cuBLAS GEMM (bf16 in,
//      fp32 accumulation, bf16 out; kv_b rounded to bf16 first, once per
//      call): per head K_nope_h | V_h;
//   3. cuda_flash_mla: the flash kernel of cuda_flash.cu with K rows of 192
//      (K_nope_h | k_r, the rope part read from lat16: shared by the heads)
//      and V rows of 128, causal from each sequence's context_lens, out
//      [T, H*V] as the op's contract.
// The whole context is expanded at every step (a chunked prefill's later
// chunks too): its cost, keys x H(N+V) x R, is 1/(query tokens x 320 / (R x
// 256)) of the attention's, under 2% of it for a chunk of 8,192 tokens, and
// the flash kernel stays the one of cuda_flash.cu (streaming key tiles
// through the expansion would need a state carried across key chunks).
// Scratch: kvb16, then lat16 and kv16 for MLA_FLASH_MAX_KEYS keys at most
// (W + H(N+V) bf16 a key: 17.5 KB at 48B's shapes, 1.15 GB for 64k keys); a
// sequence whose context is longer takes k_mla_split (slow, but exact).
#define MLA_FLASH_MAX_KEYS (1 << 16)
#define MLA_GATHER_ROWS 16 // latent rows a gather block copies

static size_t mla_align(size_t n) { return (n + 255) & ~(size_t)255; }
static size_t mla_flash_kvb(const struct mla_dims *d) {
    return mla_align((size_t)d->heads * (d->nope + d->v_dim) * d->rank * 2);
}
static size_t mla_flash_lat(const struct mla_dims *d, int keys) {
    return mla_align((size_t)keys * (d->rank + d->rope) * 2);
}
// Bytes of the flash path for groups of up to `keys` keys.
static size_t mla_flash_bytes(const struct mla_dims *d, int keys) {
    return mla_flash_kvb(d) + mla_flash_lat(d, keys) + (size_t)keys * d->heads * (d->nope + d->v_dim) * 2;
}

// The latents of sequences [seq0, seq0 + gridDim.y) (keys [0, seq_lens[s])
// each) back to back from row 0 of dst [keys, W] bf16: block (x, y) copies
// rows [16x, 16x + 16) of sequence seq0 + y, four elements a thread a step.
template <typename T>
__global__ void k_mla_gather(__nv_bfloat16 *dst, const T *cache, const int32_t *seq_lens, const int32_t *btab,
                             int mbps, int bs, int W, int seq0) {
    pdl_wait();
    pdl_trigger();
    int s = seq0 + blockIdx.y, n = seq_lens[s], wq = W / 4;
    int64_t row0 = 0;
    for (int u = seq0; u < s; u++) row0 += seq_lens[u];
    const int32_t *bt = btab + (int64_t)s * mbps;
    for (int i = threadIdx.x; i < MLA_GATHER_ROWS * wq; i += blockDim.x) {
        int j = blockIdx.x * MLA_GATHER_ROWS + i / wq, e = i % wq * 4;
        if (j >= n) break; // i only grows
        int64_t slot = (int64_t)bt[j / bs] * bs + j % bs;
        float4 v = to_f4(*(const typename raw4<T>::t *)(cache + slot * W + e));
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 u;
        u.x = *(const uint32_t *)&lo, u.y = *(const uint32_t *)&hi;
        *(uint2 *)(dst + (row0 + j) * W + e) = u;
    }
}

// 1 when this batch's prefills take the flash path.
static int mla_flash_on(const struct backend *be, const struct batch *b, const struct mla_dims *d) {
    return be->weight_dtype != WF_F32 && !b->fixed_shapes && cuda_flash_mla_shape(d);
}

// The group of prefill sequences starting at s: [s, end) with contexts of
// at most MLA_FLASH_MAX_KEYS each and `cap` keys together (one sequence
// even when over cap); its keys in *keys. Longer contexts are skipped (the
// caller runs them on k_mla_split): a group never holds one.
static int mla_group(const struct batch *b, int s, int p1, int cap, int *keys) {
    while (s < p1 && b->h_seq_lens[s] > MLA_FLASH_MAX_KEYS) s++;
    int e = s, n = 0;
    while (e < p1 && b->h_seq_lens[e] <= MLA_FLASH_MAX_KEYS && (e == s || n + b->h_seq_lens[e] <= cap))
        n += b->h_seq_lens[e++];
    *keys = n;
    return e;
}

static void mla_prefill_flash(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                              const struct batch *b, int p0, int p1, const struct mla_dims *d) {
    cuda_impl *c = cu(be);
    int H = d->heads, R = d->rank, W = R + d->rope, M = H * (d->nope + d->v_dim);
    for (int s = p0; s < p1; s++) // contexts too long to expand (their outputs are rows of their own)
        if (b->h_seq_lens[s] > MLA_FLASH_MAX_KEYS) mla_prefill_split(be, out, q, cache, kv_b, b, s, s + 1, d);
    // groups as large as the scratch reserved at load holds (a lone longer
    // sequence grows it: only where supports() was not asked, as in tests)
    size_t have = c->scratch_bytes, per = (size_t)W * 2 + (size_t)M * 2, fixed = mla_flash_kvb(d) + 256;
    int cap = have > fixed ? (int)MIN((have - fixed) / per, (size_t)MLA_FLASH_MAX_KEYS) : 0, most = 0, keys;
    for (int s = p0, e; s < p1; s = e) {
        e = mla_group(b, s, p1, cap, &keys);
        most = MAX(most, keys);
    }
    if (!most) return;
    char *scr = (char *)cuda_scratch(be, mla_flash_bytes(d, most));
    __nv_bfloat16 *kvb16 = (__nv_bfloat16 *)scr, *lat16 = (__nv_bfloat16 *)(scr + mla_flash_kvb(d));
    __nv_bfloat16 *kv16 = (__nv_bfloat16 *)(scr + mla_flash_kvb(d) + mla_flash_lat(d, most));
    int64_t nb = (int64_t)M * R;
    launch_pdl(k_to_16<__nv_bfloat16>, to16_grid(nb), 256, 0, c->stream, kvb16, kv_b, nb);
    const float one = 1.0f, zero = 0.0f;
    for (int s = p0, e; s < p1; s = e) {
        e = mla_group(b, s, p1, cap, &keys);
        if (!keys) continue;
        while (b->h_seq_lens[s] > MLA_FLASH_MAX_KEYS) s++; // the group's first sequence
        int maxlen = 0;
        for (int u = s; u < e; u++) maxlen = MAX(maxlen, b->h_seq_lens[u]);
        dim3 grid(cdiv(maxlen, MLA_GATHER_ROWS), e - s);
        if (be->kv_dtype == DT_BF16)
            launch_pdl(k_mla_gather<__nv_bfloat16>, grid, 128, 0, c->stream, lat16, (const __nv_bfloat16 *)cache,
                       (const int32_t *)b->seq_lens, (const int32_t *)b->block_tables, b->max_blocks_per_seq,
                       d->block_size, W, s);
        else launch_pdl(k_mla_gather<float>, grid, 128, 0, c->stream, lat16, (const float *)cache,
                        (const int32_t *)b->seq_lens, (const int32_t *)b->block_tables, b->max_blocks_per_seq,
                        d->block_size, W, s);
        // kv16 [keys, M] = lat16[:, :R] [keys, R] kvb16^T (column-major: M x keys = kvb16^T (R x M)^T lat16^T)
        CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, M, keys, R, &one, kvb16, CUDA_R_16BF, R, lat16,
                                  CUDA_R_16BF, W, &zero, kv16, CUDA_R_16BF, M, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
        cuda_flash_mla(be, out, q, kv16, lat16, b, s, e, d);
    }
}

// Scratch bytes of mla_attn over steps of up to max_tokens rows and
// contexts of up to max_seq_len: the split kernel's pass (lat [rows, R],
// then the partials: tiles * nsplit <= num_sms when nsplit > 1, a tile of
// at most 32 rows; 64 for margin), and in 16-bit
// mode the flash path's for the longest context plus a step's tokens (so
// that short prompts share a group with it), up to MLA_FLASH_MAX_KEYS keys.
size_t cuda_mla_scratch(struct backend *be, const struct mla_dims *d, int max_tokens, int max_seq_len) {
    size_t rows = (size_t)MIN(max_tokens, MAX(1, MLA_PASS_ROWS / d->heads)) * d->heads;
    size_t split = mla_part_offset(rows, d->rank) + (size_t)64 * cu(be)->num_sms * (d->rank + 4) * sizeof(float);
    if (be->weight_dtype == WF_F32 || !cuda_flash_mla_shape(d)) return split;
    int keys = (int)MIN((int64_t)max_seq_len + max_tokens, (int64_t)MLA_FLASH_MAX_KEYS);
    return MAX(split, mla_flash_bytes(d, keys) + 256);
}

// Decode rows (one token each, first in the batch) and prefill rows in
// passes of at most MLA_PASS_ROWS (token, head) rows; in 16-bit mode the
// prefills on tensor cores (above). The decodes' passes
// and splits come from the batch's shape alone when it is recorded into a
// graph (splits for max_model_len; each sequence cuts its own context on the
// device), as cuda_attn_decode's.
void cuda_mla_attn(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                   const struct batch *b, int seq0, int seq1, const struct mla_dims *d) {
    int pass = MAX(1, MLA_PASS_ROWS / d->heads), nd = MIN(b->num_decodes, seq1);
    if (seq0 < nd) { // decodes: token s of sequence s
        int maxlen = b->max_model_len;
        if (!b->fixed_shapes) {
            maxlen = 0;
            for (int s = seq0; s < nd; s++) maxlen = MAX(maxlen, b->h_seq_lens[s]);
        }
        for (int t = seq0; t < nd; t += pass)
            mla_pass(be, out, q, cache, kv_b, b, seq0, nd, t, MIN(nd, t + pass), maxlen, d);
    }
    int p0 = MAX(seq0, nd);
    if (p0 >= seq1) return;
    if (mla_flash_on(be, b, d)) mla_prefill_flash(be, out, q, cache, kv_b, b, p0, seq1, d);
    else mla_prefill_split(be, out, q, cache, kv_b, b, p0, seq1, d);
}
