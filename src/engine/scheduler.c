// scheduler.c - decides which requests run each step and how many tokens.
//
// Running requests come first, in admission order, each taking what it still
// needs of the token budget (1 for a decode, the rest of the prompt for a
// prefill, capped by the budget: chunked prefill). When KV blocks run out, the
// most recently admitted request is preempted: it loses its blocks and state
// slot and will recompute from scratch. Waiting requests are admitted in FCFS
// order while the budget, max_num_seqs, blocks and state slots allow, and not
// in a step that had to preempt.
//
// The priority policy (vLLM's --scheduling-policy priority) keeps both the
// waiting queue and the running set ordered by (priority, arrival), lower
// first: admission takes the most urgent waiting request, and preempting the
// last running one preempts the least urgent (the latest of the lowest
// priority), which also has no entry in the step yet (it is scheduled last).
//
// Prefix caching: at admission a request takes the longest cached prefix it
// can use (see lookup) and only the tokens after it are scheduled. What a
// step computes is committed to the cache at the next schedule (or when the
// request's resources are freed), when the step has been launched: every
// later step runs after it on the device, so a hit never reads content that
// is not written yet, and a failed launch commits nothing.
#include "core/common.h"
#include "engine/scheduler.h"

int sched_init(struct scheduler *s, const struct sched_config *cfg) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    TRY(kv_pool_init(&s->blocks, cfg->num_blocks));
    int rc = kv_pool_init(&s->ckpts, cfg->prefix_caching && cfg->num_slots ? cfg->num_ckpts : 0);
    if (rc) {
        kv_pool_release(&s->blocks);
        return rc;
    }
    id_pool_init(&s->slots, cfg->num_slots);
    id_pool_init(&s->rows, cfg->max_num_seqs);
    s->running = xcalloc(cfg->max_num_seqs, sizeof(struct request *));
    s->out.entries = xcalloc(cfg->max_num_seqs, sizeof(struct sched_entry));
    s->out.preempted = xcalloc(cfg->max_num_seqs, sizeof(struct request *));
    int mc = MAX(sched_max_ckpt_writes(cfg), 1);
    s->out.ckpt_pos = xcalloc(mc, sizeof(int32_t));
    s->out.ckpt_id = xcalloc(mc, sizeof(int32_t));
    return VLLM_OK;
}

void sched_release(struct scheduler *s) {
    kv_pool_release(&s->blocks);
    kv_pool_release(&s->ckpts);
    id_pool_release(&s->slots);
    id_pool_release(&s->rows);
    free(s->running);
    free(s->out.entries);
    free(s->out.preempted);
    free(s->out.ckpt_pos);
    free(s->out.ckpt_id);
}

int sched_blocks_for(const struct scheduler *s, int n) { return s->cfg.num_blocks ? CDIV(n, s->cfg.block_size) : 0; }

int sched_has_work(const struct scheduler *s) { return s->num_running > 0 || s->wait_head != NULL; }

// Whether a runs before b under the priority policy: (priority, arrival);
// ids are given in submit order.
static int more_urgent(const struct request *a, const struct request *b) {
    return a->sp.priority != b->sp.priority ? a->sp.priority < b->sp.priority : a->id < b->id;
}

// Into the waiting queue at its place by (priority, arrival).
static void insert_ordered(struct scheduler *s, struct request *r) {
    struct request **pp = &s->wait_head;
    while (*pp && !more_urgent(r, *pp)) pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
    if (!r->next) s->wait_tail = r;
    s->num_waiting++;
}

void sched_add(struct scheduler *s, struct request *r) {
    r->ckpt_hit = -1; // a request enters holding nothing
    r->restore = r->num_pend = r->num_committed = 0;
    r->num_cached = -1;
    r->state = REQ_WAITING;
    r->next = NULL;
    if (s->cfg.priority) {
        insert_ordered(s, r);
        return;
    }
    if (s->wait_tail) s->wait_tail->next = r;
    else s->wait_head = r;
    s->wait_tail = r;
    s->num_waiting++;
}

