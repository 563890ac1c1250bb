// cuda_qmma.cuh - quantized weights times a few rows of x on tensor cores
// (16-bit mode only: the "W8A16 / W4A16" semantic vLLM's Marlin kernels
// use). Shared by the dense GEMV (cuda_quant.cu) and meant for the routed
// experts' one (cuda_moe.cu).
//
// One mma.sync m16n8k16 (f16 in, fp32 sums) takes A = 16 weight rows x 16
// k, B = 16 k x 8 rows of x (tokens). Per the PTX ISA's fragment layout,
// lane = 4g + t holds A rows g, g + 8 and B column (token) g at the logical
// k 2t, 2t+1 (a[0] row g, a[1] row g + 8, b[0]) and 2t+8, 2t+9 (a[2], a[3],
// b[1]); C c[0], c[1]: row g, tokens 2t, 2t+1; c[2], c[3]: row g + 8.
// A dot product does not care which physical column a logical k is, so a
// warp takes QMMA_STEP = 128 columns a step as 8 mma (sub-steps m = 0..7),
// and lane t's 32 columns of the step are the ones it loads whole:
// - FP8 (e4m3 codes, per-row or 128-column block scales): two uint4 of
//   each row, columns 64i + 16t .. + 15 (i = 0, 1: each load instruction of
//   the warp reads 64 contiguous bytes a row); sub-step m = 4i + q takes the
//   load's word q: its low code pair -> a[0] / a[1], high pair -> a[2] / a[3]
//   (__nv_cvt_fp8x2_to_halfraw2: exact, one conversion per 2 weights).
// - NVFP4 (e2m1 codes, an e4m3 scale per 16 columns and one per row): one
//   uint4 of each row, columns 32t .. 32t + 31 (two 16-column blocks: their
//   two scale bytes are one 16-bit load); sub-step m = 2w + p takes word w
//   (element j at bits 4j) and its code pairs (2p, 2p + 4) -> a[0] / a[1],
//   (2p + 1, 2p + 5) -> a[2] / a[3], each as half2 of e2m1 * 2^-14 by bit
//   moves (no conversion), times the block scale in half: exact (see
//   qmma_e2m1).
// qmma_col says which physical column each lane's B register half is; x is
// staged in that order (qmma_stage_row), so a lane's B of a step is 4 uint4
// and the warp's loads are 512 contiguous bytes each: by a kernel before
// the GEMV (k_qmma_x, into scratch) or, for 1 or 2 rows of x, by each GEMV
// block itself into shared memory (no launch, no round trip; each block
// reads x from L2 once).
//
// x is fp32: each row is scaled by a power of two 2^sh (max |x| in [2^13,
// 2^14): no overflow, the scaling itself exact) and rounded to fp16 once,
// 2^-sh applied to the fp32 sums. Bound: each x value is off by at most
// 2^-11 of itself (fp16 rounding; values under 2^-14 of the scaled row,
// 2^-27 of its max |x|, by at most 2^-25 absolute, i.e. 2^-38 of max |x|),
// the products are exact in fp32 and the sums fp32, so |y - y_ref| <=
// (2^-11 + K 2^-24) sum_k |w_k x_k| (worst case; random errors: ~2^-11 /
// sqrt(3) of the root of sum w_k^2 x_k^2, ~1e-4 of max |y| at K 2688 for
// random data, against 2e-2 allowed in the bf16 mode).
#pragma once

#include "backend/cuda/cuda_common.cuh"

#define QMMA_STEP 128 // columns a warp takes a step (8 mma of 16 k)
#define QMMA_MAXB 64  // rows of x (tokens) one pass of the dense GEMV takes: 8 tiles of 8

// A quantized weight as its kernels take it (device pointers, struct weight's).
struct qweight {
    const uint8_t *codes;  // [N, K] e4m3, or [N, K/2] two e2m1 a byte (element 2i in the low nibble)
    const float *scale;    // [N] (WF_FP8, WF_NVFP4) or [N, ceil(K/128)] (WF_FP8_B128)
    const uint8_t *bscale; // WF_NVFP4: [N, K/16] e4m3
    int K;
};

// What a row's values share, applied to its fp32 sums: WF_FP8 its scale;
// WF_NVFP4 its scale * 2^14 (the codes decode to e2m1 * 2^-14: q_dq8,
// qmma_e2m1); WF_FP8_B128 none (1: its scales are per 128 columns).
template <enum wfmt F>
__device__ __forceinline__ float q_row_scale(const qweight &w, int64_t r) {
    if constexpr (F == WF_NVFP4) return w.scale[r] * 16384.0f; // exact: a power of two
    else if constexpr (F == WF_FP8) return w.scale[r];
    else return 1.0f;
}

