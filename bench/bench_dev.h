// bench_dev.h - device buffers for the CUDA op benchmarks (bench/cuda_*.c).
#ifndef VLLM_BENCH_DEV_H
#define VLLM_BENCH_DEV_H

#include <stdlib.h>

#include "backend/backend.h"
#include "core/common.h"

// A device copy of bytes of host memory.
static inline void *bench_upload(struct backend *be, const void *h, size_t bytes) {
    void *d = be->ops->alloc(be, bytes);
    be->ops->upload(be, d, h, bytes);
    return d;
}

// n floats on the device, uniform between lo and hi (seeded: runs compare).
static inline float *bench_uniform(struct backend *be, size_t n, float lo, float hi, unsigned seed) {
    float *h = xmalloc(n * sizeof(float));
    srand(seed);
    for (size_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * ((float)rand() / RAND_MAX);
    float *d = bench_upload(be, h, n * sizeof(float));
    free(h);
    return d;
}

// The median of n timings (sorts t).
static inline double bench_median(double *t, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j], t[j] = x;
            }
    return t[n / 2];
}

#endif
