// cuda_pair.h - what the CUDA op tests share: the CPU backend whose ops are
// the reference and the GPU backend (each test creates them), arrays on both
// (struct pair), and the comparison of a GPU result with the reference's.
#ifndef VLLM_TESTS_CUDA_PAIR_H
#define VLLM_TESTS_CUDA_PAIR_H

#include <math.h>
#include <stdio.h>

#include "backend/backend.h"
#include "core/common.h"
#include "test.h"

static struct backend *cpu, *gpu;
struct pair {
    void *c, *g;
    size_t bytes;
};
static struct pair up(const void *host, size_t bytes) {
    struct pair p = {cpu->ops->alloc(cpu, bytes), gpu->ops->alloc(gpu, bytes), bytes};
    cpu->ops->upload(cpu, p.c, host, bytes);
    gpu->ops->upload(gpu, p.g, host, bytes);
    return p;
}
static void pfree(struct pair p) {
    cpu->ops->free(cpu, p.c);
    gpu->ops->free(gpu, p.g);
}
// max |gpu - cpu| / max |cpu| over the n floats of p, printed and held to tol
static double cmp(const char *what, struct pair p, size_t n, double tol) {
    float *h = xmalloc(sizeof(float) * n);
    gpu->ops->download(gpu, h, p.g, sizeof(float) * n);
    const float *r = p.c;
    double m = 0, s = 1e-30;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        s = fmax(s, fabs(r[i]));
        if (!isfinite(h[i])) bad = 1;
    }
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)h[i] - r[i]));
    double e = bad ? INFINITY : m / s;
    printf("  %-36s rel err %.2e (tol %.0e) over %zu values\n", what, e, tol, n);
    CHECKF(e <= tol && n > 0, "%s: %.3g > %.0g", what, e, tol);
    free(h);
    return e;
}

#endif
