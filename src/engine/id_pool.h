// id_pool.h - a free list of the ids [0, n): KV blocks, state slots and
// token-table rows are each one of these.
#ifndef VLLM_ENGINE_ID_POOL_H
#define VLLM_ENGINE_ID_POOL_H

struct id_pool {
    int total, num_free;
    int *free_ids; // stack; lowest ids on top initially
};

void id_pool_init(struct id_pool *p, int total);
void id_pool_release(struct id_pool *p); // frees the storage
int id_pool_alloc(struct id_pool *p);     // -1 when empty
void id_pool_put(struct id_pool *p, int id);
static inline int id_pool_used(const struct id_pool *p) { return p->total - p->num_free; }

#endif
