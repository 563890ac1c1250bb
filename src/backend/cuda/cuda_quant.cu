// cuda_quant.cu - quantized dense weights on CUDA (backend.h: WF_FP8 with a
// scale per row, WF_FP8_B128 with 128x128 block scales, WF_NVFP4 with e4m3
// scales per 16 and one per row). Every weight value is wfmt_dequant's
// (src/backend/wquant.c), bit for bit, made in registers from the codes; the
// CPU reference's matmul on the same weight is the ground truth
// (tests/cuda/test_cuda_quant.c).
// - 1..4 rows of x (decode): a GEMV that reads each code once (1 byte a
//   weight; NVFP4 half a byte and an e4m3 scale per 16), x in fp32, fp32
//   accumulation: a resident grid streaming whole rows (k_gemv_qw), with
//   the bias, matmul_act's activation and matmul_act_mul's gating in its
//   epilogue; also one token's routed experts. Its dequantization bounds it
//   at more rows (instructions, not bytes), so more rows go the ways below
//   (cuda_gemv_quant says where each was measured faster).
// - 16-bit mode, K % 64 == 0: 5 to 64 rows on tensor cores (cuda_qmma.cuh:
//   codes to fp16 in registers, x in fp16, fp32 sums).
// - More rows, WF_FP8 in 16-bit mode: W8A8 on FP8 tensor cores (x quantized
//   per token, cuBLASLt's e4m3 GEMM; VLLM_FP8_W8A8=0 turns it off): 1 byte a
//   weight, as vLLM runs FP8 checkpoints.
// - Else (fp32 mode, FP8 blocks, NVFP4): the weight dequantized into scratch
//   in the model's --dtype (be->weight_dtype: fp32 in the exactness gates,
//   else bf16 / fp16), then the GEMM the dense weights of that type run
//   (cuda_backend.cu).
#include <cuda_fp8.h>

#include "backend/cuda/cuda_qmma.cuh"

#define QCHUNK 16 // columns a dequantizing thread loads a step: 16 e4m3 codes (16 bytes), or one NVFP4 block (8 bytes)

static qweight qweight_of(const struct weight *w) {
    return {(const uint8_t *)w->data, w->scale, w->bscale, (int)w->cols};
}

// An e2m1 code's bits as an fp16 of value e2m1 * 2^-14: the sign to bit 15,
// exponent and mantissa (3 bits) to bits 9..11, so that the e2m1 exponent
// becomes the fp16 one (e2m1's 0.5, exponent 0, is the fp16 subnormal 2^-15).
__device__ __forceinline__ float e2m1_f(unsigned c) {
    __half_raw h;
    h.x = (unsigned short)(((c & 7) << 9) | ((c & 8) << 12));
    return __half2float(__half(h)) * 16384.0f; // exact: a power of two
}

// Element [r][c] as wfmt_dequant makes it, in the same order (any K).
template <enum wfmt F>
__device__ __forceinline__ float q_value(const qweight &w, int64_t r, int c) {
    if constexpr (F == WF_NVFP4) {
        uint8_t b = w.codes[r * (w.K / 2) + c / 2];
        float block = e4m3_f(w.bscale[r * (w.K / WF_NVFP4_GROUP) + c / WF_NVFP4_GROUP]);
        return (e2m1_f((c & 1) ? b >> 4 : b & 15) * block) * w.scale[r];
    } else if constexpr (F == WF_FP8_B128) {
        return e4m3_f(w.codes[r * w.K + c]) * w.scale[r * ((w.K + WF_B128 - 1) / WF_B128) + c / WF_B128];
    } else {
        return e4m3_f(w.codes[r * w.K + c]) * w.scale[r];
    }
}

// One chunk (QCHUNK columns) of a row: its codes and the scale its values need.
template <enum wfmt F> struct qchunk {
    uint4 c;    // 16 e4m3 codes
    float s;    // WF_FP8: the row's scale; WF_FP8_B128: the 128-column block's
};
template <> struct qchunk<WF_NVFP4> {
    uint2 c;    // 16 e2m1 codes (element 2i in the low nibble of byte i)
    uint8_t b;  // the block's e4m3 scale
};

template <enum wfmt F>
__device__ __forceinline__ qchunk<F> q_load(const qweight &w, int64_t r, int k, float rs) {
    qchunk<F> q;
    if constexpr (F == WF_NVFP4) {
        q.c = __ldg((const uint2 *)(w.codes + r * (w.K / 2)) + k);
        q.b = __ldg(w.bscale + r * (w.K / WF_NVFP4_GROUP) + k);
    } else if constexpr (F == WF_FP8_B128) {
        q.c = __ldg((const uint4 *)(w.codes + r * w.K) + k);
        q.s = __ldg(w.scale + r * ((w.K + WF_B128 - 1) / WF_B128) + k * QCHUNK / WF_B128);
    } else {
        q.c = __ldg((const uint4 *)(w.codes + r * w.K) + k);
        q.s = rs;
    }
    return q;
}