// A preempted request: first in FCFS, at its place by priority.
static void push_front(struct scheduler *s, struct request *r) {
    r->state = REQ_WAITING;
    if (s->cfg.priority) {
        r->next = NULL;
        insert_ordered(s, r);
        return;
    }
    r->next = s->wait_head;
    s->wait_head = r;
    if (!s->wait_tail) s->wait_tail = r;
    s->num_waiting++;
}

// Into the running set: at the end (admission order), or by priority.
static void add_running(struct scheduler *s, struct request *r) {
    int i = s->num_running;
    while (s->cfg.priority && i > 0 && more_urgent(r, s->running[i - 1])) i--;
    memmove(&s->running[i + 1], &s->running[i], sizeof(struct request *) * (s->num_running - i));
    s->running[i] = r;
    s->num_running++;
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
    if (need > kv_pool_available(&s->blocks)) return 0;
    xgrow((void **)&r->blocks, &r->cap_blocks, r->num_blocks + need, sizeof(int));
    for (int i = 0; i < need; i++) r->blocks[r->num_blocks++] = kv_pool_alloc(&s->blocks);
    return 1;
}

// Hashes r's full blocks of known tokens (-1: a sampled id still in flight)
// inside its first n tokens.
static void hash_blocks(struct scheduler *s, struct request *r, int n) {
    int bs = s->cfg.block_size, nb = n / bs;
    if (r->num_hashed >= nb) return;
    xgrow((void **)&r->hashes, &r->cap_hashes, nb, sizeof(uint64_t));
    for (int j = r->num_hashed; j < nb; j++) {
        const int32_t *t = r->tokens + (int64_t)j * bs;
        for (int i = 0; i < bs; i++)
            if (t[i] < 0) return;
        r->hashes[j] = kv_hash_block(j ? r->hashes[j - 1] : r->salt, t, bs);
        r->num_hashed = j + 1;
    }
}

// Commits r's full blocks of known tokens inside its first upto tokens. At
// schedule time upto counts the tokens this step computes: a request admitted
// later in the same step may start from those blocks, because every layer
// writes the whole step's KV before any of its attention reads (vLLM caches
// blocks when it allocates them, too). Checkpoints wait for the launch
// (commit_cached): a state is gathered at the start of the step that writes it.
static void commit_blocks(struct scheduler *s, struct request *r, int upto) {
    if (!s->cfg.prefix_caching) return;
    hash_blocks(s, r, upto); // checkpoint keys too, on models without attention
    if (!s->cfg.num_blocks) return;
    int bs = s->cfg.block_size;
    int nb = MIN(MIN(r->num_hashed, upto / bs), r->num_blocks);
    for (int j = r->num_committed; j < nb; j++) kv_pool_commit(&s->blocks, r->blocks[j], r->hashes[j]);
    r->num_committed = MAX(r->num_committed, nb);
}

// Commits what r's launched steps computed: its full blocks, and the
// checkpoints written at positions it has computed past whose block hash is
// known (a decode's input token may be a sampled id still on its way back:
// its checkpoint waits for the next schedule). Checkpoints of a step that
// never launched are just dropped.
static void commit_cached(struct scheduler *s, struct request *r) {
    if (!s->cfg.prefix_caching) return;
    int bs = s->cfg.block_size;
    commit_blocks(s, r, r->num_computed);
    int keep = 0;
    for (int k = 0; k < r->num_pend; k++) {
        int pos = r->pend[2 * k], id = r->pend[2 * k + 1];
        if (pos > r->num_computed || pos / bs > r->num_hashed) { // not launched yet, or its key not known yet
            r->pend[2 * keep] = pos, r->pend[2 * keep + 1] = id, keep++;
            continue;
        }
        kv_pool_commit(&s->ckpts, id, r->hashes[pos / bs - 1]);
        kv_pool_put(&s->ckpts, id);
    }
    r->num_pend = keep;
}

