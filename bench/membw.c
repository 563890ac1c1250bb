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

static void *reader(void *arg) {
    struct part *p = arg;
    float acc[16] = {0}; // independent lanes: the compiler vectorizes without reassociation flags
    for (size_t i = 0; i + 16 <= p->n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += p->x[i + k];
    float s = 0;
    for (int k = 0; k < 16; k++) s += acc[k];
    p->sum = s;
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
        for (int k = 0; k < threads; k++) pthread_join(th[k], NULL), sink += parts[k].sum;
        gbs[r] = (double)(n / threads * threads) * sizeof(float) / (now_s() - t) / 1e9;
    }
    qsort(gbs, reps, sizeof(double), cmp);
    printf("read bandwidth: %.2f GB/s (median of %d, %d threads, %zu MiB; min %.2f max %.2f)%s\n", gbs[reps / 2], reps,
           threads, mib, gbs[0], gbs[reps - 1], sink == -1 ? " " : "");
    free(gbs);
    free(x);
    return 0;
}
