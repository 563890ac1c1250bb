// test_scheduler.c - the scheduler alone, with requests whose model steps we
// play by hand: budget, FCFS, max_num_seqs, chunked prefill, decode
// classification from request state, preemption by recompute, and prefix
// caching (hits at admission, blocks committed as scheduled and forgotten
// when the launch fails, checkpoints committed after launch).
#include "core/common.h"
#include "engine/kv_cache.h"
#include "engine/scheduler.h"
#include "test.h"

static struct request *mk(int id, int n) {
    struct request *r = xcalloc(1, sizeof *r);
    r->id = id;
    r->tokens = xcalloc(256, sizeof(int32_t));
    r->num_prompt = r->num_tokens = n;
    r->cap_tokens = 256;
    r->slot = r->row = -1;
    vllm_sampling_params_default(&r->sp); // as vllm_submit's copy: no prompt log-probs
    return r;
}

static void rfree(struct request *r) {
    free(r->tokens);
    free(r->blocks);
    free(r->hashes);
    free(r->pend);
    free(r);
}

// What the engine does after a step: tokens computed, one sampled per
// finished prefill or decode.
static void advance(const struct sched_output *o) {
    for (int i = 0; i < o->num_entries; i++) {
        struct request *r = o->entries[i].req;
        r->num_computed += o->entries[i].num_tokens;
        if (r->num_computed == r->num_tokens) r->tokens[r->num_tokens++] = 1;
    }
}

static void sched_remove(struct scheduler *s, struct request *r) {
    sched_unschedule(s, r);
    sched_free_resources(s, r);
}

static const struct sched_entry *find(const struct sched_output *o, const struct request *r) {
    for (int i = 0; i < o->num_entries; i++)
        if (o->entries[i].req == r) return &o->entries[i];
    return NULL;
}

// A prompt of n tokens: base + i.
static struct request *mkp(int id, int n, int base) {
    struct request *r = mk(id, n);
    for (int i = 0; i < n; i++) r->tokens[i] = base + i;
    return r;
}

static void test_prefix_attention(void) {
    struct scheduler s;
    struct sched_config cfg = {4, 64, 4, 32, 0, 1, 0, 0, 0};
    sched_init(&s, &cfg);
    struct request *a = mkp(1, 20, 100), *b = mkp(2, 20, 100), *c = mkp(3, 12, 100), *d = mkp(4, 20, 100);
    for (int i = 8; i < 12; i++) c->tokens[i] = 7; // c shares a's first 8 tokens
    d->salt = kv_hash_salt("another tenant");
    sched_add(&s, a);
    const struct sched_output *o = sched_schedule(&s);
    CHECK(find(o, a) && find(o, a)->num_tokens == 20 && a->num_cached == 0);
    advance(o);
    int ablocks[5];
    memcpy(ablocks, a->blocks, sizeof ablocks);
    sched_remove(&s, a); // its 5 full blocks are committed and cached
    CHECK(kv_pool_used(&s.blocks) == 0 && kv_pool_occupied(&s.blocks) == 5);
    sched_add(&s, b);
    sched_add(&s, c);
    sched_add(&s, d);
    o = sched_schedule(&s);
    // b: 4 blocks (the last token runs); c: the 2 shared blocks; d: salted, nothing
    CHECK(find(o, b) && find(o, b)->num_tokens == 4 && !find(o, b)->is_decode && b->num_cached == 16);
    CHECK(b->num_blocks == 5 && !memcmp(b->blocks, ablocks, sizeof(int) * 4) && b->blocks[4] != ablocks[4]);
    CHECK(find(o, c) && find(o, c)->num_tokens == 4 && c->num_cached == 8 && c->blocks[1] == ablocks[1]);
    CHECK(find(o, d) && find(o, d)->num_tokens == 20 && d->num_cached == 0);
    CHECK(s.prefix_queries == 72 && s.prefix_hits == 24);
    CHECK(s.blocks.ref[ablocks[0]] == 2 && s.blocks.ref[ablocks[3]] == 1);
    advance(o);
    sched_remove(&s, b);
    sched_remove(&s, c);
    sched_remove(&s, d);
    CHECK(kv_pool_used(&s.blocks) == 0);
    // a block-aligned prompt of 16 cached tokens recomputes its last block
    struct request *e = mkp(5, 16, 100);
    sched_add(&s, e);
    o = sched_schedule(&s);
    CHECK(find(o, e) && find(o, e)->num_tokens == 4 && e->num_cached == 12);
    advance(o);
    sched_remove(&s, e);
    CHECK(kv_pool_used(&s.blocks) == 0);
    // two new prompts alike in one step: y starts from the 4 blocks x computes in it
    int cached = kv_pool_occupied(&s.blocks);
    struct request *x = mkp(6, 20, 500), *y = mkp(7, 20, 500);
    sched_add(&s, x);
    sched_add(&s, y);
    o = sched_schedule(&s);
    CHECK(find(o, x) && find(o, x)->num_tokens == 20 && find(o, y) && find(o, y)->num_tokens == 4 && y->num_cached == 16);
    CHECK(!memcmp(x->blocks, y->blocks, sizeof(int) * 4) && s.blocks.ref[x->blocks[0]] == 2);
    // a launch that failed: what the step committed is forgotten, so no later prompt reads it
    sched_launch_failed(&s, o);
    sched_remove(&s, x);
    sched_remove(&s, y);
    CHECK(kv_pool_used(&s.blocks) == 0 && kv_pool_occupied(&s.blocks) == cached);
    CHECK(kv_pool_find(&s.blocks, x->hashes[0]) < 0 && kv_pool_find(&s.blocks, x->hashes[3]) < 0);
    struct request *z = mkp(8, 20, 500);
    sched_add(&s, z);
    o = sched_schedule(&s);
    CHECK(find(o, z) && find(o, z)->num_tokens == 20 && z->num_cached == 0);
    advance(o);
    sched_remove(&s, z);
    CHECK(kv_pool_find(&s.blocks, z->hashes[3]) >= 0); // launched: cached
    sched_release(&s);
    rfree(a), rfree(b), rfree(c), rfree(d), rfree(e), rfree(x), rfree(y), rfree(z);
}

