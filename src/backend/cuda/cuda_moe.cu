// cuda_moe.cu - MoE experts on the GPU (the routers are in cuda_route.cu):
// tokens permuted by expert, per-expert up / activation (gated or not) /
// down over each expert's token segment, and the weighted combine in expert
// order (the order of the CPU reference).
#include <cuda_fp8.h>

#include <type_traits>

#include "backend/cuda/cuda_qmma.cuh"

#define MAX_EXPERTS CUDA_MAX_EXPERTS

// Counting sort of the n*k assignments by expert (one block): offsets
// [E+1], perm[r] = assignment (t*k + j) at row r of its expert's segment,
// slot_of the inverse; and
// mtile_off [E+1], the prefix of each expert's ceil(count / bm) row tiles
// (the grouped GEMM's schedule). Rows within a segment come in any order:
// every row is computed on its own, and tokens combine by expert order.
__global__ void k_moe_sort(const int32_t *ids, int nk, int E, int bm, int32_t *offsets, int32_t *mtile_off,
                           int32_t *perm, int32_t *slot_of) {
    pdl_wait();
    pdl_trigger();
    __shared__ int cnt[MAX_EXPERTS + 1], fill[MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0, fill[e] = 0;
    __syncthreads();
    for (int a = threadIdx.x; a < nk; a += blockDim.x) atomicAdd(&cnt[ids[a]], 1);
    __syncthreads();
    if (threadIdx.x < 32) { // warp 0 scans: lane l owns experts [l * per, (l + 1) * per)
        int lane = threadIdx.x, per = (E + 31) / 32, e0 = min(E, lane * per), e1 = min(E, e0 + per);
        int run = 0, tiles = 0;
        for (int e = e0; e < e1; e++) run += cnt[e], tiles += (cnt[e] + bm - 1) / bm;
        int r_in = run, t_in = tiles; // inclusive prefix over the lanes
        for (int o = 1; o < 32; o <<= 1) {
            int r2 = __shfl_up_sync(0xffffffffu, r_in, o), t2 = __shfl_up_sync(0xffffffffu, t_in, o);
            if (lane >= o) r_in += r2, t_in += t2;
        }
        run = r_in - run, tiles = t_in - tiles; // exclusive
        for (int e = e0; e < e1; e++) {
            offsets[e] = run, mtile_off[e] = tiles;
            run += cnt[e], tiles += (cnt[e] + bm - 1) / bm;
        }
        if (lane == 31) offsets[E] = r_in, mtile_off[E] = t_in;
    }
    __syncthreads();
    for (int a = threadIdx.x; a < nk; a += blockDim.x) {
        int e = ids[a], r = offsets[e] + atomicAdd(&fill[e], 1);
        perm[r] = a, slot_of[a] = r;
    }
}

__device__ __forceinline__ void load8(const __nv_bfloat16 *p, float f[8]) {
    uint4 u = __ldg((const uint4 *)p);
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void load8(const __half *p, float f[8]) {
    uint4 u = __ldg((const uint4 *)p);
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __half22float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void load8(const float *p, float f[8]) {
    float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

#define MOE_NB 8 // segment rows that share one pass over a weight row

// out[r, row] = W_e[wrow0 + row] . in[src(r)] for the rows r of expert e's
// segment (GATHER: src(r) is the assignment's token, else r itself), out
// rows ldo floats apart. Each warp owns weight rows and streams each once
// per MOE_NB segment rows: VEC, 8 values per lane per load (cols % 8 == 0),
// else one value a lane a step (any width).
template <typename WT, bool GATHER, bool VEC>
__global__ void __launch_bounds__(256) k_moe_mm(const WT *w, const float *in, float *out, const int32_t *offsets,
                                                const int32_t *perm, int k, int wrows, int wrow0, int rows, int ldo,
                                                int cols, int rows_per_block) {
    int e = blockIdx.x, r0 = offsets[e], cnt = offsets[e + 1] - r0;
    if (cnt == 0) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int rbeg = blockIdx.y * rows_per_block, rend = min(rows, rbeg + rows_per_block);
    for (int row = rbeg + warp; row < rend; row += nw) {
        const WT *wr = w + ((int64_t)e * wrows + wrow0 + row) * cols;
        for (int rb = r0; rb < r0 + cnt; rb += MOE_NB) {
            int nb = min(MOE_NB, r0 + cnt - rb);
            const float *src[MOE_NB];
            float acc[MOE_NB];
#pragma unroll
            for (int b = 0; b < MOE_NB; b++) {
                int r = rb + (b < nb ? b : 0);
                src[b] = GATHER ? in + (int64_t)(perm[r] / k) * cols : in + (int64_t)r * cols;
                acc[b] = 0;
            }
            if (VEC) {
                for (int c8 = lane * 8; c8 < cols; c8 += 256) {
                    float wf[8];
                    load8(wr + c8, wf);
#pragma unroll
                    for (int b = 0; b < MOE_NB; b++) {
                        if (b >= nb) break;
                        float xs[8];
                        load8(src[b] + c8, xs);
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[b] += wf[i] * xs[i];
                    }
                }
            } else {
                for (int c = lane; c < cols; c += 32) {
                    float wv = load_f(wr + c);
#pragma unroll
                    for (int b = 0; b < MOE_NB; b++)
                        if (b < nb) acc[b] += wv * src[b][c];
                }
            }
#pragma unroll
            for (int b = 0; b < MOE_NB; b++) {
                if (b >= nb) break;
                float dot = warp_sum(acc[b]);
                if (lane == 0) out[(int64_t)(rb + b) * ldo + row] = dot;
            }
        }
    }
}

// h [A, I] = act(gu[:, :I]) * gu[:, I:] (gated, gu [A, 2I]) or act(gu) (gu [A, I])
__global__ void k_moe_act(float *h, const float *gu, int64_t A, int I, int gated, enum act kind) {
    int U = gated ? 2 * I : I;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < A * I; i += (int64_t)gridDim.x * blockDim.x) {
        const float *g = gu + (i / I) * U + i % I;
        h[i] = gated ? act_dev(kind, g[0]) * g[I] : act_dev(kind, g[0]);
    }
}

// out[t] = sum over its k experts, in ascending expert order, of w * y
// (y row slot_of[t * k + j], or t * k + j when slot_of is NULL), + add.
// Block (t, x): 256 columns of token t. Threads j < k load pick j (all k
// loads at once: one thread loading them in turn waited k memory latencies)
// and place it by its rank in expert order; then every thread's k loads of
// y are independent, so they are in flight at once.
__global__ void k_moe_combine(float *out, const float *y, const int32_t *ids, const float *weights,
                              const int32_t *slot_of, const float *add, int k, int L) {
    __shared__ int se[CUDA_MAX_TOPK], sr[CUDA_MAX_TOPK];
    __shared__ float sw[CUDA_MAX_TOPK];
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x, l = blockIdx.y * blockDim.x + threadIdx.x, j = threadIdx.x, e = 0, r = 0;
    float w = 0;
    if (j < k) e = ids[t * k + j], w = weights[t * k + j], r = slot_of ? slot_of[t * k + j] : t * k + j, se[j] = e;
    __syncthreads();
    if (j < k) {
        int rank = 0; // ties (never in a top-k) keep pick order
        for (int i = 0; i < k; i++) rank += se[i] < e || (se[i] == e && i < j);
        sr[rank] = r, sw[rank] = w;
    }
    __syncthreads();
    if (l >= L) return;
    float acc = 0;
#pragma unroll
    for (int q = 0; q < CUDA_MAX_TOPK; q++)
        if (q < k) acc += sw[q] * y[(int64_t)sr[q] * L + l];
    out[(int64_t)t * L + l] = add ? acc + add[(int64_t)t * L + l] : acc;
}

// out [segment rows, rows] = the experts' W (rows [0, rows) of each
// expert's wrows) applied to their segment rows of in (gathered by token
// when gather), for weights of type WT.
template <typename WT>
static void experts_mm(cudaStream_t st, const WT *w, const float *in, float *out, const int32_t *offsets,
                       const int32_t *perm, int top_k, int E, int rows, int cols, bool gather) {
    const int rpb = 8; // one weight row per warp: many warps in flight at decode sizes
    dim3 g(E, cdiv(rows, rpb));
    bool vec = cols % 8 == 0;
    if (gather && vec) k_moe_mm<WT, true, true><<<g, 256, 0, st>>>(w, in, out, offsets, perm, top_k, rows, 0, rows, rows, cols, rpb);
    else if (gather) k_moe_mm<WT, true, false><<<g, 256, 0, st>>>(w, in, out, offsets, perm, top_k, rows, 0, rows, rows, cols, rpb);
    else if (vec) k_moe_mm<WT, false, true><<<g, 256, 0, st>>>(w, in, out, offsets, perm, top_k, rows, 0, rows, rows, cols, rpb);
    else k_moe_mm<WT, false, false><<<g, 256, 0, st>>>(w, in, out, offsets, perm, top_k, rows, 0, rows, rows, cols, rpb);
    LAUNCH_CHECK();
}

static void experts_fmt(cudaStream_t st, const struct weight *w, const float *in, float *out, const int32_t *offsets,
                        const int32_t *perm, int top_k, int E, int rows, int cols, bool gather) {
    switch (w->fmt) {
    case WF_F32: experts_mm(st, (const float *)w->data, in, out, offsets, perm, top_k, E, rows, cols, gather); break;
    case WF_BF16: experts_mm(st, (const __nv_bfloat16 *)w->data, in, out, offsets, perm, top_k, E, rows, cols, gather); break;
    case WF_F16: experts_mm(st, (const __half *)w->data, in, out, offsets, perm, top_k, E, rows, cols, gather); break;
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: break; // quantized experts take the GEMV or the grouped GEMMs (cu_supports: L, I % 16 == 0)
    }
}

// ---- the weight types: 16-bit floats, and the quantized formats' codes ----
//
// The expert kernels are templated on the weight type WT: __nv_bfloat16 and
// __half as they are, or one of the quantized formats (docs/QUANTIZATION.md),
// whose codes are bytes: __nv_fp8_e4m3 (WF_FP8: a scale per row), fp8b_t
// (WF_FP8_B128: e4m3 codes, a scale per row and 128 columns), nvfp4_t
// (WF_NVFP4: two e2m1 codes a byte, element 2i in the low nibble, an e4m3
// scale per row and 16 columns, then a scale per row). Every code widens
// exactly: e4m3 -> half -> float; e2m1 x its e4m3 block scale has at most 6
// significant bits, so it is exact in half, float and bf16.
struct fp8b_t {
    uint8_t v;
};
struct nvfp4_t {
    uint8_t v;
};
template <typename WT>
constexpr bool IS_Q = sizeof(WT) == 1; // codes: staged in the grouped GEMMs and widened in shared memory
template <typename WT>
constexpr bool IS_B128 = std::is_same<WT, fp8b_t>::value;
template <typename WT>
constexpr bool IS_FP4 = std::is_same<WT, nvfp4_t>::value;
template <typename WT>
constexpr bool BLOCK_SCALED = IS_B128<WT> || IS_FP4<WT>;
// scaled per row, once on each fp32 sum (the GEMV) or in the grouped GEMMs' epilogue
template <typename WT>
constexpr bool ROW_SCALED = std::is_same<WT, __nv_fp8_e4m3>::value || IS_FP4<WT>;
template <typename WT>
constexpr int PACK = IS_FP4<WT> ? 2 : 1; // weights a WT holds
// A 16-byte load of weights of type WT holds WVEC<WT> of them (8 of 16 bits,
// 16 e4m3 codes, 32 e2m1 codes)
template <typename WT>
constexpr int WVEC = 16 / (int)sizeof(WT) * PACK<WT>;

// 8 e4m3 codes (p: 4 pairs, the first of each in the low byte) -> f,
// exactly (e4m3 -> half -> float, as cuda_quant.cu does).
__device__ __forceinline__ void e4m3x8(const __nv_fp8x2_storage_t *p, float f[8]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = fp8x2_f2(p[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

// 8 e4m3 codes of a 128-column block times its fp32 scale (raw bits s):
// wfmt_dequant's WF_FP8_B128 values.
__device__ __forceinline__ void e4m3x8_scaled(const __nv_fp8x2_storage_t *p, uint32_t s, float f[8]) {
    e4m3x8(p, f);
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] *= __uint_as_float(s);
}

// The e4m3 codes of the e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: a byte
// table for prmt (bytes 0-3, then 4-7).
#define E2M1_E4M3_LO 0x3C383000u
#define E2M1_E4M3_HI 0x4C484440u

// 8 e2m1 codes (q: code j in bits [4j, 4j + 4), the byte order of memory)
// times their block scale bs -> f, exactly (wfmt_dequant's e2m1 * e4m3, its
// row scale left to the caller). No half is ever subnormal: each magnitude
// becomes its e4m3 code through the byte table (prmt), pairs (j, j + 4) widen
// to half2, take the codes' sign bits (4j + 3 and 4j + 19 -> 15 and 31: one
// shift), and are multiplied by bs in half (products in [2^-10, 2688] or 0).
__device__ __forceinline__ void e2m1x8(uint32_t q, __half2 bs, float f[8]) {
    uint32_t m = q & 0x77777777u;
    uint32_t lo = __byte_perm(E2M1_E4M3_LO, E2M1_E4M3_HI, m), hi = __byte_perm(E2M1_E4M3_LO, E2M1_E4M3_HI, m >> 16);
    uint32_t pr[2] = {__byte_perm(lo, hi, 0x5140), __byte_perm(lo, hi, 0x7362)}; // codes (0 4 1 5), (2 6 3 7)
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t b = e4m3x2_bits(pr[j >> 1] >> (16 * (j & 1))) ^ ((q << (12 - 4 * j)) & 0x80008000u);
        __half2 h;
        memcpy(&h, &b, sizeof h);
        float2 v = __half22float2(__hmul2(h, bs));
        f[j] = v.x, f[j + 4] = v.y;
    }
}

// ---- 16-bit and quantized weights, decode sizes: GEMV over the active experts ----

#ifndef MOE_GEMV_MAXR // -D override: device builds sweep it against the thin-tile GEMM
#define MOE_GEMV_MAXR 32 // tokens the GEMV holds (quantized experts take it up to here: moe_gemv_max)
#endif
#define MOE_GEMV_MAXA (32 * CUDA_MAX_TOPK) // an expert's assignments a GEMV block holds (n <= 32 tokens)
static_assert(MOE_GEMV_MAXR <= 32, "the GEMV holds the assignments of at most 32 tokens per expert");
#ifndef MOE_GEMV16_MAXN
#define MOE_GEMV16_MAXN 8 // 16-bit experts: the GEMV up to 8 tokens, the thin tiles above (measured below)
#endif

// Tokens up to which experts of format f take the GEMV. nano30b's bf16
// experts on the H200 (`cuda_ops N 16 moe`, the GEMV against the thin tiles):
// 8 tokens 228 against 236 us, 16 398 against 357, 32 658 against 513.
// Quantized experts keep the GEMV to its capacity.
static int moe_gemv_max(enum wfmt f) {
    switch (f) {
    case WF_BF16:
    case WF_F16: return MOE_GEMV16_MAXN;
    case WF_F32:
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: break;
    }
    return MOE_GEMV_MAXR;
}

// The block scales of the 16-byte load of weight row r from column col, raw:
// fp8b_t: its 128-column block's fp32 scale (scale [rows, ceil(K / 128)]: a
// load never straddles two, 128 % 16 == 0); nvfp4_t: the e4m3 scales of its
// two 16-column blocks, 2 bytes (bscale [rows, K / 16], K % 32 == 0); else 0.
template <typename WT>
__device__ __forceinline__ uint32_t load_bscale(const float *scale, const uint8_t *bscale, int64_t r, int K, int col) {
    if constexpr (IS_B128<WT>) return __float_as_uint(__ldg(scale + r * ((K + WF_B128 - 1) / WF_B128) + col / WF_B128));
    else if constexpr (IS_FP4<WT>)
        return __ldg((const unsigned short *)(bscale + r * (K / WF_NVFP4_GROUP) + col / WF_NVFP4_GROUP));
    else return 0;
}

// unpack8 widens 8 weights of a 16-byte load u, the hf-th 8 of its WVEC,
// to floats (bs: the load's block scales from load_bscale): exactly, or
// for fp8b_t wfmt_dequant's fp32 product e4m3 * scale.
__device__ __forceinline__ void unpack8(const uint4 &u, const __nv_bfloat16 *, int, uint32_t, float f[8]) {
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void unpack8(const uint4 &u, const __half *, int, uint32_t, float f[8]) {
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __half22float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void unpack8(const uint4 &u, const __nv_fp8_e4m3 *, int hf, uint32_t, float f[8]) {
    e4m3x8((const __nv_fp8x2_storage_t *)&u + 4 * hf, f);
}
__device__ __forceinline__ void unpack8(const uint4 &u, const fp8b_t *, int hf, uint32_t bs, float f[8]) {
    e4m3x8_scaled((const __nv_fp8x2_storage_t *)&u + 4 * hf, bs, f);
}
__device__ __forceinline__ void unpack8(const uint4 &u, const nvfp4_t *, int hf, uint32_t bs, float f[8]) {
    e2m1x8((&u.x)[hf], e4m3_bcast((bs >> (8 * (hf >> 1))) & 0xffu), f); // words 0, 1: block 0; 2, 3: block 1
}

// The scale of weight row r (WF_FP8, WF_NVFP4: scale [rows], applied once
// to the row's fp32 sum); NULL: none.
__device__ __forceinline__ float row_scale(const float *s, int64_t r) { return s ? s[r] : 1.0f; }

// The decode schedule, computed by every GEMV block itself (no sort
// kernel): the a-th expert used by the nk assignments, ascending, and its
// assignments (ascending; at most n, as a token picks an expert once).
// Returns the expert, -1 past the last; rows / cnt in shared memory.
__device__ __forceinline__ int moe_decode_expert(const int32_t *ids, int nk, int E, int a, int *rows, int *cnt,
                                                 uint32_t *used, int *pick) {
    int lane = threadIdx.x & 31, words = (E + 31) / 32;
    for (int i = threadIdx.x; i < words; i += blockDim.x) used[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < nk; i += blockDim.x) atomicOr(&used[ids[i] >> 5], 1u << (ids[i] & 31));
    __syncthreads();
    if (threadIdx.x < 32) { // words <= 32: a word per lane, a prefix of the set bits finds the a-th
        uint32_t m = lane < words ? used[lane] : 0;
        int c = __popc(m), inc = c;
        for (int o = 1; o < 32; o <<= 1) {
            int v = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += v;
        }
        int below = inc - c;
        if (lane == 31 && a >= inc) *pick = -1;
        if (a >= below && a < inc) { // this lane's word holds it
            for (int r = a - below; r > 0; r--) m &= m - 1; // drop the lower set bits
            *pick = lane * 32 + __ffs(m) - 1;
        }
        __syncwarp();
        int e = *pick, got = 0;
        if (e >= 0)
            for (int base = 0; base < nk; base += 32) {
                int i = base + lane;
                uint32_t hit = __ballot_sync(0xffffffffu, i < nk && ids[i] == e);
                if (hit >> lane & 1) rows[got + __popc(hit & ((1u << lane) - 1))] = i;
                got += __popc(hit);
            }
        if (lane == 0) *cnt = got;
    }
    __syncthreads();
    return *pick;
}

// One pass of a warp's 4 weight rows (wrow: row indices, valid) over cnt <=
// NB assignments (rows): see k_moe_gemv. scale, bscale: the weight's scales
// (struct weight), or NULL. Chunks c0 <= c < c1 of WVEC weights (the whole
// row: 0, K / WVEC); part: lane 0 writes the 4 x cnt sums there, unscaled,
// instead of storing them (moe_shared_down).
template <typename WT, bool UP, int NB>
__device__ __forceinline__ void moe_gemv_pass(const WT *w, const float *scale, const uint8_t *bscale, const float *in,
                                              float *out, const int *rows, int cnt, const int64_t *wrow,
                                              const bool *valid, int o0, int k, int K, int I, int N, int gated,
                                              enum act kind, int c0, int c1, float *part) {
    constexpr int V = WVEC<WT>;
    int lane = threadIdx.x & 31;
    const float *src[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        int r = rows[b < cnt ? b : 0];
        src[b] = in + (int64_t)(UP ? r / k : r) * K;
    }
    const uint4 *wp[4];
#pragma unroll
    for (int q = 0; q < 4; q++) wp[q] = (const uint4 *)(w + wrow[q] * (K / PACK<WT>));
    float acc[4][NB];
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int b = 0; b < NB; b++) acc[q][b] = 0;
    for (int c = c0 + lane; c < c1; c += 64) {
        bool two = c + 32 < c1;
        uint4 u[2][4];
        uint32_t bq[2][4]; // the loads' block scales (load_bscale)
#pragma unroll
        for (int q = 0; q < 4; q++) { // all loads in flight first
            u[0][q] = __ldg(wp[q] + c);
            bq[0][q] = load_bscale<WT>(scale, bscale, wrow[q], K, c * V);
            if (two) {
                u[1][q] = __ldg(wp[q] + c + 32);
                bq[1][q] = load_bscale<WT>(scale, bscale, wrow[q], K, (c + 32) * V);
            }
        }
#pragma unroll
        for (int s = 0; s < 2; s++) {
            if (s && !two) break;
#pragma unroll
            for (int hf = 0; hf < V / 8; hf++) { // 8 weights of each row at a time (registers)
                int c8 = (c + 32 * s) * V + hf * 8;
                float wf[4][8];
#pragma unroll
                for (int q = 0; q < 4; q++) unpack8(u[s][q], w, hf, bq[s][q], wf[q]);
#pragma unroll
                for (int b = 0; b < NB; b++) {
                    if (b >= cnt) break;
                    const float4 *xp = (const float4 *)(src[b] + c8);
                    float4 x0 = xp[0], x1 = xp[1];
                    float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                    for (int q = 0; q < 4; q++)
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[q][b] += wf[q][i] * xs[i];
                }
            }
        }
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
        if (b >= cnt) break;
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; q++) v[q] = warp_sum(acc[q][b]);
        if (lane) continue;
        if (part) { // a slice of K (the shared expert's down): the block adds the slices
#pragma unroll
            for (int q = 0; q < 4; q++) part[b * 4 + q] = v[q];
            continue;
        }
#pragma unroll
        for (int q = 0; q < 4; q++) v[q] *= row_scale(ROW_SCALED<WT> ? scale : NULL, wrow[q]);
        int64_t r = rows[b];
        if (!UP) { // down
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (valid[q]) out[r * N + o0 + q] = v[q];
        } else if (gated) { // q 0, 1: gate; 2, 3: up of the same outputs
#pragma unroll
            for (int q = 0; q < 2; q++)
                if (valid[q]) out[r * I + o0 + q] = act_dev(kind, v[q]) * v[q + 2];
        } else {
#pragma unroll
            for (int q = 0; q < 4; q++)
                if (valid[q]) out[r * I + o0 + q] = act_dev(kind, v[q]);
        }
    }
}

// Decode MoE (n <= MOE_GEMV_MAXR tokens): block (x, a) = 32 weight rows (4
// per warp) of the a-th expert used this step, applied to each of its
// assignments, NB per pass (an expert with more reads its rows again, from
// L2). Each warp streams its 4 rows whole, two 16-byte loads per row and
// lane in flight (16-bit weights: 8 a load; FP8: 16 e4m3 codes, half the
// bytes; NVFP4: 32 e2m1 codes, a quarter, and their two block scales),
// widened in registers, fp32 sums, and reduces with shuffles. The row scale
// (FP8, NVFP4) goes on each row's sum once; an FP8 block's scale on each
// weight as it widens (its 16 codes are in one 128-column block), which
// makes wfmt_dequant's very value (scaling each load's partial sums instead
// needs a second set of 4 x NB accumulators: 210-226 registers a thread at
// NB = 8, one block an SM, against FP8's 128). Up (UP): gated, a warp's
// rows are gate o, o+1 and up o, o+1 and h[asg, o..o+1] = act(gate) * up;
// else rows o..o+3 and h = act(W x). Down: rows l..l+3 of W_e, y[asg,
// l..l+3]. Rows of h and y are assignments (t * k + j); x rows are the
// tokens' (UP) or h's; K % WVEC<WT> == 0 (8, 16 or 32). scale, bscale: the
// weight's (struct weight), NULL for 16-bit weights. k_moe_combine follows
// (the combine in the down GEMV's last block per column block measured 2%
// slower at one sequence in a graph with PDL: docs/BENCHMARKS.md, session
// of Dec 6). With sh.up (16-bit weights only), the last blockIdx.y (up) or
// sh.slices (down: moe_shared_down) are the shared expert's: every token
// once (rows 0..n-1), its own weights, I_s and buffers (up writes sh.h [n,
// I_s], down reads it and writes sh.y [n, L], which the combine adds), so
// its GEMVs cost no launches of their own.
struct moe_sh {
    const void *up, *down; // NULL: no shared expert in the launch
    float *h, *y;
    int inter, slices; // I_s; the down launch's blocks a column block (moe_shared_down)
};

// The shared expert's down GEMV, in k_moe_gemv's last sh.slices = S
// blockIdx.y: slice s takes 32 / S of the column block's 32 outputs, its 8
// warps as 8 / S row groups of 4 outputs by S parts of K = I_s, whose sums
// the block adds in part order (part: [warp][NB rows x 4 outputs]). A block
// then streams 32 x I_s / S weights, no more than a routed expert's 32 x I
// (S: shared_slices), so the launch has no tail of blocks that read twice
// as long (nano30b: I_s = 2 I; 84 blocks of K = 3712 after 504 of K = 1856
// at one token). rows: 0..n-1 (tokens); out: sh.y [n, N].
template <typename WT, int NB>
__device__ void moe_shared_down(const moe_sh &sh, const int *rows, int n, int N, int s, enum act kind) {
    __shared__ float part[8][NB * 4];
    int S = sh.slices, G = 8 / S, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, K = sh.inter;
    int o0 = blockIdx.x * 32 + s * (32 / S) + (warp % G) * 4, p = warp / G;
    int KV = K / WVEC<WT>, per = (KV + S - 1) / S, c0 = min(KV, p * per), c1 = min(KV, c0 + per);
    int64_t wrow[4];
    bool valid[4];
#pragma unroll
    for (int q = 0; q < 4; q++) valid[q] = o0 + q < N, wrow[q] = valid[q] ? o0 + q : 0;
    for (int r0 = 0; r0 < n; r0 += NB) { // uniform over the block: it syncs
        int cnt = min(NB, n - r0);
        if (o0 < N)
            moe_gemv_pass<WT, false, NB>((const WT *)sh.down, NULL, NULL, sh.h, sh.y, rows + r0, cnt, wrow, valid, o0,
                                         1, K, K, N, 0, kind, c0, c1, part[warp]);
        __syncthreads();
        int b = lane / 4, q = lane % 4;
        if (p == 0 && b < cnt && valid[q]) {
            float v = part[warp][lane];
            for (int i = 1; i < S; i++) v += part[warp + i * G][lane];
            sh.y[(int64_t)(r0 + b) * N + o0 + q] = v;
        }
        __syncthreads(); // part is the next pass's
    }
}
template <typename WT, bool UP, int NB>
__global__ void __launch_bounds__(256) k_moe_gemv(const WT *w, const float *scale, const uint8_t *bscale,
                                                  const float *in, float *out, const int32_t *ids, int nk, int k, int E,
                                                  int K, int I, int N, int gated, enum act kind, moe_sh sh) {
    __shared__ int rows[MOE_GEMV_MAXA], cnt, pick;
    __shared__ uint32_t used[MAX_EXPERTS / 32];
    pdl_wait();
    pdl_trigger();
    int e = 0, kr = k; // kr: assignments a token row of in holds (UP)
    if (sh.up && (int)blockIdx.y >= (int)gridDim.y - (UP ? 1 : sh.slices)) { // the shared expert, rows by token
        for (int i = threadIdx.x; i < nk / k; i += blockDim.x) rows[i] = i;
        if (threadIdx.x == 0) cnt = nk / k;
        __syncthreads();
        if (UP) w = (const WT *)sh.up, scale = NULL, bscale = NULL, out = sh.h, I = sh.inter, kr = 1;
        else if constexpr (sizeof(WT) == 2) // 16-bit only (shared_fused)
            moe_shared_down<WT, NB>(sh, rows, nk / k, N, blockIdx.y - (gridDim.y - sh.slices), kind);
        e = UP ? 0 : -1; // down: done (moe_shared_down)
    } else
        e = moe_decode_expert(ids, nk, E, blockIdx.y, rows, &cnt, used, &pick);
    int warp = threadIdx.x >> 5, U = gated ? 2 * I : I;
    int o0 = (blockIdx.x * 8 + warp) * (UP && gated ? 2 : 4); // the warp's first output index
    if (e >= 0 && o0 < (UP ? I : N)) { // else the warp has no rows
        int64_t wrow[4];
        bool valid[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int o = UP && gated ? o0 + (q & 1) : o0 + q;
            valid[q] = o < (UP ? I : N);
            int64_t row = UP && gated ? (q < 2 ? o : I + o) : o;
            wrow[q] = (int64_t)e * (UP ? U : N) + (valid[q] ? row : 0);
        }
        for (int r0 = 0; r0 < cnt; r0 += NB)
            moe_gemv_pass<WT, UP, NB>(w, scale, bscale, in, out, rows + r0, min(NB, cnt - r0), wrow, valid, o0, kr, K,
                                      I, N, gated, kind, 0, K / WVEC<WT>, NULL);
    }
}

// ---- quantized weights, decode sizes, 16-bit mode: the GEMV on tensor cores ----

template <typename WT>
constexpr enum wfmt WT_FMT = IS_FP4<WT> ? WF_NVFP4 : IS_B128<WT> ? WF_FP8_B128 : WF_FP8;

// Decode MoE on tensor cores (cuda_qmma.cuh; quantized weights, 16-bit mode,
// 5 to MOE_GEMV_MAXR tokens, K % 64 == 0): block (x, a) = 16 outputs of the
// a-th expert used this step (moe_decode_expert), for all its cnt <= 8 NT
// assignments in one pass (B columns: the tokens' rows of x for UP, the
// assignments' rows of h for down), so each weight row is read once. x
// staged by k_qmma_x (xs, inv: rows by token for UP, by assignment for
// down). UP gated (NA 2):
// A tiles gate o0.. and up o0.. of the expert, h[asg, o] = act(gate) * up;
// else one tile: UP h = act(W x), down y[asg, o] = W h. The row scales and
// the staged rows' 2^-sh go on the fp32 sums. Rows of h and y are
// assignments (t * k + j); N: down's outputs (the hidden size).
template <enum wfmt F, bool UP, int NA, int NT>
__global__ void __launch_bounds__(256) k_moe_qmma(qweight w, const uint4 *xs, const float *inv, float *out,
                                                  const int32_t *ids, int nk, int k, int E, int I, int N,
                                                  enum act kind) {
    __shared__ int rows[MOE_GEMV_MAXA], cnt, pick;
    __shared__ uint32_t used[MAX_EXPERTS / 32];
    __shared__ float red[8][NA][NT][4][32];
    pdl_wait(); // ids, xs: earlier kernels'
    pdl_trigger();
    int e = moe_decode_expert(ids, nk, E, blockIdx.y, rows, &cnt, used, &pick);
    int g = (threadIdx.x & 31) >> 2, O = UP ? I : N, o0 = blockIdx.x * 16;
    if (e < 0 || o0 >= O) return; // the whole block
    int64_t base = (int64_t)e * (UP ? NA * I : N), row[NA][2];
#pragma unroll
    for (int a = 0; a < NA; a++)
#pragma unroll
        for (int h = 0; h < 2; h++) row[a][h] = base + a * I + min(o0 + g + 8 * h, O - 1);
    qmma_a<F> cur[NA] = {};
    if ((int)(threadIdx.x >> 5) < qmma_steps(w.K))
#pragma unroll
        for (int a = 0; a < NA; a++) cur[a] = qmma_load<F>(w, row[a], threadIdx.x >> 5, threadIdx.x & 3);
    int src[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) { // columns past cnt read the last one's (their sums are not written)
        int r = rows[min(8 * i + g, cnt - 1)];
        src[i] = UP ? r / k : r;
    }
    float acc[NA][NT][4];
    qmma_run<F, NA, NT>(w, row, cur, xs, src, acc);
    qmma_reduce<NA, NT>(red, acc);
    for (int i = threadIdx.x; i < NT * 128; i += 256) {
        qmma_out q = qmma_at(i);
        int o = o0 + q.r;
        if (o >= O || q.col >= cnt) continue;
        int64_t asg = rows[q.col];
        float xi = inv[UP ? asg / k : asg];
        float v = qmma_sum<NA, NT>(red, 0, q) * q_row_scale<F>(w, base + o) * xi;
        if constexpr (!UP) out[asg * N + o] = v;
        else if constexpr (NA == 2) // gate, up
            out[asg * I + o] = act_dev(kind, v) * (qmma_sum<NA, NT>(red, 1, q) * q_row_scale<F>(w, base + I + o) * xi);
        else out[asg * I + o] = act_dev(kind, v);
    }
}

// ---- 16-bit weights, prefill sizes: a grouped GEMM on tensor cores ----
//
// C = A B^T per expert over its segment rows, bf16 / fp16 inputs, fp32
// accumulation (mma.sync m16n8k16). Tiles of 128 x 128 x TBK, 8 warps as
// 2 x 4 (64 x 32 each), TSTAGES cp.async stages (moe_mma_tile). Block t
// takes row tile t / NT of the experts' schedule (mtile_off) and column tile
// t % NT; blocks past the last tile exit, so the grid is sized from n alone
// (no host round trip).
// UP: A = the tokens' rows of x (through perm), B = each expert's up rows,
// gate and up interleaved (B row 2j: gate j, 2j + 1: up j) so that a
// thread's accumulator pair is (gate, up) of one hidden unit, and the
// epilogue writes h = act(gate) * up (or act(W x)) in 16 bits. Down: A = h,
// B = W_e's rows, fp32 out. K step, stages and the blocks an SM must hold
// (__launch_bounds__: at 2, at most 128 registers a thread) take -D
// overrides so that a device build can compare them (tools/device_moemma.sh
// wide). Shared memory a block, bf16 / FP8 codes (tile_smem): 32 x 3
// stages 60 / 62 KB; 64 x 2: 72 / 88 KB, x 3: 108 / 114 KB, x 4: 144 /
// 140 KB (cuda_moe_smem: supports() refuses a device that cannot opt in).
#define TBM 128
#define TBN 128
#define TTHREADS 256
#ifndef TBK
#define TBK 32 // 32 or 64 (64: a 128-byte line of each weight row per stage)
#endif
#ifndef TSTAGES
#define TSTAGES 3 // 2 to 4
#endif
#ifndef TMINB
#define TMINB 2 // 32 x 3: 2 blocks of 60 KB an SM, as before the cap (124 registers uncapped then, 136 now)
#endif

template <typename T>
__device__ __forceinline__ void store2(T *p, float a, float b);
template <> __device__ __forceinline__ void store2(__nv_bfloat16 *p, float a, float b) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
}
template <> __device__ __forceinline__ void store2(__half *p, float a, float b) { *(__half2 *)p = __floats2half2_rn(a, b); }

// The expert whose row tiles (the prefix mtile_off [E + 1]) hold tile mt.
__device__ __forceinline__ int tile_expert(const int32_t *mtile_off, int E, int mt) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (mtile_off[mid] <= mt) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// The grouped GEMMs' epilogue for one accumulator pair (v0, v1) at segment
// row r, output columns col, col + 1 (col even). UP gated: the columns are
// (gate, up) of hidden unit col / 2, h[r, col / 2] = act(gate) * up; UP:
// h[r, col..] = act(v); both 16-bit h [rows, I]. Down: y [rows, N] fp32.
// sc: the expert's weight row scales (FP8, NVFP4: up rows [U], down rows
// [N]), each on its column's sum before the activation; NULL for the others.
template <typename T, bool UP>
__device__ __forceinline__ void mma_store(void *out, int64_t r, int col, float v0, float v1, int I, int N, int gated,
                                          enum act kind, const float *sc) {
    if (!UP) {
        float *y = (float *)out + r * N + col;
        if (col + 1 < N) *(float2 *)y = make_float2(v0 * row_scale(sc, col), v1 * row_scale(sc, col + 1));
        else if (col < N) y[0] = v0 * row_scale(sc, col);
    } else if (gated) {
        int hj = col / 2;
        if (hj < I) ((T *)out)[r * I + hj] = (T)(act_dev(kind, v0 * row_scale(sc, hj)) * (v1 * row_scale(sc, I + hj)));
    } else {
        T *hp = (T *)out + r * I + col;
        if (col + 1 < I) store2(hp, act_dev(kind, v0 * row_scale(sc, col)), act_dev(kind, v1 * row_scale(sc, col + 1)));
        else if (col < I) hp[0] = (T)act_dev(kind, v0 * row_scale(sc, col));
    }
}

// Quantized weights in the grouped GEMMs (WT a code type, T = bf16): the
// same tiles and schedule as 16-bit weights; the weights' cp.async stages
// hold the codes (a chunk of 8 weights: 8 bytes of e4m3, 4 of e2m1), and
// each thread widens the chunks it loaded into one of two bf16 tiles just
// before the k step that reads them (widen8), so ldmatrix and mma are the
// 16-bit kernels'. FP8 (e4m3 -> bf16) and NVFP4 (e2m1 x its e4m3 block
// scale: at most 6 significant bits) widen exactly; their row scales go on
// the fp32 sums in the epilogue (mma_store), once per output, rather than
// on every weight before the bf16 rounding (which would round each weight
// to 8 bits and cost a multiply a weight). FP8 blocks widen to bf16(e4m3 *
// scale), the reference's weight rounded once to bf16 (relative 2^-9, as a
// bf16 checkpoint's): a chunk (8 columns) never straddles a 128-column block, so
// a chunk has one scale, and the 128 x 128 tile keeps its one set of 64
// accumulators a thread (scaling in the epilogue per k block would need a
// second set, flushed every 4 k steps). The block scales (one a chunk: a
// byte for NVFP4, a float for FP8 blocks) are loaded into registers with
// their chunk's codes, STAGES - 1 k steps ahead, and held there (a ring
// shifted each step) until the widening, so their latency hides as the
// codes' does. Chosen over running the GEMV in passes of 32 tokens, which
// reads every active expert's weights again per pass (a prefill chunk of
// 8192 tokens: 256 passes over ~1.3 GB a nano30b layer, ~60 ms a layer at 5
// TB/s, ~40x the bf16 GEMM). Prefill speed (k_moe_mma): per block and k
// step the 16-bit kernel moves ~64 KB through shared memory (A 8 KB
// written, 32 KB read by the warps; B 8 + 16 KB) for 1.05 MFLOP; FP8 adds
// the codes' 4 KB written and read (~72 KB, +12%) and 16 conversions a
// thread, under the barrier it already has: expected ~90% of the bf16
// prefill (NVFP4: 2 KB of codes and ~4x the integer work of widening).
// Decode sizes (k_moe_mma_dec) read half (a quarter) the bytes of bf16.

// cp.async of n = 4, 8 or 16 bytes (zero-filled when !valid)
template <int n>
__device__ __forceinline__ void cp_async_n(void *smem, const void *g, bool valid) {
    if constexpr (n == 16) cp_async16(smem, g, valid);
    else {
        uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(g), "n"(n), "r"(valid ? n : 0));
    }
}

// The block scale of a grouped GEMM's chunk (8 weights of row r from column
// col, col % 8 == 0), raw: fp8b_t: the fp32 scale of its 128-column block;
// nvfp4_t: the e4m3 byte of its 16-column block; else 0.
template <typename WT>
__device__ __forceinline__ uint32_t chunk_bscale(const float *scale, const uint8_t *bscale, int64_t r, int K, int col) {
    if constexpr (IS_FP4<WT>) return __ldg(bscale + r * (K / WF_NVFP4_GROUP) + col / WF_NVFP4_GROUP);
    else return load_bscale<WT>(scale, bscale, r, K, col);
}

// 8 floats -> 8 bf16 at t (16-byte aligned), rounded to nearest even.
__device__ __forceinline__ void store8_bf16(__nv_bfloat16 *t, const float f[8]) {
    uint4 r;
    __nv_bfloat162 *o = (__nv_bfloat162 *)&r;
#pragma unroll
    for (int i = 0; i < 4; i++) o[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *(uint4 *)t = r;
}

// A chunk's 8 codes at q (in shared memory, aligned to their size) -> 8
// bf16 at t; bs: chunk_bscale's.
__device__ __forceinline__ void widen8(__nv_bfloat16 *t, const uint8_t *q, const __nv_fp8_e4m3 *, uint32_t) {
    uint2 u = *(const uint2 *)q;
    float f[8];
    e4m3x8((const __nv_fp8x2_storage_t *)&u, f);
    store8_bf16(t, f);
}
__device__ __forceinline__ void widen8(__nv_bfloat16 *t, const uint8_t *q, const fp8b_t *, uint32_t bs) {
    uint2 u = *(const uint2 *)q;
    float f[8];
    e4m3x8_scaled((const __nv_fp8x2_storage_t *)&u, bs, f); // wfmt_dequant's values, then rounded to bf16
    store8_bf16(t, f);
}
__device__ __forceinline__ void widen8(__nv_bfloat16 *t, const uint8_t *q, const nvfp4_t *, uint32_t bs) {
    float f[8];
    e2m1x8(*(const uint32_t *)q, e4m3_bcast(bs), f);
    store8_bf16(t, f);
}

// Bytes of a weight chunk's cp.async (8 weights) and of a weight row's codes
// in one k step of bk columns.
template <typename WT>
constexpr int CHUNK_BYTES = 8 * (int)sizeof(WT) / PACK<WT>;
template <typename WT>
__host__ __device__ constexpr int code_bytes(int bk) {
    return bk * (int)sizeof(WT) / PACK<WT>;
}

// Shared memory of a grouped GEMM tile (moe_mma_tile) of BM x BN outputs, K
// in steps of BK over S stages: A stages [S][BM][BK + 8], then the weights'
// (16 bits: stages [S][BN][BK + 8]; codes: two bf16 tiles [2][BN][BK + 8],
// then the codes' stages [S][BN] x code_bytes(BK)).
template <typename WT, int BM, int BN, int BK, int S>
static constexpr size_t tile_smem() {
    size_t a = (size_t)S * BM * (BK + 8) * 2;
    return IS_Q<WT> ? a + 2 * (size_t)BN * (BK + 8) * 2 + (size_t)S * BN * code_bytes<WT>(BK)
                    : a + (size_t)S * BN * (BK + 8) * 2;
}

// The weight row a grouped GEMM's tile row reads for expert e (n: the tile's
// first output column + the row), and whether it is inside the weight. The
// gated up-projection interleaves its output columns: 2j is gate row j, 2j + 1
// up row j (rows I + j), so a tile holds both halves of each hidden unit.
template <bool UP>
__device__ __forceinline__ int64_t moe_wrow(int e, int n, int U, int I, int N, int gated, bool *valid) {
    if (UP && gated) {
        int j = n / 2;
        *valid = j < I;
        return (int64_t)e * U + (n & 1 ? I : 0) + (*valid ? j : 0);
    }
    *valid = n < N;
    return (int64_t)e * (UP ? U : N) + (*valid ? n : 0);
}

// The block scales of a thread's NCH weight chunks (block-scaled formats;
// nothing for the others) for the k steps in flight: during step kt, v[p][i]
// is chunk i's at step kt + p (p < S - 1). fetch(p, ...) fills slot p (p
// constant after unrolling: registers) from the chunks' weight rows wr at
// column col; shift() moves every slot down one at the end of a step.
template <typename WT, int S, int NCH>
struct bscale_ring {
    uint32_t v[S - 1][NCH] = {}; // zeros for the formats without block scales (widen8 ignores them)
    __device__ __forceinline__ void fetch(int p, const float *scale, const uint8_t *bscale, const int64_t *wr, int K,
                                          int col) {
        if constexpr (BLOCK_SCALED<WT>) {
#pragma unroll
            for (int i = 0; i < NCH; i++) v[p][i] = col < K ? chunk_bscale<WT>(scale, bscale, wr[i], K, col) : 0;
        }
    }
    __device__ __forceinline__ void shift() {
        if constexpr (BLOCK_SCALED<WT>) {
#pragma unroll
            for (int p = 0; p + 1 < S - 1; p++)
#pragma unroll
                for (int i = 0; i < NCH; i++) v[p][i] = v[p + 1][i];
        }
    }
};

// One tile of a grouped GEMM (k_moe_mma, k_moe_mma_dec): rows r0 .. r0 +
// rows - 1 (< BM) of expert e's segment x output columns n0 .. n0 + BN - 1,
// the 16-bit and the quantized weights alike. THREADS / 32 warps as WM x WN
// (WN = BN / 32), each BM / WM rows x 32 columns (MI A fragments, 4 n8 B
// fragments, 4 x MI mma per k16). Each stage a thread copies chunk tid %
// CPR (8 columns) of rows tid / CPR + i * RPP of both operands; rows padded
// to BK + 8 elements (16 x an odd number of bytes: ldmatrix is
// conflict-free). tsm: tile_smem<WT, BM, BN, BK, S>() bytes.
template <typename T, typename WT, bool UP, int BM, int BN, int BK, int S, int THREADS>
__device__ __forceinline__ void moe_mma_tile(unsigned char *tsm, const T *A, const WT *W, const float *wscale,
                                             const uint8_t *wbscale, void *out, const int32_t *perm, int e, int r0,
                                             int rows, int n0, int k, int K, int I, int N, int gated, enum act kind) {
    constexpr bool Q = IS_Q<WT>;
    constexpr int PAD = BK + 8, QB = code_bytes<WT>(BK); // QB: a weight row's code bytes a stage
    constexpr int CPR = BK / 8, RPP = THREADS / CPR, ACH = (BM + RPP - 1) / RPP, BCH = BN / RPP;
    constexpr int WN = BN / 32, WM = THREADS / 32 / WN, MI = BM / WM / 16;
    static_assert(BK % 16 == 0 && S >= 2 && THREADS % CPR == 0 && BN % RPP == 0 && THREADS % (32 * WN) == 0 &&
                      BM % (16 * WM) == 0, "grouped GEMM tile layout");
    T *As = (T *)tsm, *Bs = As + S * BM * PAD; // 16 bits: the weights' stages; codes: the two bf16 tiles
    uint8_t *Bq = (uint8_t *)(Bs + 2 * BN * PAD); // codes: their stages
    int U = gated ? 2 * I : I, tid = threadIdx.x, c = (tid % CPR) * 8;
    const T *ga[ACH];
    const WT *gb[BCH];
    int64_t wr[BCH]; // the weight chunks' rows
    bool va[ACH], vb[BCH];
#pragma unroll
    for (int i = 0; i < ACH; i++) { // A: the segment's rows (UP: their tokens' x), zero past rows
        int row = tid / CPR + i * RPP;
        va[i] = row < rows;
        int r = r0 + (va[i] ? row : 0);
        ga[i] = A + (int64_t)(UP ? perm[r] / k : r) * K + c;
    }
#pragma unroll
    for (int i = 0; i < BCH; i++) {
        int row = tid / CPR + i * RPP;
        wr[i] = moe_wrow<UP>(e, n0 + row, U, I, N, gated, &vb[i]);
        gb[i] = W + (wr[i] * K + c) / PACK<WT>;
    }
    int KT = (K + BK - 1) / BK;
    auto load = [&](int stage, int kt) {
        int k0 = kt * BK;
        bool kin = k0 + c < K; // K % 8 == 0: a chunk is all in or all out
#pragma unroll
        for (int i = 0; i < ACH; i++) {
            int row = tid / CPR + i * RPP;
            if (row < BM) cp_async16(As + (stage * BM + row) * PAD + c, ga[i] + (kin ? k0 : 0), va[i] && kin);
        }
#pragma unroll
        for (int i = 0; i < BCH; i++) {
            int row = tid / CPR + i * RPP;
            if constexpr (Q)
                cp_async_n<CHUNK_BYTES<WT>>(Bq + (stage * BN + row) * QB + c / PACK<WT>,
                                            gb[i] + (kin ? k0 : 0) / PACK<WT>, vb[i] && kin);
            else cp_async16(Bs + (stage * BN + row) * PAD + c, gb[i] + (kin ? k0 : 0), vb[i] && kin);
        }
    };
    bscale_ring<WT, S, BCH> bsr;
    int warp = tid >> 5, lane = tid & 31, wm = warp / WN, wn = warp % WN; // warp tile rows wm * MI * 16, cols wn * 32
    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0;
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < KT) load(s, s), bsr.fetch(s, wscale, wbscale, wr, K, s * BK + c);
        asm volatile("cp.async.commit_group;\n");
    }
    for (int kt = 0; kt < KT; kt++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2));
        if constexpr (Q) { // this thread's own chunks of step kt have landed: widen them into
                           // bf16 tile kt & 1 (last read at step kt - 2, before the previous barrier)
            const uint8_t *q8 = Bq + (kt % S) * BN * QB;
            T *bt = Bs + (kt & 1) * BN * PAD;
#pragma unroll
            for (int i = 0; i < BCH; i++) {
                int row = tid / CPR + i * RPP;
                widen8(bt + row * PAD + c, q8 + row * QB + c / PACK<WT>, W, bsr.v[0][i]);
            }
            bsr.shift();
        }
        __syncthreads();
        int nx = kt + S - 1; // refill the stage every warp finished with
        if (nx < KT) load(nx % S, nx), bsr.fetch(S - 2, wscale, wbscale, wr, K, nx * BK + c);
        asm volatile("cp.async.commit_group;\n");
        const T *as = As + ((kt % S) * BM + wm * MI * 16) * PAD, *bs = Bs + (Q ? kt & 1 : kt % S) * BN * PAD;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[MI][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < MI; i++) ldsm_x4(af[i], as + (i * 16 + (lane & 15)) * PAD + kk + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < 4; j += 2) {
                uint32_t r[4];
                ldsm_x4(r, bs + (wn * 32 + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * PAD + kk + ((lane >> 3) & 1) * 8);
                bf[j][0] = r[0], bf[j][1] = r[1], bf[j + 1][0] = r[2], bf[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) mma16<T>::run(acc[i][j], af[i], bf[j]);
        }
    }
    asm volatile("cp.async.wait_group 0;\n");
    const float *sc = ROW_SCALED<WT> ? wscale + (int64_t)e * (UP ? U : N) : NULL; // the expert's row scales
    // epilogue: a thread holds rows lane / 4 (+ 8) and column pair (lane % 4) * 2 of each 16 x 8 tile
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int h8 = 0; h8 < 2; h8++) {
            int row = wm * MI * 16 + i * 16 + (lane >> 2) + h8 * 8;
            if (row >= rows) continue;
#pragma unroll
            for (int j = 0; j < 4; j++)
                mma_store<T, UP>(out, r0 + row, n0 + wn * 32 + j * 8 + (lane & 3) * 2, acc[i][j][h8 * 2],
                                 acc[i][j][h8 * 2 + 1], I, N, gated, kind, sc);
        }
}

