// bench_stats.c - the statistics `vllm bench` takes of its runs' times.
#include <math.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "core/common.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_pct(double *v, int n, double p) {
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[MIN(i, n - 1)];
}

// The window [t0, t1]: from the last request's first token to the first
// request's last. Each request's own tokens in it are a step apart; its
// first and last there give its mean step (a request's tokens of one step
// carry one time, so callbacks of other requests delivered a little earlier
// or later in the same step cannot move a boundary by a step, as a count of
// everyone's tokens in the window would).
double bench_steady_step(const double *tt, int stride, const int *n, int B) {
    double t0 = -INFINITY, t1 = INFINITY, sum = 0;
    int used = 0;
    for (int b = 0; b < B; b++) {
        if (n[b] < 1) return 0;
        t0 = MAX(t0, tt[(int64_t)b * stride]), t1 = MIN(t1, tt[(int64_t)b * stride + n[b] - 1]);
    }
    for (int b = 0; b < B && t1 > t0; b++) {
        const double *r = tt + (int64_t)b * stride;
        int j0 = 0, j1 = n[b] - 1;
        while (j0 < n[b] && r[j0] < t0) j0++;
        while (j1 >= 0 && r[j1] > t1) j1--;
        if (j1 > j0 && r[j1] > r[j0]) sum += (r[j1] - r[j0]) / (j1 - j0), used++;
    }
    return used ? sum / used : 0;
}