// Values 8h .. 8h + 7 of a chunk into v, each wfmt_dequant's to the bit.
// FP8: e4m3 -> half -> float (exact), times the scale (the one rounding).
// NVFP4: two codes of a byte pair at a time as a half2 of e2m1 * 2^-14
// (e2m1_f's bits), times the block scale in fp16 -- exact: e2m1 * bscale has
// at most 6 significant bits and is a multiple of 2^-10 (bscale of 2^-9),
// so with the 2^-14 it is a multiple of 2^-24 below 2^-2, which fp16 holds --
// then times scale * 2^14 in fp32: the one rounding of (e2m1 * bscale) * scale.
template <enum wfmt F>
__device__ __forceinline__ void q_dq8(const qchunk<F> &q, int h, float rs, float *v) {
    if constexpr (F == WF_NVFP4) {
        uint32_t u = h ? q.c.y : q.c.x; // element j at bits 4j..4j+3
        __half2 bs = e4m3_bcast(q.b);
#pragma unroll
        for (int j = 0; j < 4; j++) { // elements j and j + 4 (e2m1x2_h2)
            float2 f = __half22float2(__hmul2(e2m1x2_h2(u, j), bs));
            v[j] = f.x * rs, v[j + 4] = f.y * rs;
        }
    } else {
        (void)rs;
        uint32_t p[2] = {h ? q.c.z : q.c.x, h ? q.c.w : q.c.y};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __nv_fp8x2_storage_t c2 = (__nv_fp8x2_storage_t)(p[i / 2] >> (16 * (i % 2)));
            float2 f = fp8x2_f2(c2);
            v[2 * i] = f.x * q.s, v[2 * i + 1] = f.y * q.s;
        }
    }
}

// ---- 1..CUDA_QGEMV_MAXB rows: a GEMV that streams the codes ----
//
// k_gemv_qw, the decode GEMV of quantized weights (k_gemv16w's schedule for
// codes): y [NB, N] = x [NB, K] W^T (+ bias). The grid is resident (XS: 1
// block of 16 warps an SM, else 2 of 8) and loops over groups of QW_R weight
// rows, handed to warps block-first (group g: block g % blocks), so every SM
// streams the same share. A warp streams its group's rows whole, U
// (qw_pick_u) 16-byte loads per row per lane per step (lane l of step s
// reads load s * 32 U + 32 j + l of each row: 16 e4m3 codes, or 32 e2m1
// codes and their two block-scale bytes), the next step's loads (the next group's
// first) issued before this step's arithmetic, the first before pdl_wait:
// 2 QW_R U loads a lane in flight. A load is one or two chunks of 16
// values: each chunk's dot with x is an fp32 sum, times its block scale
// (FP8 blocks: the 128-column block's; NVFP4: the e4m3 scale of its 16
// columns, the values e2m1 * 2^-14), added to the row's sum; the row scale
// (q_row_scale) goes on the row's sum once. With one-hot x each output is
// wfmt_dequant's value to the bit. XS: x [NB, K] fp32 staged once a block
// into shared memory, as P = V / 4 arrays of float4 a row (xq_at), so a
// warp's reads of one part are 16 consecutive bytes a lane (conflict-free);
// else the same float4 read from x (L1). Against the block-per-4-rows GEMV
// it replaced (H100, `cuda_ops 1 64 quant`): nano30b's in_proj FP8 at 1 row
// 14.20 -> 11.55 us (64.6 -> 80.2% of the copy rate), NVFP4 19.93 -> 10.00
// us (26 -> 52%; there the tensor-core GEMV's 15.2 on the H200); 4 rows
// 31.4 -> 15.7 us.
#define QW_R 2 // weight rows a warp streams at once
// 16-byte loads per row and lane a step (U): for more than one row of x, 2
// (at 4 their registers spill under the 128 a thread of a 16-warp block);
// for one, 2 to 4, whichever fills most of the last step's load slots (a
// row of KV loads takes ceil(KV / 32 U) steps; ties to the larger U): at K
// = 2,688 FP8 (KV 168) U = 4 fills 168 of 256 slots, U = 3 168 of 192. On
// an H100 (`cuda_ops 1 64 quant`, nano30b) against U = 4 everywhere: in_proj
// FP8 11.70 -> 11.21 us, NVFP4 10.01 -> 9.24; one token's routed experts FP8
// 32.64 -> 31.64, NVFP4 (U = 2 for down's K = 1,856) 29.33 -> 26.72.
static int qw_pick_u(int kv) {
    int best = 4;
    long best_slots = (long)cdiv(kv, 32 * 4) * 32 * 4;
    for (int u = 3; u >= 2; u--) {
        long slots = (long)cdiv(kv, 32 * u) * 32 * u;
        if (slots < best_slots) best = u, best_slots = slots;
    }
    return best;
}

template <bool XS> struct qw_shape {
    static constexpr int warps = XS ? 16 : 8, per_sm = XS ? 1 : 2;
};
// Values a 16-byte load of format F holds
template <enum wfmt F>
constexpr int QV = F == WF_NVFP4 ? 32 : 16;

// The block scales of load q (16-byte index within the row) of row r, raw:
// FP8 blocks: its 128-column block's fp32 scale (a load never straddles
// two); NVFP4: the e4m3 bytes of its two 16-column blocks; FP8: none.
template <enum wfmt F>
__device__ __forceinline__ uint32_t qw_bscale(const qweight &w, int64_t r, int q) {
    if constexpr (F == WF_FP8_B128)
        return __float_as_uint(__ldg(w.scale + r * ((w.K + WF_B128 - 1) / WF_B128) + q * 16 / WF_B128));
    else if constexpr (F == WF_NVFP4) return __ldg((const unsigned short *)(w.bscale + r * (w.K / WF_NVFP4_GROUP)) + q);
    else return 0;
}