// The 128-row tiles: block t takes row tile t / NT of the experts' schedule
// (mtile_off, sorted with bm = TBM) and column tile t % NT.
template <typename T, typename WT, bool UP>
__global__ void __launch_bounds__(TTHREADS, TMINB) k_moe_mma(const T *A, const WT *W, const float *wscale,
                                                           const uint8_t *wbscale, void *out, const int32_t *offsets,
                                                           const int32_t *mtile_off, const int32_t *perm, int E,
                                                           int k, int K, int I, int N, int gated, enum act kind) {
    extern __shared__ __align__(16) unsigned char tsm[];
    int NT = (N + TBN - 1) / TBN, mt = blockIdx.x / NT, nt = blockIdx.x % NT;
    if (mt >= mtile_off[E]) return;
    int e = tile_expert(mtile_off, E, mt), r0 = offsets[e] + (mt - mtile_off[e]) * TBM;
    moe_mma_tile<T, WT, UP, TBM, TBN, TBK, TSTAGES, TTHREADS>(tsm, A, W, wscale, wbscale, out, perm, e, r0,
                                                              min(TBM, offsets[e + 1] - r0), nt * TBN, k, K, I, N,
                                                              gated, kind);
}

// ---- 16-bit and quantized weights, above the GEMV: a grouped GEMM of thin row tiles ----
//
// Between the GEMV and prefill sizes nearly every expert is used by a few
// rows (nano30b at 64 tokens: ~122 of 128 experts, ~3 rows each), so a step
// is the experts' weights streamed once: k_moe_mma's 128-row tiles are ~98%
// padding (their mma work rivals the weights' streaming time), and its 3
// stages of 8 KB of weights per block leave the HBM half idle (~52%). Here a
// tile is DBM (16) rows of an expert's segment (zero-padded) x DBN (128)
// weight rows, K in DBK (64) steps over DSTAGES (4) cp.async stages: 3 x 16
// KB of weights in flight per block, 2 blocks (83 KB of shared memory each)
// per SM. A stage reads a 128-byte line of each of its 128 weight rows: with
// K steps of 32 (half a line a row, 6 stages, 3 blocks an SM) the same
// kernel streamed at 57% of the copy rate, against 88-90% now (nano30b's
// experts at 33-128 tokens on the H200, `cuda_ops N 16 moe`; 85% at 256).
// 4 warps, each all DBM rows x 32 columns (DBM / 16 A fragments, 4
// n8 B fragments, 4 x DBM / 16 mma per k16). An expert with more than DBM
// rows takes several tiles; the later ones read its weight tile again, from
// L2 (its tiles are neighbours in the grid). Operands, the schedule
// (k_moe_sort with bm = DBM) and the epilogue are k_moe_mma's. Thresholds
// and tile sizes take -D overrides so that a device build can sweep them
// (tools/device_moemma.sh).
#ifndef MOE_DEC_MAXN
#define MOE_DEC_MAXN 512 // tokens of the thin-tile GEMM (above: k_moe_mma)
#endif
#ifndef DBM
#define DBM 16 // 16 or 32
#endif
#ifndef DBK
#define DBK 64 // 32 or 64 (64: a 128-byte line of each weight row per stage)
#endif
#ifndef DSTAGES
#define DSTAGES 4
#endif
#define DBN 128
#define DTHREADS 128

