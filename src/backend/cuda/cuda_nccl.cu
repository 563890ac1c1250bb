// cuda_nccl.cu - tensor parallelism on CUDA: one NCCL rank per GPU, all in
// this process (ncclCommInitAll), each driven by its own host thread. The
// collectives run on the rank's stream, so they are ordered with its ops and
// can be recorded into graphs. Their CPU reference is src/backend/cpu/cpu_tp.c.
//
// Multi-node is the same code with one process per GPU: rank 0 makes an
// ncclUniqueId, MPI broadcasts it, every process calls ncclCommInitRank
// (docs/TENSOR_PARALLEL.md). Not built yet: it needs a step broadcast too.
#include <vector>

#include "backend/cuda/cuda_common.cuh"

#ifdef VLLM_HAVE_NCCL
#include <nccl.h>

#define NCCL_CHECK(x)                                                                                    \
    do {                                                                                                 \
        ncclResult_t r_ = (x);                                                                           \
        if (r_ != ncclSuccess) {                                                                         \
            fprintf(stderr, "vllm: NCCL error %d at %s:%d: %s\n", (int)r_, __FILE__, __LINE__,           \
                    ncclGetErrorString(r_));                                                             \
            abort();                                                                                     \
        }                                                                                                \
    } while (0)

static ncclComm_t comm_of(struct backend *be) { return (ncclComm_t)cu(be)->comm; }

void cuda_all_reduce(struct backend *be, float *x, int64_t n) {
    if (n <= 0) return;
    NCCL_CHECK(ncclAllReduce(x, x, (size_t)n, ncclFloat32, ncclSum, comm_of(be), cu(be)->stream));
}

// out[i, k*in_cols + j] = g[k, i, j] (rank k's rows, as ncclAllGather lays
// them out one rank after the other), for columns below out_cols.
__global__ void k_interleave(float *out, int out_cols, const float *g, int in_cols, int rows) {
    int64_t n = (int64_t)rows * out_cols;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = idx / out_cols;
        int c = (int)(idx % out_cols), k = c / in_cols, j = c % in_cols;
        out[idx] = g[((int64_t)k * rows + i) * in_cols + j];
    }
}

void cuda_all_gather(struct backend *be, float *out, int out_cols, const float *in, int in_cols, int rows) {
    if (rows <= 0) return;
    size_t part = (size_t)rows * in_cols;
    float *g = (float *)cuda_scratch(be, sizeof(float) * part * be->tp_size);
    cudaStream_t s = cu(be)->stream;
    NCCL_CHECK(ncclAllGather(in, g, part, ncclFloat32, comm_of(be), s));
    int64_t n = (int64_t)rows * out_cols;
    k_interleave<<<(int)(n < 4096LL * 256 ? cdiv(n, 256) : 4096), 256, 0, s>>>(out, out_cols, g, in_cols, rows);
    LAUNCH_CHECK();
}

void cuda_comm_destroy(void *comm) {
    if (comm) ncclCommDestroy((ncclComm_t)comm);
}

extern "C" int backend_cuda_create_group(int n, enum dtype kv_dtype, struct backend **out) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) cudaGetLastError(), count = 0;
    if (count < n)
        return vllm_err(VLLM_ERR_BACKEND, "tensor_parallel_size %d needs %d GPUs; %d visible", n, n, count);
    std::vector<ncclComm_t> comms(n);
    ncclResult_t r = ncclCommInitAll(comms.data(), n, NULL); // rank r on visible GPU r
    if (r != ncclSuccess)
        return vllm_err(VLLM_ERR_BACKEND, "NCCL could not join %d GPUs: %s", n, ncclGetErrorString(r));
    for (int k = 0; k < n; k++) {
        CUDA_CHECK(cudaSetDevice(k));
        int rc = backend_cuda_create(kv_dtype, &out[k]); // on the current device
        if (rc) {
            for (int j = k; j < n; j++) ncclCommDestroy(comms[j]);
            while (k-- > 0) backend_free(out[k]), out[k] = NULL;
            return rc;
        }
        cu(out[k])->comm = comms[k];
        out[k]->tp_rank = k;
        out[k]->tp_size = n;
    }
    CUDA_CHECK(cudaSetDevice(0));
    return VLLM_OK;
}

#else // a CUDA build without NCCL: one GPU only

void cuda_comm_destroy(void *comm) { (void)comm; }

extern "C" int backend_cuda_create_group(int n, enum dtype kv_dtype, struct backend **out) {
    (void)kv_dtype, (void)out;
    return vllm_err(VLLM_ERR_UNSUPPORTED, "tensor_parallel_size %d on cuda: this build has no NCCL", n);
}

#endif
