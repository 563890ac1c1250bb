// quant_gemv.c - decode-sized products (one row) of the CPU fast path with
// bf16, FP8 (per-row and 128-block scales) and NVFP4 weights of the same
// shape, and a streaming read of as many bytes as the bf16 weight on the same
// threads (the roofline's bandwidth), interleaved round by round so that
// every one sees the same machine (the shared CPU's bandwidth moves by 2x
// between minutes): median time of each, its bytes per second, its fraction
// of the read's, and its speed-up over bf16 (docs/BENCHMARKS_CPU.md).
//
// Usage: build/quant_gemv [THREADS (2)] [ROUNDS (15)] [ROWS (32768)] [COLS (1024)] [M (1)]
// (M: rows of x, as a decode step of M sequences)
// (a few hundred rows keep the weights in L2: the kernels' own speed)
#include <stdio.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

#define NF 4 // formats; row NF of the times is the streaming read

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The read: one sequential stream per task, four lines a step, prefetched
// FAST_Q_PF ahead as the kernels' weight streams are (bench/membw.c).
struct read_ctx {
    const float *buf;
    int64_t per; // floats per task, a multiple of 64
    float sums[256];
};

typedef float v16 __attribute__((vector_size(64)));
static void read_task(void *ctx, int i, int thread) {
    struct read_ctx *c = ctx;
    const float *p = c->buf + (int64_t)i * c->per;
    v16 acc[4] = {{0}};
    for (int64_t j = 0; j < c->per; j += 64)
        for (int k = 0; k < 4; k++) {
            __builtin_prefetch((const char *)(p + j + 16 * k) + FAST_Q_PF);
            v16 v;
            memcpy(&v, p + j + 16 * k, sizeof v);
            acc[k] += v;
        }
    float s = 0;
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 16; l++) s += acc[k][l];
    c->sums[thread & 255] += s;
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 15;
    int64_t N = argc > 3 ? atoll(argv[3]) : 32768, K = argc > 4 ? atoll(argv[4]) : 1024;
    int M = argc > 5 ? atoi(argv[5]) : 1;
    M = MAX(1, MIN(M, 64));
    rounds = MAX(1, MIN(rounds, 256));
    nt = MAX(1, MIN(nt, 256));
    struct backend *be = NULL;
    if (N < 1 || K < 1 || cpu_backend_create(nt, 0, -1, &be)) {
        fprintf(stderr, "quant_gemv: %s\n", N < 1 || K < 1 ? "ROWS and COLS must be positive" : vllm_last_error());
        return 1;
    }
    enum wfmt fmts[NF] = {WF_BF16, WF_FP8, WF_FP8_B128, WF_NVFP4};
    struct weight w[NF];
    for (int f = 0; f < NF; f++)
        if (be->ops->weight_alloc(be, &w[f], fmts[f], N, K) || be->ops->weight_random(be, &w[f], 1, 0.02f)) {
            fprintf(stderr, "quant_gemv: %s\n", vllm_last_error());
            return 1;
        }
    // the read: bf16's bytes in 4 tasks per thread (as the GEMV splits its rows)
    int tasks = 4 * nt;
    int64_t per = MAX(64, wfmt_weight_bytes(WF_BF16, N, K) / 4 / tasks / 64 * 64);
    struct read_ctx rc = {xmalloc(sizeof(float) * (size_t)(per * tasks)), per, {0}};
    for (int64_t i = 0; i < per * tasks; i++) ((float *)rc.buf)[i] = (float)(i & 1023);
    double read_bytes = 4.0 * (double)(per * tasks);
    float *x = xcalloc((size_t)(M * K), sizeof(float)), *y = xcalloc((size_t)(M * N), sizeof(float));
    for (int64_t i = 0; i < M * K; i++) x[i] = 0.01f * (float)(i % 7);
    double *t = xcalloc((size_t)(NF + 1) * rounds, sizeof(double));
    for (int r = 0; r < rounds; r++)
        for (int f = 0; f <= NF; f++) {
            double t0 = now_s();
            for (int i = 0; i < 5; i++) {
                if (f == NF) cpu_parallel(be, tasks, read_task, &rc);
                else fast_matmul(be, y, x, &w[f], M);
            }
            t[f * rounds + r] = (now_s() - t0) / 5;
        }
    for (int f = 0; f <= NF; f++) qsort(t + f * rounds, rounds, sizeof(double), cmp_double);
    double base = t[rounds / 2], read_gbs = read_bytes / t[NF * rounds + rounds / 2] / 1e9;
    printf("[%lld, %lld] x %d row%s, %d threads, kernels %s, median of %d rounds\n", (long long)N, (long long)K, M,
           M > 1 ? "s" : "", nt, fast_k(be)->name, rounds);
    printf("%-40s %8.2f ms %7.2f GB/s  (the roofline)\n", "streaming read", t[NF * rounds + rounds / 2] * 1e3, read_gbs);
    for (int f = 0; f < NF; f++) {
        double med = t[f * rounds + rounds / 2], gbs = (double)wfmt_weight_bytes(fmts[f], N, K) / med / 1e9;
        printf("%-40s %8.2f ms %7.2f GB/s  %3.0f%% of the read  x%.2f over bf16\n", wfmt_name(fmts[f]), med * 1e3, gbs,
               100 * gbs / read_gbs, base / med);
    }
    for (int f = 0; f < NF; f++) be->ops->free(be, w[f].scale), be->ops->free(be, w[f].bscale), free(w[f].data);
    free((void *)rc.buf), free(x), free(y), free(t);
    backend_free(be);
    return 0;
}