// The physical column (within a step) of lane t's B register r (0, 1) half
// h (0, 1) of sub-step m (0..7): see the comment above.
__host__ __device__ constexpr int qmma_col(bool fp4, int t, int m, int r, int h) {
    return fp4 ? 32 * t + 8 * (m >> 1) + 2 * (m & 1) + r + 4 * h : 64 * (m >> 2) + 16 * t + 4 * (m & 3) + 2 * r + h;
}

// Steps of a row of K columns (the last may be partial: K % 64 == 0)
__host__ __device__ constexpr int qmma_steps(int K) { return (K + QMMA_STEP - 1) / QMMA_STEP; }
// Token tiles of n rows as the kernels are instantiated: 1, 2, 4, 8
static inline int qmma_tiles(int n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }
// Scratch of `rows` staged rows of x: their scales, then [rows / 8, steps, 4, 32] uint4
static inline size_t qmma_x_bytes(int rows, int K) {
    size_t r8 = (size_t)(rows + 7) / 8 * 8;
    return (4 * r8 + 255) / 256 * 256 + r8 / 8 * qmma_steps(K) * 4 * 32 * sizeof(uint4);
}

// The staged fp16 x (k_qmma_x, into scratch): row r of a group of 8 rows
// (a tile of B columns) as uint4 [rows / 8, steps, 4, 8, 4]: group r / 8,
// step s, load v of lane 4 (r % 8) + t holds row r's
// halves of sub-steps 2v, 2v + 1 in the order b[0] lo, hi, b[1] lo, hi
// (qmma_col); columns K.. zero. Each row scaled by 2^sh (max |x| 2^sh in
// [2^13, 2^14)), inv[r] = 2^-sh. All of the block's threads stage row r of
// x (xr; zeros when !live); red: 32 floats of shared memory.
template <bool FP4>
__device__ __forceinline__ void qmma_stage_row(uint4 *xs, float *inv, const float *xr, bool live, int K, int r,
                                               float *red) {
    int steps = qmma_steps(K);
    float m = 0;
    if (live)
        for (int i = threadIdx.x; i < K; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
    m = block_reduce<true>(m, red);
    int ex = (int)((__float_as_uint(m) >> 23) & 0xff) - 126;          // m < 2^ex (>= 2^(ex-1) unless subnormal)
    int sh = m > 0 && isfinite(m) ? max(-126, min(126, 14 - ex)) : 0; // max |x| 2^sh in [2^13, 2^14)
    float s = __uint_as_float((uint32_t)(127 + sh) << 23);           // 2^sh, exact
    if (threadIdx.x == 0) inv[r] = __uint_as_float((uint32_t)(127 - sh) << 23);
    for (int i = threadIdx.x; i < steps * 16; i += blockDim.x) { // (step, t, v)
        int st = i / 16, t = (i / 4) % 4, v = i % 4;
        __half h[8];
#pragma unroll
        for (int j = 0; j < 8; j++) { // half j of the uint4: sub-step 2v + j / 4, register (j / 2) % 2, half j % 2
            int c = st * QMMA_STEP + qmma_col(FP4, t, 2 * v + j / 4, (j / 2) % 2, j % 2);
            h[j] = __float2half_rn(live && c < K ? xr[c] * s : 0.0f);
        }
        xs[((int64_t)((r / 8) * steps + st) * 4 + v) * 32 + 4 * (r % 8) + t] = *(const uint4 *)h;
    }
}

// x [n, K] fp32 staged into xs, inv: a block a row (grid: the staged
// rows, a multiple of 8; rows n.. zero).
template <bool FP4>
__global__ void __launch_bounds__(256) k_qmma_x(uint4 *xs, float *inv, const float *x, int n, int K) {
    __shared__ float red[32];
    pdl_wait(); // x is the previous kernel's output
    pdl_trigger();
    int r = blockIdx.x;
    qmma_stage_row<FP4>(xs, inv, x + (int64_t)r * K, r < n, K, r, red);
}

// e2m1 codes j and j + 4 of word u (code i at bits 4i) as half2 of e2m1 *
// 2^-14 (sign to bit 15, exponent and mantissa to bits 9..11: e2m1's
// exponent becomes fp16's, its 0.5 the subnormal 2^-15), times bs (the
// block's e4m3 scale as half2) in half: exact, as e2m1 * scale has at most
// 6 significant bits and is a multiple of 2^-10, so with the 2^-14 a
// multiple of 2^-24 below 2^-2, which fp16 holds. The row's scale * 2^14
// goes on the fp32 sums.
__device__ __forceinline__ __half2 e2m1x2_h2(uint32_t u, int j) { // the half2 before the scale
    uint32_t t = u << (12 - 4 * j);
    uint32_t bits = (t & 0x80008000u) | ((t >> 3) & 0x0E000E00u);
    __half2 e;
    memcpy(&e, &bits, sizeof e);
    return e;
}
__device__ __forceinline__ uint32_t qmma_e2m1(uint32_t u, int j, __half2 bs) {
    __half2 p = __hmul2(e2m1x2_h2(u, j), bs);
    uint32_t o;
    memcpy(&o, &p, sizeof o);
    return o;
}

// A fragment of sub-step m for FP8 from the two rows' words (rows g, g + 8).
__device__ __forceinline__ void qmma_a_fp8(uint32_t a[4], uint32_t w0, uint32_t w1) {
    a[0] = e4m3x2_bits(w0), a[1] = e4m3x2_bits(w1), a[2] = e4m3x2_bits(w0 >> 16), a[3] = e4m3x2_bits(w1 >> 16);
}
// ... and for NVFP4 (p: the sub-step's half of the word; bs0, bs1: the rows' block scales)
__device__ __forceinline__ void qmma_a_fp4(uint32_t a[4], uint32_t w0, uint32_t w1, int p, __half2 bs0, __half2 bs1) {
    a[0] = qmma_e2m1(w0, 2 * p, bs0), a[1] = qmma_e2m1(w1, 2 * p, bs1);
    a[2] = qmma_e2m1(w0, 2 * p + 1, bs0), a[3] = qmma_e2m1(w1, 2 * p + 1, bs1);
}

// The staged x of `rows` rows in scratch (qmma_x_bytes), staged from x [n, K]
struct qmma_x {
    float *inv;
    const uint4 *xs;
};
template <bool FP4>
static inline qmma_x qmma_stage(cudaStream_t s, void *scratch, const float *x, int n, int rows, int K) {
    int r8 = (rows + 7) / 8 * 8;
    qmma_x q = {(float *)scratch, (const uint4 *)((char *)scratch + (4 * (size_t)r8 + 255) / 256 * 256)};
    launch_pdl(k_qmma_x<FP4>, r8, 256, 0, s, (uint4 *)q.xs, q.inv, x, n, K);
    return q;
}

// A lane's B of one step (the staged x): 4 uint4 loads of staged row src's
// (the B column of lane t's group), as qmma_stage_row put them
__device__ __forceinline__ void qmma_b(uint4 b[4], const uint4 *xs, int src, int steps, int step, int t) {
    const uint4 *p = xs + ((int64_t)((src / 8) * steps + step) * 4) * 32 + 4 * (src % 8) + t;
#pragma unroll
    for (int v = 0; v < 4; v++) b[v] = p[32 * v];
}
// ... and sub-step m's two registers of it
__device__ __forceinline__ void qmma_b_regs(uint32_t r[2], const uint4 b[4], int m) {
    const uint4 &u = b[m >> 1];
    r[0] = m & 1 ? u.z : u.x, r[1] = m & 1 ? u.w : u.y;
}

// A lane's codes of one step (QMMA_STEP columns) of its rows g and g + 8
template <enum wfmt F> struct qmma_a {
    uint4 c[2][2]; // [row][i]: columns 64i + 16t .. + 15
    float s[2];    // WF_FP8_B128: the rows' scales of the step's 128-column block
};
template <> struct qmma_a<WF_NVFP4> {
    uint4 c[2];  // [row]: columns 32t .. 32t + 31
    uint32_t b[2]; // [row]: their two blocks' e4m3 scales (bits 0..7, 8..15)
};

// Loads of step st (zeros past K: K % 64 == 0, so a last half step)
template <enum wfmt F>
__device__ __forceinline__ qmma_a<F> qmma_load(const qweight &w, const int64_t *row, int st, int t) {
    qmma_a<F> a;
    int c0 = st * QMMA_STEP, K = w.K;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if constexpr (F == WF_NVFP4) {
            bool ok = c0 + 32 * t < K;
            a.c[h] = ok ? __ldg((const uint4 *)(w.codes + row[h] * (K / 2) + c0 / 2) + t) : make_uint4(0, 0, 0, 0);
            a.b[h] = ok ? __ldg((const unsigned short *)(w.bscale + row[h] * (K / WF_NVFP4_GROUP) + c0 / 16) + t) : 0;
        } else {
#pragma unroll
            for (int i = 0; i < 2; i++)
                a.c[h][i] = c0 + 64 * i < K ? __ldg((const uint4 *)(w.codes + row[h] * K + c0 + 64 * i) + t)
                                            : make_uint4(0, 0, 0, 0);
            if constexpr (F == WF_FP8_B128) a.s[h] = __ldg(w.scale + row[h] * qmma_steps(K) + st);
        }
    }
    return a;
}

