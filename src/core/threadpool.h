// threadpool.h - a fixed pool of worker threads for parallel loops. Between
// calls a worker polls for at most VLLM_CPU_SPIN_US microseconds (default
// 100), then sleeps on a condition variable: an idle pool does not spin.
#ifndef VLLM_CORE_THREADPOOL_H
#define VLLM_CORE_THREADPOOL_H

struct tpool;

// n_threads total, the calling thread included (n_threads - 1 workers).
struct tpool *tpool_create(int n_threads);
void tpool_free(struct tpool *p);

// Calls fn(ctx, i, thread) for every i in [0, n), spread over the pool's
// threads (thread in [0, size)); returns when all calls are done. Not
// reentrant: fn must not call tpool_for on the same pool.
void tpool_for(struct tpool *p, int n, void (*fn)(void *ctx, int i, int thread), void *ctx);

#endif
