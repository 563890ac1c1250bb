// team.h - n threads that run one function at once, each with its own index
// (rank 0 on the caller): the ranks of a tensor-parallel group, whose
// collectives need every rank running at the same time. (A thread pool's
// parallel loop may run two indices on one thread, one after the other.)
#ifndef VLLM_CORE_TEAM_H
#define VLLM_CORE_TEAM_H

struct team;

struct team *team_create(int n); // n - 1 worker threads
void team_free(struct team *t);
// Calls fn(ctx, rank) for every rank in [0, n) at once, each on its own
// thread; returns when all calls are done. Not reentrant.
void team_run(struct team *t, void (*fn)(void *ctx, int rank), void *ctx);

#endif
