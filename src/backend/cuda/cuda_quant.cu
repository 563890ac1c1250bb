// cuda_quant.cu - quantized dense weights on CUDA (backend.h: WF_FP8 with a
// scale per row, WF_FP8_B128 with 128x128 block scales, WF_NVFP4 with e4m3
// scales per 16 and one per row). Every weight value is wfmt_dequant's
// (src/backend/wquant.c), bit for bit, made in registers from the codes; the
// CPU reference's matmul on the same weight is the ground truth
// (tests/cuda/test_cuda_quant.c).
// - 1..4 rows of x (decode): a GEMV that reads each code once (1 byte a
//   weight; NVFP4 half a byte and an e4m3 scale per 16), x in fp32, fp32
//   accumulation, the bias in its epilogue. Its dequantization is the cost
//   (instructions, not bytes): on the H200, mamba in_proj FP8 at 1 row 13.7
//   us, at 16 rows 124.7 us, where dequantizing and the GEMM take ~42 us
//   (`cuda_ops ROWS 64 quant`), so more rows go the ways below.
// - 16-bit mode, K % 64 == 0: up to 64 rows on tensor cores (cuda_qmma.cuh:
//   codes to fp16 in registers, x in fp16, fp32 sums), FP8 from 5 rows on,
//   NVFP4 from 1 (cuda_gemv_quant says where each was measured faster).
// - More rows, WF_FP8 in 16-bit mode: W8A8 on FP8 tensor cores (x quantized
//   per token, cuBLASLt's e4m3 GEMM; VLLM_FP8_W8A8=0 turns it off): 1 byte a
//   weight, as vLLM runs FP8 checkpoints.
// - Else (fp32 mode, FP8 blocks, NVFP4): the weight dequantized into scratch
//   in the model's --dtype (be->weight_dtype: fp32 in the exactness gates,
//   else bf16 / fp16), then the GEMM the dense weights of that type run
//   (cuda_backend.cu).
#include <cuda_fp8.h>

#include "backend/cuda/cuda_qmma.cuh"