// Hybrid: checkpoints every 8 tokens (blocks of 4), a budget of 10 tokens.
static void test_prefix_hybrid(void) {
    struct scheduler s;
    struct sched_config cfg = {4, 10, 4, 32, 4, 1, 8, 8, 0};
    sched_init(&s, &cfg);
    struct request *a = mkp(1, 20, 100), *b = mkp(2, 20, 100), *c = mkp(3, 14, 100), *f = mkp(4, 20, 300);
    sched_add(&s, a);
    const struct sched_output *o = sched_schedule(&s);
    const struct sched_entry *e = find(o, a);
    CHECK(e && e->num_tokens == 10 && e->restore == -1 && e->num_ckpt == 1 && o->ckpt_pos[e->ckpt0] == 8);
    int ck8 = o->ckpt_id[e->ckpt0];
    advance(o);
    o = sched_schedule(&s); // commits the checkpoint at 8; plans 16
    e = find(o, a);
    CHECK(e && e->num_tokens == 10 && e->num_ckpt == 1 && o->ckpt_pos[e->ckpt0] == 16);
    int ck16 = o->ckpt_id[e->ckpt0];
    CHECK(kv_pool_occupied(&s.ckpts) == 2 && kv_pool_used(&s.ckpts) == 1); // 8 cached, 16 held until launched
    advance(o);
    sched_remove(&s, a);
    CHECK(kv_pool_used(&s.ckpts) == 0 && kv_pool_occupied(&s.ckpts) == 2);
    sched_add(&s, b);
    sched_add(&s, c);
    o = sched_schedule(&s);
    e = find(o, b); // the prefix of 16 is covered by blocks and a checkpoint: restored into b's slot
    CHECK(e && e->num_tokens == 4 && e->restore == ck16 && b->ckpt_hit == ck16 && b->num_cached == 16);
    e = find(o, c); // 13 tokens may hit: 3 blocks, and a checkpoint at 8 only
    CHECK(e && e->num_tokens == 6 && e->restore == ck8 && c->num_cached == 8);
    CHECK(s.ckpts.ref[ck16] == 1 && s.ckpts.ref[ck8] == 1);
    advance(o);
    o = sched_schedule(&s); // decodes restore nothing and write no checkpoint
    CHECK(find(o, b) && find(o, b)->is_decode && find(o, b)->restore == -1 && find(o, b)->num_ckpt == 0);
    sched_remove(&s, b);
    sched_remove(&s, c);
    // a step that never launched commits nothing: f's checkpoint at 8 is dropped, its blocks forgotten
    int cached = kv_pool_occupied(&s.blocks);
    sched_add(&s, f);
    o = sched_schedule(&s);
    CHECK(find(o, f) && find(o, f)->num_ckpt == 1);
    sched_launch_failed(&s, o);
    sched_remove(&s, f); // as after a failed launch: num_computed did not advance
    CHECK(kv_pool_used(&s.ckpts) == 0 && kv_pool_occupied(&s.ckpts) == 2 && kv_pool_used(&s.blocks) == 0);
    CHECK(kv_pool_occupied(&s.blocks) == cached);
    sched_release(&s);
    rfree(a), rfree(b), rfree(c), rfree(f);
}