// Where k_gemv_qw's groups of QW_R weight rows come from and go to (rows
// clamped: a partial last group reads a real row, its output unwritten).
// qw_dense: a weight [N, K] times x's NB rows; GATED (matmul_act_mul's [2I,
// K] gate | up): group g is hidden unit g, its gate row g and up row I + g,
// y [NB, I] = act(gate) * up; else y [NB, N] = x W^T + bias, act(kind) of
// it if act. The rows are known before pdl_wait (early).
template <bool GATED> struct qw_dense {
    static_assert(!GATED || QW_R == 2, "a GATED group is one hidden unit");
    static constexpr bool early = true;
    int N;
    const float *bias;
    enum act kind;
    bool act;
    __device__ int groups() const { return GATED ? N / 2 : (N + QW_R - 1) / QW_R; }
    __device__ int64_t row(int g, int r) const {
        if (GATED) return min(g, N / 2 - 1) + (r ? N / 2 : 0);
        return min(g * QW_R + r, N - 1);
    }
    __device__ int xrows(int nb) const { return nb; }
    __device__ int xrow(int, int b) const { return b; }
    __device__ float bias_of(int64_t o) const { return bias ? bias[o] : 0.0f; }
    // v: the group's sums, scaled and biased; lane r * NB + b writes one
    template <int NB>
    __device__ void store(float *y, int g, const float (&v)[QW_R][NB], int lane) const {
#pragma unroll
        for (int r = 0; r < (GATED ? 1 : QW_R); r++)
#pragma unroll
            for (int b = 0; b < NB; b++) {
                int o = g * QW_R + r;
                if (GATED && lane == b) y[(int64_t)b * (N / 2) + g] = act_dev(kind, v[0][b]) * v[1][b];
                else if (!GATED && lane == r * NB + b && o < N) y[(int64_t)b * N + o] = act ? act_dev(kind, v[r][b]) : v[r][b];
            }
    }
};
// qw_moe: one token's top_k routed experts (ids [k], each assignment j its
// expert's rows; the weight [E * rows, K] as a whole). UP: x the token's
// row [L]; gated: group g is hidden unit u of assignment j (rows U e + u and
// U e + I + u), h [k, I] = act(gate) * up; else rows u, u + 1 of W_e, h =
// act(W_e x). Down: rows o, o + 1 of W_e [L, I] times h's row j, y [k, L].
// The rows follow ids (the router's output): read after pdl_wait.
template <bool UP> struct qw_moe {
    static constexpr bool early = false;
    const int32_t *ids;
    int k, I, L, gated;
    enum act kind;
    __device__ int per() const { return UP && gated ? I : UP ? (I + 1) / 2 : (L + 1) / 2; } // groups an assignment
    __device__ int groups() const { return k * per(); }
    __device__ int64_t row(int g, int r) const {
        int j = g / per(), i = g % per();
        if (UP && gated) return (int64_t)ids[j] * 2 * I + i + (r ? I : 0);
        int M = UP ? I : L;
        return (int64_t)ids[j] * M + min(2 * i + r, M - 1);
    }
    __device__ int xrows(int) const { return UP ? 1 : k; }
    __device__ int xrow(int g, int) const { return UP ? 0 : g / per(); }
    __device__ float bias_of(int64_t) const { return 0.0f; }
    template <int NB>
    __device__ void store(float *y, int g, const float (&v)[QW_R][NB], int lane) const {
        int j = g / per(), i = g % per();
        if (UP && gated) {
            if (lane == 0) y[(int64_t)j * I + i] = act_dev(kind, v[0][0]) * v[1][0];
            return;
        }
        int M = UP ? I : L, o = 2 * i + lane;
        if (lane < QW_R && o < M) y[(int64_t)j * M + o] = UP ? act_dev(kind, v[lane][0]) : v[lane][0];
    }
};

// Step s of group g: v[r][j], bs[r][j] = load s * 32 U + 32 j + lane of row r (those < KV).
template <enum wfmt F, int U, class M>
__device__ __forceinline__ void qw_load(uint4 (&v)[QW_R][U], uint32_t (&bs)[QW_R][U], const qweight &w, const M &m,
                                        int g, int s, int KV, int lane) {
    int q0 = s * 32 * U + lane;
#pragma unroll
    for (int r = 0; r < QW_R; r++) {
        int64_t row = m.row(g, r);
        const uint4 *p = (const uint4 *)w.codes + row * KV + q0;
#pragma unroll
        for (int j = 0; j < U; j++)
            if (q0 + 32 * j < KV) v[r][j] = ld_weight(p + 32 * j), bs[r][j] = qw_bscale<F>(w, row, q0 + 32 * j);
    }
}

// Chunk c (16 values) of load u as floats, in column order: FP8 the e4m3
// values; NVFP4 e2m1 * 2^-14 (words 2c, 2c + 1; element j of a word at bits
// 4j: e2m1x2_h2).
template <enum wfmt F>
__device__ __forceinline__ void qw_chunk(const uint4 &u, int c, float (&f)[16]) {
    const uint32_t *wd = &u.x;
    if constexpr (F == WF_NVFP4) {
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float2 v = __half22float2(e2m1x2_h2(wd[2 * c + i], j));
                f[8 * i + j] = v.x, f[8 * i + j + 4] = v.y;
            }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 a = fp8x2_f2((__nv_fp8x2_storage_t)(wd[i] & 0xffffu)), b = fp8x2_f2((__nv_fp8x2_storage_t)(wd[i] >> 16));
            f[4 * i] = a.x, f[4 * i + 1] = a.y, f[4 * i + 2] = b.x, f[4 * i + 3] = b.y;
        }
    }
}