#define QCHUNK 16     // columns a lane loads per step: 16 e4m3 codes (16 bytes), or one NVFP4 block (8 bytes)
#define QGEMV_ROWS 4  // weight rows per block (each x value loaded serves 4)

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
        for (int j = 0; j < 4; j++) { // elements j and j + 4: their nibbles to bits 12..15 of each half
            uint32_t t = u << (12 - 4 * j);
            uint32_t bits = (t & 0x80008000u) | ((t >> 3) & 0x0E000E00u);
            __half2 e;
            memcpy(&e, &bits, sizeof e);
            float2 f = __half22float2(__hmul2(e, bs));
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

// y [nb, N] = x [nb, K] W^T (+ bias), nb <= NB. A block owns QGEMV_ROWS
// weight rows; its 8 warps split K a chunk a lane a step, the next step's
// chunks in flight while this one computes, and reduce through shared memory
// in a fixed order (deterministic). K % 16 == 0, codes and x 16-byte aligned.
template <enum wfmt F, int NB>
__global__ void __launch_bounds__(256) k_gemv_q(float *y, const float *x, qweight w, const float *bias, int N,
                                                int nb) {
    __shared__ float red[8][QGEMV_ROWS][NB];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, row0 = blockIdx.x * QGEMV_ROWS, K = w.K, nk = K / QCHUNK;
    int64_t row[QGEMV_ROWS];
    float rs[QGEMV_ROWS];
#pragma unroll
    for (int r = 0; r < QGEMV_ROWS; r++) row[r] = min(row0 + r, N - 1), rs[r] = q_row_scale<F>(w, row[r]);
    float acc[QGEMV_ROWS][NB];
#pragma unroll
    for (int r = 0; r < QGEMV_ROWS; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) acc[r][b] = 0;
    int k = warp * 32 + lane;
    qchunk<F> nxt[QGEMV_ROWS];
    if (k < nk)
#pragma unroll
        for (int r = 0; r < QGEMV_ROWS; r++) nxt[r] = q_load<F>(w, row[r], k, rs[r]);
    pdl_wait(); // x is the previous kernel's output
    pdl_trigger();
    for (; k < nk; k += 256) {
        qchunk<F> cur[QGEMV_ROWS];
#pragma unroll
        for (int r = 0; r < QGEMV_ROWS; r++) cur[r] = nxt[r];
        if (k + 256 < nk)
#pragma unroll
            for (int r = 0; r < QGEMV_ROWS; r++) nxt[r] = q_load<F>(w, row[r], k + 256, rs[r]);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float v[QGEMV_ROWS][8];
#pragma unroll
            for (int r = 0; r < QGEMV_ROWS; r++) q_dq8<F>(cur[r], h, rs[r], v[r]);
#pragma unroll
            for (int b = 0; b < NB; b++) {
                if (b >= nb) break;
                const float4 *xp = (const float4 *)(x + (int64_t)b * K + k * QCHUNK + h * 8);
                float4 x0 = xp[0], x1 = xp[1];
                float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int r = 0; r < QGEMV_ROWS; r++)
#pragma unroll
                    for (int i = 0; i < 8; i++) acc[r][b] = fmaf(v[r][i], xs[i], acc[r][b]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < QGEMV_ROWS; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float s = warp_sum(acc[r][b]);
            if (lane == 0) red[warp][r][b] = s;
        }
    __syncthreads();
    if (threadIdx.x < QGEMV_ROWS * NB) {
        int r = threadIdx.x / NB, b = threadIdx.x % NB;
        float s = 0;
        for (int q = 0; q < 8; q++) s += red[q][r][b];
        if (bias && row0 + r < N) s += bias[row0 + r];
        if (row0 + r < N && b < nb) y[(int64_t)b * N + row0 + r] = s;
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
// loaded before pdl_wait, under the previous kernel's tail) over the staged
// x: R 8, k_qmma_x's (xs, inv); R = n (1, 2: qmma_in_block), staged by the
// block itself into shared memory (dynamic: qmma_smem) from x [n, K]. A C
// per token tile; the warps' sums reduce through shared memory in a fixed
// order (deterministic); the epilogue applies the row scale (FP8; NVFP4's
// times 2^14), the row of x's 2^-sh and the bias.
template <enum wfmt F, int NT, int R>
__global__ void __launch_bounds__(256) k_gemv_qmma(float *y, const uint4 *xs, const float *inv, const float *x,
                                                   qweight w, const float *bias, int N, int n) {
    extern __shared__ uint4 xsm[];
    __shared__ float red[8][1][NT][4][32], invs[R];
    static_assert(R == 8 || NT == 1, "a block stages one tile at most");
    int g = (threadIdx.x & 31) >> 2, row0 = blockIdx.x * 16;
    int64_t row[1][2] = {{min(row0 + g, N - 1), min(row0 + g + 8, N - 1)}};
    int src[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) src[i] = R == 8 ? 8 * i + g : min(g, n - 1); // past n: not written
    qmma_a<F> cur[1] = {};
    if ((int)(threadIdx.x >> 5) < qmma_steps(w.K)) cur[0] = qmma_load<F>(w, row[0], threadIdx.x >> 5, threadIdx.x & 3);
    pdl_wait(); // x, xs: the previous kernel's
    pdl_trigger();
    if constexpr (R < 8) {
        qmma_stage_rows<F == WF_NVFP4, R>(xsm, invs, x, w.K, n, [](int r) { return r; });
        xs = xsm, inv = invs;
    }
    float acc[1][NT][4];
    qmma_run<F, 1, NT, R>(w, row, cur, xs, src, acc);
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
    if (qmma_in_block(n, K)) { // n 1, 2: no staging kernel
        size_t sm = qmma_smem(n, K);
        if (n == 1) launch_pdl(k_gemv_qmma<F, 1, 1>, g, 256, sm, s, y, (const uint4 *)0, (const float *)0, x, q, w->bias, N, n);
        else launch_pdl(k_gemv_qmma<F, 1, 2>, g, 256, sm, s, y, (const uint4 *)0, (const float *)0, x, q, w->bias, N, n);
        return;
    }
    qmma_x sx = qmma_stage<F == WF_NVFP4>(s, scratch, x, n, 8 * nt, K);
    switch (nt) {
    case 1: launch_pdl(k_gemv_qmma<F, 1, 8>, g, 256, 0, s, y, sx.xs, sx.inv, x, q, w->bias, N, n); break;
    case 2: launch_pdl(k_gemv_qmma<F, 2, 8>, g, 256, 0, s, y, sx.xs, sx.inv, x, q, w->bias, N, n); break;
    case 4: launch_pdl(k_gemv_qmma<F, 4, 8>, g, 256, 0, s, y, sx.xs, sx.inv, x, q, w->bias, N, n); break;
    default: launch_pdl(k_gemv_qmma<F, 8, 8>, g, 256, 0, s, y, sx.xs, sx.inv, x, q, w->bias, N, n); break;
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

// The chunked kernels' conditions: K a multiple of 16, the codes and x (the
// GEMV's input, the dequantization's output) 16-byte aligned.
static bool q_chunked(const void *x, const struct weight *w) {
    return w->cols % QCHUNK == 0 && !((uintptr_t)x & 15) && !((uintptr_t)w->data & 15);
}

template <enum wfmt F>
static void gemv_q(cudaStream_t s, float *y, const float *x, const struct weight *w, int n) {
    qweight q = qweight_of(w);
    int N = (int)w->rows;
    dim3 g(cdiv(N, QGEMV_ROWS));
    if (!q_chunked(x, w)) launch_pdl(k_gemv_q_any<F>, cdiv(N, 8), 256, 0, s, y, x, q, w->bias, N, n);
    else if (n == 1) launch_pdl(k_gemv_q<F, 1>, g, 256, 0, s, y, x, q, w->bias, N, n);
    else if (n == 2) launch_pdl(k_gemv_q<F, 2>, g, 256, 0, s, y, x, q, w->bias, N, n);
    else launch_pdl(k_gemv_q<F, 4>, g, 256, 0, s, y, x, q, w->bias, N, n);
}

// FP8 at 1-4 rows keeps the fp32 GEMV: on the H200 (`cuda_ops 1 64 quant`,
// the tensor-core GEMV against it) nano30b's in_proj 17.55 against 13.83 us,
// out_proj 10.05 against 5.80; NVFP4 14.56 against 20.16. From 5 rows on the
// tensor cores win for every format (16 rows: in_proj FP8 18.4 against W8A8's
// 19.2 us, FP8 blocks 17.8 against 43.6 dequantized, NVFP4 17.2 against 40.8).
void cuda_gemv_quant(struct backend *be, float *y, const float *x, const struct weight *w, int n) {
    cudaStream_t s = cu(be)->stream;
    bool mma = qmma_fits(be, w) && (w->fmt == WF_NVFP4 || n > CUDA_QGEMV_MAXB);
    void *sc = mma ? cuda_scratch(be, cuda_qgemv_scratch(be, w, n)) : NULL;
    switch (w->fmt) {
    case WF_FP8: mma ? gemv_qmma<WF_FP8>(s, y, x, w, n, sc) : gemv_q<WF_FP8>(s, y, x, w, n); break;
    case WF_FP8_B128: mma ? gemv_qmma<WF_FP8_B128>(s, y, x, w, n, sc) : gemv_q<WF_FP8_B128>(s, y, x, w, n); break;
    case WF_NVFP4: mma ? gemv_qmma<WF_NVFP4>(s, y, x, w, n, sc) : gemv_q<WF_NVFP4>(s, y, x, w, n); break;
    case WF_F32:
    case WF_BF16:
    case WF_F16: break; // dense: cuda_backend.cu's GEMVs
    }
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
    struct lt_plan *p = cuda_lt_plan(c, N, K, n, WF_FP8, w->scale, ts);
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
