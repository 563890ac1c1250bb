// cuda_backend.cu - the CUDA backend: device memory on one stream, cuBLAS
// GEMMs (bf16 inputs with fp32 accumulation, or fp32), and the dense ops.
#include <vector>

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "io/dtype.h"
}

// Grows the scratch to at least `bytes` (a quarter more, so that small
// growth does not repeat); VLLM_ERR_OUT_OF_MEMORY when the device has no room.
static int scratch_grow(struct backend *be, size_t bytes) {
    cuda_impl *c = cu(be);
    if (c->scratch_bytes >= bytes) return VLLM_OK;
    cudaStreamCaptureStatus cs;
    CUDA_CHECK(cudaStreamIsCapturing(c->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone) {
        fprintf(stderr, "vllm: internal error: scratch grows while a graph is recorded\n");
        abort();
    }
    CUDA_CHECK(cudaStreamSynchronize(c->stream)); // nothing queued may still use the old buffer
    be->graph_epoch++; // recorded graphs point at the old buffer
    if (c->scratch) CUDA_CHECK(cudaFree(c->scratch));
    c->scratch = NULL;
    c->scratch_bytes = 0;
    size_t n = bytes + bytes / 4 + (1 << 20);
    if (cudaMalloc(&c->scratch, n) != cudaSuccess) {
        cudaGetLastError();
        c->scratch = NULL;
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of GPU scratch", n);
    }
    c->scratch_bytes = n;
    return VLLM_OK;
}

int cuda_pdl; // cuda_common.cuh: programmatic dependent launch on (sm_90+, no VLLM_NO_PDL)
__global__ void k_pdl_probe() {} // its attributes say which architecture the kernels were built for

// Sized at load by cu_supports: growing here is only a fallback.
void *cuda_scratch(struct backend *be, size_t bytes) {
    if (scratch_grow(be, bytes)) {
        fprintf(stderr, "vllm: %s\n", vllm_last_error());
        abort();
    }
    return cu(be)->scratch;
}

static void cu_destroy(struct backend *be) {
    cuda_impl *c = cu(be);
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream);
    cuda_comm_destroy(c->comm);
    if (c->scratch) cudaFree(c->scratch);
    for (int i = 0; i < c->num_plans; i++) {
        struct lt_plan *p = &c->plans[i];
        if (p->op) cublasLtMatmulDescDestroy(p->op);
        if (p->la) cublasLtMatrixLayoutDestroy(p->la);
        if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
        if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    }
    cublasLtDestroy(c->lt);
    cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    for (int i = 0; i < CUDA_FENCES; i++) cudaEventDestroy(c->events[i]);
    cudaStreamDestroy(c->stream);
    free(c);
    free(be);
}

static void *cu_alloc(struct backend *be, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky-free error so later calls work
        return NULL;
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes ? bytes : 1, cu(be)->stream));
    return p;
}

static void cu_mem_info(struct backend *be, int64_t *free_bytes, int64_t *total_bytes) {
    (void)be; // the bound device's
    size_t f = 0, t = 0;
    CUDA_CHECK(cudaMemGetInfo(&f, &t));
    *free_bytes = (int64_t)f, *total_bytes = (int64_t)t;
}

static void cu_free(struct backend *be, void *p) {
    if (!p) return;
    CUDA_CHECK(cudaStreamSynchronize(cu(be)->stream));
    CUDA_CHECK(cudaFree(p));
}

static void cu_upload(struct backend *be, void *dst, const void *src, size_t n) {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, cu(be)->stream));
}

static void cu_download(struct backend *be, void *dst, const void *src, size_t n) {
    if (!n) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, cu(be)->stream));
    CUDA_CHECK(cudaStreamSynchronize(cu(be)->stream));
}

static void cu_sync(struct backend *be) { CUDA_CHECK(cudaStreamSynchronize(cu(be)->stream)); }

// Every format is stored as backend.h lays it out: quantized weights keep
// their codes row-major and their scales beside them (scale [rows,
// wfmt_scale_cols] fp32, NVFP4's bscale [rows, cols/16] e4m3), whatever op
// reads them (cuda_quant.cu, the routed experts of cuda_moe.cu); an op that
// cannot read a format refuses it in cu_supports, naming it.
static int cu_weight_alloc(struct backend *be, struct weight *w, enum wfmt fmt, int64_t rows, int64_t cols) {
    memset(w, 0, sizeof *w);
    if (fmt == WF_NVFP4 && cols % WF_NVFP4_GROUP)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "an nvfp4 weight needs columns in multiples of 16, not %lld",
                        (long long)cols);
    size_t bytes = (size_t)rows * wfmt_bytes(fmt, cols);
    w->data = cu_alloc(be, bytes);
    if (!w->data) return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of GPU memory for a weight", bytes);
    w->fmt = fmt;
    w->rows = rows;
    w->cols = cols;
    if (!wfmt_quantized(fmt)) return VLLM_OK;
    w->scale = (float *)cu_alloc(be, sizeof(float) * (size_t)(rows * wfmt_scale_cols(fmt, cols)));
    if (fmt == WF_NVFP4) w->bscale = (uint8_t *)cu_alloc(be, (size_t)(rows * (cols / WF_NVFP4_GROUP)));
    if (!w->scale || (fmt == WF_NVFP4 && !w->bscale))
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate the scales of a %s weight on the GPU", wfmt_name(fmt));
    return VLLM_OK;
}

// Rows as they are when the formats match (one 2D copy straight from the
// checkpoint's mapping; quantized codes only so), else converted on the host
// in slabs of rows. ld: elements (wfmt_bytes of them apart).
static int cu_weight_upload_raw(struct backend *be, struct weight *w, int64_t row0, int64_t n, const void *src,
                                enum wfmt src_fmt, int64_t ld) {
    cudaStream_t s = cu(be)->stream; // after the zeroing memset cu_alloc queued here
    size_t ss = wfmt_size(src_fmt), row = wfmt_bytes(w->fmt, w->cols);
    char *dst = (char *)w->data + (size_t)row0 * row;
    if (wfmt_quantized(w->fmt) && src_fmt != w->fmt)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "a %s weight cannot be made from %s rows", wfmt_name(w->fmt),
                        wfmt_name(src_fmt));
    if (src_fmt == w->fmt) {
        CUDA_CHECK(cudaMemcpy2DAsync(dst, row, src, wfmt_bytes(src_fmt, ld), row, (size_t)n, cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        return VLLM_OK;
    }
    int64_t slab = MAX(1, ((int64_t)16 << 20) / (int64_t)row);
    std::vector<char> tmp((size_t)MIN(slab, n) * row);
    for (int64_t r = 0; r < n; r += slab) {
        int64_t m = MIN(slab, n - r);
        for (int64_t i = 0; i < m; i++)
            wfmt_convert(w->fmt, tmp.data() + i * row, src_fmt, (const char *)src + (size_t)(r + i) * ld * ss, w->cols);
        CUDA_CHECK(cudaMemcpyAsync(dst + (size_t)r * row, tmp.data(), (size_t)m * row, cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaStreamSynchronize(s)); // tmp is reused by the next slab
    }
    return VLLM_OK;
}

// Uniform values with standard deviation std from a counter hash, so every
// element is independent of launch shape.
template <typename T>
__global__ void k_random(T *w, size_t n, uint64_t seed, float std) {
    float a = std * 1.7320508f * 0x1.0p-31f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        w[i] = (T)(a * (float)(int32_t)(z >> 32));
    }
}

static int cu_weight_random(struct backend *be, struct weight *w, uint64_t seed, float std) {
    size_t n = (size_t)w->rows * w->cols;
    cudaStream_t s = cu(be)->stream;
    switch (w->fmt) {
    case WF_F32: k_random<<<4096, 256, 0, s>>>((float *)w->data, n, seed, std); break;
    case WF_BF16: k_random<<<4096, 256, 0, s>>>((__nv_bfloat16 *)w->data, n, seed, std); break;
    case WF_F16: k_random<<<4096, 256, 0, s>>>((__half *)w->data, n, seed, std); break;
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: return weight_random_quant(be, w, seed, std); // quantized on the host
    }
    LAUNCH_CHECK();
    return VLLM_OK;
}

__global__ void k_gather_ids(int32_t *ids, const int32_t *table, const int32_t *src, int n) {
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) ids[t] = table[src[t]];
}

