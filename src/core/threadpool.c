// threadpool.c - workers take loop indices from a shared atomic counter.
//
// Waiting is spin-then-sleep: after a job, a worker polls for the next one
// for at most spin_us microseconds (a decode step issues ~100 parallel loops
// a few microseconds apart, and a condition-variable wake-up costs tens of
// microseconds), then sleeps on a condition variable. An idle pool therefore
// spins for at most spin_us and then costs nothing. The caller waits for the
// workers the same way.
//
// Wake-ups are lost by neither side: a sleeper announces itself (seq_cst)
// before it re-reads the generation under the mutex, and the caller publishes
// the generation (seq_cst) before it reads the sleeper count, so at least one
// of them sees the other (the same for done / caller_sleeping).
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/common.h"
#include "core/threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

struct tpool {
    int n;
    int spin_ns;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    atomic_uint_fast64_t generation; // bumped once per tpool_for
    atomic_int pending;              // workers still in the current job
    atomic_int sleepers;             // workers blocked on work_cv
    atomic_int caller_sleeping;
    atomic_int quit;
    // the current job
    void (*fn)(void *, int, int);
    void *ctx;
    int count;
    atomic_int next;
};

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// Polls until pred(p, arg) holds or spin_ns passed; returns whether it holds.
static int spin_until(struct tpool *p, int (*pred)(struct tpool *, uint64_t), uint64_t arg) {
    if (pred(p, arg)) return 1;
    if (p->spin_ns <= 0) return 0;
    int64_t end = mono_ns() + p->spin_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            cpu_relax();
            if (pred(p, arg)) return 1;
        }
        if (mono_ns() > end) return 0;
    }
}

static int new_job(struct tpool *p, uint64_t seen) {
    return atomic_load_explicit(&p->generation, memory_order_acquire) != seen || atomic_load(&p->quit);
}
static int job_done(struct tpool *p, uint64_t unused) {
    (void)unused;
    return atomic_load_explicit(&p->pending, memory_order_acquire) == 0;
}

static void run_job(struct tpool *p, int thread) {
    for (;;) {
        int i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->count) break;
        p->fn(p->ctx, i, thread);
    }
}

struct worker_arg {
    struct tpool *p;
    int id;
};

static void *worker(void *arg) {
    struct worker_arg wa = *(struct worker_arg *)arg;
    free(arg);
    struct tpool *p = wa.p;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_until(p, new_job, seen)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (!new_job(p, seen)) pthread_cond_wait(&p->work_cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) break;
        seen = atomic_load(&p->generation);
        run_job(p, wa.id);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

struct tpool *tpool_create(int n_threads) {
    struct tpool *p = xcalloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
    const char *s = getenv("VLLM_CPU_SPIN_US");
    int us = s && *s ? atoi(s) : 100;
    p->spin_ns = (us < 0 ? 0 : us > 100000 ? 100000 : us) * 1000;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->threads = xcalloc(p->n, sizeof(pthread_t));
    for (int i = 1; i < p->n; i++) {
        struct worker_arg *a = xmalloc(sizeof *a);
        a->p = p;
        a->id = i;
        pthread_create(&p->threads[i], NULL, worker, a);
    }
    return p;
}

void tpool_free(struct tpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}

int tpool_size(const struct tpool *p) { return p->n; }

void tpool_for(struct tpool *p, int n, void (*fn)(void *ctx, int i, int thread), void *ctx) {
    if (n <= 0) return;
    if (p->n == 1 || n == 1) {
        for (int i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->count = n;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->generation, 1); // publishes the job (seq_cst)
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_job(p, 0);
    if (!spin_until(p, job_done, 0)) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeping, 1);
        while (!job_done(p, 0)) pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->caller_sleeping, 0);
        pthread_mutex_unlock(&p->mu);
    }
}
