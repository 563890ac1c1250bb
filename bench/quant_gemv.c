// quant_gemv.c - decode-sized products (one row) of the CPU fast path with
// bf16, FP8 and NVFP4 weights of the same shape, interleaved round by round
// so that every format sees the same machine (the shared CPU's bandwidth
// moves by 2x between minutes): median time per format, its bytes per
// second, and its speed-up over bf16 (docs/BENCHMARKS.md).
//
// Usage: build/quant_gemv [THREADS (2)] [ROUNDS (15)] [ROWS (32768)] [COLS (1024)]
#include <stdio.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 15;
    int64_t N = argc > 3 ? atoll(argv[3]) : 32768, K = argc > 4 ? atoll(argv[4]) : 1024;
    rounds = MAX(1, MIN(rounds, 256));
    struct backend *be = NULL;
    if (cpu_backend_create(MAX(nt, 1), 0, -1, &be)) {
        fprintf(stderr, "quant_gemv: %s\n", vllm_last_error());
        return 1;
    }
    enum wfmt fmts[] = {WF_BF16, WF_FP8, WF_NVFP4};
    struct weight w[3];
    for (int f = 0; f < 3; f++)
        if (be->ops->weight_alloc(be, &w[f], fmts[f], N, K) || be->ops->weight_random(be, &w[f], 1, 0.02f)) {
            fprintf(stderr, "quant_gemv: %s\n", vllm_last_error());
            return 1;
        }
    float *x = xcalloc((size_t)K, sizeof(float)), *y = xcalloc((size_t)N, sizeof(float));
    for (int64_t i = 0; i < K; i++) x[i] = 0.01f * (float)(i % 7);
    double *t = xcalloc((size_t)3 * rounds, sizeof(double));
    for (int r = 0; r < rounds; r++)
        for (int f = 0; f < 3; f++) {
            double t0 = now_s();
            for (int i = 0; i < 5; i++) fast_matmul(be, y, x, &w[f], 1);
            t[f * rounds + r] = (now_s() - t0) / 5;
        }
    printf("[%lld, %lld] x 1 row, %d threads, kernels %s, median of %d rounds\n", (long long)N, (long long)K, nt,
           fast_k(be)->name, rounds);
    double base = 0;
    for (int f = 0; f < 3; f++) {
        qsort(t + f * rounds, rounds, sizeof(double), cmp_double);
        double med = t[f * rounds + rounds / 2];
        if (f == 0) base = med;
        printf("%-40s %8.2f ms %7.2f GB/s  x%.2f over bf16\n", wfmt_name(fmts[f]), med * 1e3,
               (double)wfmt_weight_bytes(fmts[f], N, K) / med / 1e9, base / med);
    }
    for (int f = 0; f < 3; f++) be->ops->free(be, w[f].scale), be->ops->free(be, w[f].bscale), free(w[f].data);
    free(x), free(y), free(t);
    backend_free(be);
    return 0;
}