static void cu_gather_ids(struct backend *be, int32_t *ids, const int32_t *table, const int32_t *src, int n) {
    if (n <= 0) return;
    launch_pdl(k_gather_ids, cdiv(n, 256), 256, 0, cu(be)->stream, ids, table, src, n);
}

template <typename T>
__global__ void k_embed(float *out, const T *table, const int32_t *ids, int d) {
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x;
    const T *row = table + (int64_t)ids[t] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[(int64_t)t * d + i] = load_f(row + i);
}

static void cu_embed(struct backend *be, float *out, const struct weight *table, const int32_t *ids, int n) {
    if (n <= 0) return;
    int d = (int)table->cols;
    cudaStream_t s = cu(be)->stream;
    switch (table->fmt) {
    case WF_F32: launch_pdl(k_embed<float>, n, 256, 0, s, out, (const float *)table->data, ids, d); break;
    case WF_BF16: launch_pdl(k_embed<__nv_bfloat16>, n, 256, 0, s, out, (const __nv_bfloat16 *)table->data, ids, d); break;
    case WF_F16: launch_pdl(k_embed<__half>, n, 256, 0, s, out, (const __half *)table->data, ids, d); break;
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: break; // refused by cu_supports (OP_EMBED)
    }
}

// One block per row: res += x (if x); out = rmsnorm(res) * w.
__global__ void k_add_rmsnorm(float *res, const float *x, float *out, const float *w, int d, float eps) {
    pdl_wait();
    pdl_trigger();
    __shared__ float red[32];
    int64_t off = (int64_t)blockIdx.x * d;
    float ss = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = res[off + i];
        if (x) res[off + i] = v = v + x[off + i];
        ss += v * v;
    }
    ss = block_sum(ss, red);
    float r = rsqrtf(ss / d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[off + i] = w[i] * (res[off + i] * r);
}

// The same with the row in registers: V float4 per thread, every load of
// the row in flight at once and no second read (dim % 4 == 0, 16-byte
// aligned rows, dim <= 4 * V * blockDim). In place (out == res) is safe:
// every read is before the block's reduction, every write after it. Up to
// V = 4 the weights are loaded before the dependency wait (they are no
// kernel's output); at V = 8 the row and the weights would take 64 float
// registers a thread, more than 1024 threads can have (the launch fails),
// so the weights are read at the stores.
template <int V>
__global__ void __launch_bounds__(1024) k_add_rmsnorm4(float *res, const float *x, float *out, const float *w, int d,
                                                       float eps) {
    constexpr bool PRE = V <= 4;
    __shared__ float red[32];
    int64_t off = (int64_t)blockIdx.x * (d / 4);
    int d4 = d / 4;
    float4 v[V], g[PRE ? V : 1];
#pragma unroll
    for (int i = 0; i < (PRE ? V : 0); i++)
        if (threadIdx.x + i * blockDim.x < d4) g[i] = ((const float4 *)w)[threadIdx.x + i * blockDim.x];
    pdl_wait();
    pdl_trigger();
    float ss = 0;
#pragma unroll
    for (int i = 0; i < V; i++) {
        int c = threadIdx.x + i * blockDim.x;
        if (c >= d4) break;
        float4 a = ((const float4 *)res)[off + c];
        if (x) {
            float4 b = ((const float4 *)x)[off + c];
            a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
            ((float4 *)res)[off + c] = a;
        }
        v[i] = a;
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
    ss = block_sum(ss, red);
    float r = rsqrtf(ss / d + eps);
#pragma unroll
    for (int i = 0; i < V; i++) {
        int c = threadIdx.x + i * blockDim.x;
        if (c >= d4) break;
        float4 a = v[i], gw = PRE ? g[PRE ? i : 0] : ((const float4 *)w)[c];
        ((float4 *)out)[off + c] = make_float4(gw.x * (a.x * r), gw.y * (a.y * r), gw.z * (a.z * r), gw.w * (a.w * r));
    }
}

static void add_rmsnorm(cudaStream_t s, float *res, const float *x, float *out, const float *w, int n, int d,
                        float eps) {
    if (n <= 0) return;
    uintptr_t align = (uintptr_t)res | (uintptr_t)x | (uintptr_t)out | (uintptr_t)w;
    int d4 = d / 4, v = cdiv(d4, 1024), th = (int)MIN(1024, (d4 + 31) / 32 * 32);
    if (d % 4 || align % 16 || v > 8) launch_pdl(k_add_rmsnorm, n, 256, 0, s, res, x, out, w, d, eps);
    else if (v == 1) launch_pdl(k_add_rmsnorm4<1>, n, th, 0, s, res, x, out, w, d, eps);
    else if (v == 2) launch_pdl(k_add_rmsnorm4<2>, n, 1024, 0, s, res, x, out, w, d, eps);
    else if (v <= 4) launch_pdl(k_add_rmsnorm4<4>, n, 1024, 0, s, res, x, out, w, d, eps);
    else launch_pdl(k_add_rmsnorm4<8>, n, 1024, 0, s, res, x, out, w, d, eps);
}

static void cu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n, int dim, float eps) {
    add_rmsnorm(cu(be)->stream, (float *)x, NULL, out, w, n, dim, eps);
}

static void cu_add_rmsnorm(struct backend *be, float *res, const float *x, float *out, const float *w, int n, int dim,
                           float eps) {
    add_rmsnorm(cu(be)->stream, res, x, out, w, n, dim, eps);
}

__device__ __forceinline__ float2 pair_f32(const __nv_bfloat162 &h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float2 pair_f32(const __half2 &h) { return __half22float2(h); }
template <typename T> struct pair_of;
template <> struct pair_of<__nv_bfloat16> { typedef __nv_bfloat162 type; };
template <> struct pair_of<__half> { typedef __half2 type; };

// xs = x [b, 8 k8 .. 8 k8 + 7] rounded to T, as the GEMM path rounds x (x: [n, K] fp32)
template <typename T>
__device__ __forceinline__ void x8_rounded(float (&xs)[8], const float *x, int b, int K, int k8) {
    const float4 *xp = (const float4 *)(x + (int64_t)b * K + k8 * 8);
    float4 x0 = xp[0], x1 = xp[1];
    xs[0] = x0.x, xs[1] = x0.y, xs[2] = x0.z, xs[3] = x0.w, xs[4] = x1.x, xs[5] = x1.y, xs[6] = x1.z, xs[7] = x1.w;
#pragma unroll
    for (int i = 0; i < 8; i++) xs[i] = (float)(T)xs[i];
}

// Decode-sized products (n <= 4 rows) with 16-bit weights: each warp streams
// one weight row once, 16 bytes per lane per load, and applies it to every
// row of x (rounded to T as the GEMM path rounds it), accumulating fp32.
// cuBLAS reaches a fraction of the bandwidth on these skinny shapes.
#define GEMV_ROWS 4 // weight rows per block: each x value loaded serves 4 rows

// A block owns GEMV_ROWS weight rows; its 8 warps split K between them and
// reduce through shared memory in a fixed order (deterministic), so even
// 4096-row matrices give the GPU thousands of warps to keep loads in flight.
// GATED (matmul_act_mul): W is [2I, K] gate | up; a block owns GEMV_HALF
// hidden units, rows u (gate) and I + u (up) of each, and writes y [n, I] =
// act(gate) * up, the values of the product then act_mul. bias [N] (or
// NULL) is added to each product as k_bias adds it (one kernel fewer).
#define GEMV_HALF (GEMV_ROWS / 2)
template <typename T, int NB, bool GATED>
__global__ void __launch_bounds__(256) k_gemv16(float *y, const float *x, const T *w, const float *bias, int N, int K,
                                                enum act kind, bool with_act) {
    typedef typename pair_of<T>::type T2;
    __shared__ float red[8][GEMV_ROWS][NB];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, row0 = blockIdx.x * (GATED ? GEMV_HALF : GEMV_ROWS);
    int I = N / 2;
    const uint4 *wr[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) {
        int row = !GATED         ? min(row0 + r, N - 1)
                  : r < GEMV_HALF ? min(row0 + r, I - 1)                  // gate of unit row0 + r
                                  : I + min(row0 + r - GEMV_HALF, I - 1); // up of unit row0 + r - GEMV_HALF
        wr[r] = (const uint4 *)(w + (int64_t)row * K);
    }
    float acc[GEMV_ROWS][NB];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) acc[r][b] = 0;
    int k8 = warp * 32 + lane;
    uint4 u[GEMV_ROWS]; // the next step's weights, in flight while this one computes
    if (k8 < K / 8)
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) u[r] = __ldg(wr[r] + k8);
    pdl_wait(); // x is the previous kernel's output
    pdl_trigger();
    for (; k8 < K / 8; k8 += 256) {
        uint4 cur[GEMV_ROWS];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) cur[r] = u[r];
        if (k8 + 256 < K / 8)
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) u[r] = __ldg(wr[r] + k8 + 256);
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float xs[8];
            x8_rounded<T>(xs, x, b, K, k8);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) {
                const T2 *h = (const T2 *)&cur[r];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float2 f = pair_f32(h[i]);
                    acc[r][b] += f.x * xs[2 * i] + f.y * xs[2 * i + 1];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float v = warp_sum(acc[r][b]);
            if (lane == 0) red[warp][r][b] = v;
        }
    __syncthreads();
    if (GATED && threadIdx.x < GEMV_HALF * NB) {
        int u = threadIdx.x / NB, b = threadIdx.x % NB;
        float gv = 0, uv = 0;
        for (int q = 0; q < 8; q++) gv += red[q][u][b], uv += red[q][u + GEMV_HALF][b];
        if (bias && row0 + u < I) gv += bias[row0 + u], uv += bias[I + row0 + u];
        if (row0 + u < I) y[(int64_t)b * I + row0 + u] = act_dev(kind, gv) * uv;
    } else if (!GATED && threadIdx.x < GEMV_ROWS * NB) {
        int r = threadIdx.x / NB, b = threadIdx.x % NB;
        float v = 0;
        for (int q = 0; q < 8; q++) v += red[q][r][b];
        if (bias && row0 + r < N) v += bias[row0 + r];
        if (row0 + r < N) y[(int64_t)b * N + row0 + r] = with_act ? act_dev(kind, v) : v;
    }
}

