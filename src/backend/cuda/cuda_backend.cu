// cuda_backend.cu - the CUDA backend: device memory on one stream, cuBLAS
// GEMMs (bf16 inputs with fp32 accumulation, or fp32), and the dense ops.
#include <vector>

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "io/dtype.h"
}

#define CUBLAS_CHECK(x)                                                                                   \
    do {                                                                                                  \
        cublasStatus_t s_ = (x);                                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                \
            fprintf(stderr, "vllm: cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__);            \
            abort();                                                                                      \
        }                                                                                                 \
    } while (0)

void *cuda_scratch(struct backend *be, size_t bytes) {
    cuda_impl *c = cu(be);
    if (c->scratch_bytes < bytes) {
        CUDA_CHECK(cudaStreamSynchronize(c->stream)); // nothing queued may still use the old buffer
        if (c->scratch) CUDA_CHECK(cudaFree(c->scratch));
        size_t n = bytes + bytes / 4 + (1 << 20);
        CUDA_CHECK(cudaMalloc(&c->scratch, n));
        c->scratch_bytes = n;
    }
    return c->scratch;
}

static void cu_destroy(struct backend *be) {
    cuda_impl *c = cu(be);
    cudaStreamSynchronize(c->stream);
    if (c->scratch) cudaFree(c->scratch);
    cublasDestroy(c->blas);
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

static void cu_memset0(struct backend *be, void *dst, size_t n) {
    if (n) CUDA_CHECK(cudaMemsetAsync(dst, 0, n, cu(be)->stream));
}

static void cu_sync(struct backend *be) { CUDA_CHECK(cudaStreamSynchronize(cu(be)->stream)); }

static int cu_weight_upload(struct backend *be, struct weight *w, const float *src, int64_t rows, int64_t cols,
                            enum dtype dt) {
    size_t n = (size_t)rows * cols, bytes = n * dtype_size(dt);
    w->data = cu_alloc(be, bytes);
    if (!w->data) return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of GPU memory for a weight", bytes);
    w->dtype = dt;
    w->rows = rows;
    w->cols = cols;
    // On our stream, after the zeroing memset that cu_alloc queued there (a plain
    // cudaMemcpy runs on the legacy stream, which does not wait for ours).
    cudaStream_t s = cu(be)->stream;
    if (dt == DT_F32) {
        CUDA_CHECK(cudaMemcpyAsync(w->data, src, bytes, cudaMemcpyHostToDevice, s));
        CUDA_CHECK(cudaStreamSynchronize(s));
        return VLLM_OK;
    }
    // bf16: convert on the host in slabs, round to nearest even
    const size_t slab = 1 << 22;
    std::vector<uint16_t> tmp(slab < n ? slab : n);
    for (size_t i = 0; i < n; i += slab) {
        size_t m = n - i < slab ? n - i : slab;
        for (size_t k = 0; k < m; k++) tmp[k] = f32_to_bf16(src[i + k]);
        CUDA_CHECK(cudaMemcpyAsync((uint16_t *)w->data + i, tmp.data(), m * 2, cudaMemcpyHostToDevice, s));
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
        float v = a * (float)(int32_t)(z >> 32);
        if constexpr (sizeof(T) == 2) w[i] = __float2bfloat16(v);
        else w[i] = v;
    }
}

static int cu_weight_random(struct backend *be, struct weight *w, int64_t rows, int64_t cols, enum dtype dt,
                            uint64_t seed, float std) {
    size_t n = (size_t)rows * cols, bytes = n * dtype_size(dt);
    w->data = cu_alloc(be, bytes);
    if (!w->data) return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of GPU memory for a weight", bytes);
    w->dtype = dt;
    w->rows = rows;
    w->cols = cols;
    if (dt == DT_BF16) k_random<<<4096, 256, 0, cu(be)->stream>>>((__nv_bfloat16 *)w->data, n, seed, std);
    else k_random<<<4096, 256, 0, cu(be)->stream>>>((float *)w->data, n, seed, std);
    LAUNCH_CHECK();
    return VLLM_OK;
}

__global__ void k_gather_ids(int32_t *ids, const int32_t *table, const int32_t *src, int n) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) ids[t] = table[src[t]];
}

static void cu_gather_ids(struct backend *be, int32_t *ids, const int32_t *table, const int32_t *src, int n) {
    if (n <= 0) return;
    k_gather_ids<<<cdiv(n, 256), 256, 0, cu(be)->stream>>>(ids, table, src, n);
    LAUNCH_CHECK();
}

template <typename T>
__global__ void k_embed(float *out, const T *table, const int32_t *ids, int d) {
    int t = blockIdx.x;
    const T *row = table + (int64_t)ids[t] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[(int64_t)t * d + i] = load_f(row + i);
}

static void cu_embed(struct backend *be, float *out, const struct weight *table, const int32_t *ids, int n) {
    if (n <= 0) return;
    int d = (int)table->cols;
    if (table->dtype == DT_BF16)
        k_embed<<<n, 256, 0, cu(be)->stream>>>(out, (const __nv_bfloat16 *)table->data, ids, d);
    else k_embed<<<n, 256, 0, cu(be)->stream>>>(out, (const float *)table->data, ids, d);
    LAUNCH_CHECK();
}

// One block per row: res += x (if x); out = rmsnorm(res) * w.
__global__ void k_add_rmsnorm(float *res, const float *x, float *out, const float *w, int d, float eps) {
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

static void cu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n, int dim, float eps) {
    if (n <= 0) return;
    k_add_rmsnorm<<<n, 256, 0, cu(be)->stream>>>((float *)x, NULL, out, w, dim, eps);
    LAUNCH_CHECK();
}

static void cu_add_rmsnorm(struct backend *be, float *res, const float *x, float *out, const float *w, int n, int dim,
                           float eps) {
    if (n <= 0) return;
    k_add_rmsnorm<<<n, 256, 0, cu(be)->stream>>>(res, x, out, w, dim, eps);
    LAUNCH_CHECK();
}

__global__ void k_to_bf16(__nv_bfloat16 *y, const float *x, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n; i += (int64_t)gridDim.x * blockDim.x) y[i] = __float2bfloat16(x[i]);
}