// The factor on chunk c's sum: FP8 blocks the 128-column block's scale,
// NVFP4 its 16 columns' e4m3 scale; FP8 1 (folded away).
template <enum wfmt F>
__device__ __forceinline__ float qw_chunk_scale(uint32_t bs, int c) {
    if constexpr (F == WF_NVFP4) return e4m3_f(bs >> (8 * c));
    else if constexpr (F == WF_FP8_B128) return __uint_as_float(bs);
    else return 1.0f;
}

// Part h (4 values: columns V q + 4h ..) of load q of x's row b.
template <enum wfmt F, bool XS>
__device__ __forceinline__ float4 xq_at(const float4 *xsh, const float *x, int b, int q, int h, int K) {
    constexpr int P = QV<F> / 4;
    if (XS) return xsh[(b * P + h) * (K / QV<F>) + q];
    return *(const float4 *)(x + (int64_t)b * K + QV<F> * q + 4 * h);
}

// The map M (qw_dense, qw_moe) gives the groups' rows, x's row for each and
// the epilogue; bias on each row's sum before any activation.
template <enum wfmt F, int NB, int U, bool XS, class M>
__global__ void __launch_bounds__(qw_shape<XS>::warps * 32, qw_shape<XS>::per_sm)
    k_gemv_qw(float *y, const float *x, qweight w, M m) {
    constexpr int V = QV<F>, P = V / 4, C = V / 16; // P float4 of x a load, C chunks of 16
    extern __shared__ float4 xsh[];                   // XS: [m.xrows(NB)][P][KV] float4 (xq_at)
    int lane = threadIdx.x & 31, K = w.K, KV = K / V, groups = m.groups();
    int steps = max(1, (KV + 32 * U - 1) / (32 * U));
    int nw = gridDim.x * qw_shape<XS>::warps, g = (threadIdx.x >> 5) * gridDim.x + blockIdx.x, s = 0;
    uint4 nxt[QW_R][U];
    uint32_t nbs[QW_R][U];
    if (M::early && g < groups) qw_load<F, U>(nxt, nbs, w, m, g, s, KV, lane);
    pdl_wait(); // x (and qw_moe's ids) are earlier kernels' outputs
    pdl_trigger();
    if (!M::early && g < groups) qw_load<F, U>(nxt, nbs, w, m, g, s, KV, lane);
    if (XS) { // x's float4 c of row b (columns 4c..) is part c % P of load c / P
        for (int i = threadIdx.x; i < m.xrows(NB) * K / 4; i += blockDim.x) {
            int b = i / (K / 4), c = i % (K / 4);
            const float *xp = x + (int64_t)b * K + 4 * c; // any alignment
            xsh[(b * P + c % P) * KV + c / P] = make_float4(xp[0], xp[1], xp[2], xp[3]);
        }
        __syncthreads();
    }
    float acc[QW_R][NB];
#pragma unroll
    for (int r = 0; r < QW_R; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) acc[r][b] = 0;
    while (g < groups) {
        uint4 cur[QW_R][U];
        uint32_t cbs[QW_R][U];
#pragma unroll
        for (int r = 0; r < QW_R; r++)
#pragma unroll
            for (int j = 0; j < U; j++) cur[r][j] = nxt[r][j], cbs[r][j] = nbs[r][j];
        int cg = g, q0 = s * 32 * U + lane, xr[NB];
#pragma unroll
        for (int b = 0; b < NB; b++) xr[b] = m.xrow(cg, b);
        if (++s == steps) s = 0, g += nw;
        if (g < groups) qw_load<F, U>(nxt, nbs, w, m, g, s, KV, lane);
#pragma unroll
        for (int j = 0; j < U; j++) {
            int q = q0 + 32 * j;
            if (q >= KV) break;
#pragma unroll
            for (int c = 0; c < C; c++) {
                float f[QW_R][16];
#pragma unroll
                for (int r = 0; r < QW_R; r++) qw_chunk<F>(cur[r][j], c, f[r]);
#pragma unroll
                for (int b = 0; b < NB; b++) {
                    float xs[16];
#pragma unroll
                    for (int h = 0; h < 4; h++) {
                        float4 v = xq_at<F, XS>(xsh, x, xr[b], q, 4 * c + h, K);
                        xs[4 * h] = v.x, xs[4 * h + 1] = v.y, xs[4 * h + 2] = v.z, xs[4 * h + 3] = v.w;
                    }
#pragma unroll
                    for (int r = 0; r < QW_R; r++) {
                        float p = 0;
#pragma unroll
                        for (int i = 0; i < 16; i++) p = fmaf(f[r][i], xs[i], p);
                        if constexpr (F == WF_FP8) acc[r][b] += p;
                        else acc[r][b] = fmaf(p, qw_chunk_scale<F>(cbs[r][j], c), acc[r][b]);
                    }
                }
            }
        }
        if (s) continue; // group cg has steps left
        // cg done: every lane holds every sum, scaled and biased per row
#pragma unroll
        for (int r = 0; r < QW_R; r++) {
            int64_t o = m.row(cg, r);
#pragma unroll
            for (int b = 0; b < NB; b++) acc[r][b] = warp_sum(acc[r][b]) * q_row_scale<F>(w, o) + m.bias_of(o);
        }
        m.template store<NB>(y, cg, acc, lane);
#pragma unroll
        for (int r = 0; r < QW_R; r++)
#pragma unroll
            for (int b = 0; b < NB; b++) acc[r][b] = 0;
    }
}

