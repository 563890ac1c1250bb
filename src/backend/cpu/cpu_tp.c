// cpu_tp.c - the CPU stand-in for a tensor-parallel group: the ranks are
// threads of one process, each driving its own CPU backend; a collective
// meets at a barrier, and each rank reads the others' buffers directly.
//
// It is the reference for the NCCL collectives of the CUDA backend: sums are
// taken in rank order, so every rank gets the same bits (as NCCL's ring and
// tree reductions give every rank one result).
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "core/common.h"

struct cpu_group {
    int n;
    atomic_int refs;           // backends still alive
    pthread_barrier_t bar;
    float **bufs;              // [n] each rank's buffer in the all-reduce under way
    const float **ins;         // [n] each rank's input in the all-gather under way
};

void cpu_group_release(struct cpu_group *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    pthread_barrier_destroy(&g->bar);
    free(g->bufs);
    free(g->ins);
    free(g);
}

// Rank r owns the slice [n*r/N, n*(r+1)/N): it sums that slice over the
// ranks, rank 0 first, and writes the sum back into every rank's buffer.
// No two ranks touch the same element between the two barriers.
void cpu_all_reduce(struct backend *be, float *x, int64_t n) {
    struct cpu_group *g = cpu_of(be)->group;
    int r = be->tp_rank, N = g->n;
    g->bufs[r] = x;
    pthread_barrier_wait(&g->bar);
    int64_t lo = n * r / N, hi = n * (r + 1) / N;
    float *acc = g->bufs[0];
    for (int k = 1; k < N; k++) {
        const float *s = g->bufs[k];
        for (int64_t i = lo; i < hi; i++) acc[i] += s[i];
    }
    for (int k = 1; k < N; k++) memcpy(g->bufs[k] + lo, acc + lo, sizeof(float) * (hi - lo));
    pthread_barrier_wait(&g->bar); // nobody returns (and reuses its buffer) while others still write it
}

void cpu_all_gather(struct backend *be, float *out, int out_cols, const float *in, int in_cols, int rows) {
    struct cpu_group *g = cpu_of(be)->group;
    int r = be->tp_rank, N = g->n;
    g->ins[r] = in;
    pthread_barrier_wait(&g->bar);
    for (int k = 0; k < N; k++) {
        int cols = MIN(in_cols, out_cols - k * in_cols);
        for (int i = 0; i < rows && cols > 0; i++)
            memcpy(out + (int64_t)i * out_cols + (int64_t)k * in_cols, g->ins[k] + (int64_t)i * in_cols,
                   sizeof(float) * cols);
    }
    pthread_barrier_wait(&g->bar); // inputs stay put until every rank has copied them
}

int backend_cpu_create_group(int n, int num_threads, enum dtype kv_dtype, struct backend **out) {
    if (num_threads <= 0) num_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int per = MAX(num_threads / n, 1); // the ranks share the threads asked for
    struct cpu_group *g = xcalloc(1, sizeof *g);
    g->n = n;
    g->bufs = xcalloc(n, sizeof *g->bufs);
    g->ins = xcalloc(n, sizeof *g->ins);
    pthread_barrier_init(&g->bar, NULL, (unsigned)n);
    atomic_init(&g->refs, 1); // the loop's own, dropped below
    for (int r = 0; r < n; r++) {
        int rc = backend_cpu_create(per, kv_dtype, &out[r]);
        if (rc) {
            while (r-- > 0) backend_free(out[r]), out[r] = NULL;
            cpu_group_release(g);
            return rc;
        }
        out[r]->tp_rank = r;
        out[r]->tp_size = n;
        cpu_of(out[r])->group = g;
        atomic_fetch_add(&g->refs, 1);
    }
    cpu_group_release(g);
    return VLLM_OK;
}