void sched_free_resources(struct scheduler *s, struct request *r) {
    commit_cached(s, r);
    for (int k = 0; k < r->num_pend; k++) kv_pool_put(&s->ckpts, r->pend[2 * k + 1]);
    r->num_pend = 0;
    kv_pool_put(&s->ckpts, r->ckpt_hit);
    r->ckpt_hit = -1;
    r->restore = 0;
    for (int i = 0; i < r->num_blocks; i++) kv_pool_put(&s->blocks, r->blocks[i]);
    r->num_blocks = r->num_committed = 0;
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

// One checkpoint r holds until the step that writes it at position q has
// launched (commit_cached); 0 when every checkpoint is held (fewer hits
// later, nothing wrong).
static int pend_ckpt(struct scheduler *s, struct request *r, struct sched_entry *e, int q) {
    int id = kv_pool_alloc(&s->ckpts);
    if (id < 0) return 0;
    xgrow((void **)&r->pend, &r->cap_pend, 2 * (r->num_pend + 1), sizeof(int32_t));
    r->pend[2 * r->num_pend] = q, r->pend[2 * r->num_pend + 1] = id, r->num_pend++;
    s->out.ckpt_pos[s->out.num_ckpt] = q;
    s->out.ckpt_id[s->out.num_ckpt++] = id;
    e->num_ckpt++;
    return 1;
}

// Plans the checkpoints an entry of n tokens writes, where not cached yet. A
// prefill: at each multiple of the interval in (ctx, ctx + n] whose block
// hash is known (the SSD scan has the state at chunk boundaries only). A
// decode: after its token, when that token ends a block. Where a reply ends
// (EOS, a stop string, max_tokens, an abort) is unknown while it is decoded,
// so every block boundary of it is written: a next turn that re-sends prompt
// + reply then hits up to the last full block of the reply, not only up to
// the last interval of the prompt. The cost: one more write of the state per
// block_size tokens of a sequence; a full pool means fewer hits (LRU).
static void plan_ckpts(struct scheduler *s, struct request *r, struct sched_entry *e, int n) {
    e->ckpt0 = s->out.num_ckpt;
    e->num_ckpt = 0;
    int iv = s->cfg.ckpt_interval, bs = s->cfg.block_size, ctx = r->num_computed;
    if (!s->ckpts.total || !iv) return;
    hash_blocks(s, r, ctx + n);
    if (e->is_decode) {
        int q = ctx + 1; // the input token may still be in flight: its hash is then known only at the commit
        if (q % bs || (q / bs <= r->num_hashed && kv_pool_find(&s->ckpts, r->hashes[q / bs - 1]) >= 0)) return;
        s->decode_ckpts += pend_ckpt(s, r, e, q);
        return;
    }
    for (int q = (ctx / iv + 1) * iv; q <= ctx + n && q / bs <= r->num_hashed; q += iv) {
        if (kv_pool_find(&s->ckpts, r->hashes[q / bs - 1]) >= 0) continue;
        if (!pend_ckpt(s, r, e, q)) return;
    }
}

static void add_entry(struct scheduler *s, struct request *r, int n, int new_row) {
    struct sched_entry *e = &s->out.entries[s->out.num_entries++];
    e->req = r;
    e->num_tokens = n;
    e->new_row = new_row;
    // decode: the one token left is a sampled one, and the state holds the
    // rest (a request admitted this step, even with a cached prefix, prefills)
    e->is_decode = !new_row && r->num_computed > 0 && r->num_computed == r->num_tokens - 1 &&
                   r->num_tokens > r->num_prompt;
    e->restore = r->restore ? r->ckpt_hit : -1;
    r->restore = 0;
    plan_ckpts(s, r, e, n);
    e->commit0 = r->num_committed;
    if (!e->is_decode) commit_blocks(s, r, r->num_computed + n);
    e->commit1 = r->num_committed;
    s->out.num_tokens += n;
}

void sched_launch_failed(struct scheduler *s, const struct sched_output *o) {
    for (int i = 0; i < o->num_entries; i++) {
        const struct sched_entry *e = &o->entries[i];
        for (int j = e->commit0; j < e->commit1; j++) kv_pool_forget(&s->blocks, e->req->blocks[j]);
        e->req->num_committed = MIN(e->req->num_committed, e->commit0);
    }
}

// The longest cached prefix r can start from, in tokens: whole blocks found
// in the block pool (every block of a model without attention), never the
// last token (it must run, for logits). With recurrent state also a
// checkpoint at its end (*ckpt; -1 for none): the prefix must be covered by
// both. Checkpoints sit at block boundaries (interval multiples from
// prefills, any block from decodes), keyed by the hash of the block that
// ends at them, so every block boundary is looked at, longest first.
static int lookup(struct scheduler *s, struct request *r, int *ckpt) {
    int bs = s->cfg.block_size, max = r->num_tokens - 1;
    *ckpt = -1;
    hash_blocks(s, r, max);
    int nb = MIN(r->num_hashed, max / bs);
    if (s->cfg.num_blocks) {
        int k = 0;
        while (k < nb && kv_pool_find(&s->blocks, r->hashes[k]) >= 0) k++;
        nb = k;
    }
    if (!s->cfg.num_slots) return nb * bs;
    if (!s->ckpts.total || !s->cfg.ckpt_interval) return 0;
    for (int j = nb; j > 0; j--) {
        int id = kv_pool_find(&s->ckpts, r->hashes[j - 1]);
        if (id >= 0) {
            *ckpt = id;
            return j * bs;
        }
    }
    return 0;
}

// Admits r with its cached prefix of hit tokens (blocks and checkpoint
// referenced) and blocks for n more; 0 (holding nothing) when the pool cannot.
static int admit_blocks(struct scheduler *s, struct request *r, int hit, int ckpt, int n) {
    int bs = s->cfg.block_size, nh = s->cfg.num_blocks ? hit / bs : 0, idle = 0;
    for (int j = 0; j < nh; j++) idle += s->blocks.ref[kv_pool_find(&s->blocks, r->hashes[j])] == 0;
    // hit blocks no one holds are among the available ones: taking them leaves fewer
    if (sched_blocks_for(s, hit + n) - nh > kv_pool_available(&s->blocks) - idle) return 0;
    xgrow((void **)&r->blocks, &r->cap_blocks, MAX(nh, 1), sizeof(int));
    for (int j = 0; j < nh; j++) {
        int id = kv_pool_find(&s->blocks, r->hashes[j]);
        kv_pool_ref(&s->blocks, id);
        r->blocks[j] = id;
    }
    r->num_blocks = r->num_committed = nh;
    if (ckpt >= 0) {
        kv_pool_ref(&s->ckpts, ckpt);
        r->ckpt_hit = ckpt;
        r->restore = 1;
    }
    r->num_computed = hit;
    ensure_blocks(s, r, hit + n);
    return 1;
}

const struct sched_output *sched_schedule(struct scheduler *s) {
    s->out.num_entries = s->out.num_tokens = s->out.num_preempted = s->out.num_ckpt = 0;
    for (int i = 0; i < s->num_running; i++) commit_cached(s, s->running[i]);
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
        if ((s->cfg.num_slots && s->slots.num_free == 0) || s->rows.num_free == 0) break;
        // prompt log-probs need every prompt row's logits: no cached prefix (vLLM's skip_reading_prefix_cache)
        int reads = s->cfg.prefix_caching && r->sp.prompt_logprobs < 0;
        int ckpt = -1, hit = reads ? lookup(s, r, &ckpt) : 0;
        int n = MIN(r->num_tokens - hit, budget);
        if (!admit_blocks(s, r, hit, ckpt, n)) break;
        if (reads) {
            s->prefix_queries += r->num_tokens;
            s->prefix_hits += hit;
        }
        if (r->num_cached < 0) r->num_cached = MIN(hit, r->num_prompt);
        unlink_waiting(s, r);
        if (s->cfg.num_slots) r->slot = id_pool_alloc(&s->slots);
        r->row = id_pool_alloc(&s->rows);
        r->state = REQ_RUNNING;
        add_running(s, r);
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