// k_gemv16w: the decode GEMV of weights under GEMV16W_MAX_BYTES (gemv16_g;
// `cuda_ops 1 64 gemv` times both kernels). No block-wide step in the loop. A warp owns a group
// of R weight rows (GATED: R/2 hidden units, their gate and up rows) at a
// time and streams them whole, U 16-byte loads per row per lane per step
// (lane l of step s reads uint4 s*32U + 32j + l, j < U); the next step's
// loads (the next group's first, at a group's end) are issued before this
// step's arithmetic, so a warp keeps up to 2*R*U loads in flight, over the
// group's warp_sum too. The grid is resident (2 blocks of 8 warps per SM, XS:
// 1 of 16) and loops over the groups, handed to warps block-first (group g:
// block g % blocks), so every SM gets the same number of rows (+-1 group)
// whatever N. Sums per output: each lane fmaf's its columns in increasing
// order (per 16-byte load: elements 0..7), then warp_sum's xor butterfly,
// then + bias (a row's sum is the same whether it sits in a GATED group or
// not). Weight loads: ld.global.nc.L1::no_allocate.L2::256B (the
// weights pass L1 by, x stays there; the L2 fetches 256-byte lines). XS: x
// rounded to T once per block into shared memory (fp32, NB * K * 4 bytes, one
// __syncthreads after pdl_wait), each column's two halves apart so a warp's
// 16-byte reads are conflict-free; else each lane reads x (L1) and rounds it.
template <bool XS> struct gemvw_shape {
    static constexpr int warps = XS ? 16 : 8, per_sm = XS ? 1 : 2;
};

// Weight row r of group g (clamped: a partial last group reads a real row, its output unwritten).
template <bool GATED, int R> __device__ __forceinline__ int gemvw_row(int g, int r, int N) {
    if (!GATED) return min(g * R + r, N - 1);
    int I = N / 2, H = R / 2;
    return r < H ? min(g * H + r, I - 1) : I + min(g * H + r - H, I - 1);
}

// Step s of group g: v[r][j] = uint4 s*32U + 32j + lane of row r (only those < K/8).
template <bool GATED, int R, int U, typename T>
__device__ __forceinline__ void gemvw_load(uint4 (&v)[R][U], const T *w, int g, int s, int N, int K, int lane) {
    int k0 = s * 32 * U + lane;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint4 *p = (const uint4 *)(w + (int64_t)gemvw_row<GATED, R>(g, r, N) * K) + k0;
#pragma unroll
        for (int j = 0; j < U; j++)
            if (k0 + 32 * j < K / 8) v[r][j] = ld_weight(p + 32 * j);
    }
}

template <typename T, int NB, bool GATED, int R, int U, bool XS>
__global__ void __launch_bounds__(gemvw_shape<XS>::warps * 32, gemvw_shape<XS>::per_sm)
    k_gemv16w(float *y, const float *x, const T *w, const float *bias, int N, int K, enum act kind, bool with_act) {
    static_assert(!GATED || R % 2 == 0, "a GATED group holds gate and up rows in pairs");
    typedef typename pair_of<T>::type T2;
    extern __shared__ float4 xsh[]; // XS: [NB][2][K/8] float4, x [b, 8k8 + 4h ..] rounded at [b][h][k8]
    constexpr int H = GATED ? R / 2 : R; // outputs of a group
    int lane = threadIdx.x & 31, I = N / 2, M = GATED ? I : N, K8 = K / 8;
    int groups = (M + H - 1) / H, steps = max(1, (K8 + 32 * U - 1) / (32 * U));
    int nw = gridDim.x * gemvw_shape<XS>::warps, g = (threadIdx.x >> 5) * gridDim.x + blockIdx.x, s = 0;
    uint4 nxt[R][U];
    if (g < groups) gemvw_load<GATED, R, U>(nxt, w, g, s, N, K, lane);
    pdl_wait(); // x is the previous kernel's output
    pdl_trigger();
    if (XS) {
        for (int i = threadIdx.x; i < NB * 2 * K8; i += blockDim.x) {
            int b = i / (2 * K8), k8 = i % (2 * K8) / 2, h = i % 2;
            float4 v = ((const float4 *)x)[i];
            v.x = (float)(T)v.x, v.y = (float)(T)v.y, v.z = (float)(T)v.z, v.w = (float)(T)v.w;
            xsh[(b * 2 + h) * K8 + k8] = v;
        }
        __syncthreads();
    }
    float acc[R][NB];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int b = 0; b < NB; b++) acc[r][b] = 0;
    while (g < groups) {
        uint4 cur[R][U];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < U; j++) cur[r][j] = nxt[r][j];
        int cg = g, k0 = s * 32 * U + lane;
        if (++s == steps) s = 0, g += nw;
        if (g < groups) gemvw_load<GATED, R, U>(nxt, w, g, s, N, K, lane);
#pragma unroll
        for (int j = 0; j < U; j++) {
            int k8 = k0 + 32 * j;
            if (k8 >= K8) break;
#pragma unroll
            for (int b = 0; b < NB; b++) {
                float xs[8];
                if (XS) {
                    float4 x0 = xsh[b * 2 * K8 + k8], x1 = xsh[(b * 2 + 1) * K8 + k8];
                    xs[0] = x0.x, xs[1] = x0.y, xs[2] = x0.z, xs[3] = x0.w;
                    xs[4] = x1.x, xs[5] = x1.y, xs[6] = x1.z, xs[7] = x1.w;
                } else
                    x8_rounded<T>(xs, x, b, K, k8);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const T2 *h = (const T2 *)&cur[r][j];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        float2 f = pair_f32(h[i]);
                        acc[r][b] = fmaf(f.y, xs[2 * i + 1], fmaf(f.x, xs[2 * i], acc[r][b]));
                    }
                }
            }
        }
        if (s) continue; // group cg has steps left
        // cg done: every lane holds every sum; lane (output * NB + b) writes one
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int b = 0; b < NB; b++) acc[r][b] = warp_sum(acc[r][b]);
#pragma unroll
        for (int o = 0; o < H; o++)
#pragma unroll
            for (int b = 0; b < NB; b++) {
                int u = cg * H + o;
                if (lane != o * NB + b || u >= M) continue;
                if (GATED) {
                    float gv = acc[o][b], uv = acc[o + H][b];
                    if (bias) gv += bias[u], uv += bias[I + u];
                    y[(int64_t)b * I + u] = act_dev(kind, gv) * uv;
                } else {
                    float v = acc[o][b] + (bias ? bias[u] : 0.0f);
                    y[(int64_t)b * N + u] = with_act ? act_dev(kind, v) : v;
                }
            }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int b = 0; b < NB; b++) acc[r][b] = 0;
    }
}

