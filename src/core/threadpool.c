// threadpool.c - a parallel loop whose caller takes part and never waits for
// a worker that has not started: on a shared machine a worker may sit
// descheduled for a time slice, and the loop must not stall on it.
//
// The job word packs generation (32 bits) | count (16) | next index (16).
// Anyone claims index i by a compare-and-swap from (gen, count, i) to
// (gen, count, i + 1) while i < count; the caller returns once `done` reaches
// count. A worker that wakes late sees a new generation (or an exhausted
// one) and claims nothing, so fn and ctx it read are only used while their
// job is unfinished (a successful claim proves it).
//
// Waiting is spin-then-sleep: a worker polls for the next job for at most
// VLLM_CPU_SPIN_US microseconds (a decode step issues ~100 parallel loops a
// few microseconds apart; a condition-variable wake-up costs tens), then
// sleeps on a condition variable, so an idle pool costs nothing. A sleeper
// announces itself (seq_cst) before it re-reads the job word under the
// mutex, and the caller publishes the word (seq_cst) before it reads the
// sleeper count, so one of them always sees the other (likewise for done
// and caller_sleeping).
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

#define MAX_COUNT 0xffff

struct tpool {
    int n;
    int64_t spin_ns;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    atomic_uint_fast64_t job; // gen << 32 | count << 16 | next
    _Atomic(void (*)(void *, int, int)) fn;
    _Atomic(void *) ctx;
    atomic_int done;    // items of the current job finished
    atomic_int sleepers; // workers blocked on work_cv
    atomic_int caller_sleeping;
    atomic_int quit;
};

static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int new_job(struct tpool *p, uint64_t gen) {
    return (atomic_load(&p->job) >> 32) != gen || atomic_load(&p->quit);
}
static int job_done(struct tpool *p, uint64_t count) { return (uint64_t)atomic_load(&p->done) == count; }

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

// Claims and runs items of generation gen until none is left.
static void run_items(struct tpool *p, uint64_t gen, void (*fn)(void *, int, int), void *ctx, int thread) {
    uint64_t v = atomic_load_explicit(&p->job, memory_order_acquire);
    for (;;) {
        uint64_t next = v & 0xffff, count = (v >> 16) & 0xffff;
        if ((v >> 32) != gen || next >= count) return;
        if (!atomic_compare_exchange_weak_explicit(&p->job, &v, v + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        fn(ctx, (int)next, thread);
        if ((uint64_t)atomic_fetch_add(&p->done, 1) + 1 == count &&
            atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
        v = atomic_load_explicit(&p->job, memory_order_acquire);
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
        seen = atomic_load_explicit(&p->job, memory_order_acquire) >> 32;
        void (*fn)(void *, int, int) = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
        run_items(p, seen, fn, ctx, wa.id);
    }
    return NULL;
}

struct tpool *tpool_create(int n_threads) {
    struct tpool *p = xcalloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
    const char *s = getenv("VLLM_CPU_SPIN_US");
    int us = s && *s ? atoi(s) : 100;
    p->spin_ns = (int64_t)(us < 0 ? 0 : us > 100000 ? 100000 : us) * 1000;
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


// Indices [base, base + count) as one job (count <= MAX_COUNT).
struct offset_ctx {
    void (*fn)(void *, int, int);
    void *ctx;
    int base;
};
static void offset_fn(void *c, int i, int thread) {
    struct offset_ctx *o = c;
    o->fn(o->ctx, o->base + i, thread);
}

static void run_job(struct tpool *p, int count, void (*fn)(void *, int, int), void *ctx) {
    uint64_t gen = (atomic_load_explicit(&p->job, memory_order_relaxed) >> 32) + 1;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store(&p->job, (gen & 0xffffffffu) << 32 | (uint64_t)count << 16); // publishes the job (seq_cst)
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_items(p, gen & 0xffffffffu, fn, ctx, 0);
    if (!spin_until(p, job_done, (uint64_t)count)) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_sleeping, 1);
        while (!job_done(p, (uint64_t)count)) pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->caller_sleeping, 0);
        pthread_mutex_unlock(&p->mu);
    }
}

void tpool_for(struct tpool *p, int n, void (*fn)(void *ctx, int i, int thread), void *ctx) {
    if (n <= 0) return;
    if (p->n == 1 || n == 1) {
        for (int i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    if (n <= MAX_COUNT) {
        run_job(p, n, fn, ctx);
        return;
    }
    for (int base = 0; base < n; base += MAX_COUNT) {
        struct offset_ctx o = {fn, ctx, base};
        run_job(p, MIN(MAX_COUNT, n - base), offset_fn, &o);
    }
}