// Any K and alignment: a warp per weight row, one value a lane a step.
template <enum wfmt F>
__global__ void __launch_bounds__(256) k_gemv_q_any(float *y, const float *x, qweight w, const float *bias, int N,
                                                    int nb) {
    pdl_wait();
    pdl_trigger();
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31, K = w.K;
    if (row >= N) return;
    float acc[CUDA_QGEMV_MAXB];
#pragma unroll
    for (int b = 0; b < CUDA_QGEMV_MAXB; b++) acc[b] = 0;
    for (int k = lane; k < K; k += 32) {
        float v = q_value<F>(w, row, k);
#pragma unroll
        for (int b = 0; b < CUDA_QGEMV_MAXB; b++)
            if (b < nb) acc[b] = fmaf(v, x[(int64_t)b * K + k], acc[b]);
    }
#pragma unroll
    for (int b = 0; b < CUDA_QGEMV_MAXB; b++) {
        float s = warp_sum(acc[b]);
        if (lane == 0 && b < nb) y[(int64_t)b * N + row] = s + (bias ? bias[row] : 0.0f);
    }
}

// ---- 16-bit mode, up to QMMA_MAXB rows: tensor cores (cuda_qmma.cuh) ----

// y [n, N] = x [n, K] W^T (+ bias), n <= 8 NT: a block a 16-row tile of W,
// its 8 warps taking its steps in turn (qmma_run; the first step's codes
// loaded before pdl_wait, under the previous kernel's tail) over x staged
// by k_qmma_x (xs, inv). A C per token tile; the warps' sums reduce
// through shared memory in a fixed order (deterministic); the epilogue
// applies the row scale (FP8; NVFP4's times 2^14), the row of x's 2^-sh
// and the bias.
template <enum wfmt F, int NT>
__global__ void __launch_bounds__(256) k_gemv_qmma(float *y, const uint4 *xs, const float *inv, qweight w,
                                                   const float *bias, int N, int n) {
    __shared__ float red[8][1][NT][4][32];
    int g = (threadIdx.x & 31) >> 2, row0 = blockIdx.x * 16;
    int64_t row[1][2] = {{min(row0 + g, N - 1), min(row0 + g + 8, N - 1)}};
    int src[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) src[i] = 8 * i + g; // past n: zero rows, not written
    qmma_a<F> cur[1] = {};
    if ((int)(threadIdx.x >> 5) < qmma_steps(w.K)) cur[0] = qmma_load<F>(w, row[0], threadIdx.x >> 5, threadIdx.x & 3);
    pdl_wait(); // x, xs: the previous kernel's
    pdl_trigger();
    float acc[1][NT][4];
    qmma_run<F, 1, NT>(w, row, cur, xs, src, acc);
    qmma_reduce<1, NT>(red, acc);
    for (int i = threadIdx.x; i < NT * 128; i += 256) {
        qmma_out o = qmma_at(i);
        int r = row0 + o.r;
        if (r >= N || o.col >= n) continue;
        float v = qmma_sum<1, NT>(red, 0, o) * q_row_scale<F>(w, r) * inv[o.col];
        y[(int64_t)o.col * N + r] = v + (bias ? bias[r] : 0.0f);
    }
}

template <enum wfmt F>
static void gemv_qmma(cudaStream_t s, float *y, const float *x, const struct weight *w, int n, void *scratch) {
    qweight q = qweight_of(w);
    int N = (int)w->rows, K = (int)w->cols, nt = qmma_tiles(n);
    dim3 g(cdiv(N, 16));
    qmma_x sx = qmma_stage<F == WF_NVFP4>(s, scratch, x, n, 8 * nt, K);
    switch (nt) {
    case 1: launch_pdl(k_gemv_qmma<F, 1>, g, 256, 0, s, y, sx.xs, sx.inv, q, w->bias, N, n); break;
    case 2: launch_pdl(k_gemv_qmma<F, 2>, g, 256, 0, s, y, sx.xs, sx.inv, q, w->bias, N, n); break;
    case 4: launch_pdl(k_gemv_qmma<F, 4>, g, 256, 0, s, y, sx.xs, sx.inv, q, w->bias, N, n); break;
    default: launch_pdl(k_gemv_qmma<F, 8>, g, 256, 0, s, y, sx.xs, sx.inv, q, w->bias, N, n); break;
    }
}

// The tensor-core GEMV's conditions: 16-bit mode (not VLLM_QMMA=0), K % 64
// == 0, the codes 16-byte aligned (NVFP4's block scales 2).
static bool qmma_fits(const struct backend *be, const struct weight *w) {
    cuda_impl *c = (cuda_impl *)be->impl;
    return c->qmma && (be->weight_dtype == WF_BF16 || be->weight_dtype == WF_F16) && w->cols % 64 == 0 &&
           !((uintptr_t)w->data & 15) && !((uintptr_t)w->bscale & 1);
}

int cuda_qgemv_rows(const struct backend *be, const struct weight *w) {
    return qmma_fits(be, w) ? QMMA_MAXB : CUDA_QGEMV_MAXB;
}

size_t cuda_qgemv_scratch(const struct backend *be, const struct weight *w, int n) {
    return qmma_fits(be, w) ? qmma_x_bytes(8 * qmma_tiles(MIN(n, QMMA_MAXB)), (int)w->cols) : 0;
}