template <typename T, int NB, bool GATED, int R, int U, bool XS>
static void gemv16w_launch(struct backend *be, float *y, const float *x, const T *W, const float *bias, int N, int K,
                           enum act kind, bool with_act) {
    typedef gemvw_shape<XS> sh;
    int groups = GATED ? cdiv(N / 2, R / 2) : cdiv(N, R);
    size_t sm = XS ? sizeof(float) * NB * K : 0;
    if (XS) CUDA_CHECK(cudaFuncSetAttribute(k_gemv16w<T, NB, GATED, R, U, XS>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    launch_pdl(k_gemv16w<T, NB, GATED, R, U, XS>, MIN(groups, sh::per_sm * cu(be)->num_sms), sh::warps * 32, sm,
               cu(be)->stream, y, x, W, bias, N, K, kind, with_act);
}
// XS where x [n, K] fits in shared memory, else the same kernel reading x from L1
template <typename T, bool GATED, int R, int U, bool XS>
static void gemv16w(struct backend *be, float *y, const float *x, const T *W, const float *bias, int N, int K, int n,
                    enum act kind, bool with_act) {
    if (XS && sizeof(float) * n * K > cu(be)->smem_optin) {
        gemv16w<T, GATED, R, U, false>(be, y, x, W, bias, N, K, n, kind, with_act);
        return;
    }
    switch (n) {
    case 1: gemv16w_launch<T, 1, GATED, R, U, XS>(be, y, x, W, bias, N, K, kind, with_act); break;
    case 2: gemv16w_launch<T, 2, GATED, R, U, XS>(be, y, x, W, bias, N, K, kind, with_act); break;
    case 3: gemv16w_launch<T, 3, GATED, R, U, XS>(be, y, x, W, bias, N, K, kind, with_act); break;
    default: gemv16w_launch<T, 4, GATED, R, U, XS>(be, y, x, W, bias, N, K, kind, with_act); break;
    }
}

// Weights below this many bytes take k_gemv16w (R = 2, U = 4, no-allocate
// loads, x in shared memory), larger ones k_gemv16. On the H200, 1 row, %
// of the copy rate (`cuda_ops 1 64 gemv`; k_gemv16 / k_gemv16w): nano30b's
// in_proj (55 MB) 75.5 / 89.0, out_proj (22 MB) 63.2 / 75.4, shared up
// 71.5 / 75.6, down 62.6 / 73.4; qwen3_8b's o_proj (34 MB) 79.1 / 82.9,
// qkv (50 MB) 86.7 / 86.1, gate | up (201 MB) 100.8 / 96.3, down (101 MB)
// 92.1 / 91.5, a 151,936-row lm_head 109.3 / 100.3. Four other variants
// of k_gemv16w (R, U, the loads, x from L1) lost at every shape.
#define GEMV16W_MAX_BYTES (64 << 20)

// gated: y [n, N/2] = act_mul(x W^T + bias) (k_gemv16's GATED), else y [n, N] = x W^T + bias,
// act(kind) of it if with_act; the kernel: by the weight's size, or VLLM_GEMV16 (0 k_gemv16, 1 k_gemv16w)
template <typename T, bool GATED>
static void gemv16_g(struct backend *be, float *y, const float *x, const T *W, const float *bias, int N, int K, int n,
                     enum act kind, bool with_act) {
    int v = cu(be)->gemv16;
    if (v < 0) v = (int64_t)N * K * (int64_t)sizeof(T) < GEMV16W_MAX_BYTES;
    if (v == 1) {
        gemv16w<T, GATED, 2, 4, true>(be, y, x, W, bias, N, K, n, kind, with_act);
        return;
    }
    dim3 g(GATED ? cdiv(N / 2, GEMV_HALF) : cdiv(N, GEMV_ROWS));
    cudaStream_t s = cu(be)->stream;
    switch (n) {
    case 1: launch_pdl(k_gemv16<T, 1, GATED>, g, 256, 0, s, y, x, W, bias, N, K, kind, with_act); break;
    case 2: launch_pdl(k_gemv16<T, 2, GATED>, g, 256, 0, s, y, x, W, bias, N, K, kind, with_act); break;
    case 3: launch_pdl(k_gemv16<T, 3, GATED>, g, 256, 0, s, y, x, W, bias, N, K, kind, with_act); break;
    default: launch_pdl(k_gemv16<T, 4, GATED>, g, 256, 0, s, y, x, W, bias, N, K, kind, with_act); break;
    }
}
template <typename T>
static void gemv16(struct backend *be, float *y, const float *x, const T *W, const float *bias, int N, int K, int n) {
    gemv16_g<T, false>(be, y, x, W, bias, N, K, n, ACT_SILU, false);
}

static cudaDataType_t cuda_type(enum wfmt f) {
    switch (f) {
    case WF_F32: return CUDA_R_32F;
    case WF_BF16: return CUDA_R_16BF;
    case WF_F16: return CUDA_R_16F;
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: break; // dequantized first (cuda_dequant)
    }
    return CUDA_R_32F;
}

// The token counts one plan serves: (nb / 2, nb] for nb a power of two, 8 at
// least. A plan's algorithm comes from cuBLASLt's heuristic at nb, and the
// first run of an algorithm loads its kernel: on the H200 together 2-115 ms
// for each new shape (nano8's fp32 router [128, 2,688] ~60 ms a heuristic).
// Keyed by the exact count, a chat server's prefills, of a new length nearly
// every step, paid that each step (nano8, eight 111-token turns: 90 ms for
// a 6.5 ms step).
static int lt_bucket(int n) {
    int b = 8;
    while (b < n) b *= 2;
    return b;
}

// A new plan for nb columns (cuda_lt_plan's bucket).
static struct lt_plan *lt_plan_make(cuda_impl *c, int N, int K, int n, enum wfmt fmt, const float *a_scale,
                                    const float *b_scale, int out16) {
    struct lt_plan *p = &c->plans[c->num_plans++];
    memset(p, 0, sizeof *p);
    p->N = N, p->K = K, p->n = n, p->fmt = fmt, p->out16 = out16;
    cudaDataType_t in = fmt == WF_FP8 ? CUDA_R_8F_E4M3 : cuda_type(fmt);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F; // W8A8: y[t][r] = a_scale[r] b_scale[t] sum
    if (cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ||
        (fmt == WF_FP8 &&
         (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof outer) ||
          cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof outer) ||
          cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof a_scale) ||
          cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof b_scale))) ||
        cublasLtMatrixLayoutCreate(&p->la, in, K, N, K) || cublasLtMatrixLayoutCreate(&p->lb, in, K, n, K) ||
        cublasLtMatrixLayoutCreate(&p->lc, out16 ? cuda_type(fmt) : CUDA_R_32F, N, n, N))
        return p;
    cublasLtMatmulPreference_t pref;
    if (cublasLtMatmulPreferenceCreate(&pref)) return p;
    uint64_t ws = c->blas_ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    if (!cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &h, &found) && found) {
        p->algo = h.algo;
        p->ok = 1;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return p;
}

// Column-major: Y^T (N x n) = op(W) * X^T with W seen as K x N, transposed
// (the TN layout FP8 needs too); fp32 output and accumulation (no TF32).
// The plan of n's bucket, its layouts set to n columns for this call.
struct lt_plan *cuda_lt_plan(cuda_impl *c, int N, int K, int n, enum wfmt fmt, const float *a_scale,
                             const float *b_scale, int out16) {
    int nb = lt_bucket(n);
    struct lt_plan *p = NULL;
    for (int i = 0; i < c->num_plans && !p; i++) {
        struct lt_plan *q = &c->plans[i];
        if (q->N == N && q->K == K && q->n == nb && q->fmt == (int)fmt && q->out16 == out16) p = q;
    }
    if (!p && c->num_plans < LT_PLANS) p = lt_plan_make(c, N, K, nb, fmt, a_scale, b_scale, out16);
    if (!p || !p->ok) return p; // no plan: cublasGemmEx serves the rest
    uint64_t cols = (uint64_t)n;
    if (cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols) ||
        cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols))
        return NULL;
    return p;
}

