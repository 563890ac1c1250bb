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

// One op call; i picks the copy of its weights (and inputs) to read.
typedef void (*bench_op_fn)(void *ctx, int i);

// Median over 5 launches of a graph of `calls` calls of f: microseconds per
// call. One call runs first, outside the graph (scratch sized: a recording
// cannot grow it).
static inline double bench_graph_us(struct backend *be, bench_op_fn f, void *ctx, int calls) {
    const struct backend_ops *o = be->ops;
    f(ctx, 0);
    o->sync(be);
    o->graph_begin(be);
    for (int i = 0; i < calls; i++) f(ctx, i);
    void *g = o->graph_end(be);
    double t[5];
    for (int r = 0; r < 5; r++) {
        o->sync(be);
        double t0 = now_s();
        o->graph_launch(be, g);
        o->sync(be);
        t[r] = (now_s() - t0) * 1e6 / calls;
    }
    o->graph_free(be, g);
    return bench_median(t, 5);
}

#endif