// The chunked dequantization's conditions: K a multiple of 16, the codes
// and out 16-byte aligned.
static bool q_chunked(const void *out, const struct weight *w) {
    return w->cols % QCHUNK == 0 && !((uintptr_t)out & 15) && !((uintptr_t)w->data & 15);
}

// k_gemv_qw's conditions: K a multiple of a load's values (16; NVFP4 32),
// the codes 16-byte aligned (NVFP4's block scales 2), and x 16-byte aligned
// where it is read in place (xs: not staged).
static bool qw_fits(const float *x, const struct weight *w, bool xs) {
    int v = w->fmt == WF_NVFP4 ? 32 : 16;
    return w->cols % v == 0 && !((uintptr_t)w->data & 15) && !((uintptr_t)w->bscale & 1) && (xs || !((uintptr_t)x & 15));
}

// The epilogue of k_gemv_qw: what matmul (none), matmul_act (act) and
// matmul_act_mul (gated) write.
struct qw_epi {
    enum act kind;
    bool act, gated;
};

// k_gemv_qw over map m: x staged (XS) where its rows fit a block's shared memory.
template <enum wfmt F, int NB, int U, class M>
static void gemv_qw_launch_u(struct backend *be, cudaStream_t st, float *y, const float *x, const qweight &q,
                             const M &m, int groups, int xrows) {
    size_t sm = sizeof(float) * xrows * q.K;
    int sms = cu(be)->num_sms;
    if (sm <= cu(be)->smem_optin) {
        auto k = k_gemv_qw<F, NB, U, true, M>;
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
        launch_pdl(k, MIN(groups, qw_shape<true>::per_sm * sms), qw_shape<true>::warps * 32, sm, st, y, x, q, m);
    } else
        launch_pdl(k_gemv_qw<F, NB, U, false, M>, MIN(groups, qw_shape<false>::per_sm * sms),
                   qw_shape<false>::warps * 32, 0, st, y, x, q, m);
}
template <enum wfmt F, int NB, class M>
static void gemv_qw_launch(struct backend *be, cudaStream_t st, float *y, const float *x, const qweight &q, const M &m,
                           int groups, int xrows) {
    if constexpr (NB > 1) return gemv_qw_launch_u<F, NB, 2>(be, st, y, x, q, m, groups, xrows);
    else switch (qw_pick_u(q.K / QV<F>)) {
    case 2: gemv_qw_launch_u<F, NB, 2>(be, st, y, x, q, m, groups, xrows); break;
    case 3: gemv_qw_launch_u<F, NB, 3>(be, st, y, x, q, m, groups, xrows); break;
    default: gemv_qw_launch_u<F, NB, 4>(be, st, y, x, q, m, groups, xrows); break;
    }
}
template <enum wfmt F, bool GATED>
static void gemv_qw(struct backend *be, float *y, const float *x, const qweight &q, const float *bias, int N, int n,
                    qw_epi e) {
    qw_dense<GATED> m = {N, bias, e.kind, e.act};
    int groups = GATED ? N / 2 : cdiv(N, QW_R);
    cudaStream_t st = cu(be)->stream;
    switch (n) {
    case 1: gemv_qw_launch<F, 1>(be, st, y, x, q, m, groups, n); break;
    case 2: gemv_qw_launch<F, 2>(be, st, y, x, q, m, groups, n); break;
    case 3: gemv_qw_launch<F, 3>(be, st, y, x, q, m, groups, n); break;
    default: gemv_qw_launch<F, 4>(be, st, y, x, q, m, groups, n); break;
    }
}

// n <= CUDA_QGEMV_MAXB rows: k_gemv_qw (x staged where n x K floats fit a
// block's shared memory). Returns 0 where its conditions fail: a plain
// product then takes the any-shape GEMV, the others matmul + act.
template <enum wfmt F>
static int gemv_q(struct backend *be, float *y, const float *x, const struct weight *w, int n, qw_epi e) {
    qweight q = qweight_of(w);
    int N = (int)w->rows;
    bool xs = sizeof(float) * n * w->cols <= cu(be)->smem_optin;
    if (!qw_fits(x, w, xs) || (e.gated && N % 2)) {
        if (e.act || e.gated) return 0;
        launch_pdl(k_gemv_q_any<F>, cdiv(N, 8), 256, 0, cu(be)->stream, y, x, q, w->bias, N, n);
    } else if (e.gated) gemv_qw<F, true>(be, y, x, q, w->bias, N, n, e);
    else gemv_qw<F, false>(be, y, x, q, w->bias, N, n, e);
    return 1;
}