// y: [n, N] = xin: [n, K] @ W[N, K]^T through cuBLAS(Lt), W dense and xin
// of its type; y fp32, or (out16) of W's 16-bit type.
static void blas_gemm(struct backend *be, void *y, const void *xin, const struct weight *w, int n, int out16) {
    cuda_impl *c = cu(be);
    int N = (int)w->rows, K = (int)w->cols;
    const float one = 1.0f, zero = 0.0f;
    struct lt_plan *p = cuda_lt_plan(c, N, K, n, w->fmt, NULL, NULL, out16);
    if (p && p->ok &&
        cublasLtMatmul(c->lt, p->op, &one, w->data, p->la, xin, p->lb, &zero, y, p->lc, y, p->lc, &p->algo, c->blas_ws,
                       c->blas_ws_bytes, c->stream) == CUBLAS_STATUS_SUCCESS)
        return;
    cudaDataType_t t = cuda_type(w->fmt);
    CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, w->data, t, K, xin, t, K, &zero, y,
                              out16 ? t : CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// y: [n, N] = x: [n, K] @ W[N, K]^T through cuBLAS(Lt), W dense: fp32 as it
// is, 16-bit with x rounded to the weight's type first, into x16 ([n, K]
// 16-bit of device memory; NULL: the scratch).
static void blas_matmul(struct backend *be, float *y, const float *x, const struct weight *w, int n, void *x16) {
    cuda_impl *c = cu(be);
    int K = (int)w->cols;
    int64_t nk = (int64_t)n * K;
    int grid = to16_grid(nk);
    if (w->fmt != WF_F32 && !x16) x16 = cuda_scratch(be, (size_t)nk * 2);
    const void *xin = w->fmt == WF_F32 ? (const void *)x : x16;
    switch (w->fmt) {
    case WF_F32: break;
    case WF_BF16: k_to_16<<<grid, 256, 0, c->stream>>>((__nv_bfloat16 *)x16, x, nk); break;
    case WF_F16: k_to_16<<<grid, 256, 0, c->stream>>>((__half *)x16, x, nk); break;
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: return; // dequantized first (cu_matmul)
    }
    LAUNCH_CHECK();
    blas_gemm(be, y, xin, w, n, 0);
}

// fp32 weights at decode sizes (the routers; the fp32 exactness gates):
// gemv32_row (cuda_common.cuh), a block per weight row.
template <int NB>
__global__ void __launch_bounds__(256) k_gemv32(float *y, const float *x, const float *w, const float *bias, int N,
                                                int K) {
    gemv32_row<NB>(y, x, w, bias, N, K, blockIdx.x);
}

static void gemv32(cudaStream_t s, float *y, const float *x, const float *W, const float *bias, int N, int K, int n) {
    dim3 g(N);
    switch (n) {
    case 1: launch_pdl(k_gemv32<1>, g, 256, 0, s, y, x, W, bias, N, K); break;
    case 2: launch_pdl(k_gemv32<2>, g, 256, 0, s, y, x, W, bias, N, K); break;
    case 3: launch_pdl(k_gemv32<3>, g, 256, 0, s, y, x, W, bias, N, K); break;
    default: launch_pdl(k_gemv32<4>, g, 256, 0, s, y, x, W, bias, N, K); break;
    }
}

__global__ void k_bias(float *y, const float *b, int64_t n, int N) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * N; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += b[i % N];
}

// The 16-byte-load GEMVs' conditions: decode rows, K % 8, aligned x and W.
static bool gemv_fits(const float *x, const struct weight *w, int n) {
    return n <= 4 && w->cols % 8 == 0 && !((uintptr_t)x & 15) && !((uintptr_t)w->data & 15);
}

// The scratch a matmul of up to T rows takes: x rounded to 16 bits, after
// the dequantized weight when quantized weights run through the GEMM; at
// least the quantized GEMV's (its staged x).
static size_t matmul_scratch(const struct backend *be, const struct weight *w, int64_t T) {
    bool q = wfmt_quantized(w->fmt), dq = q && T > cuda_qgemv_rows(be, w);
    size_t gemm = (dq ? cuda_dequant_bytes(be, w) : 0) + (size_t)(T * w->cols * 2);
    return q ? MAX(gemm, cuda_qgemv_scratch(be, w, (int)MIN(T, 1 << 20))) : gemm;
}

static void cu_matmul(struct backend *be, float *y, const float *x, const struct weight *w, int n) {
    if (n <= 0) return;
    int N = (int)w->rows, K = (int)w->cols;
    bool quant = wfmt_quantized(w->fmt), gemv = quant ? n <= cuda_qgemv_rows(be, w) : gemv_fits(x, w, n);
    cudaStream_t s = cu(be)->stream;
    if (quant && gemv) cuda_gemv_quant(be, y, x, w, n);
    else if (quant) { // more rows: W8A8 (WF_FP8 in 16-bit mode), else dequantized, then the dense GEMM
        char *sc = (char *)cuda_scratch(be, matmul_scratch(be, w, n));
        if (!cuda_matmul_w8a8(be, y, x, w, n, sc)) {
            struct weight d = cuda_dequant(be, w, sc);
            blas_matmul(be, y, x, &d, n, sc + cuda_dequant_bytes(be, w));
        }
    } else if (gemv && w->fmt == WF_F32) gemv32(s, y, x, (const float *)w->data, w->bias, N, K, n);
    else if (gemv && w->fmt == WF_BF16) gemv16(be, y, x, (const __nv_bfloat16 *)w->data, w->bias, N, K, n);
    else if (gemv && w->fmt == WF_F16) gemv16(be, y, x, (const __half *)w->data, w->bias, N, K, n);
    else blas_matmul(be, y, x, w, n, NULL);
    if (w->bias && !gemv) { // else in the GEMV's epilogue
        int64_t m = (int64_t)n * N;
        launch_pdl(k_bias, (int)(m < 4096LL * 256 ? cdiv(m, 256) : 4096), 256, 0, s, y, w->bias, n, N);
    }
}

__global__ void k_gather_rows(float *out, const float *x, const int32_t *rows, int d) {
    pdl_wait();
    pdl_trigger();
    int i = blockIdx.x;
    const float *src = x + (int64_t)rows[i] * d;
    for (int k = threadIdx.x; k < d; k += blockDim.x) out[(int64_t)i * d + k] = src[k];
}

static void cu_gather_rows(struct backend *be, float *out, const float *x, const int32_t *rows, int n, int dim) {
    if (n <= 0) return;
    launch_pdl(k_gather_rows, n, 256, 0, cu(be)->stream, out, x, rows, dim);
}

__global__ void k_add(float *y, const float *x, int64_t n) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}
__global__ void k_act(enum act kind, float *x, int64_t n) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = act_dev(kind, x[i]);
}

// out [n, I] = act(x[:, :I]) * x[:, I:], x [n, 2I]
__global__ void k_act_mul(enum act kind, float *out, const float *x, int64_t n, int I) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * I; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / I, j = i % I;
        const float *g = x + t * 2 * I;
        out[i] = act_dev(kind, g[j]) * g[I + j];
    }
}

static int grid_for(int64_t n) { return (int)(n < 4096LL * 256 ? cdiv(n, 256) : 4096); }

static void cu_add(struct backend *be, float *y, const float *x, int64_t n) {
    if (n <= 0) return;
    launch_pdl(k_add, grid_for(n), 256, 0, cu(be)->stream, y, x, n);
}

static void cu_act(struct backend *be, enum act kind, float *x, int64_t n) {
    if (n <= 0) return;
    launch_pdl(k_act, grid_for(n), 256, 0, cu(be)->stream, kind, x, n);
}

static void cu_act_mul(struct backend *be, enum act kind, float *out, const float *x, int n, int inter) {
    if (n <= 0) return;
    launch_pdl(k_act_mul, grid_for((int64_t)n * inter), 256, 0, cu(be)->stream, kind, out, x, n, inter);
}

// One block per token: its heads' pairs (i, i + d/2) rotated by its position.
__global__ void k_rope(float *x, int ld, int heads, int hd, const float *table, const int32_t *pos) {
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x, h2 = hd / 2;
    float *row = x + (int64_t)t * ld;
    const float *c = table + (int64_t)pos[t] * hd, *s = c + h2;
    for (int j = threadIdx.x; j < heads * h2; j += blockDim.x) {
        int h = j / h2, i = j % h2;
        float *a = row + h * hd + i, u = a[0], v = a[h2];
        a[0] = u * c[i] - v * s[i];
        a[h2] = v * c[i] + u * s[i];
    }
}

