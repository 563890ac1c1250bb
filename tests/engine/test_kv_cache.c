// test_kv_cache.c - the content-addressed pool alone (engine/kv_cache.h):
// reference counts, commit and lookup, LRU eviction of what no one holds
// (never of what someone does), and the chain hash (parent, tokens, salt).
#include <sys/resource.h>

#include "core/common.h"
#include "engine/kv_cache.h"
#include "test.h"

static void test_pool(void) {
    struct kv_pool p;
    kv_pool_init(&p, 4);
    int id[4];
    for (int i = 0; i < 4; i++) id[i] = kv_pool_alloc(&p);
    CHECK(kv_pool_alloc(&p) == -1 && kv_pool_available(&p) == 0 && kv_pool_used(&p) == 4);
    for (int i = 0; i < 3; i++) CHECK(kv_pool_commit(&p, id[i], 100 + i) == 1);
    CHECK(kv_pool_commit(&p, id[3], 100) == 0);   // 100 is cached already: the first id keeps it
    CHECK(kv_pool_commit(&p, id[0], 555) == 0);   // committed ids keep their content
    CHECK(kv_pool_find(&p, 100) == id[0] && kv_pool_find(&p, 555) == -1 && kv_pool_find(&p, 103) == -1);
    kv_pool_ref(&p, id[1]); // a second holder
    for (int i = 0; i < 4; i++) kv_pool_put(&p, id[i]);
    // free: id 3 (no content); LRU: id 0, id 2 (id 1 is still held)
    CHECK(kv_pool_used(&p) == 1 && kv_pool_available(&p) == 3 && kv_pool_occupied(&p) == 3);
    CHECK(kv_pool_alloc(&p) == id[3] && p.evictions == 0); // blank ids go first
    int a = kv_pool_alloc(&p);
    CHECK(a == id[0] && p.evictions == 1 && kv_pool_find(&p, 100) == -1); // then the least recently freed
    kv_pool_ref(&p, id[2]); // a hit takes id 2 back off the LRU list
    CHECK(kv_pool_alloc(&p) == -1 && kv_pool_find(&p, 102) == id[2]); // held ids are never evicted
    kv_pool_put(&p, id[1]);
    CHECK(kv_pool_find(&p, 101) == id[1] && kv_pool_available(&p) == 1);
    CHECK(kv_pool_alloc(&p) == id[1] && kv_pool_find(&p, 101) == -1);
    kv_pool_release(&p);

    // a pool of many ids through the hash table: every content found, LRU in order
    kv_pool_init(&p, 1000);
    for (int i = 0; i < 1000; i++) {
        int x = kv_pool_alloc(&p);
        kv_pool_commit(&p, x, kv_hash_block(0, &i, 1));
        kv_pool_put(&p, x);
    }
    int found = 0;
    for (int i = 0; i < 1000; i++) found += kv_pool_find(&p, kv_hash_block(0, &i, 1)) >= 0;
    CHECK(found == 1000 && kv_pool_used(&p) == 0 && kv_pool_available(&p) == 1000);
    for (int i = 0; i < 10; i++) kv_pool_alloc(&p); // evicts contents 0..9, oldest first
    CHECK(kv_pool_find(&p, kv_hash_block(0, (int[]){9}, 1)) == -1 && kv_pool_find(&p, kv_hash_block(0, (int[]){10}, 1)) >= 0);
    CHECK(p.evictions == 10);
    kv_pool_release(&p);
}

static void test_hash(void) {
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 4, 3};
    uint64_t h = kv_hash_block(0, a, 4);
    CHECK(h == kv_hash_block(0, a, 4));
    CHECK(h != kv_hash_block(0, b, 4));                  // token order
    CHECK(h != kv_hash_block(kv_hash_block(0, b, 4), a, 4)); // the same block after another parent
    CHECK(kv_hash_block(h, a, 4) != kv_hash_block(kv_hash_block(0, b, 4), a, 4));
    CHECK(h != kv_hash_block(0, a, 3));
    uint64_t s1 = kv_hash_salt("tenant-1"), s2 = kv_hash_salt("tenant-2");
    CHECK(kv_hash_salt(NULL) == 0 && kv_hash_salt("") == 0 && s1 && s2 && s1 != s2);
    CHECK(kv_hash_block(s1, a, 4) != h && kv_hash_block(s1, a, 4) != kv_hash_block(s2, a, 4)); // tenants never share
}

// A pool too big for the host (under a 1 GiB address-space bound, so that
// lazily committed pages cannot make it pass): an error naming the pool,
// the pool left empty. Not under ASan, whose shadow needs terabytes of
// address space.
static void test_pool_too_big(void) {
#if !defined(__SANITIZE_ADDRESS__)
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_AS, &old) == 0);
    lim = old;
    lim.rlim_cur = (rlim_t)1 << 30;
    CHECK(setrlimit(RLIMIT_AS, &lim) == 0);
    struct kv_pool p;
    int rc = kv_pool_init(&p, 1 << 30); // ~38 GiB of index
    setrlimit(RLIMIT_AS, &old);
    CHECK(rc == VLLM_ERR_OUT_OF_MEMORY);
    CHECKF(strstr(vllm_last_error(), "KV block pool") != NULL, "%s", vllm_last_error());
    CHECK(p.ref == NULL && p.bucket == NULL && p.total == 0);
    kv_pool_release(&p);
    CHECK(kv_pool_init(&p, 1000) == VLLM_OK && p.num_free == 1000);
    kv_pool_release(&p);
#endif
}

int main(void) {
    test_pool();
    test_hash();
    test_pool_too_big();
    return test_summary("kv_cache");
}
