// cuda_common.cuh - internals shared by the CUDA backend's files.
// Every op here has a CPU reference op of the same name in src/backend/cpu/;
// tests/cuda/test_cuda_ops.c compares each pair.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

extern "C" {
#include "backend/backend.h"
#include "core/common.h"
}

#define CUDA_FENCES 16

// A cuBLASLt plan for one GEMM shape: y [n, N] = x [n, K] W^T (cuda_lt_plan).
struct lt_plan {
    // key: n the bucket of token counts it serves (cuda_lt_plan), fmt W's enum
    // wfmt, out16 y in W's 16-bit type (else fp32)
    int N, K, n, fmt, out16;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int ok;
};
#define LT_PLANS 256

struct cuda_impl {
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    struct lt_plan plans[LT_PLANS];
    int num_plans;
    void *blas_ws;
    size_t blas_ws_bytes;
    cudaEvent_t events[CUDA_FENCES]; // fences, used in turn
    int next_fence;
    int device, num_sms;
    size_t smem_optin; // max dynamic shared memory per block
    // scratch (grown on demand, device)
    void *scratch;
    size_t scratch_bytes;
    void *comm;      // ncclComm_t of a tensor-parallel group (cuda_nccl.cu); NULL alone
    int w8a8;        // WF_FP8 above the GEMV's rows as W8A8 (cuda_quant.cu; VLLM_FP8_W8A8=0: 0); 2 once a refusal was reported
    int gemv16;      // the 16-bit decode GEMV's kernel (cuda_backend.cu; VLLM_GEMV16 0 or 1; -1: by the weight's size)
    int qmma;        // quantized GEMVs of up to 64 rows on tensor cores in 16-bit mode (cuda_quant.cu; VLLM_QMMA=0: 0)
};

static inline cuda_impl *cu(struct backend *be) { return (cuda_impl *)be->impl; }