// A gated MLP's gate | up product: at decode sizes with 16-bit or quantized
// weights, one GEMV whose epilogue adds the bias and writes act(gate) * up
// (gu unwritten); else the product into gu, then act_mul.
static void cu_matmul_act_mul(struct backend *be, enum act kind, float *out, const float *x, const struct weight *w,
                              int n, float *gu) {
    if (n <= 0) return;
    int N = (int)w->rows, K = (int)w->cols;
    bool fuse = gemv_fits(x, w, n) && N % 2 == 0;
    if (fuse && w->fmt == WF_BF16)
        gemv16_g<__nv_bfloat16, true>(be, out, x, (const __nv_bfloat16 *)w->data, w->bias, N, K, n, kind, true);
    else if (fuse && w->fmt == WF_F16)
        gemv16_g<__half, true>(be, out, x, (const __half *)w->data, w->bias, N, K, n, kind, true);
    else if (!(wfmt_quantized(w->fmt) && cuda_gemv_quant_act(be, out, x, w, n, kind, 1))) {
        cu_matmul(be, gu, x, w, n);
        cu_act_mul(be, kind, out, gu, n, N / 2);
    }
}

// A plain MLP's up product: at decode sizes with 16-bit or quantized
// weights, one GEMV whose epilogue adds the bias and applies act; else the
// product, then act.
static void cu_matmul_act(struct backend *be, enum act kind, float *out, const float *x, const struct weight *w,
                          int n) {
    if (n <= 0) return;
    int N = (int)w->rows, K = (int)w->cols;
    bool fuse = gemv_fits(x, w, n);
    if (fuse && w->fmt == WF_BF16)
        gemv16_g<__nv_bfloat16, false>(be, out, x, (const __nv_bfloat16 *)w->data, w->bias, N, K, n, kind, true);
    else if (fuse && w->fmt == WF_F16)
        gemv16_g<__half, false>(be, out, x, (const __half *)w->data, w->bias, N, K, n, kind, true);
    else if (!(wfmt_quantized(w->fmt) && cuda_gemv_quant_act(be, out, x, w, n, kind, 0))) {
        cu_matmul(be, out, x, w, n);
        cu_act(be, kind, out, (int64_t)n * N);
    }
}

// act in place over x [n8 * 8] of 16 bits, 8 a thread (16-byte aligned)
template <typename T> __global__ void k_act16(enum act kind, T *x, int64_t n8) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 u = ((const uint4 *)x)[i];
        T *e = (T *)&u;
#pragma unroll
        for (int k = 0; k < 8; k++) e[k] = (T)act_dev(kind, (float)e[k]);
        ((uint4 *)x)[i] = u;
    }
}

// out [t, j] = act(gu [t, j]) * gu [t, I + j] of 16 bits (act_mul's values
// in fp32, rounded), 8 columns a thread: I8 = I / 8 pieces a row, n rows
template <typename T> __global__ void k_act_mul16(enum act kind, T *out, const T *gu, int64_t n, int I8) {
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * I8; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / I8, j = i - t * I8;
        uint4 g = ((const uint4 *)gu)[t * 2 * I8 + j], u = ((const uint4 *)gu)[t * 2 * I8 + I8 + j], o;
        const T *ge = (const T *)&g, *ue = (const T *)&u;
        T *oe = (T *)&o;
#pragma unroll
        for (int k = 0; k < 8; k++) oe[k] = (T)(act_dev(kind, (float)ge[k]) * (float)ue[k]);
        ((uint4 *)out)[i] = o;
    }
}

// An MLP (backend_mlp's contract) with 16-bit weights past decode sizes, its
// hidden kept in the weights' type T: x rounded to T, the up product written
// in T into h's memory ([n, U] of T fits h's [n, I] fp32 for U <= 2I), act in
// place there (act_mul: into tmp's memory), the down product reading it. The
// composed ops write the hidden in fp32, read and write it for act, then read
// it to round it to T for the down product: 14 bytes an element moved against
// 6 here (gated: 26 against 10). What rounds differently: up x (gate and up
// x) is rounded to T before act (act_mul), as its result is before the down
// product either way.
template <typename T>
static void mlp16(struct backend *be, float *y, const float *x, const struct weight *up, const struct weight *down,
                  int gated, enum act act, float *h, float *tmp, int n) {
    cuda_impl *c = cu(be);
    int K = (int)up->cols, U = (int)up->rows, I = gated ? U / 2 : U;
    int64_t nk = (int64_t)n * K;
    T *x16 = (T *)cuda_scratch(be, (size_t)nk * sizeof(T)), *pre = (T *)h, *hid = gated ? (T *)tmp : pre;
    launch_pdl(k_to_16<T>, to16_grid(nk), 256, 0, c->stream, x16, x, nk);
    blas_gemm(be, pre, x16, up, n, 1);
    if (gated) launch_pdl(k_act_mul16<T>, grid_for((int64_t)n * I / 8), 256, 0, c->stream, act, hid, (const T *)pre,
                          (int64_t)n, I / 8);
    else launch_pdl(k_act16<T>, grid_for((int64_t)n * I / 8), 256, 0, c->stream, act, hid, (int64_t)n * I / 8);
    blas_gemm(be, y, hid, down, n, 0);
}

// 0 where mlp16 does not take the shape: decode rows (the fused GEMVs), other
// formats, biases, I not a multiple of 8.
static int cu_mlp(struct backend *be, float *y, const float *x, const struct weight *up, const struct weight *down,
                  int gated, enum act act, float *h, float *tmp, int n) {
    enum wfmt f = up->fmt;
    int U = (int)up->rows, I = gated ? U / 2 : U;
    if ((f != WF_BF16 && f != WF_F16) || down->fmt != f || up->bias || down->bias || gemv_fits(x, up, n) ||
        (gated && U % 2) || I % 8 || down->cols != I || ((uintptr_t)h & 15) || ((uintptr_t)tmp & 15))
        return 0;
    if (f == WF_BF16) mlp16<__nv_bfloat16>(be, y, x, up, down, gated, act, h, tmp, n);
    else mlp16<__half>(be, y, x, up, down, gated, act, h, tmp, n);
    return 1;
}

static void cu_rope(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *table,
                    const int32_t *positions) {
    if (n <= 0) return;
    launch_pdl(k_rope, n, 128, 0, cu(be)->stream, x, ld, heads, head_dim, table, positions);
}

// One warp per (token, head): RMSNorm over head_dim.
__global__ void k_head_rmsnorm(float *x, int ld, int n, int heads, int hd, const float *w, float eps) {
    pdl_wait();
    pdl_trigger();
    int g = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (g >= n * heads) return;
    float *p = x + (int64_t)(g / heads) * ld + (g % heads) * hd;
    float ss = 0;
    for (int i = lane; i < hd; i += 32) ss += p[i] * p[i];
    ss = warp_sum(ss);
    float r = rsqrtf(ss / hd + eps);
    // in place: a lane's 8 loads of p and w before its 8 stores (a load, store
    // loop waited a memory latency an element: 16 of them for MLA's 512)
    for (int i0 = lane; i0 < hd; i0 += 8 * 32) {
        float pv[8], wv[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int i = i0 + 32 * k;
            pv[k] = i < hd ? p[i] : 0.0f, wv[k] = i < hd ? w[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (i0 + 32 * k < hd) p[i0 + 32 * k] = wv[k] * (pv[k] * r);
    }
}

static void cu_head_rmsnorm(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *w,
                            float eps) {
    if (n <= 0) return;
    launch_pdl(k_head_rmsnorm, cdiv((int64_t)n * heads, 4), 128, 0, cu(be)->stream, x, ld, n, heads, head_dim, w, eps);
}

__global__ void k_sum_sq(const float *x, int64_t n, double *out) {
    __shared__ float red[32];
    float s = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        s += x[i] * x[i];
    s = block_sum(s, red);
    if (threadIdx.x == 0) atomicAdd(out, (double)s);
}

static double cu_sum_sq(struct backend *be, const float *x, int64_t n) {
    double *d = (double *)cuda_scratch(be, sizeof(double)), h = 0;
    CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof(double), cu(be)->stream));
    if (n > 0) k_sum_sq<<<grid_for(n) < 1024 ? grid_for(n) : 1024, 256, 0, cu(be)->stream>>>(x, n, d);
    LAUNCH_CHECK();
    cu_download(be, &h, d, sizeof h);
    return h;
}