// The A fragment of sub-step m (0..7) from a step's codes
template <enum wfmt F>
__device__ __forceinline__ void qmma_frag(uint32_t f[4], const qmma_a<F> &a, int m) {
    if constexpr (F == WF_NVFP4) {
        int w = m >> 1;
        __half2 b0 = e4m3_bcast(a.b[0] >> (8 * (w >> 1))), b1 = e4m3_bcast(a.b[1] >> (8 * (w >> 1)));
        qmma_a_fp4(f, (&a.c[0].x)[w], (&a.c[1].x)[w], m & 1, b0, b1);
    } else {
        qmma_a_fp8(f, (&a.c[0][m >> 2].x)[m & 3], (&a.c[1][m >> 2].x)[m & 3]);
    }
}

// A warp's share of a tile product over the steps warp, warp + 8, ... of K:
// NA A tiles (row[a]: the lane's weight rows g and g + 8 of tile a; cur[a]:
// their codes of the warp's first step, loaded by the caller, before or
// after its PDL wait) times NT B tiles (src[nt]: the staged row of x lane
// group g's B column reads), into acc [NA][NT] C fragments. The next step's
// codes are loaded while this one computes; FP8 blocks sum each step (one
// 128-column block) into a fresh C, then acc += scale * C.
template <enum wfmt F, int NA, int NT>
__device__ __forceinline__ void qmma_run(const qweight &w, const int64_t (&row)[NA][2], qmma_a<F> (&cur)[NA],
                                         const uint4 *xs, const int (&src)[NT], float (&acc)[NA][NT][4]) {
    int t = threadIdx.x & 3, steps = qmma_steps(w.K);
#pragma unroll
    for (int a = 0; a < NA; a++)
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[a][i][j] = 0;
    for (int st = threadIdx.x >> 5; st < steps; st += 8) {
        qmma_a<F> nxt[NA];
#pragma unroll
        for (int a = 0; a < NA; a++)
            if (st + 8 < steps) nxt[a] = qmma_load<F>(w, row[a], st + 8, t);
#pragma unroll
        for (int a = 0; a < NA; a++) {
            uint32_t fa[8][4];
#pragma unroll
            for (int m = 0; m < 8; m++) qmma_frag<F>(fa[m], cur[a], m);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint4 b[4];
                qmma_b(b, xs, src[nt], steps, st, t);
                uint32_t br[8][2];
#pragma unroll
                for (int m = 0; m < 8; m++) qmma_b_regs(br[m], b, m);
                if constexpr (F == WF_FP8_B128) {
                    float c[4] = {0, 0, 0, 0};
#pragma unroll
                    for (int m = 0; m < 8; m++) mma16<__half>::run(c, fa[m], br[m]);
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[a][nt][j] = fmaf(cur[a].s[j >> 1], c[j], acc[a][nt][j]);
                } else {
#pragma unroll
                    for (int m = 0; m < 8; m++) mma16<__half>::run(acc[a][nt], fa[m], br[m]);
                }
            }
        }
#pragma unroll
        for (int a = 0; a < NA; a++) cur[a] = nxt[a];
    }
}

