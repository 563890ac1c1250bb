// kv_cache.c - the content-addressed pool of kv_cache.h: reference counts, a
// hash table of committed content, an LRU list of what no request holds.
#include "core/common.h"
#include "engine/kv_cache.h"

int kv_pool_init(struct kv_pool *p, int total) {
    memset(p, 0, sizeof *p);
    int n = MAX(total, 1);
    uint32_t nb = 1;
    while (nb < 2u * (uint32_t)n) nb <<= 1; // load factor <= 1/2
    // ~38 host bytes a block: sized by the KV budget, so a pool of tiny
    // blocks fails here with a message rather than aborting.
    void **dst[] = {(void **)&p->ref, (void **)&p->hash, (void **)&p->committed, (void **)&p->prev,
                    (void **)&p->next, (void **)&p->in_lru, (void **)&p->chain, (void **)&p->free_ids,
                    (void **)&p->bucket};
    size_t elt[] = {4, 8, 1, 4, 4, 1, 4, 4, 4}, cnt[] = {n, n, n, n, n, n, n, n, nb};
    for (size_t i = 0; i < sizeof dst / sizeof dst[0]; i++)
        if (!(*dst[i] = try_calloc(cnt[i], elt[i], "the KV block pool's index"))) {
            kv_pool_release(p);
            return vllm_err_prefix(VLLM_ERR_OUT_OF_MEMORY, "%d blocks", total);
        }
    p->total = total;
    for (int i = 0; i < total; i++) p->free_ids[i] = total - 1 - i;
    p->num_free = total;
    p->lru_head = p->lru_tail = -1;
    p->mask = nb - 1;
    for (uint32_t i = 0; i < nb; i++) p->bucket[i] = -1;
    return VLLM_OK;
}

void kv_pool_release(struct kv_pool *p) {
    void *a[] = {p->ref, p->hash, p->committed, p->prev, p->next, p->in_lru, p->chain, p->free_ids, p->bucket};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++) free(a[i]);
    memset(p, 0, sizeof *p);
}

static void lru_unlink(struct kv_pool *p, int id) {
    if (!p->in_lru[id]) return;
    int a = p->prev[id], b = p->next[id];
    if (a >= 0) p->next[a] = b;
    else p->lru_head = b;
    if (b >= 0) p->prev[b] = a;
    else p->lru_tail = a;
    p->in_lru[id] = 0;
    p->num_lru--;
}

static void lru_push(struct kv_pool *p, int id) { // to the tail: the most recently freed
    lru_unlink(p, id);
    p->prev[id] = p->lru_tail;
    p->next[id] = -1;
    if (p->lru_tail >= 0) p->next[p->lru_tail] = id;
    else p->lru_head = id;
    p->lru_tail = id;
    p->in_lru[id] = 1;
    p->num_lru++;
}

static int32_t *bucket_of(const struct kv_pool *p, uint64_t h) { return &p->bucket[(h ^ (h >> 32)) & p->mask]; }

// Forgets id's content (an eviction).
static void uncommit(struct kv_pool *p, int id) {
    int32_t *pp = bucket_of(p, p->hash[id]);
    while (*pp != id) pp = &p->chain[*pp];
    *pp = p->chain[id];
    p->committed[id] = 0;
}

int kv_pool_alloc(struct kv_pool *p) {
    int id;
    if (p->num_free) {
        id = p->free_ids[--p->num_free];
    } else if (p->lru_head >= 0) {
        id = p->lru_head;
        lru_unlink(p, id);
        uncommit(p, id);
        p->evictions++;
    } else {
        return -1;
    }
    p->ref[id] = 1;
    p->num_used++;
    return id;
}

void kv_pool_ref(struct kv_pool *p, int id) {
    if (p->ref[id]++ == 0) {
        lru_unlink(p, id); // a hit: no longer evictable
        p->num_used++;
    }
}

void kv_pool_put(struct kv_pool *p, int id) {
    if (id < 0) return;
    if (p->ref[id] <= 0) { // two owners of one id: a bug that would corrupt the lists
        fprintf(stderr, "vllm: internal error: kv_pool id %d released while free\n", id);
        abort();
    }
    if (--p->ref[id]) return;
    p->num_used--;
    if (p->committed[id]) lru_push(p, id);
    else p->free_ids[p->num_free++] = id;
}

void kv_pool_forget(struct kv_pool *p, int id) {
    if (p->committed[id]) uncommit(p, id);
}

int kv_pool_find(const struct kv_pool *p, uint64_t h) {
    for (int id = *bucket_of(p, h); id >= 0; id = p->chain[id])
        if (p->hash[id] == h) return id;
    return -1;
}

int kv_pool_commit(struct kv_pool *p, int id, uint64_t h) {
    if (p->committed[id] || kv_pool_find(p, h) >= 0) return 0;
    int32_t *b = bucket_of(p, h);
    p->hash[id] = h;
    p->committed[id] = 1;
    p->chain[id] = *b;
    *b = id;
    return 1;
}

// splitmix64's finalizer: every input bit reaches every output bit
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t kv_hash_salt(const char *salt) {
    if (!salt || !*salt) return 0;
    uint64_t h = 0x5a17ull;
    for (const unsigned char *s = (const unsigned char *)salt; *s; s++) h = mix64(h ^ *s);
    return mix64(h ^ 0x5a17ull) | 1; // never the unsalted root
}

uint64_t kv_hash_block(uint64_t parent, const int32_t *ids, int n) {
    uint64_t h = mix64(parent + 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++) h = mix64(h ^ ((uint64_t)(uint32_t)ids[i] + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1)));
    return mix64(h ^ (uint64_t)n);
}
