// kv_cache.h - content-addressed pools for prefix caching: KV blocks, and
// recurrent-state checkpoints (one of each per id: an id is a KV block, or a
// checkpoint slot holding every Mamba layer's conv + SSM state at a position).
//
// An id has a reference count (the requests that hold it). Content is keyed
// by a 64-bit hash of the token chain it was computed from: block j's hash is
// kv_hash_block(hash of block j-1, its block_size token ids), block 0's parent
// the request's salt root, so equal hashes mean equal prefixes (up to a 2^-64
// collision per pair). A held id is committed under its hash when the step
// that computes its content is scheduled (forgotten if that step never runs).
// At reference count 0 a committed id joins an LRU list and keeps its content
// until the pool needs an id: allocation takes ids without content first,
// then evicts the least recently freed. A hit takes the id back off the list.
#ifndef VLLM_ENGINE_KV_CACHE_H
#define VLLM_ENGINE_KV_CACHE_H

#include <stdint.h>

struct kv_pool {
    int total;
    int num_used;       // ids with ref > 0
    int32_t *ref;       // [total]
    uint64_t *hash;     // [total] the content's key, where committed
    uint8_t *committed; // [total]
    // LRU of committed ids at ref 0, oldest at head; -1 ends
    int32_t *prev, *next;
    uint8_t *in_lru;
    int lru_head, lru_tail, num_lru;
    int32_t *free_ids; // ids without content at ref 0 (a stack: lowest ids on top initially)
    int num_free;
    // hash table: chains through chain[], heads in bucket[] (a power of two)
    int32_t *bucket, *chain;
    uint32_t mask;
    uint64_t evictions;
};

// VLLM_ERR_OUT_OF_MEMORY (p left empty) when the host index cannot be allocated.
int kv_pool_init(struct kv_pool *p, int total);
void kv_pool_release(struct kv_pool *p);
// Ids an allocation can take now: without content, or evictable.
static inline int kv_pool_available(const struct kv_pool *p) { return p->num_free + p->num_lru; }
static inline int kv_pool_used(const struct kv_pool *p) { return p->num_used; }
// Ids that hold content or a request (what is not blank).
static inline int kv_pool_occupied(const struct kv_pool *p) { return p->total - p->num_free; }
// A held id (ref 1) without content, evicting the LRU one when it must; -1 when none.
int kv_pool_alloc(struct kv_pool *p);
// One more holder of id (a cache hit).
void kv_pool_ref(struct kv_pool *p, int id);
// One holder less (id < 0: nothing); at 0 the id joins the LRU list if it is
// committed, else the free ids.
void kv_pool_put(struct kv_pool *p, int id);
// The committed id holding content h, or -1.
int kv_pool_find(const struct kv_pool *p, uint64_t h);
// The held id now holds the content h. Returns 0 and changes nothing where
// id is committed already, or another id holds h (the first one stays).
int kv_pool_commit(struct kv_pool *p, int id, uint64_t h);
// The held id holds no content after all (its step never ran): uncommitted,
// so that no lookup finds it; nothing where it is not committed.
void kv_pool_forget(struct kv_pool *p, int id);

// The chain's root: 0 without a salt; a request's cache_salt gives another.
uint64_t kv_hash_salt(const char *salt);
// The hash of a block of n token ids after a block of hash parent.
uint64_t kv_hash_block(uint64_t parent, const int32_t *ids, int n);

#endif