// The 8 warps' fragments into red (shared), then each thread's outputs i =
// threadIdx.x, + 256, ... < NA NT 128 read their sums (qmma_sum) in a fixed
// order: deterministic.
template <int NA, int NT>
__device__ __forceinline__ void qmma_reduce(float (*red)[NA][NT][4][32], const float (&acc)[NA][NT][4]) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int a = 0; a < NA; a++)
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) red[warp][a][i][j][lane] = acc[a][i][j];
    __syncthreads();
}
// Output i of the C fragments (per A tile): tile nt = i / 128, register j,
// lane l: weight row (l >> 2) + 8 (j >> 1) of the tile, B column 8 nt + 2 (l
// & 3) + (j & 1); its sum over the warps.
struct qmma_out {
    int r, col, nt, j, l;
};
__device__ __forceinline__ qmma_out qmma_at(int i) {
    int nt = i / 128, j = (i / 32) % 4, l = i % 32;
    return {(l >> 2) + 8 * (j >> 1), 8 * nt + 2 * (l & 3) + (j & 1), nt, j, l};
}
template <int NA, int NT>
__device__ __forceinline__ float qmma_sum(float (*red)[NA][NT][4][32], int a, const qmma_out &o) {
    float s = 0;
    for (int q = 0; q < 8; q++) s += red[q][a][o.nt][o.j][o.l];
    return s;
}
