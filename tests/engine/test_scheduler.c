// test_scheduler.c - the scheduler alone, with requests whose model steps we
// play by hand: budget, FCFS, max_num_seqs, chunked prefill, decode
// classification from request state, and preemption by recompute.
#include "core/common.h"
#include "engine/scheduler.h"
#include "test.h"

static struct request *mk(int id, int n) {
    struct request *r = xcalloc(1, sizeof *r);
    r->id = id;
    r->tokens = xcalloc(256, sizeof(int32_t));
    r->num_prompt = r->num_tokens = n;
    r->cap_tokens = 256;
    r->slot = r->row = -1;
    return r;
}

static void rfree(struct request *r) {
    free(r->tokens);
    free(r->blocks);
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

int main(void) {
    struct scheduler s;
    struct sched_config cfg = {2, 8, 4, 100, 2}; // 2 seqs, 8 tokens/step, blocks of 4
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
    struct sched_config small = {4, 64, 4, 6, 4};
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
