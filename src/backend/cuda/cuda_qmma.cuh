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
// qmma_col says which physical column each lane's B register half is; the
// staging kernel (k_qmma_x) writes x in that order, so a lane's B of a step
// is 4 uint4 and the warp's loads are 512 contiguous bytes each.
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
#define QMMA_MAXB 64  // rows of x (tokens) one pass takes: 8 tiles of 8

// The physical column (within a step) of lane t's B register r (0, 1) half
// h (0, 1) of sub-step m (0..7): see the comment above.
__host__ __device__ constexpr int qmma_col(bool fp4, int t, int m, int r, int h) {
    return fp4 ? 32 * t + 8 * (m >> 1) + 2 * (m & 1) + r + 4 * h : 64 * (m >> 2) + 16 * t + 4 * (m & 3) + 2 * r + h;
}

// Steps of a row of K columns (the last may be partial: K % 64 == 0)
__host__ __device__ constexpr int qmma_steps(int K) { return (K + QMMA_STEP - 1) / QMMA_STEP; }
// Token tiles of n rows as the kernels are instantiated: 1, 2, 4, 8
static inline int qmma_tiles(int n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }
// Scratch of the staged x: 64 row scales, then [tiles, steps, 4, 32] uint4
static inline size_t qmma_x_bytes(int n, int K) {
    return 256 + (size_t)qmma_tiles(n) * qmma_steps(K) * 4 * 32 * sizeof(uint4);
}

// x [n, K] fp32 -> xs: the staged fp16 x (uint4 [tiles, steps, 4, 32]: tile
// nt, step s, load v of lane 4g + t holds token 8 nt + g's halves of
// sub-steps 2v, 2v + 1 in the order b[0] lo, hi, b[1] lo, hi), rows n.. and
// columns K.. zero; inv [8 tiles]: each row's 2^-sh. A block a row of x (grid
// 8 tiles), a uint4 a thread a pass.
template <bool FP4>
__global__ void __launch_bounds__(256) k_qmma_x(uint4 *xs, float *inv, const float *x, int n, int K) {
    __shared__ float red[32];
    int row = blockIdx.x, steps = qmma_steps(K), nt = row / 8, g = row % 8;
    pdl_wait(); // x is the previous kernel's output
    pdl_trigger();
    const float *xr = x + (int64_t)row * K;
    float m = 0;
    if (row < n)
        for (int i = threadIdx.x; i < K; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
    m = block_reduce<true>(m, red);
    int ex = (int)((__float_as_uint(m) >> 23) & 0xff) - 126;          // m < 2^ex (>= 2^(ex-1) unless subnormal)
    int sh = m > 0 && isfinite(m) ? max(-126, min(126, 14 - ex)) : 0; // max |x| 2^sh in [2^13, 2^14)
    float s = __uint_as_float((uint32_t)(127 + sh) << 23);           // 2^sh, exact
    if (threadIdx.x == 0) inv[row] = __uint_as_float((uint32_t)(127 - sh) << 23);
    for (int i = threadIdx.x; i < steps * 16; i += blockDim.x) { // (step, t, v)
        int st = i / 16, t = (i / 4) % 4, v = i % 4;
        __half h[8];
#pragma unroll
        for (int j = 0; j < 8; j++) { // half j of the uint4: sub-step 2v + j / 4, register (j / 2) % 2, half j % 2
            int c = st * QMMA_STEP + qmma_col(FP4, t, 2 * v + j / 4, (j / 2) % 2, j % 2);
            h[j] = __float2half_rn(row < n && c < K ? xr[c] * s : 0.0f);
        }
        xs[((int64_t)(nt * steps + st) * 4 + v) * 32 + 4 * g + t] = *(const uint4 *)h;
    }
}

// Two e4m3 codes (bits 0..15, the first low) as half2 (e4m3x2_h2), as a register
__device__ __forceinline__ uint32_t qmma_e4m3x2(uint32_t c) {
    __half2 h = e4m3x2_h2(c);
    uint32_t r;
    memcpy(&r, &h, sizeof r);
    return r;
}

// e2m1 codes j and j + 4 of word u (code i at bits 4i) as half2 of e2m1 *
// 2^-14 (sign to bit 15, exponent and mantissa to bits 9..11: e2m1's
// exponent becomes fp16's, its 0.5 the subnormal 2^-15), times bs (the
// block's e4m3 scale as half2) in half: exact, as e2m1 * scale has at most
// 6 significant bits and is a multiple of 2^-10, so with the 2^-14 a
// multiple of 2^-24 below 2^-2, which fp16 holds. The row's scale * 2^14
// goes on the fp32 sums.
__device__ __forceinline__ uint32_t qmma_e2m1(uint32_t u, int j, __half2 bs) {
    uint32_t t = u << (12 - 4 * j);
    uint32_t bits = (t & 0x80008000u) | ((t >> 3) & 0x0E000E00u);
    __half2 e, p;
    memcpy(&e, &bits, sizeof e);
    p = __hmul2(e, bs);
    uint32_t o;
    memcpy(&o, &p, sizeof o);
    return o;
}

// A fragment of sub-step m for FP8 from the two rows' words (rows g, g + 8).
__device__ __forceinline__ void qmma_a_fp8(uint32_t a[4], uint32_t w0, uint32_t w1) {
    a[0] = qmma_e4m3x2(w0), a[1] = qmma_e4m3x2(w1), a[2] = qmma_e4m3x2(w0 >> 16), a[3] = qmma_e4m3x2(w1 >> 16);
}
// ... and for NVFP4 (p: the sub-step's half of the word; bs0, bs1: the rows' block scales)
__device__ __forceinline__ void qmma_a_fp4(uint32_t a[4], uint32_t w0, uint32_t w1, int p, __half2 bs0, __half2 bs1) {
    a[0] = qmma_e2m1(w0, 2 * p, bs0), a[1] = qmma_e2m1(w1, 2 * p, bs1);
    a[2] = qmma_e2m1(w0, 2 * p + 1, bs0), a[3] = qmma_e2m1(w1, 2 * p + 1, bs1);
}

// A lane's B of one step of token tile nt (the staged x): 4 uint4 loads
__device__ __forceinline__ void qmma_b(uint4 b[4], const uint4 *xs, int nt, int steps, int step, int lane) {
    const uint4 *p = xs + ((int64_t)(nt * steps + step) * 4) * 32 + lane;
#pragma unroll
    for (int v = 0; v < 4; v++) b[v] = p[32 * v];
}
// ... and sub-step m's two registers of it
__device__ __forceinline__ void qmma_b_regs(uint32_t r[2], const uint4 b[4], int m) {
    const uint4 &u = b[m >> 1];
    r[0] = m & 1 ? u.z : u.x, r[1] = m & 1 ? u.w : u.y;
}