template <typename T, typename WT, bool UP>
__global__ void __launch_bounds__(DTHREADS) k_moe_mma_dec(const T *A, const WT *W, const float *wscale,
                                                          const uint8_t *wbscale, void *out, const int32_t *offsets,
                                                          const int32_t *mtile_off, const int32_t *perm, int E, int k,
                                                          int K, int I, int N, int gated, enum act kind) {
    extern __shared__ __align__(16) unsigned char tsm[];
    pdl_wait();
    pdl_trigger();
    int NT = (N + DBN - 1) / DBN, mt = blockIdx.x / NT, nt = blockIdx.x % NT;
    if (mt >= mtile_off[E]) return;
    int e = tile_expert(mtile_off, E, mt), r0 = offsets[e] + (mt - mtile_off[e]) * DBM;
    moe_mma_tile<T, WT, UP, DBM, DBN, DBK, DSTAGES, DTHREADS>(tsm, A, W, wscale, wbscale, out, perm, e, r0,
                                                              min(DBM, offsets[e + 1] - r0), nt * DBN, k, K, I, N,
                                                              gated, kind);
}

// The thin-tile grouped GEMM's two launches (up with the activation, down)
// over a schedule sorted with bm = DBM; xb: x in T [n, L], h: T [nk, I].
template <typename T, typename WT>
static void dec_experts(cudaStream_t st, const struct moe_experts *w, const T *xb, T *h, float *y,
                        const int32_t *offsets, const int32_t *mtile_off, const int32_t *perm, int n, int top_k) {
    int E = w->num_experts, I = w->inter, L = w->dim, nk = n * top_k, U = w->gated ? 2 * I : I;
    int mtiles = cdiv(nk, DBM) + (nk < E ? nk : E);
    size_t sm = tile_smem<WT, DBM, DBN, DBK, DSTAGES>();
    CUDA_CHECK(cudaFuncSetAttribute(k_moe_mma_dec<T, WT, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    CUDA_CHECK(cudaFuncSetAttribute(k_moe_mma_dec<T, WT, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    launch_pdl(k_moe_mma_dec<T, WT, true>, mtiles * cdiv(U, DBN), DTHREADS, sm, st, xb, (const WT *)w->up.data,
               (const float *)w->up.scale, (const uint8_t *)w->up.bscale, (void *)h, offsets, mtile_off, perm, E,
               top_k, L, I, U, w->gated, w->act);
    launch_pdl(k_moe_mma_dec<T, WT, false>, mtiles * cdiv(L, DBN), DTHREADS, sm, st, (const T *)h,
               (const WT *)w->down.data, (const float *)w->down.scale, (const uint8_t *)w->down.bscale, (void *)y,
               offsets, mtile_off, perm, E, top_k, I, I, L, 0, w->act);
}

// 16-bit or quantized weights (WT) with T activations: x rounded to T, then
// the thin tiles (dec) or the 128-row tiles.
template <typename T, typename WT>
static void tc_experts(struct backend *be, cudaStream_t st, const struct moe_experts *w, const float *x, T *xb, T *h,
                       float *y, const int32_t *offsets, const int32_t *mtile_off, const int32_t *perm, int n,
                       int top_k, bool dec) {
    int E = w->num_experts, I = w->inter, L = w->dim, nk = n * top_k, U = w->gated ? 2 * I : I;
    int64_t nx = (int64_t)n * L;
    launch_pdl(k_to_16<T>, to16_grid(nx), 256, 0, st, xb, x, nx);
    if (dec) { // the thin tiles (schedule sorted with bm = DBM)
        dec_experts<T, WT>(st, w, xb, h, y, offsets, mtile_off, perm, n, top_k);
        return;
    }
    int mtiles = cdiv(nk, TBM) + (nk < E ? nk : E); // at most: each active expert adds one partial tile
    // over the 48 KB default: opt in (per call: cheap, and right on every device)
    size_t sm = tile_smem<WT, TBM, TBN, TBK, TSTAGES>();
    CUDA_CHECK(cudaFuncSetAttribute(k_moe_mma<T, WT, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    CUDA_CHECK(cudaFuncSetAttribute(k_moe_mma<T, WT, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    (void)be;
    k_moe_mma<T, WT, true><<<mtiles * cdiv(U, TBN), TTHREADS, sm, st>>>(
        xb, (const WT *)w->up.data, (const float *)w->up.scale, (const uint8_t *)w->up.bscale, h, offsets, mtile_off,
        perm, E, top_k, L, I, U, w->gated, w->act);
    LAUNCH_CHECK();
    k_moe_mma<T, WT, false><<<mtiles * cdiv(L, TBN), TTHREADS, sm, st>>>(
        h, (const WT *)w->down.data, (const float *)w->down.scale, (const uint8_t *)w->down.bscale, y, offsets,
        mtile_off, perm, E, top_k, I, I, L, 0, w->act);
    LAUNCH_CHECK();
}

// Accumulators for NB rows: the batch's n up to 8 (an expert gets at most
// n), passes of 8 above. h and y rows are assignments.
// sh.up: the shared expert's GEMVs join the launches (one more blockIdx.y
// for up, sh.slices more for down).
template <typename T, int NB>
static void gemv_experts_nb(cudaStream_t st, const struct moe_experts *w, const float *x, float *h, float *y,
                            const int32_t *ids, int n, int top_k, moe_sh sh) {
    int E = w->num_experts, I = w->inter, L = w->dim, nk = n * top_k, ny = nk < E ? nk : E;
    dim3 gu(cdiv(MAX(I, sh.up ? sh.inter : 0), w->gated ? 16 : 32), ny + (sh.up ? 1 : 0));
    dim3 gd(cdiv(L, 32), ny + (sh.up ? sh.slices : 0));
    launch_pdl(k_moe_gemv<T, true, NB>, gu, 256, 0, st, (const T *)w->up.data, (const float *)w->up.scale,
               (const uint8_t *)w->up.bscale, x, h, ids, nk, top_k, E, L, I, I, w->gated, w->act, sh);
    launch_pdl(k_moe_gemv<T, false, NB>, gd, 256, 0, st, (const T *)w->down.data, (const float *)w->down.scale,
               (const uint8_t *)w->down.bscale, (const float *)h, y, ids, nk, top_k, E, I, I, L, 0, w->act, sh);
}

template <typename T>
static void gemv_experts(cudaStream_t st, const struct moe_experts *w, const float *x, float *h, float *y,
                         const int32_t *ids, int n, int top_k, moe_sh sh) {
    if (n <= 1) gemv_experts_nb<T, 1>(st, w, x, h, y, ids, n, top_k, sh);
    else if (n <= 2) gemv_experts_nb<T, 2>(st, w, x, h, y, ids, n, top_k, sh);
    else if (n <= 4) gemv_experts_nb<T, 4>(st, w, x, h, y, ids, n, top_k, sh);
    else gemv_experts_nb<T, 8>(st, w, x, h, y, ids, n, top_k, sh); // passes of 8 rows
}

// Quantized experts on tensor cores (k_moe_qmma), NT tiles of 8 tokens, 5 to
// MOE_GEMV_MAXR tokens (cuda_moe_experts): x staged into qs first, h after
// up; up into h [nk, I] fp32, down into y [nk, L].
template <typename WT, int NT>
static void qmma_experts_nt(cudaStream_t st, const struct moe_experts *w, const float *x, float *h, float *y,
                            const int32_t *ids, int n, int top_k, char *qs) {
    constexpr enum wfmt F = WT_FMT<WT>;
    constexpr bool FP4 = IS_FP4<WT>;
    int E = w->num_experts, I = w->inter, L = w->dim, nk = n * top_k, ny = nk < E ? nk : E;
    qweight up = {(const uint8_t *)w->up.data, w->up.scale, w->up.bscale, L};
    qweight down = {(const uint8_t *)w->down.data, w->down.scale, w->down.bscale, I};
    dim3 gu(cdiv(I, 16), ny), gd(cdiv(L, 16), ny);
    qmma_x sx = qmma_stage<FP4>(st, qs, x, n, n, L);
    if (w->gated)
        launch_pdl(k_moe_qmma<F, true, 2, NT>, gu, 256, 0, st, up, sx.xs, sx.inv, h, ids, nk, top_k, E, I, L,
                   w->act);
    else
        launch_pdl(k_moe_qmma<F, true, 1, NT>, gu, 256, 0, st, up, sx.xs, sx.inv, h, ids, nk, top_k, E, I, L,
                   w->act);
    qmma_x sh = qmma_stage<FP4>(st, qs + qmma_x_bytes(n, L), h, nk, nk, I);
    launch_pdl(k_moe_qmma<F, false, 1, NT>, gd, 256, 0, st, down, sh.xs, sh.inv, y, ids, nk,
               top_k, E, I, L, w->act);
}

template <typename WT>
static void qmma_experts(cudaStream_t st, const struct moe_experts *w, const float *x, float *h, float *y,
                         const int32_t *ids, int n, int top_k, char *qs) {
    static_assert(MOE_GEMV_MAXR <= 32, "4 tiles of 8 tokens at most");
    switch (qmma_tiles(n)) {
    case 1: qmma_experts_nt<WT, 1>(st, w, x, h, y, ids, n, top_k, qs); break;
    case 2: qmma_experts_nt<WT, 2>(st, w, x, h, y, ids, n, top_k, qs); break;
    default: qmma_experts_nt<WT, 4>(st, w, x, h, y, ids, n, top_k, qs); break;
    }
}

// The staged x and h of qmma_experts at n <= MOE_GEMV_MAXR tokens (256 for alignment)
static size_t moe_qmma_bytes(int n, int top_k, int I, int L) {
    return 256 + qmma_x_bytes(n, L) + qmma_x_bytes(n * top_k, I);
}

size_t cuda_moe_smem(void) { // the codes' stages are largest for FP8 (fp8b_t the same), smallest for NVFP4
    size_t wb = tile_smem<__nv_bfloat16, TBM, TBN, TBK, TSTAGES>(), wq = tile_smem<__nv_fp8_e4m3, TBM, TBN, TBK, TSTAGES>();
    size_t db = tile_smem<__nv_bfloat16, DBM, DBN, DBK, DSTAGES>(), dq = tile_smem<__nv_fp8_e4m3, DBM, DBN, DBK, DSTAGES>();
    return MAX(MAX(wb, wq), MAX(db, dq));
}

// Scratch of moe_experts at n tokens: offsets, mtile_off [E + 1], perm,
// slot_of [n * k]; then (256-aligned) the up output [nk, U], h [nk, I], y
// [nk, L] and x in 16 bits [n, L]; quantized experts, the staged x and h of
// their tensor-core GEMV (moe_qmma_bytes).
static size_t moe_ints_bytes(int E, size_t nk) { return ((2 * (size_t)(E + 1) + 2 * nk) * 4 + 255) & ~(size_t)255; }

size_t cuda_moe_scratch(const struct moe_experts *w, int n, int top_k) {
    size_t nk = (size_t)n * top_k, U = (size_t)(w->gated ? 2 : 1) * w->inter;
    size_t q = wfmt_quantized(w->up.fmt) ? moe_qmma_bytes(MIN(n, MOE_GEMV_MAXR), top_k, w->inter, w->dim) : 0;
    return moe_ints_bytes(w->num_experts, nk) + 4 * (nk * (U + w->inter + w->dim) + (size_t)n * w->dim) + q;
}

// Which of experts_run's paths a batch of n tokens takes: the quantized
// GEMV on tensor cores (from 5 tokens: at one token the plain GEMV was the
// faster, nano30b NVFP4 on the H200: 38.8 against 42.0 us), the GEMV
// (shared_fused joins the shared expert to it only where it runs).
static bool takes_qmma(struct backend *be, const struct moe_experts *w, int n) {
    enum wfmt f = w->up.fmt;
    return wfmt_quantized(f) && f == w->down.fmt && cu(be)->qmma && n > CUDA_QGEMV_MAXB && n <= MOE_GEMV_MAXR &&
           w->dim % 64 == 0 && w->inter % 64 == 0 && (be->weight_dtype == WF_BF16 || be->weight_dtype == WF_F16);
}
// the fp32 mode (the exactness gates) with quantized experts above the
// GEMV's rows: the grouped GEMMs round x and h to bf16, so the GEMV (fp32 x
// and sums) runs in passes of its tokens
static bool takes_fp32_passes(const struct backend *be, const struct moe_experts *w, int n) {
    return be->weight_dtype == WF_F32 && wfmt_quantized(w->up.fmt) && n > MOE_GEMV_MAXR;
}
static bool takes_gemv(struct backend *be, const struct moe_experts *w, int n) {
    enum wfmt f = w->up.fmt;
    return !takes_fp32_passes(be, w, n) && !takes_qmma(be, w, n) && f != WF_F32 && f == w->down.fmt &&
           w->dim % 8 == 0 && w->inter % 8 == 0 && n <= moe_gemv_max(f);
}

// fp32 weights (the exactness gates): the SIMT path. 16-bit: GEMV over the
// active experts up to moe_gemv_max tokens (quantized experts in the 16-bit
// mode with L and I multiples of 64: on tensor cores, k_moe_qmma), the thin-tile grouped GEMM up
// to MOE_DEC_MAXN, the 128 x 128 tensor-core grouped GEMM above (K % 8 == 0
// for 16-byte loads; else the SIMT path). Quantized (FP8, FP8 blocks,
// NVFP4; up and down in one format, L and I multiples of 16, 32 for NVFP4:
// cu_supports): the same paths, the grouped GEMMs with bf16 activations.
// add: [n, L] to add in the combine, or NULL; sh.up: the shared expert's
// GEMVs joined to the routed ones' (the GEMV path only: shared_fused).
static void experts_run(struct backend *be, float *out, const float *x, const struct moe_experts *w, const int32_t *ids,
                        const float *weights, int n, int top_k, const float *add, moe_sh sh) {
    if (takes_fp32_passes(be, w, n)) {
        for (int t0 = 0; t0 < n; t0 += MOE_GEMV_MAXR) {
            size_t o = (size_t)t0 * w->dim, ok = (size_t)t0 * top_k;
            experts_run(be, out + o, x + o, w, ids + ok, weights + ok, MIN(MOE_GEMV_MAXR, n - t0), top_k,
                        add ? add + o : NULL, moe_sh{});
        }
        return;
    }
    int E = w->num_experts, I = w->inter, L = w->dim, nk = n * top_k, U = w->gated ? 2 * I : I;
    char *s = (char *)cuda_scratch(be, cuda_moe_scratch(w, n, top_k));
    int32_t *offsets = (int32_t *)s, *mtile_off = offsets + E + 1, *perm = mtile_off + E + 1, *slot_of = perm + nk;
    float *gu = (float *)(s + moe_ints_bytes(E, (size_t)nk)), *h = gu + (size_t)nk * U, *y = h + (size_t)nk * I;
    void *xb = y + (size_t)nk * L; // x in 16 bits (the grouped GEMM's A)
    cudaStream_t st = cu(be)->stream;
    bool k8 = L % 8 == 0 && I % 8 == 0;
    enum wfmt f = w->up.fmt;
    const int32_t *rows = NULL; // y's row of each assignment: itself (the GEMV), or slot_of (sorted)
    if (takes_qmma(be, w, n)) { // no sort; 16-bit mode: tensor cores
        char *qs = (char *)(((uintptr_t)xb + 4 * (size_t)n * L + 255) & ~(uintptr_t)255);
        switch (f) {
        case WF_FP8: qmma_experts<__nv_fp8_e4m3>(st, w, x, h, y, ids, n, top_k, qs); break;
        case WF_FP8_B128: qmma_experts<fp8b_t>(st, w, x, h, y, ids, n, top_k, qs); break;
        case WF_NVFP4: qmma_experts<nvfp4_t>(st, w, x, h, y, ids, n, top_k, qs); break;
        case WF_F32:
        case WF_BF16:
        case WF_F16: break; // not quantized
        }
    } else if (n == 1 && wfmt_quantized(f) && takes_gemv(be, w, n) &&
               cuda_qgemv_experts1(be, st, w, x, h, y, ids, top_k)) {
        // one token, quantized: up and down ran as the streaming GEMV (cuda_quant.cu)
    } else if (takes_gemv(be, w, n)) { // no sort
        switch (f) {
        case WF_BF16: gemv_experts<__nv_bfloat16>(st, w, x, h, y, ids, n, top_k, sh); break;
        case WF_F16: gemv_experts<__half>(st, w, x, h, y, ids, n, top_k, sh); break;
        case WF_FP8: gemv_experts<__nv_fp8_e4m3>(st, w, x, h, y, ids, n, top_k, sh); break;
        case WF_FP8_B128: gemv_experts<fp8b_t>(st, w, x, h, y, ids, n, top_k, sh); break;
        case WF_NVFP4: gemv_experts<nvfp4_t>(st, w, x, h, y, ids, n, top_k, sh); break;
        case WF_F32: break; // not here
        }
    } else {
        int sort_threads = (int)MIN(1024, ((int64_t)MAX(E, nk) + 31) / 32 * 32); // a few warps at small nk
        bool tc = f != WF_F32 && f == w->down.fmt && k8, dec = tc && n <= MOE_DEC_MAXN;
        launch_pdl(k_moe_sort, 1, sort_threads, 0, st, ids, nk, E, dec ? DBM : TBM, offsets, mtile_off, perm, slot_of);
        rows = slot_of;
        __nv_bfloat16 *xb16 = (__nv_bfloat16 *)xb, *h16 = (__nv_bfloat16 *)h;
        if (tc) switch (f) {
            case WF_BF16:
                tc_experts<__nv_bfloat16, __nv_bfloat16>(be, st, w, x, xb16, h16, y, offsets, mtile_off, perm, n, top_k,
                                                         dec);
                break;
            case WF_F16:
                tc_experts<__half, __half>(be, st, w, x, (__half *)xb, (__half *)h, y, offsets, mtile_off, perm, n,
                                           top_k, dec);
                break;
            case WF_FP8:
                tc_experts<__nv_bfloat16, __nv_fp8_e4m3>(be, st, w, x, xb16, h16, y, offsets, mtile_off, perm, n, top_k,
                                                         dec);
                break;
            case WF_FP8_B128:
                tc_experts<__nv_bfloat16, fp8b_t>(be, st, w, x, xb16, h16, y, offsets, mtile_off, perm, n, top_k, dec);
                break;
            case WF_NVFP4:
                tc_experts<__nv_bfloat16, nvfp4_t>(be, st, w, x, xb16, h16, y, offsets, mtile_off, perm, n, top_k, dec);
                break;
            case WF_F32: break; // not tc
            }
        else {
            experts_fmt(st, &w->up, x, gu, offsets, perm, top_k, E, U, L, true);
            int64_t nh = (int64_t)nk * I;
            k_moe_act<<<(int)(nh < 4096LL * 256 ? cdiv(nh, 256) : 4096), 256, 0, st>>>(h, gu, nk, I, w->gated, w->act);
            LAUNCH_CHECK();
            experts_fmt(st, &w->down, h, y, offsets, perm, top_k, E, L, I, false);
        }
    }
    launch_pdl(k_moe_combine, dim3(n, cdiv(L, 256)), 256, 0, st, out, (const float *)y, ids, weights, rows, add, top_k,
               L);
}

// The shared expert joins the routed experts' GEMV launches where both are
// 16-bit in one format with one activation (no biases) and the batch takes
// the GEMV (takes_gemv: the one path that reads sh).
// The shared expert's down blocks a column block (moe_shared_down): the
// fewest, a power of two up to 8, that read no more of K each than a routed
// expert's block.
static int shared_slices(int I, int I_s) {
    int S = 1;
    while (S < 8 && I_s > S * I) S *= 2;
    return S;
}

static bool shared_fused(struct backend *be, const struct moe_experts *w, const struct moe_experts *s, int n) {
    enum wfmt f = w->up.fmt;
    return (f == WF_BF16 || f == WF_F16) && s->up.fmt == f && s->down.fmt == f && !s->up.bias && !s->down.bias &&
           s->gated == w->gated && s->act == w->act && s->dim == w->dim && s->inter % 8 == 0 && takes_gemv(be, w, n);
}

void cuda_moe_experts(struct backend *be, float *out, const float *x, const struct moe_experts *w, const int32_t *ids,
                      const float *weights, int n, int top_k, const struct moe_shared *shared) {
    if (n <= 0) return; // expert count and top_k checked at load (cu_supports)
    moe_sh sh = {};
    if (shared && shared_fused(be, w, shared->w, n))
        sh = moe_sh{shared->w->up.data, shared->w->down.data, shared->h, shared->y, shared->w->inter,
                    shared_slices(w->inter, shared->w->inter)};
    else if (shared)
        moe_shared_fwd(be, shared, x, n); // its products first: the routed part's scratch is its own
    experts_run(be, out, x, w, ids, weights, n, top_k, shared ? shared->y : NULL, sh);
}