// y: [n, N] = x: [n, K] @ W[N, K]^T. cuBLAS is column-major: it computes
// Y^T (N x n) = op(W) (N x K) * X^T (K x n) with W seen as K x N, transposed.
static void cu_matmul(struct backend *be, float *y, const float *x, const struct weight *w, int n) {
    if (n <= 0) return;
    cuda_impl *c = cu(be);
    int N = (int)w->rows, K = (int)w->cols;
    const float one = 1.0f, zero = 0.0f;
    if (w->dtype == DT_F32) {
        CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, (const float *)w->data, K, x, K,
                                 &zero, y, N));
        return;
    }
    __nv_bfloat16 *xb = (__nv_bfloat16 *)cuda_scratch(be, (size_t)n * K * 2);
    int64_t nk = (int64_t)n * K;
    k_to_bf16<<<(int)(nk < 65536 * 256 ? cdiv(nk, 256) : 65536), 256, 0, c->stream>>>(xb, x, nk);
    LAUNCH_CHECK();
    CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n, K, &one, w->data, CUDA_R_16BF, K, xb,
                              CUDA_R_16BF, K, &zero, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

__global__ void k_gather_rows(float *out, const float *x, const int32_t *rows, int d) {
    int i = blockIdx.x;
    const float *src = x + (int64_t)rows[i] * d;
    for (int k = threadIdx.x; k < d; k += blockDim.x) out[(int64_t)i * d + k] = src[k];
}

static void cu_gather_rows(struct backend *be, float *out, const float *x, const int32_t *rows, int n, int dim) {
    if (n <= 0) return;
    k_gather_rows<<<n, 256, 0, cu(be)->stream>>>(out, x, rows, dim);
    LAUNCH_CHECK();
}

__global__ void k_add(float *y, const float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}
__global__ void k_relu2(float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = x[i];
        x[i] = v > 0 ? v * v : 0.0f;
    }
}

static int grid_for(int64_t n) { return (int)(n < 4096LL * 256 ? cdiv(n, 256) : 4096); }

static void cu_add(struct backend *be, float *y, const float *x, int64_t n) {
    if (n <= 0) return;
    k_add<<<grid_for(n), 256, 0, cu(be)->stream>>>(y, x, n);
    LAUNCH_CHECK();
}

static void cu_relu2(struct backend *be, float *x, int64_t n) {
    if (n <= 0) return;
    k_relu2<<<grid_for(n), 256, 0, cu(be)->stream>>>(x, n);
    LAUNCH_CHECK();
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

static const struct backend_ops cuda_ops = {
    "cuda",
    cu_destroy,
    cu_alloc,
    cu_free,
    cu_upload,
    cu_download,
    cu_memset0,
    cu_sync,
    cu_weight_upload,
    cu_weight_random,
    cu_gather_ids,
    cu_embed,
    cu_rmsnorm,
    cu_add_rmsnorm,
    cu_matmul,
    cu_gather_rows,
    cu_add,
    cu_relu2,
    cu_sum_sq,
    cuda_conv1d_fwd,
    cuda_conv1d_update,
    cuda_ssd_prefill,
    cuda_ssd_decode,
    cuda_gated_rmsnorm,
    cuda_kv_write,
    cuda_attn_prefill,
    cuda_attn_decode,
    cuda_moe_route,
    cuda_moe_experts,
    cuda_sample,
};

extern "C" int backend_cuda_create(enum dtype kv_dtype, struct backend **out) {
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
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&c->blas));
    CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
    struct backend *be = (struct backend *)xcalloc(1, sizeof *be);
    be->ops = &cuda_ops;
    be->num_threads = 1;
    be->kv_dtype = kv_dtype;
    be->impl = c;
    *out = be;
    return VLLM_OK;
}
