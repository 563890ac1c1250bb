// id_pool.c - LIFO free list: a freed id is reused first, which is what
// makes stale state visible to the tests if a fresh slot were not zeroed.
#include "core/common.h"
#include "engine/id_pool.h"

void id_pool_init(struct id_pool *p, int total) {
    p->total = total;
    p->num_free = total;
    p->free_ids = xmalloc(sizeof(int) * (total ? total : 1));
    for (int i = 0; i < total; i++) p->free_ids[i] = total - 1 - i;
}

void id_pool_release(struct id_pool *p) {
    free(p->free_ids);
    p->free_ids = NULL;
}

int id_pool_alloc(struct id_pool *p) { return p->num_free ? p->free_ids[--p->num_free] : -1; }

void id_pool_put(struct id_pool *p, int id) {
    if (id < 0) return;
    p->free_ids[p->num_free++] = id;
}
