// threadpool.c - workers take loop indices from a shared atomic counter.
#include <pthread.h>
#include <stdatomic.h>

#include "core/common.h"
#include "core/threadpool.h"

struct tpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    uint64_t generation; // bumped once per tpool_for
    int active;          // workers still in the current job
    int quit;
    // the current job
    void (*fn)(void *, int, int);
    void *ctx;
    int count;
    atomic_int next;
};

static void run_job(struct tpool *p, int thread) {
    for (;;) {
        int i = atomic_fetch_add(&p->next, 1);
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
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_job(p, wa.id);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

struct tpool *tpool_create(int n_threads) {
    struct tpool *p = xcalloc(1, sizeof *p);
    p->n = n_threads < 1 ? 1 : n_threads;
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
    p->quit = 1;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->count = n;
    atomic_store(&p->next, 0);
    p->active = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    run_job(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
