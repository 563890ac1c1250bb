// membw.c - this machine's memory read bandwidth, the denominator of the
// CPU decode roofline (bytes read per token / bandwidth).
// Usage: membw [THREADS] [MiB] [REPEATS]; prints the median of the repeats.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"

struct part {
    const float *x;
    size_t n;
    float sum;
};

// One sequential stream per thread, four lines per step, prefetched 8 KB
// ahead: the access pattern of the decode GEMV kernels over the packed
// weights (a group of 64 rows is one stream), so the denominator is the
// bandwidth those kernels can reach.
typedef float v16 __attribute__((vector_size(64)));
static void *reader(void *arg) {
    struct part *p = arg;
    size_t n = p->n / 64 * 64;
    v16 acc[4] = {{0}};
    for (size_t i = 0; i < n; i += 64)
        for (int k = 0; k < 4; k++) {
            __builtin_prefetch(p->x + i + 16 * k + 2048);
            v16 v;
            memcpy(&v, p->x + i + 16 * k, sizeof v);
            acc[k] += v;
        }
    float sum = 0;
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 16; l++) sum += acc[k][l];
    p->sum = sum;
    p->n = n; // what was read
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    int reps = argc > 3 ? atoi(argv[3]) : 9;
    if (threads < 1 || threads > 256 || mib < 16 || reps < 1) {
        fprintf(stderr, "usage: membw [THREADS] [MiB >= 16] [REPEATS]\n");
        return 2;
    }
    size_t n = mib * 1024 * 1024 / sizeof(float);
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 1023);
    pthread_t th[256];
    struct part parts[256];
    double *gbs = xcalloc(reps, sizeof(double)), sink = 0;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        for (int k = 0; k < threads; k++) {
            parts[k] = (struct part){x + n / threads * k, n / threads, 0};
            pthread_create(&th[k], NULL, reader, &parts[k]);
        }
        size_t bytes = 0;
        for (int k = 0; k < threads; k++) pthread_join(th[k], NULL), sink += parts[k].sum, bytes += parts[k].n * sizeof(float);
        gbs[r] = (double)bytes / (now_s() - t) / 1e9;
    }
    qsort(gbs, reps, sizeof(double), cmp);
    printf("read bandwidth: %.2f GB/s (median of %d, %d threads, %zu MiB; min %.2f max %.2f)%s\n", gbs[reps / 2], reps,
           threads, mib, gbs[0], gbs[reps - 1], sink == -1 ? " " : "");
    free(gbs);
    free(x);
    return 0;
}