// 1-4 rows: the streaming GEMV (k_gemv_qw), every format. On the H200
// (`cuda_ops 1 64 quant`) the tensor-core GEMV ran nano30b's in_proj FP8 at
// 17.55 us and NVFP4 at 14.56, the block-per-4-rows fp32 GEMV before
// k_gemv_qw 13.83 and 20.16 (and k_gemv_qw 11.55 and 10.00 on an H100,
// where that GEMV took 14.20 and 19.93). From 5 rows on the tensor cores win
// for every format (16 rows: in_proj FP8 18.4 against W8A8's 19.2 us, FP8
// blocks 17.8 against 43.6 dequantized, NVFP4 17.2 against 40.8).
void cuda_gemv_quant(struct backend *be, float *y, const float *x, const struct weight *w, int n) {
    cudaStream_t s = cu(be)->stream;
    bool mma = qmma_fits(be, w) && n > CUDA_QGEMV_MAXB;
    void *sc = mma ? cuda_scratch(be, cuda_qgemv_scratch(be, w, n)) : NULL;
    qw_epi e = {ACT_SILU, false, false};
    switch (w->fmt) {
    case WF_FP8: mma ? gemv_qmma<WF_FP8>(s, y, x, w, n, sc) : (void)gemv_q<WF_FP8>(be, y, x, w, n, e); break;
    case WF_FP8_B128:
        mma ? gemv_qmma<WF_FP8_B128>(s, y, x, w, n, sc) : (void)gemv_q<WF_FP8_B128>(be, y, x, w, n, e);
        break;
    case WF_NVFP4: mma ? gemv_qmma<WF_NVFP4>(s, y, x, w, n, sc) : (void)gemv_q<WF_NVFP4>(be, y, x, w, n, e); break;
    case WF_F32:
    case WF_BF16:
    case WF_F16: break; // dense: cuda_backend.cu's GEMVs
    }
}

int cuda_gemv_quant_act(struct backend *be, float *y, const float *x, const struct weight *w, int n, enum act kind,
                        int gated) {
    if (n > CUDA_QGEMV_MAXB) return 0;
    qw_epi e = {kind, !gated, gated != 0};
    switch (w->fmt) {
    case WF_FP8: return gemv_q<WF_FP8>(be, y, x, w, n, e);
    case WF_FP8_B128: return gemv_q<WF_FP8_B128>(be, y, x, w, n, e);
    case WF_NVFP4: return gemv_q<WF_NVFP4>(be, y, x, w, n, e);
    case WF_F32:
    case WF_BF16:
    case WF_F16: break; // dense: cuda_backend.cu's GEMVs
    }
    return 0;
}

// One token's routed experts (cuda_moe.cu's GEMV path at n = 1): up then
// down, each one k_gemv_qw launch over the k assignments' rows.
template <enum wfmt F>
static void experts1(struct backend *be, cudaStream_t st, const struct moe_experts *w, const float *x, float *h,
                     float *y, const int32_t *ids, int k) {
    int I = w->inter, L = w->dim;
    qweight up = {(const uint8_t *)w->up.data, w->up.scale, w->up.bscale, L};
    qweight down = {(const uint8_t *)w->down.data, w->down.scale, w->down.bscale, I};
    qw_moe<true> mu = {ids, k, I, L, w->gated, w->act};
    qw_moe<false> md = {ids, k, I, L, w->gated, w->act};
    gemv_qw_launch<F, 1>(be, st, h, x, up, mu, k * (w->gated ? I : cdiv(I, 2)), 1);
    gemv_qw_launch<F, 1>(be, st, y, h, down, md, k * cdiv(L, 2), k);
}

int cuda_qgemv_experts1(struct backend *be, cudaStream_t st, const struct moe_experts *w, const float *x, float *h,
                        float *y, const int32_t *ids, int top_k) {
    int v = w->up.fmt == WF_NVFP4 ? 32 : 16;
    if (w->up.fmt != w->down.fmt || w->up.bias || w->down.bias || w->dim % v || w->inter % v ||
        ((uintptr_t)w->up.data | (uintptr_t)w->down.data) & 15 || ((uintptr_t)w->up.bscale | (uintptr_t)w->down.bscale) & 1 ||
        ((uintptr_t)x | (uintptr_t)h) & 15)
        return 0;
    switch (w->up.fmt) {
    case WF_FP8: experts1<WF_FP8>(be, st, w, x, h, y, ids, top_k); return 1;
    case WF_FP8_B128: experts1<WF_FP8_B128>(be, st, w, x, h, y, ids, top_k); return 1;
    case WF_NVFP4: experts1<WF_NVFP4>(be, st, w, x, h, y, ids, top_k); return 1;
    case WF_F32:
    case WF_BF16:
    case WF_F16: break; // not quantized: k_moe_gemv
    }
    return 0;
}

// ---- prefill: the weight dequantized to a dense one ----

__device__ __forceinline__ void store8(float *o, const float *v) {
    ((float4 *)o)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4 *)o)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename T>
__device__ __forceinline__ void store8(T *o, const float *v) { // 16-bit: rounded to nearest even
    T t[8];
#pragma unroll
    for (int i = 0; i < 8; i++) t[i] = (T)v[i];
    *(uint4 *)o = *(const uint4 *)t;
}

// out [N, K] = W, a chunk a thread (the chunked kernels' conditions).
template <enum wfmt F, typename T>
__global__ void k_dequant(T *out, qweight w, int N) {
    int nk = w.K / QCHUNK;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)N * nk;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / nk;
        int k = (int)(i % nk);
        float rs = q_row_scale<F>(w, r), v[8];
        qchunk<F> q = q_load<F>(w, r, k, rs);
        T *o = out + r * w.K + (int64_t)k * QCHUNK;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            q_dq8<F>(q, h, rs, v);
            store8(o + 8 * h, v);
        }
    }
}

// Any K and alignment: a value a thread.
template <enum wfmt F, typename T>
__global__ void k_dequant_any(T *out, qweight w, int N) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)N * w.K;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = (T)q_value<F>(w, i / w.K, (int)(i % w.K));
}

// The dense format a quantized weight's GEMM runs in: the model's --dtype.
static enum wfmt dq_fmt(const struct backend *be) {
    switch (be->weight_dtype) {
    case WF_BF16: return WF_BF16;
    case WF_F16: return WF_F16;
    case WF_F32:
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: break; // a --dtype is never quantized
    }
    return WF_F32;
}

