// cuda_quant.cu - FP8 weights on CUDA, weight-only (WF_FP8: e4m3 codes [N, K]
// and a per-row scale, backend.h): a decode GEMV that reads 1 byte per weight,
// widens codes in registers (e4m3 -> half -> float: exact) and accumulates in
// fp32; the CPU reference's matmul on the same weight is its ground truth
// (tests/cuda/test_cuda_fp8.c). Up to 16 rows of x per pass; more rows run in
// passes of 16 (prefill with FP8 weights is correct on CUDA, not fast: the
// FP8 tensor-core GEMM is not written yet).
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"

#define FP8_GEMV_ROWS 4   // weight rows per block (each x value loaded serves 4)
#define FP8_GEMV_MAXB 16  // rows of x per pass

// 16 codes of a uint4 -> 16 floats (e4m3 -> half -> float, both exact).
__device__ __forceinline__ void fp8x16(const uint4 &u, float *f) {
    const __nv_fp8x2_storage_t *p = (const __nv_fp8x2_storage_t *)&u;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        __half2 h(__nv_cvt_fp8x2_to_halfraw2(p[i], __NV_E4M3));
        float2 v = __half22float2(h);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}

// A block owns FP8_GEMV_ROWS weight rows; its 8 warps split K (16 codes a
// lane a load) and reduce through shared memory in a fixed order
// (deterministic). nb <= NB rows of x; K % 16 == 0, x 16-byte aligned.
template <int NB>
__global__ void __launch_bounds__(256) k_gemv_fp8(float *y, const float *x, const uint8_t *w, const float *scale,
                                                  int N, int K, int nb) {
    __shared__ float red[8][FP8_GEMV_ROWS][NB];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, row0 = blockIdx.x * FP8_GEMV_ROWS;
    const uint4 *wr[FP8_GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < FP8_GEMV_ROWS; r++) wr[r] = (const uint4 *)(w + (int64_t)min(row0 + r, N - 1) * K);
    float acc[FP8_GEMV_ROWS][NB];
#pragma unroll
    for (int r = 0; r < FP8_GEMV_ROWS; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) acc[r][b] = 0;
    for (int k16 = warp * 32 + lane; k16 < K / 16; k16 += 256) {
        uint4 u[FP8_GEMV_ROWS];
#pragma unroll
        for (int r = 0; r < FP8_GEMV_ROWS; r++) u[r] = __ldg(wr[r] + k16); // all loads in flight first
        float wf[FP8_GEMV_ROWS][16];
#pragma unroll
        for (int r = 0; r < FP8_GEMV_ROWS; r++) fp8x16(u[r], wf[r]);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            if (b >= nb) break;
            const float4 *xp = (const float4 *)(x + (int64_t)b * K + (int64_t)k16 * 16);
            float4 x4[4] = {xp[0], xp[1], xp[2], xp[3]};
            const float *xs = (const float *)x4;
#pragma unroll
            for (int r = 0; r < FP8_GEMV_ROWS; r++)
#pragma unroll
                for (int i = 0; i < 16; i++) acc[r][b] += wf[r][i] * xs[i];
        }
    }
#pragma unroll
    for (int r = 0; r < FP8_GEMV_ROWS; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float v = warp_sum(acc[r][b]);
            if (lane == 0) red[warp][r][b] = v;
        }
    __syncthreads();
    if (threadIdx.x < FP8_GEMV_ROWS * NB) {
        int r = threadIdx.x / NB, b = threadIdx.x % NB;
        float v = 0;
        for (int q = 0; q < 8; q++) v += red[q][r][b];
        if (row0 + r < N && b < nb) y[(int64_t)b * N + row0 + r] = v * scale[row0 + r];
    }
}

// Any K and alignment: a warp per weight row, one code a lane a step.
__global__ void __launch_bounds__(256) k_gemv_fp8_any(float *y, const float *x, const uint8_t *w, const float *scale,
                                                      int N, int K, int nb) {
    int row = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    float acc[FP8_GEMV_MAXB];
#pragma unroll
    for (int b = 0; b < FP8_GEMV_MAXB; b++) acc[b] = 0;
    for (int k = lane; k < K; k += 32) {
        __half h(__nv_cvt_fp8_to_halfraw(w[(int64_t)row * K + k], __NV_E4M3));
        float v = __half2float(h);
#pragma unroll
        for (int b = 0; b < FP8_GEMV_MAXB; b++)
            if (b < nb) acc[b] += v * x[(int64_t)b * K + k];
    }
#pragma unroll
    for (int b = 0; b < FP8_GEMV_MAXB; b++) {
        float s = warp_sum(acc[b]);
        if (lane == 0 && b < nb) y[(int64_t)b * N + row] = s * scale[row];
    }
}

void cuda_matmul_fp8(struct backend *be, float *y, const float *x, const struct weight *w, int n) {
    cudaStream_t s = cu(be)->stream;
    int N = (int)w->rows, K = (int)w->cols;
    const uint8_t *codes = (const uint8_t *)w->data;
    for (int r0 = 0; r0 < n; r0 += FP8_GEMV_MAXB) {
        int nb = min(FP8_GEMV_MAXB, n - r0);
        const float *xr = x + (int64_t)r0 * K;
        float *yr = y + (int64_t)r0 * N;
        bool vec = K % 16 == 0 && !((uintptr_t)xr & 15) && !((uintptr_t)codes & 15);
        if (!vec) k_gemv_fp8_any<<<cdiv(N, 8), 256, 0, s>>>(yr, xr, codes, w->scale, N, K, nb);
        else if (nb <= 4) k_gemv_fp8<4><<<cdiv(N, FP8_GEMV_ROWS), 256, 0, s>>>(yr, xr, codes, w->scale, N, K, nb);
        else if (nb <= 8) k_gemv_fp8<8><<<cdiv(N, FP8_GEMV_ROWS), 256, 0, s>>>(yr, xr, codes, w->scale, N, K, nb);
        else k_gemv_fp8<16><<<cdiv(N, FP8_GEMV_ROWS), 256, 0, s>>>(yr, xr, codes, w->scale, N, K, nb);
        LAUNCH_CHECK();
    }
}