static void *cu_host_alloc(struct backend *be, size_t bytes) {
    (void)be;
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

static void cu_host_free(struct backend *be, void *p) {
    cu_sync(be);
    CUDA_CHECK(cudaFreeHost(p));
}

static void cu_download_async(struct backend *be, void *dst, const void *src, size_t n) {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, cu(be)->stream));
}

static int cu_fence(struct backend *be) {
    cuda_impl *c = cu(be);
    int f = c->next_fence++;
    CUDA_CHECK(cudaEventRecord(c->events[f % CUDA_FENCES], c->stream));
    return f;
}

static void cu_fence_wait(struct backend *be, int fence) {
    CUDA_CHECK(cudaEventSynchronize(cu(be)->events[fence % CUDA_FENCES]));
}

static void cu_graph_begin(struct backend *be) {
    CUDA_CHECK(cudaStreamBeginCapture(cu(be)->stream, cudaStreamCaptureModeThreadLocal));
}

static void *cu_graph_end(struct backend *be) {
    cudaGraph_t g;
    cudaGraphExec_t x;
    CUDA_CHECK(cudaStreamEndCapture(cu(be)->stream, &g));
    if (diag_on("graphs")) { // the kernels a replayed step launches (docs/BENCHMARKS.md counts them per layer)
        size_t n = 0, k = 0;
        CUDA_CHECK(cudaGraphGetNodes(g, NULL, &n));
        cudaGraphNode_t *nodes = (cudaGraphNode_t *)xcalloc(n ? n : 1, sizeof *nodes);
        CUDA_CHECK(cudaGraphGetNodes(g, nodes, &n));
        for (size_t i = 0; i < n; i++) {
            cudaGraphNodeType t;
            CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &t));
            k += t == cudaGraphNodeTypeKernel;
        }
        free(nodes);
        diag_printf("graph recorded: %zu kernels, %zu nodes\n", k, n);
    }
    CUDA_CHECK(cudaGraphInstantiate(&x, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    return (void *)x;
}

static void cu_graph_launch(struct backend *be, void *graph) {
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, cu(be)->stream));
}