size_t cuda_dequant_bytes(const struct backend *be, const struct weight *w) {
    size_t b = (size_t)w->rows * w->cols * wfmt_size(dq_fmt(be));
    return (b + 255) / 256 * 256;
}

template <enum wfmt F, typename T>
static void dequant_t(cudaStream_t s, T *out, const struct weight *w) {
    qweight q = qweight_of(w);
    int N = (int)w->rows;
    bool chunked = q_chunked(out, w);
    int64_t n = chunked ? (int64_t)N * (w->cols / QCHUNK) : (int64_t)N * w->cols;
    int grid = (int)MIN(cdiv(n, 256), 65536);
    if (chunked) k_dequant<F, T><<<grid, 256, 0, s>>>(out, q, N);
    else k_dequant_any<F, T><<<grid, 256, 0, s>>>(out, q, N);
    LAUNCH_CHECK();
}

template <enum wfmt F>
static void dequant_f(cudaStream_t s, void *out, enum wfmt to, const struct weight *w) {
    switch (to) {
    case WF_BF16: dequant_t<F>(s, (__nv_bfloat16 *)out, w); break;
    case WF_F16: dequant_t<F>(s, (__half *)out, w); break;
    case WF_F32:
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: dequant_t<F>(s, (float *)out, w); break; // dq_fmt gives F32 for these
    }
}

struct weight cuda_dequant(struct backend *be, const struct weight *w, void *dst) {
    cudaStream_t s = cu(be)->stream;
    enum wfmt to = dq_fmt(be);
    switch (w->fmt) {
    case WF_FP8: dequant_f<WF_FP8>(s, dst, to, w); break;
    case WF_FP8_B128: dequant_f<WF_FP8_B128>(s, dst, to, w); break;
    case WF_NVFP4: dequant_f<WF_NVFP4>(s, dst, to, w); break;
    case WF_F32:
    case WF_BF16:
    case WF_F16: break; // not quantized: never asked
    }
    struct weight d = {};
    d.data = dst, d.fmt = to, d.rows = w->rows, d.cols = w->cols;
    return d;
}

// ---- more than CUDA_QGEMV_MAXB rows of WF_FP8 as W8A8 (VLLM_FP8_W8A8=0: off) ----

// x [n, K] fp32 -> q [n, K] e4m3 and s [n]: each row's largest |x| / 448
// (1 for a zero row), q = e4m3(x / s) rounded to nearest. A block a row.
__global__ void k_quant_rows(uint8_t *q, float *s, const float *x, int K) {
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * K;
    float m = 0;
    for (int i = threadIdx.x; i < K; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
    m = block_reduce<true>(m, red);
    float sc = m > 0 ? m / 448.0f : 1.0f;
    if (threadIdx.x == 0) s[blockIdx.x] = sc;
    for (int i = threadIdx.x; i < K; i += blockDim.x)
        q[(int64_t)blockIdx.x * K + i] = __nv_cvt_float_to_fp8(xr[i] / sc, __NV_SATFINITE, __NV_E4M3);
}

// y [n, N] = x W^T on FP8 tensor cores: x quantized per token (k_quant_rows,
// into scratch), then cuBLASLt's e4m3 x e4m3 GEMM with fp32 accumulation,
// the weight's row scales and the tokens' scales applied as outer vectors,
// fp32 out. Less exact than the dequantized bf16 GEMM (x rounded to 3
// mantissa bits, not 7: ~2.5e-2 of max |y| against ~2.5e-3, emulated on the
// host at nano30b's K; vLLM's FP8 path rounds the same way), so never in the
// fp32 mode; 1.53x the bf16 GEMM's FLOP/s at 8192 rows on the H200.
int cuda_matmul_w8a8(struct backend *be, float *y, const float *x, const struct weight *w, int n, void *scratch) {
    cuda_impl *c = cu(be);
    int N = (int)w->rows, K = (int)w->cols;
    if (!c->w8a8 || w->fmt != WF_FP8 || dq_fmt(be) == WF_F32 || K % 16) return 0;
    uint8_t *q = (uint8_t *)scratch;
    float *ts = (float *)(q + ((size_t)n * K + 255) / 256 * 256);
    struct lt_plan *p = cuda_lt_plan(c, N, K, n, WF_FP8, w->scale, ts, 0);
    cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (p && p->ok) {
        k_quant_rows<<<n, 256, 0, c->stream>>>(q, ts, x, K);
        LAUNCH_CHECK();
        const float one = 1.0f, zero = 0.0f;
        const float *a = w->scale;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a, sizeof a));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &ts, sizeof ts));
        st = cublasLtMatmul(c->lt, p->op, &one, w->data, p->la, q, p->lb, &zero, y, p->lc, y, p->lc, &p->algo,
                            c->blas_ws, c->blas_ws_bytes, c->stream);
        if (st != CUBLAS_STATUS_SUCCESS) p->ok = 0; // not again for this shape
    }
    if (st == CUBLAS_STATUS_SUCCESS) return 1;
    if (c->w8a8 == 1) // said once: the run goes on dequantized
        fprintf(stderr, "vllm: VLLM_FP8_W8A8: cuBLASLt runs no FP8 GEMM of [%d, %d] x [%d, %d]^T (status %d): "
                "dequantized to 16 bits instead\n", n, K, N, K, (int)st);
    c->w8a8 = 2;
    return 0;
}