// --scheduling-policy priority: admission by (priority, arrival), and the
// least urgent running request is preempted, not the last admitted.
static void test_priority(void) {
    struct scheduler s;
    struct sched_config one = {1, 64, 4, 100, 1, 0, 0, 0, 1}; // one sequence at a time
    sched_init(&s, &one);
    struct request *q[4] = {mk(1, 3), mk(2, 3), mk(3, 3), mk(4, 3)};
    int prio[4] = {5, 0, 0, -1}, want[4] = {3, 1, 2, 0}; // d, then b and c by arrival, then a
    for (int i = 0; i < 4; i++) q[i]->sp.priority = prio[i], sched_add(&s, q[i]);
    for (int k = 0; k < 4; k++) {
        const struct sched_output *o = sched_schedule(&s);
        CHECK(o->num_entries == 1 && o->entries[0].req == q[want[k]]);
        sched_remove(&s, q[want[k]]);
    }
    sched_release(&s);

    // x (priority 1) runs first, y (priority 0) comes later: when the 6
    // blocks run out it is x that goes back to the queue
    struct sched_config small = {4, 64, 4, 6, 4, 0, 0, 0, 1};
    sched_init(&s, &small);
    struct request *x = mk(5, 10), *y = mk(6, 10);
    x->sp.priority = 1;
    sched_add(&s, x);
    const struct sched_output *o = sched_schedule(&s);
    advance(o);
    sched_add(&s, y);
    o = sched_schedule(&s);
    CHECK(find(o, y) && s.num_running == 2 && s.running[0] == y);
    int steps = 0;
    while (!o->num_preempted && steps++ < 100) advance(o), o = sched_schedule(&s);
    CHECK(o->num_preempted == 1 && o->preempted[0] == x && s.wait_head == x && find(o, y));
    sched_remove(&s, x);
    sched_remove(&s, y);
    CHECK(s.blocks.num_free == 6 && s.slots.num_free == 4);
    sched_release(&s);
    for (int i = 0; i < 4; i++) rfree(q[i]);
    rfree(x), rfree(y);
}

int main(void) {
    test_priority();
    test_prefix_attention();
    test_prefix_hybrid();
    struct scheduler s;
    struct sched_config cfg = {2, 8, 4, 100, 2, 0, 0, 0, 0}; // 2 seqs, 8 tokens/step, blocks of 4
    sched_init(&s, &cfg);
    struct request *a = mk(1, 1), *b = mk(2, 13), *c = mk(3, 5);
    sched_add(&s, a);
    sched_add(&s, b);
    sched_add(&s, c);
    const struct sched_output *o = sched_schedule(&s);
    // a one-token prompt is a prefill; b gets the rest of the budget: chunked
    CHECK(o->num_entries == 2 && find(o, a) && !find(o, a)->is_decode && find(o, a)->num_tokens == 1);
    CHECK(find(o, b) && find(o, b)->num_tokens == 7 && !find(o, b)->is_decode && o->num_tokens == 8);
    CHECK(!find(o, c)); // max_num_seqs = 2
    CHECK(a->slot >= 0 && b->slot >= 0 && a->slot != b->slot);
    advance(o);
    o = sched_schedule(&s);
    CHECK(find(o, a) && find(o, a)->is_decode && find(o, a)->num_tokens == 1);  // a now decodes
    CHECK(find(o, b) && !find(o, b)->is_decode && find(o, b)->num_tokens == 6); // b finishes its prompt
    advance(o);
    o = sched_schedule(&s);
    CHECK(find(o, a)->is_decode && find(o, b)->is_decode && o->num_tokens == 2);
    sched_remove(&s, a);
    CHECK(a->slot == -1 && a->num_blocks == 0 && s.num_running == 1);
    advance(o);
    o = sched_schedule(&s); // c admitted once a left
    CHECK(find(o, c) && find(o, c)->num_tokens == 5 && find(o, b)->num_tokens == 1);
    advance(o);
    sched_remove(&s, b);
    sched_remove(&s, c);
    CHECK(s.blocks.num_free == 100 && s.slots.num_free == 2);
    sched_release(&s);

    // preemption: 6 blocks of 4 = 24 tokens for two sequences growing past it
    struct sched_config small = {4, 64, 4, 6, 4, 0, 0, 0, 0};
    sched_init(&s, &small);
    struct request *x = mk(4, 10), *y = mk(5, 10);
    sched_add(&s, x);
    sched_add(&s, y);
    o = sched_schedule(&s);
    CHECK(o->num_entries == 2 && s.blocks.num_free == 0);
    int preempted = 0, steps = 0;
    while (x->num_tokens < 20 && steps++ < 100) {
        advance(o);
        o = sched_schedule(&s);
        if (o->num_preempted) {
            preempted = 1;
            CHECK(o->preempted[0] == y && y->num_computed == 0 && y->slot == -1 && y->num_blocks == 0);
            CHECK(s.wait_head == y); // back to the front of the queue
        }
        const struct sched_entry *e = find(o, y);
        if (preempted && e && y->num_tokens > y->num_prompt) CHECK(!e->is_decode || y->num_computed > 0);
        int used = 0;
        for (int i = 0; i < o->num_entries; i++) used += o->entries[i].num_tokens;
        CHECK(used <= 64 && used == o->num_tokens);
    }
    CHECK(preempted && s.num_preemptions > 0);
    // a recompute of prompt + output is a prefill
    sched_remove(&s, x);
    o = sched_schedule(&s);
    const struct sched_entry *e = find(o, y);
    CHECK(e && !e->is_decode && e->num_tokens == y->num_tokens);
    sched_remove(&s, y);
    CHECK(s.blocks.num_free == 6 && s.slots.num_free == 4);
    sched_release(&s);
    rfree(a), rfree(b), rfree(c), rfree(x), rfree(y);
    return test_summary("scheduler");
}
