// scheduler.c - decides which requests run each step and how many tokens.
//
// Running requests come first, in admission order, each taking what it still
// needs of the token budget (1 for a decode, the rest of the prompt for a
// prefill, capped by the budget: chunked prefill). When KV blocks run out, the
// most recently admitted request is preempted: it loses its blocks and state
// slot and will recompute from scratch. Waiting requests are admitted in FCFS
// order while the budget, max_num_seqs, blocks and state slots allow, and not
// in a step that had to preempt.
#include "core/common.h"
#include "engine/scheduler.h"

void sched_init(struct scheduler *s, const struct sched_config *cfg) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    id_pool_init(&s->blocks, cfg->num_blocks);
    id_pool_init(&s->slots, cfg->num_slots);
    id_pool_init(&s->rows, cfg->max_num_seqs);
    s->running = xcalloc(cfg->max_num_seqs, sizeof(struct request *));
    s->out.entries = xcalloc(cfg->max_num_seqs, sizeof(struct sched_entry));
    s->out.preempted = xcalloc(cfg->max_num_seqs, sizeof(struct request *));
}

void sched_release(struct scheduler *s) {
    id_pool_release(&s->blocks);
    id_pool_release(&s->slots);
    id_pool_release(&s->rows);
    free(s->running);
    free(s->out.entries);
    free(s->out.preempted);
}

int sched_blocks_for(const struct scheduler *s, int n) { return s->cfg.num_blocks ? CDIV(n, s->cfg.block_size) : 0; }

int sched_has_work(const struct scheduler *s) { return s->num_running > 0 || s->wait_head != NULL; }

void sched_add(struct scheduler *s, struct request *r) {
    r->state = REQ_WAITING;
    r->next = NULL;
    if (s->wait_tail) s->wait_tail->next = r;
    else s->wait_head = r;
    s->wait_tail = r;
    s->num_waiting++;
}

static void push_front(struct scheduler *s, struct request *r) {
    r->state = REQ_WAITING;
    r->next = s->wait_head;
    s->wait_head = r;
    if (!s->wait_tail) s->wait_tail = r;
    s->num_waiting++;
}

static void unlink_waiting(struct scheduler *s, struct request *r) {
    struct request **pp = &s->wait_head, *prev = NULL;
    while (*pp && *pp != r) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = r->next;
    if (s->wait_tail == r) s->wait_tail = prev;
    r->next = NULL;
    s->num_waiting--;
}

// Grows r's block list to cover n tokens; 0 when the pool cannot.
static int ensure_blocks(struct scheduler *s, struct request *r, int n) {
    int need = sched_blocks_for(s, n) - r->num_blocks;
    if (need <= 0) return 1;
    if (need > s->blocks.num_free) return 0;
    xgrow((void **)&r->blocks, &r->cap_blocks, r->num_blocks + need, sizeof(int));
    for (int i = 0; i < need; i++) r->blocks[r->num_blocks++] = id_pool_alloc(&s->blocks);
    return 1;
}

void sched_free_resources(struct scheduler *s, struct request *r) {
    for (int i = 0; i < r->num_blocks; i++) id_pool_put(&s->blocks, r->blocks[i]);
    r->num_blocks = 0;
    id_pool_put(&s->slots, r->slot);
    r->slot = -1;
    id_pool_put(&s->rows, r->row);
    r->row = -1;
}

static void remove_running(struct scheduler *s, struct request *r) {
    for (int i = 0; i < s->num_running; i++)
        if (s->running[i] == r) {
            memmove(&s->running[i], &s->running[i + 1], sizeof(struct request *) * (s->num_running - i - 1));
            s->num_running--;
            return;
        }
}

static void preempt_last(struct scheduler *s) {
    struct request *v = s->running[--s->num_running];
    sched_free_resources(s, v);
    v->num_computed = 0; // recompute: prompt + output so far, as a prefill
    push_front(s, v);
    s->out.preempted[s->out.num_preempted++] = v;
    s->num_preemptions++;
}

static void add_entry(struct scheduler *s, struct request *r, int n, int new_row) {
    struct sched_entry *e = &s->out.entries[s->out.num_entries++];
    e->req = r;
    e->num_tokens = n;
    e->new_row = new_row;
    // decode: the one token left is a sampled one, and the state holds the rest
    e->is_decode = r->num_computed > 0 && r->num_computed == r->num_tokens - 1 && r->num_tokens > r->num_prompt;
    s->out.num_tokens += n;
}

const struct sched_output *sched_schedule(struct scheduler *s) {
    s->out.num_entries = s->out.num_tokens = s->out.num_preempted = 0;
    int budget = s->cfg.max_num_batched_tokens;
    for (int i = 0; i < s->num_running && budget > 0;) {
        struct request *r = s->running[i];
        int n = MIN(r->num_tokens - r->num_computed, budget);
        if (n <= 0 || r->length_done) { // all it needs is in flight
            i++;
            continue;
        }
        int preempted_self = 0;
        while (!ensure_blocks(s, r, r->num_computed + n)) {
            preempted_self = s->running[s->num_running - 1] == r;
            preempt_last(s);
            if (preempted_self) break;
        }
        if (preempted_self) break;
        add_entry(s, r, n, 0);
        budget -= n;
        i++;
    }
    if (s->out.num_preempted) return &s->out;
    while (s->wait_head && budget > 0 && s->num_running < s->cfg.max_num_seqs) {
        struct request *r = s->wait_head;
        int n = MIN(r->num_tokens - r->num_computed, budget);
        if ((s->cfg.num_slots && s->slots.num_free == 0) || s->rows.num_free == 0) break;
        if (!ensure_blocks(s, r, r->num_computed + n)) break;
        unlink_waiting(s, r);
        if (s->cfg.num_slots) r->slot = id_pool_alloc(&s->slots);
        r->row = id_pool_alloc(&s->rows);
        r->state = REQ_RUNNING;
        s->running[s->num_running++] = r;
        add_entry(s, r, n, 1);
        budget -= n;
    }
    return &s->out;
}

void sched_unschedule(struct scheduler *s, struct request *r) {
    if (r->state == REQ_RUNNING) remove_running(s, r);
    else if (r->state == REQ_WAITING) unlink_waiting(s, r);
    r->state = REQ_FINISHED;
}
