// team.c - worker threads that each wait for the next job and run it once.
#include <pthread.h>

#include "core/common.h"
#include "core/team.h"

struct team {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    uint64_t generation; // bumped once per team_run
    int active;          // workers still in the current job
    int quit;
    void (*fn)(void *, int);
    void *ctx;
};

struct member {
    struct team *t;
    int rank;
};

static void *member_main(void *arg) {
    struct member m = *(struct member *)arg;
    free(arg);
    struct team *t = m.t;
    uint64_t seen = 0;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->quit && t->generation == seen) pthread_cond_wait(&t->work_cv, &t->mu);
        if (t->quit) break;
        seen = t->generation;
        pthread_mutex_unlock(&t->mu);
        t->fn(t->ctx, m.rank);
        pthread_mutex_lock(&t->mu);
        if (--t->active == 0) pthread_cond_signal(&t->done_cv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

struct team *team_create(int n) {
    struct team *t = xcalloc(1, sizeof *t);
    t->n = n < 1 ? 1 : n;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->work_cv, NULL);
    pthread_cond_init(&t->done_cv, NULL);
    t->threads = xcalloc(t->n, sizeof(pthread_t));
    for (int i = 1; i < t->n; i++) {
        struct member *m = xmalloc(sizeof *m);
        m->t = t;
        m->rank = i;
        pthread_create(&t->threads[i], NULL, member_main, m);
    }
    return t;
}

void team_free(struct team *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    for (int i = 1; i < t->n; i++) pthread_join(t->threads[i], NULL);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->work_cv);
    pthread_cond_destroy(&t->done_cv);
    free(t->threads);
    free(t);
}


void team_run(struct team *t, void (*fn)(void *ctx, int rank), void *ctx) {
    if (t->n == 1) {
        fn(ctx, 0);
        return;
    }
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->ctx = ctx;
    t->active = t->n - 1;
    t->generation++;
    pthread_cond_broadcast(&t->work_cv);
    pthread_mutex_unlock(&t->mu);
    fn(ctx, 0);
    pthread_mutex_lock(&t->mu);
    while (t->active > 0) pthread_cond_wait(&t->done_cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}