// A failed CUDA call is not recoverable mid-step: report it and abort, so a
// device fault never turns into silently wrong tokens.
#define CUDA_CHECK(x)                                                                                    \
    do {                                                                                                 \
        cudaError_t e_ = (x);                                                                            \
        if (e_ != cudaSuccess) {                                                                         \
            fprintf(stderr, "vllm: CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, \
                    cudaGetErrorString(e_));                                                             \
            abort();                                                                                     \
        }                                                                                                \
    } while (0)
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())
#define CUBLAS_CHECK(x)                                                                                   \
    do {                                                                                                  \
        cublasStatus_t s_ = (x);                                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                \
            fprintf(stderr, "vllm: cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__);            \
            abort();                                                                                      \
        }                                                                                                 \
    } while (0)

// Programmatic dependent launch (sm_90+). A kernel started with launch_pdl
// may begin while the one before it drains: before pdl_wait() it reads only
// weights (never what earlier work in the stream writes) and writes nothing,
// so a decode GEMV streams its first weights under the previous kernel's
// tail. pdl_trigger() lets the next kernel's blocks be scheduled; a kernel
// launched with launch_pdl calls it only after its own wait. cuda_pdl: 0
// below sm_90 or with VLLM_NO_PDL=1 (launch_pdl is then a plain launch).
extern int cuda_pdl;
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
template <typename... KArgs, typename... Args>
static inline void launch_pdl(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args... args) {
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid, c.blockDim = block, c.dynamicSmemBytes = smem, c.stream = s;
    c.attrs = &at, c.numAttrs = cuda_pdl ? 1 : 0;
    CUDA_CHECK(cudaLaunchKernelEx(&c, k, (KArgs)args...));
}

// Scratch of at least `bytes` on the device, valid until the next call.
void *cuda_scratch(struct backend *be, size_t bytes);

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// A weight load of a decode GEMV: 16 bytes that pass L1 by (x stays
// there), the L2 fetching 256-byte lines.
__device__ __forceinline__ uint4 ld_weight(const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
// Block-wide sum (MAX: maximum); every thread gets the result. blockDim.x
// multiple of 32, <= 1024.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float *red /* >= 32 floats shared */) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : MAX ? -INFINITY : 0.0f;
    return MAX ? warp_max(v) : warp_sum(v);
}
__device__ __forceinline__ float block_sum(float v, float *red) { return block_reduce<false>(v, red); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus_th(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float load_f(const float *p) { return *p; }
__device__ __forceinline__ float load_f(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load_f(const __half *p) { return __half2float(*p); }
// The fp8 KV cache (DT_FP8, backend.h's enum dtype): x / scale as an e4m3
// code, rounded to nearest even and saturating at +-448 (vLLM's
// scaled_convert), and codes back as floats (e4m3 -> half -> float: exact).
__device__ __forceinline__ __nv_fp8_e4m3 fp8_code(float x, float scale) {
    __nv_fp8_e4m3 c;
    c.__x = __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
    return c;
}
// Every e4m3 code widens through e4m3x2_h2 (and only it): two codes (bits
// 0..15, the first low) as half2, one conversion, exact; then to float
// exactly where fp32 is wanted.
__device__ __forceinline__ __half2 e4m3x2_h2(uint32_t c) {
    return __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(c & 0xffffu), __NV_E4M3));
}
__device__ __forceinline__ uint32_t e4m3x2_bits(uint32_t c) { // the half2's bits (an mma fragment's register)
    __half2 h = e4m3x2_h2(c);
    uint32_t r;
    memcpy(&r, &h, sizeof r);
    return r;
}
__device__ __forceinline__ float2 fp8x2_f2(__nv_fp8x2_storage_t p) { return __half22float2(e4m3x2_h2(p)); }
__device__ __forceinline__ float e4m3_f(uint32_t b) { return __low2float(e4m3x2_h2(b & 0xffu)); }
__device__ __forceinline__ float fp8_f(__nv_fp8_e4m3 c) { return e4m3_f(c.__x); }
// The e4m3 byte b (a block scale) as half in both halves
__device__ __forceinline__ __half2 e4m3_bcast(uint32_t b) { return e4m3x2_h2((b & 0xffu) * 0x101u); }
// Calls f with a null pointer of the KV cache's element type: float, bf16
// or e4m3 codes (DT_F16 is refused when the backend is created), so that
// each launcher names its kernels once.
template <typename F>
static inline void kv_dispatch(enum dtype dt, F f) {
    switch (dt) {
    case DT_BF16: f((__nv_bfloat16 *)0); return;
    case DT_FP8: f((__nv_fp8_e4m3 *)0); return;
    case DT_F32:
    case DT_F16: f((float *)0); return;
    }
}
__device__ __forceinline__ float act_dev(enum act k, float x) {
    switch (k) {
    case ACT_RELU2: return x > 0 ? x * x : 0.0f;
    case ACT_SILU: return silu_f(x);
    case ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
    }
    return x;
}

// y = x rounded to a 16-bit type (bf16, fp16): a 16-bit GEMM's input. 8
// values a thread a step (two 16-byte loads, one 16-byte store) where x and y
// are 16-byte aligned, then the tail (or all of it) one a thread.
template <typename T>
__global__ void k_to_16(T *y, const float *x, int64_t n) {
    pdl_wait();
    pdl_trigger();
    int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    int64_t n8 = ((uintptr_t)x | (uintptr_t)y) & 15 ? 0 : n / 8;
    for (int64_t i = i0; i < n8; i += step) {
        float4 a = ((const float4 *)x)[2 * i], b = ((const float4 *)x)[2 * i + 1];
        uint4 o;
        T *e = (T *)&o;
        e[0] = (T)a.x, e[1] = (T)a.y, e[2] = (T)a.z, e[3] = (T)a.w;
        e[4] = (T)b.x, e[5] = (T)b.y, e[6] = (T)b.z, e[7] = (T)b.w;
        ((uint4 *)y)[i] = o;
    }
    for (int64_t i = 8 * n8 + i0; i < n; i += step) y[i] = (T)x[i];
}
// k_to_16's grid for n values: a block of 256 threads takes 8 values a
// thread, at most 65536 blocks (they loop past that)
static inline int to16_grid(int64_t n) {
    int64_t b = (n + 8 * 256 - 1) / (8 * 256);
    return (int)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

// Tensor-core building blocks (sm_80+): one m16n8k16 product with fp32
// accumulation, 16-byte async copies (zero-filled when !valid), ldmatrix.
template <typename T> struct mma16;
template <> struct mma16<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float d[4], const uint32_t a[4], const uint32_t b[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct mma16<__half> {
    static __device__ __forceinline__ void run(float d[4], const uint32_t a[4], const uint32_t b[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

__device__ __forceinline__ void cp_async16(void *smem, const void *g, bool valid) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0; // 0: zero-fill
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(n));
}
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *smem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *smem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}


// fp32 weights at decode sizes (the routers; the fp32 exactness gates): a
// block (256 threads) for weight row `row`, its 8 warps splitting K (float4
// loads), every row of x (n <= 4) at once. The row's first 3 x 256 float4 (all of it up to K =
// 3072) are loaded before the wait, under the previous kernel's tail.
// bias [N] or NULL, added as k_bias adds it.
#define GEMV32_PRE 3
template <int NB>
__device__ __forceinline__ void gemv32_row(float *y, const float *x, const float *w, const float *bias, int N, int K,
                                           int row) {
    __shared__ float red[8][NB];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, K4 = K / 4;
    const float4 *wr = (const float4 *)(w + (int64_t)row * K);
    float4 pre[GEMV32_PRE];
#pragma unroll
    for (int i = 0; i < GEMV32_PRE; i++)
        if (threadIdx.x + 256 * i < K4) pre[i] = __ldg(wr + threadIdx.x + 256 * i);
    pdl_wait();
    pdl_trigger();
    float acc[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) acc[b] = 0;
#pragma unroll
    for (int i = 0; i < GEMV32_PRE; i++) {
        int k4 = threadIdx.x + 256 * i;
        if (k4 >= K4) break;
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float4 xv = ((const float4 *)(x + (int64_t)b * K))[k4], v = pre[i];
            acc[b] += v.x * xv.x + v.y * xv.y + v.z * xv.z + v.w * xv.w;
        }
    }
    for (int k4 = threadIdx.x + 256 * GEMV32_PRE; k4 < K4; k4 += 256) {
        float4 v = __ldg(wr + k4);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float4 xv = ((const float4 *)(x + (int64_t)b * K))[k4];
            acc[b] += v.x * xv.x + v.y * xv.y + v.z * xv.z + v.w * xv.w;
        }
    }
#pragma unroll
    for (int b = 0; b < NB; b++) {
        float s = warp_sum(acc[b]);
        if (lane == 0) red[warp][b] = s;
    }
    __syncthreads();
    if (threadIdx.x < NB) {
        float v = 0;
        for (int q = 0; q < 8; q++) v += red[q][threadIdx.x];
        if (bias) v += bias[row];
        y[(int64_t)threadIdx.x * N + row] = v;
    }
}

static inline int cdiv(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

// Load-time limits of the kernels (supports() in cuda_backend.cu).
#define CUDA_MAX_EXPERTS 1024
#define CUDA_MAX_TOPK 16
#define CUDA_MAX_GROUPS 64
#define CUDA_MAX_HEAD_DIM 256
#define CUDA_MAX_STATE 256
#define CUDA_CONV_KMIN 2
#define CUDA_CONV_KMAX 6
#define CUDA_KDA_MAX_HEAD_DIM 128 // a head's state rows in registers: 16 a thread (cuda_kimi.cu)
#define CUDA_MLA_MAX_RANK 512 // kv_lora_rank (Kimi-Linear, DeepSeek-V3: 512), a multiple of 4
#define CUDA_MLA_MAX_W 640    // kv_lora_rank + qk_rope_head_dim (576), rope a multiple of 4

// ops in cuda_mamba.cu, cuda_attn.cu, cuda_route.cu, cuda_moe.cu, cuda_sample.cu
void cuda_conv1d_fwd(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias, float *conv_state,
                     const struct batch *b, int seq0, int seq1, const struct mamba_dims *d);
void cuda_conv1d_update(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                        float *conv_state, const struct batch *b, const struct mamba_dims *d);
void cuda_ssd_prefill(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                      const float *D, float *ssm_state, const struct batch *b, int seq0, int seq1,
                      const struct mamba_dims *d);
// Scratch bytes of ssd_prefill over steps of up to max_tokens rows in the backend's mode (kv_dtype)
size_t cuda_ssd_scratch(struct backend *be, const struct mamba_dims *d, int max_tokens, int max_seqs);
void cuda_ssd_decode(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                     const float *D, float *ssm_state, const struct batch *b, const struct mamba_dims *d);
void cuda_gated_rmsnorm(struct backend *be, float *out, const float *y, const float *z, int zld, const float *w, int n,
                        int dim, int group_size, float eps);
void cuda_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *qkv, int ld, const struct batch *b,
                   const struct attn_dims *d);
void cuda_qk_norm_rope(struct backend *be, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                       void *v_cache, const struct batch *b, int t0, const struct attn_dims *d);
void cuda_attn_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                       const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d);
void cuda_attn_decode(struct backend *be, float *out, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                      void *v_cache, const struct batch *b, const struct attn_dims *d);
// Scratch bytes of both attention ops' split-KV partials (OP_ATTN).
size_t cuda_attn_scratch(struct backend *be, const struct attn_dims *d, int max_tokens, int max_seqs, int max_seq_len);
void cuda_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                    const struct moe_route_cfg *c);
void cuda_moe_experts(struct backend *be, float *out, const float *x, const struct moe_experts *w, const int32_t *ids,
                      const float *weights, int n, int top_k, const struct moe_shared *shared);
size_t cuda_moe_scratch(const struct moe_experts *w, int n, int top_k);
size_t cuda_moe_smem(void); // the grouped GEMMs' shared memory per block (16-bit experts)
void cuda_mask_logits(struct backend *be, float *logits, int rows, int vocab, const uint32_t *mask);
void cuda_bias_logits(struct backend *be, float *logits, int n, const int64_t *idx, const float *val);
void cuda_token_logprobs(struct backend *be, const float *logits, int vocab, const int32_t *rows,
                         const int32_t *targets, int n, int k, float *lp, int32_t *rank, int32_t *top_ids,
                         float *top_lp);
size_t cuda_sample_scratch(int n, int vocab); // cuda_sample's at n rows (OP_SAMPLE)
void cuda_sample(struct backend *be, const float *logits, int vocab, int32_t *token_table, const struct batch *b,
                 struct sample_out *out);
// Prefill attention on tensor cores for a bf16 or fp8 KV cache and head_dim
// 64 / 128 (cuda_flash.cu); 0 when the shape is not one it runs
// (cuda_flash_shape: 0 for every batch).
int cuda_flash_shape(const struct backend *be, const struct attn_dims *d);
int cuda_flash_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                       const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d);
// MLA's prefill on the same kernel (cuda_flash.cu) over keys expanded per
// head by cuda_mla.cu: kv [keys, H*(N+V)] (K_nope_h | V_h per head), lat
// [keys, R+P] (k_r at R), the contexts of sequences [seq0, seq1) back to back;
// cuda_flash_mla_shape: 1 for the shapes it runs (N 128, N + P 192, V 128).
int cuda_flash_mla_shape(const struct mla_dims *d);
void cuda_flash_mla(struct backend *be, float *out, const float *q, const __nv_bfloat16 *kv,
                    const __nv_bfloat16 *lat, const struct batch *b, int seq0, int seq1, const struct mla_dims *d);
// Quantized dense weights (cuda_quant.cu). cuda_gemv_quant: y [n, N] = x [n,
// K] W^T (+ W.bias) for n <= cuda_qgemv_rows(be, w): 64 in 16-bit mode where
// the tensor-core GEMV runs (cuda_qmma.cuh; its scratch: cuda_qgemv_scratch
// bytes), else CUDA_QGEMV_MAXB. Above, cu_matmul dequantizes W
// (cuda_dequant: into dst, cuda_dequant_bytes of device memory, as a dense
// weight of the model's --dtype) and runs the dense GEMM on it.
// cuda_matmul_w8a8: the same for WF_FP8 in 16-bit mode on FP8 tensor cores
// (unless VLLM_FP8_W8A8=0; scratch: at least the dequantization's); 0
// (nothing run) where it does not apply or cuBLASLt refuses the shape.
// cuda_gemv_quant_act: matmul_act (gated 0: y [n, N] = act(x W^T + bias))
// or matmul_act_mul's product (gated: y [n, N/2] = act(gate) * up) in one
// GEMV at n <= CUDA_QGEMV_MAXB; 0 (nothing run) where
// it does not apply.
#define CUDA_QGEMV_MAXB 4
void cuda_gemv_quant(struct backend *be, float *y, const float *x, const struct weight *w, int n);
int cuda_gemv_quant_act(struct backend *be, float *y, const float *x, const struct weight *w, int n, enum act kind,
                        int gated);
// One token's quantized routed experts on k_gemv_qw: h [k, I] (the
// activation applied), y [k, L] (assignment j's row j); 0 (nothing run)
// where the formats, widths or alignment do not fit it.
int cuda_qgemv_experts1(struct backend *be, cudaStream_t st, const struct moe_experts *w, const float *x, float *h,
                        float *y, const int32_t *ids, int top_k);
int cuda_qgemv_rows(const struct backend *be, const struct weight *w);
size_t cuda_qgemv_scratch(const struct backend *be, const struct weight *w, int n);
size_t cuda_dequant_bytes(const struct backend *be, const struct weight *w);
struct weight cuda_dequant(struct backend *be, const struct weight *w, void *dst);
int cuda_matmul_w8a8(struct backend *be, float *y, const float *x, const struct weight *w, int n, void *scratch);
// The cuBLASLt plan of y [n, N] = x [n, K] W^T (cuda_backend.cu), made once
// per shape: W of a dense format fmt (x rounded to it), or WF_FP8 for W8A8
// (e4m3 W and x, each with a vector of fp32 scales: W's rows' a_scale, x's
// rows' b_scale; pointers the caller sets again before each call). NULL when
// the plan table is full; p->ok 0 when cuBLASLt has no algorithm for it.
// out16: y in W's 16-bit type (fmt bf16 or f16), else fp32.
struct lt_plan *cuda_lt_plan(cuda_impl *c, int N, int K, int n, enum wfmt fmt, const float *a_scale,
                             const float *b_scale, int out16);
// Kimi-Linear's ops, in cuda_kimi.cu and cuda_mla.cu, and the dynamic shared memory they take
void cuda_kda_prefill(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                      const struct batch *b, int seq0, int seq1, const struct kda_dims *d);
void cuda_kda_decode(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                     const struct batch *b, const struct kda_dims *d);
void cuda_kda_gate(struct backend *be, float *g, const float *A_log, const float *dt_bias, int n,
                   const struct kda_dims *d);
void cuda_head_norm_gate(struct backend *be, float *y, const float *gate, const float *w, int n, int heads,
                         int head_dim, float eps);
void cuda_mla_kv_write(struct backend *be, void *cache, const float *lat, int ld, const struct batch *b,
                       const struct mla_dims *d);
void cuda_mla_attn(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                   const struct batch *b, int seq0, int seq1, const struct mla_dims *d);
size_t cuda_kda_smem(int head_dim); // the chunked prefill's shared memory per block (0: no chunks)
size_t cuda_mla_smem(const struct mla_dims *d);
// Scratch bytes of mla_attn over steps of up to max_tokens rows and contexts
// of up to max_seq_len tokens (cuda_mla.cu)
size_t cuda_mla_scratch(struct backend *be, const struct mla_dims *d, int max_tokens, int max_seq_len);
// tensor parallelism, in cuda_nccl.cu (the collectives exist only with NCCL)
void cuda_all_reduce(struct backend *be, float *x, int64_t n);
void cuda_all_gather(struct backend *be, float *out, int out_cols, const float *in, int in_cols, int rows);
void cuda_comm_destroy(void *comm);
