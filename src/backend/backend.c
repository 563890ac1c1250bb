// backend.c - picks a backend by device name.
#include "backend/backend.h"
#include "core/common.h"

size_t dtype_size(enum dtype d) { return d == DT_BF16 ? 2 : 4; }

int backend_create(const char *device, int num_threads, enum dtype kv_dtype, struct backend **out) {
    if (!device || !strcmp(device, "cpu")) return backend_cpu_create(num_threads, out);
    if (!strcmp(device, "cuda")) {
#ifdef VLLM_HAVE_CUDA
        return backend_cuda_create(kv_dtype, out);
#else
        (void)kv_dtype;
        return vllm_err(VLLM_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (build with -DVLLM_CUDA=ON)");
#endif
    }
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown device '%s' (expected cpu or cuda)", device);
}

int backend_create_group(const char *device, int n, int num_threads, enum dtype kv_dtype, struct backend **out) {
    if (n < 1) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "a tensor-parallel group of %d ranks", n);
    if (n == 1) return backend_create(device, num_threads, kv_dtype, out);
    if (!device || !strcmp(device, "cpu")) return backend_cpu_create_group(n, num_threads, out);
    if (!strcmp(device, "cuda")) {
#ifdef VLLM_HAVE_CUDA
        return backend_cuda_create_group(n, kv_dtype, out);
#else
        return vllm_err(VLLM_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (build with -DVLLM_CUDA=ON)");
#endif
    }
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown device '%s' (expected cpu or cuda)", device);
}

void backend_bind(struct backend *be) {
    if (be && be->ops->bind) be->ops->bind(be);
}

void backend_free(struct backend *be) {
    if (be) be->ops->destroy(be);
}