static void cu_graph_free(struct backend *be, void *graph) {
    cu_sync(be);
    CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

// A 1 GiB device-to-device copy (2 GiB moved) and a bf16 8192^3 GEMM through
// cuBLAS, best of a few, timed with events.
static int cu_peaks(struct backend *be, double *bw, double *fl) {
    cuda_impl *c = cu(be);
    size_t nb = (size_t)1 << 30, n = 8192;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, nb) != cudaSuccess || cudaMalloc(&b, nb) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(a);
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "no room to measure the device's limits");
    }
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float best = 1e30f, ms;
    for (int i = 0; i < 5; i++) {
        CUDA_CHECK(cudaEventRecord(e0, c->stream));
        CUDA_CHECK(cudaMemcpyAsync(b, a, nb, cudaMemcpyDeviceToDevice, c->stream));
        CUDA_CHECK(cudaEventRecord(e1, c->stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (i) best = fminf(best, ms); // the first warms up
    }
    *bw = 2.0 * nb / (best * 1e-3);
    k_random<<<4096, 256, 0, c->stream>>>((__nv_bfloat16 *)a, n * n * 2, 1, 0.1f); // random, never zeros
    LAUNCH_CHECK();
    const float one = 1.0f, zero = 0.0f;
    best = 1e30f;
    char *A = (char *)a, *B = A + n * n * 2;
    for (int i = 0; i < 4; i++) {
        CUDA_CHECK(cudaEventRecord(e0, c->stream));
        CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one, A, CUDA_R_16BF, (int)n,
                                  B, CUDA_R_16BF, (int)n, &zero, b, CUDA_R_16BF, (int)n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
        CUDA_CHECK(cudaEventRecord(e1, c->stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (i) best = fminf(best, ms);
    }
    *fl = 2.0 * n * n * n / (best * 1e-3);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    return VLLM_OK;
}

static void cu_bind(struct backend *be) { CUDA_CHECK(cudaSetDevice(cu(be)->device)); }

// The kernels' limits, and the scratch the ops need at the query's sizes
// (grown now, so that no step grows it).
static int cu_supports(struct backend *be, const struct op_query *q) {
    const char *why = NULL;
    char buf[160];
    size_t T = (size_t)MAX(q->max_tokens, 1), S = (size_t)MAX(q->max_seq_len, 1), need = 0;
    switch (q->op) {
    case OP_MATMUL: need = matmul_scratch(be, q->w, (int64_t)T); break;
    case OP_EMBED:                                   // fp32, bf16 and fp16 weights
        if (wfmt_quantized(q->w->fmt))
            snprintf(buf, sizeof buf, "embedding: %s table", wfmt_name(q->w->fmt)), why = buf;
        break;
    case OP_ATTN: {
        const struct attn_dims *d = q->attn;
        if (d->head_dim > CUDA_MAX_HEAD_DIM)
            snprintf(buf, sizeof buf, "attention: head_dim %d > %d", d->head_dim, CUDA_MAX_HEAD_DIM), why = buf;
        need = cuda_attn_scratch(be, d, (int)T, q->max_seqs, (int)S);
        break;
    }
    case OP_MAMBA: {
        const struct mamba_dims *d = q->mamba;
        if (d->conv_kernel < CUDA_CONV_KMIN || d->conv_kernel > CUDA_CONV_KMAX)
            snprintf(buf, sizeof buf, "Mamba2: conv_kernel %d outside [%d, %d]", d->conv_kernel, CUDA_CONV_KMIN,
                     CUDA_CONV_KMAX), why = buf;
        else if (d->state > CUDA_MAX_STATE || d->state % 4) // ssd_decode's 16-byte state loads
            snprintf(buf, sizeof buf, "Mamba2: ssm_state_size %d (at most %d, a multiple of 4)", d->state,
                     CUDA_MAX_STATE), why = buf;
        need = cuda_ssd_scratch(be, d, (int)T, q->max_seqs);
        break;
    }
    case OP_MOE_ROUTE: {
        const struct moe_route_cfg *r = q->route;
        if (r->num_experts > CUDA_MAX_EXPERTS || r->top_k > CUDA_MAX_TOPK || r->n_group > CUDA_MAX_GROUPS ||
            r->num_experts % MAX(r->n_group, 1))
            snprintf(buf, sizeof buf, "MoE router: %d experts in %d groups, top-%d (at most %d experts, %d groups, "
                     "top-%d)", r->num_experts, r->n_group, r->top_k, CUDA_MAX_EXPERTS, CUDA_MAX_GROUPS, CUDA_MAX_TOPK),
                why = buf;
        break;
    }
    case OP_MOE_EXPERTS: {
        const struct moe_experts *w = q->moe;
        enum wfmt fu = w->up.fmt, fd = w->down.fmt;
        bool qu = wfmt_quantized(fu), qd = wfmt_quantized(fd);
        int mult = fu == WF_NVFP4 ? 32 : 16; // codes a 16-byte load of the GEMV (NVFP4: 32, and 2 block scales)
        if ((qu || qd) && fu != fd) // cuda_moe.cu: one weight type for both
            snprintf(buf, sizeof buf, "MoE experts: %s up and %s down weights (quantized experts need both in one "
                     "format)", wfmt_name(fu), wfmt_name(fd)), why = buf;
        else if (qu && (w->dim % mult || w->inter % mult))
            snprintf(buf, sizeof buf, "MoE experts: %s weights need hidden and expert sizes that are multiples of "
                     "%d (%d, %d)", wfmt_name(fu), mult, w->dim, w->inter), why = buf;
        else if (w->num_experts > CUDA_MAX_EXPERTS || q->route->top_k > CUDA_MAX_TOPK)
            snprintf(buf, sizeof buf, "MoE experts: %d experts top-%d", w->num_experts, q->route->top_k), why = buf;
        else if (w->up.fmt != WF_F32 && cuda_moe_smem() > cu(be)->smem_optin)
            snprintf(buf, sizeof buf, "MoE experts: the grouped GEMM's %zu bytes of shared memory per block (the "
                     "device has %zu)", cuda_moe_smem(), cu(be)->smem_optin), why = buf;
        need = cuda_moe_scratch(w, T, q->route->top_k);
        break;
    }
    case OP_KDA: {
        const struct kda_dims *d = q->kda;
        if (d->conv_kernel < CUDA_CONV_KMIN || d->conv_kernel > CUDA_CONV_KMAX)
            snprintf(buf, sizeof buf, "Kimi Delta Attention: short_conv_kernel_size %d outside [%d, %d]",
                     d->conv_kernel, CUDA_CONV_KMIN, CUDA_CONV_KMAX), why = buf;
        else if (d->head_dim > CUDA_KDA_MAX_HEAD_DIM)
            snprintf(buf, sizeof buf, "Kimi Delta Attention: head_dim %d over CUDA_KDA_MAX_HEAD_DIM %d (the decode "
                     "step keeps a head's state in registers)", d->head_dim, CUDA_KDA_MAX_HEAD_DIM), why = buf;
        else if (cuda_kda_smem(d->head_dim) > cu(be)->smem_optin)
            snprintf(buf, sizeof buf, "Kimi Delta Attention: head_dim %d: prefill chunks take %zu bytes of shared "
                     "memory (%zu a block)", d->head_dim, cuda_kda_smem(d->head_dim), cu(be)->smem_optin), why = buf;
        break;
    }
    case OP_MLA: {
        const struct mla_dims *d = q->mla;
        if (be->kv_dtype == DT_FP8) // as the CPU backend (its cuda_mla.cu caches fp32 or bf16 latents)
            snprintf(buf, sizeof buf, "multi-head latent attention (MLA) with an fp8 KV cache (use kv_cache_dtype "
                     "auto or bfloat16)"), why = buf;
        else if (d->rank > CUDA_MLA_MAX_RANK || d->rank % 4 || d->rope % 4 || d->rank + d->rope > CUDA_MLA_MAX_W ||
            cuda_mla_smem(d) > cu(be)->smem_optin)
            snprintf(buf, sizeof buf, "multi-head latent attention: kv_lora_rank %d, qk_rope_head_dim %d (multiples "
                     "of 4, rank at most %d, together at most %d)", d->rank, d->rope, CUDA_MLA_MAX_RANK,
                     CUDA_MLA_MAX_W), why = buf;
        else need = cuda_mla_scratch(be, d, (int)T, (int)S);
        break;
    }
    case OP_SAMPLE: // also covers lm_head's all-gather under TP: rows x vocab (padded to tp) fp32
        need = cuda_sample_scratch(MAX(q->max_seqs, 1), q->vocab);
        break;
    }
    if (why) return vllm_err(VLLM_ERR_UNSUPPORTED, "the CUDA backend cannot run %s", why);
    return scratch_grow(be, need); // now: no step grows it (nor a graph's recording)
}

static struct backend_ops cuda_ops;

static void init_ops(void) {
    struct backend_ops *o = &cuda_ops;
    o->name = "cuda";
    o->destroy = cu_destroy;
    o->alloc = cu_alloc;
    o->free = cu_free;
    o->upload = cu_upload;
    o->download = cu_download;
    o->sync = cu_sync;
    o->host_alloc = cu_host_alloc;
    o->host_free = cu_host_free;
    o->download_async = cu_download_async;
    o->fence = cu_fence;
    o->fence_wait = cu_fence_wait;
    o->graph_begin = cu_graph_begin;
    o->graph_end = cu_graph_end;
    o->graph_launch = cu_graph_launch;
    o->graph_free = cu_graph_free;
    o->supports = cu_supports;
    o->weight_alloc = cu_weight_alloc;
    o->weight_upload_raw = cu_weight_upload_raw;
    o->weight_random = cu_weight_random;
    o->gather_ids = cu_gather_ids;
    o->embed = cu_embed;
    o->rmsnorm = cu_rmsnorm;
    o->add_rmsnorm = cu_add_rmsnorm;
    o->matmul = cu_matmul;
    o->gather_rows = cu_gather_rows;
    o->add = cu_add;
    o->act = cu_act;
    o->act_mul = cu_act_mul;
    o->rope = cu_rope;
    o->head_rmsnorm = cu_head_rmsnorm;
    o->qk_norm_rope = cuda_qk_norm_rope;
    o->matmul_act_mul = cu_matmul_act_mul;
    o->matmul_act = cu_matmul_act;
    o->mlp = cu_mlp;
    o->sum_sq = cu_sum_sq;
    o->conv1d_fwd = cuda_conv1d_fwd;
    o->conv1d_update = cuda_conv1d_update;
    o->ssd_prefill = cuda_ssd_prefill;
    o->ssd_decode = cuda_ssd_decode;
    o->gated_rmsnorm = cuda_gated_rmsnorm;
    // The three kernels in stream order (PDL overlaps each launch with the one
    // before). One kernel for the three (a block's own x rows and its group's B
    // and C convolved in shared memory, the group's last block closing with B
    // and C's windows and the gated norm; aa5ef0f) ran 2.5% slower at 64 decode
    // rows on nano30b and no faster at one (docs/BENCHMARKS.md, Dec 6): every
    // head's block convolved its group's B and C again, and the closing blocks
    // ran after the rest.
    o->mamba_decode = backend_mamba_decode;
    o->kv_write = cuda_kv_write;
    o->kda_prefill = cuda_kda_prefill;
    o->kda_decode = cuda_kda_decode;
    o->kda_gate = cuda_kda_gate;
    o->head_norm_gate = cuda_head_norm_gate;
    o->mla_kv_write = cuda_mla_kv_write;
    o->mla_attn = cuda_mla_attn;
    o->attn_prefill = cuda_attn_prefill;
    o->attn_decode = cuda_attn_decode;
    o->moe_route = cuda_moe_route;
    o->moe_experts = cuda_moe_experts;
    o->mask_logits = cuda_mask_logits;
    o->bias_logits = cuda_bias_logits;
    o->mem_info = cu_mem_info;
    o->sample = cuda_sample;
    o->token_logprobs = cuda_token_logprobs;
    o->bind = cu_bind;
    o->peaks = cu_peaks;
#ifdef VLLM_HAVE_NCCL
    o->all_reduce = cuda_all_reduce;
    o->all_gather = cuda_all_gather;
#endif
}

extern "C" int backend_cuda_create(enum dtype kv_dtype, struct backend **out) {
    if (kv_dtype == DT_F16)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "the CUDA backend keeps the KV cache in float32, bfloat16 or fp8, not "
                        "float16");
    const char *gv = getenv("VLLM_GEMV16"); // the decode GEMV's kernel (gemv16_g); unset: by the weight's size
    int gemv16 = gv && *gv ? gv[0] - '0' : -1;
    if (gv && *gv && (gemv16 < 0 || gemv16 > 1 || gv[1]))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "VLLM_GEMV16=%s: not a kernel 0 or 1 (docs/ENVIRONMENT.md)", gv);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return vllm_err(VLLM_ERR_BACKEND, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    cuda_impl *c = (cuda_impl *)xcalloc(1, sizeof *c);
    CUDA_CHECK(cudaGetDevice(&c->device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, c->device));
    c->num_sms = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    // PDL needs the device (sm_90+) and kernels compiled for it: an older
    // architecture's code has no pdl_wait, so launching it early would race
    cudaFuncAttributes fa;
    CUDA_CHECK(cudaFuncGetAttributes(&fa, k_pdl_probe));
    const char *no_pdl = getenv("VLLM_NO_PDL");
    cuda_pdl = prop.major >= 9 && fa.ptxVersion >= 90 && fa.binaryVersion >= 90 &&
               !(no_pdl && *no_pdl && strcmp(no_pdl, "0"));
    const char *w8a8 = getenv("VLLM_FP8_W8A8");
    c->w8a8 = !(w8a8 && !strcmp(w8a8, "0"));
    c->gemv16 = gemv16;
    const char *qmma = getenv("VLLM_QMMA");
    c->qmma = !(qmma && !strcmp(qmma, "0"));
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&c->blas));
    CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
    for (int i = 0; i < CUDA_FENCES; i++) CUDA_CHECK(cudaEventCreateWithFlags(&c->events[i], cudaEventDisableTiming));
    // cuBLAS gets a fixed workspace, so that recording it in a graph allocates nothing
    c->blas_ws_bytes = (size_t)64 << 20;
    CUDA_CHECK(cudaMalloc(&c->blas_ws, c->blas_ws_bytes));
    CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes));
    CUBLAS_CHECK(cublasLtCreate(&c->lt));
    init_ops();
    struct backend *be = (struct backend *)xcalloc(1, sizeof *be);
    be->ops = &cuda_ops;
    be->num_threads = 1;
    be->kv_dtype = kv_dtype;
    be->tp_size = 1;
    be->impl = c;
    *out = be;
    return VLLM_OK;
}
