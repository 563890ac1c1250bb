// runner.c - one flat batch per step, on the backend's device.
//
// The token table [max_num_seqs, max_model_len] on the device is the one
// owner of input ids: prompts are uploaded into a request's row once, the
// sampler writes each sampled id into the row at its position, and every
// step's input ids are gathered from it on the device. No host copy of an id
// ever feeds the model, so none can be stale.
//
// Tensor parallelism: the runner drives one rank per backend of a group, each
// with its model shards, caches, token table and step buffers, each from its
// own thread (a team; rank 0 is the caller). The host builds one step (its
// metadata image and the token rows of newly admitted requests) and every
// rank runs that same step: this hand-over is the broadcast of the step. All
// ranks sample the same ids from the same all-gathered logits into their own
// tables; rank 0's are read back.
#include "core/common.h"
#include "core/team.h"
#include "runner/runner.h"

struct meta_layout { // offsets (int32 units) into the metadata buffer
    size_t qsl, seq_lens, ctx, pos, slot_map, btab, state, state_src, ckpt_start, ckpt_pos, ckpt_slot, ckpt_dst, src,
        srows, sparams, plp, total;
};

// Host side of one launched step (RUNNER_INFLIGHT of them, used in turn):
// page-locked so its copies overlap the device's work.
struct step_slot {
    int32_t *staging;          // metadata image uploaded by the launch
    int32_t *ids, *top_ids;    // sampled ids and top log-prob ids, copied back
    float *lp, *top_lp;
    struct request **reqs;     // sampled requests, in sample-row order
    int32_t *pos;              // where each sampled id goes in its request's tokens
    struct request **sched;    // every request of the step
    struct request **admitted; // requests given a token-table row by this step
    uint32_t *mask;            // [num, mask_words] allowed ids of each sampled row, when masked
    int64_t *bias_idx;         // [num_bias] logit_bias entries of the sampled rows: row * vocab + id
    float *bias_val;           // [num_bias]
    int num, num_sched, num_admitted, any_logprobs, fence, num_bias;
    // Prompt log-probs (runner_plp_alloc, at the first step that has any):
    // the rows' batch rows (staging + lay.plp) then their target ids, uploaded
    // after the metadata; the results copied back (page-locked).
    int num_plp, plp_k;
    struct request **plp_req; // [max tokens]
    int32_t *plp_pos, *plp_tgt;
    float *plp_lp, *plp_top_lp;
    int32_t *plp_rank, *plp_top_ids;
    // Some sampled row has a constraint (or a logit_bias): the launch queues
    // gather and forward only; runner_sample, once the step before is
    // postprocessed (its tokens advanced the constraints), queues the masks,
    // mask_logits, bias_logits and sample.
    int masked;
};

#define MAX_GRAPH_BATCH 512 // vLLM's default largest captured size
// Graphs by padded batch size, twice: without and with the token mask
// (constrained decoding adds mask_logits before the sampler).
#define NUM_GRAPHS (2 * (MAX_GRAPH_BATCH + 1))

// One tensor-parallel rank (the only one without tensor parallelism).
struct rank {
    struct backend *be;
    struct model *model; // this rank's shards
    struct caches caches;
    int32_t *table;      // device [(max_num_seqs + 1) * max_model_len]; the last row pads graphs
    int32_t *input_ids;  // device [max_num_batched_tokens]
    int32_t *meta;       // device metadata, uploaded in one copy per step
    float *logits;       // device [logit rows, vocab]
    float *logits_all;   // device [max tokens, vocab] with the hook or prompt log-probs
    float *plp_lp;       // rank 0, device: prompt log-probs [max tokens], ranks, top [max tokens, max_top]
    int32_t *plp_rank, *plp_top_ids;
    float *plp_top_lp;
    uint32_t *mask;      // device [max_num_seqs, mask_words] token masks of a masked step
    int64_t *bias_idx;   // device [max_num_seqs * VLLM_MAX_LOGIT_BIAS] a masked step's logit_bias entries
    float *bias_val;
    struct sample_out dev_out;
    void *graphs[NUM_GRAPHS];
    int graph_epoch;
};

// The step every rank runs, set by runner_launch.
struct launch {
    struct step_slot *sl;
    struct batch b; // device pointers of rank 0
    size_t meta_bytes;
    int pad, replay, record;
    int gi; // graphs[] index: pad, or pad + MAX_GRAPH_BATCH + 1 when masked (those graphs stop before the sampler)
};

struct runner {
    int tp;
    struct rank *rk;   // [tp]
    struct team *team; // a thread per rank, rank 0 the caller's
    struct runner_config cfg;
    int vocab, max_blocks, pad_row, pad_slot;
    int mask_words; // CDIV(vocab, 32)
    struct meta_layout lay;
    struct step_slot slots[RUNNER_INFLIGHT];
    int next_slot;
    int32_t *order;
    struct launch job;
    // graphs of pure-decode steps, by padded batch size: seen once (run eagerly,
    // which sizes every buffer), then recorded and replayed (per rank)
    unsigned char seen[NUM_GRAPHS];
    int num_graphs;
    runner_logits_hook hook;
    void *hook_user;
    float *hook_logits;
    struct request **hook_req;
    int32_t *hook_pos;
    int64_t kv_bytes, state_bytes;
    uint64_t steps;
    int plp_ready;  // the prompt log-prob buffers exist
    int plp_failed; // the last launch needed them and could not allocate them
};

static void layout(struct meta_layout *l, int S, int T, int MB, int MC) {
    size_t o = 0;
    l->qsl = o, o += S + 1;
    l->seq_lens = o, o += S;
    l->ctx = o, o += S;
    l->pos = o, o += T;
    l->slot_map = o, o += T;
    l->btab = o, o += (size_t)S * MB;
    l->state = o, o += S;
    l->state_src = o, o += S;
    l->ckpt_start = o, o += S + 1;
    l->ckpt_pos = o, o += MC;
    l->ckpt_slot = o, o += MC;
    l->ckpt_dst = o, o += S;
    l->src = o, o += T;
    l->srows = o, o += S;
    o = (o + 3) & ~(size_t)3; // 16-byte aligned sample params
    l->sparams = o, o += S * (sizeof(struct sample_params) / 4);
    l->plp = o, o += 2 * (size_t)T; // prompt log-prob rows and targets: uploaded apart, only when there are any
    l->total = o;
}

static void *dev_alloc(struct rank *k, size_t bytes, int *rc, const char *what) {
    void *p = k->be->ops->alloc(k->be, bytes);
    if (!p && !*rc) *rc = vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes on the device for %s", bytes, what);
    return p;
}

// Page-locked host memory, of rank 0 (which reads back the sampled ids).
static void *host_alloc(struct runner *r, size_t bytes, int *rc) {
    struct backend *be = r->rk[0].be;
    void *p = be->ops->host_alloc(be, bytes);
    if (!p && !*rc) *rc = vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of page-locked host memory", bytes);
    return p;
}

// A rank's caches, at its shards' sizes (model spec): the pools hold the
// same blocks and slots on every rank, each of the rank's heads. State slots:
// the live ones, the one that pads graph batches, then the checkpoints (so
// that the ops that gather a sequence's state restore a checkpoint too).
static int alloc_caches(struct runner *r, struct rank *k) {
    return caches_alloc(k->be, &k->model->spec, r->cfg.num_blocks, r->cfg.block_size,
                        r->cfg.num_slots + 1 + r->cfg.num_ckpts, &k->caches, &r->kv_bytes, &r->state_bytes);
}

int runner_create(int tp, struct backend *const *be, struct model *const *m, const struct runner_config *cfg,
                  struct runner **out) {
    struct runner *r = xcalloc(1, sizeof *r);
    r->tp = tp;
    r->rk = xcalloc(tp, sizeof *r->rk);
    r->cfg = *cfg;
    r->vocab = m[0]->spec.vocab_size;
    r->mask_words = CDIV(r->vocab, 32);
    r->max_blocks = CDIV(cfg->max_model_len, cfg->block_size);
    r->pad_row = cfg->max_num_seqs;
    r->pad_slot = cfg->num_slots;
    int S = cfg->max_num_seqs, T = cfg->max_num_batched_tokens, mt = MAX(cfg->max_top_logprobs, 1), SP = S, rc = 0;
    layout(&r->lay, S, T, r->max_blocks, MAX(cfg->max_ckpt_writes, 1));
    for (int i = 0; i < tp && !rc; i++) {
        struct rank *k = &r->rk[i];
        k->be = be[i];
        k->model = m[i];
        k->graph_epoch = be[i]->graph_epoch;
        backend_bind(k->be);
        rc = alloc_caches(r, k);
        k->table = dev_alloc(k, sizeof(int32_t) * (size_t)(S + 1) * cfg->max_model_len, &rc, "the token table");
        k->input_ids = dev_alloc(k, sizeof(int32_t) * T, &rc, "input ids");
        k->meta = dev_alloc(k, sizeof(int32_t) * r->lay.total, &rc, "batch metadata");
        k->logits = dev_alloc(k, sizeof(float) * (size_t)SP * r->vocab, &rc, "logits");
        k->dev_out.ids = dev_alloc(k, sizeof(int32_t) * SP, &rc, "sampled ids");
        k->dev_out.logprobs = dev_alloc(k, sizeof(float) * SP, &rc, "logprobs");
        k->dev_out.top_ids = dev_alloc(k, sizeof(int32_t) * SP * mt, &rc, "top logprobs");
        k->dev_out.top_logprobs = dev_alloc(k, sizeof(float) * SP * mt, &rc, "top logprobs");
        k->dev_out.max_top = mt;
        k->mask = dev_alloc(k, sizeof(uint32_t) * SP * r->mask_words, &rc, "token masks");
        k->bias_idx = dev_alloc(k, sizeof(int64_t) * SP * VLLM_MAX_LOGIT_BIAS, &rc, "logit biases");
        k->bias_val = dev_alloc(k, sizeof(float) * SP * VLLM_MAX_LOGIT_BIAS, &rc, "logit biases");
    }
    backend_bind(be[0]);
    for (int k = 0; k < RUNNER_INFLIGHT; k++) {
        struct step_slot *sl = &r->slots[k];
        sl->staging = host_alloc(r, sizeof(int32_t) * r->lay.total, &rc);
        sl->ids = host_alloc(r, sizeof(int32_t) * SP, &rc);
        sl->lp = host_alloc(r, sizeof(float) * SP, &rc);
        sl->top_ids = host_alloc(r, sizeof(int32_t) * SP * mt, &rc);
        sl->top_lp = host_alloc(r, sizeof(float) * SP * mt, &rc);
        sl->mask = host_alloc(r, sizeof(uint32_t) * SP * r->mask_words, &rc);
        sl->bias_idx = host_alloc(r, sizeof(int64_t) * SP * VLLM_MAX_LOGIT_BIAS, &rc);
        sl->bias_val = host_alloc(r, sizeof(float) * SP * VLLM_MAX_LOGIT_BIAS, &rc);
        sl->reqs = xcalloc(SP, sizeof(struct request *));
        sl->pos = xcalloc(SP, sizeof(int32_t));
        sl->sched = xcalloc(S, sizeof(struct request *));
        sl->admitted = xcalloc(S, sizeof(struct request *));
    }
    r->order = xcalloc(S, sizeof(int32_t));
    r->team = team_create(tp);
    if (rc) {
        runner_free(r);
        return rc;
    }
    *out = r;
    return VLLM_OK;
}

// Every rank's graphs go together, so that all ranks replay or record alike.
static void free_graphs(struct runner *r) {
    for (int k = 0; k < r->tp && r->rk[k].be; k++) {
        struct rank *rk = &r->rk[k];
        backend_bind(rk->be);
        for (int i = 0; i < NUM_GRAPHS; i++) {
            if (rk->graphs[i]) rk->be->ops->graph_free(rk->be, rk->graphs[i]);
            rk->graphs[i] = NULL;
        }
        rk->graph_epoch = rk->be->graph_epoch;
    }
    memset(r->seen, 0, sizeof r->seen);
    backend_bind(r->rk[0].be);
}

static void free_rank(struct rank *k) {
    struct backend *be = k->be;
    if (!be) return;
    backend_bind(be);
    be->ops->sync(be);
    caches_release(be, &k->caches);
    void *dev[] = {k->table, k->input_ids, k->meta, k->logits, k->logits_all, k->dev_out.ids, k->dev_out.logprobs,
                   k->dev_out.top_ids, k->dev_out.top_logprobs, k->mask, k->bias_idx, k->bias_val,
                   k->plp_lp, k->plp_rank, k->plp_top_ids, k->plp_top_lp};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) be->ops->free(be, dev[i]);
}

void runner_free(struct runner *r) {
    if (!r) return;
    free_graphs(r);
    for (int k = r->tp - 1; k >= 0; k--) free_rank(&r->rk[k]); // rank 0 last: it stays bound
    struct backend *be = r->rk[0].be;
    for (int k = 0; k < RUNNER_INFLIGHT; k++) {
        struct step_slot *sl = &r->slots[k];
        void *h[] = {sl->staging, sl->ids, sl->lp, sl->top_ids, sl->top_lp, sl->mask, sl->bias_idx, sl->bias_val,
                     sl->plp_lp, sl->plp_rank, sl->plp_top_ids, sl->plp_top_lp};
        for (size_t i = 0; i < sizeof h / sizeof h[0]; i++)
            if (h[i]) be->ops->host_free(be, h[i]);
        free(sl->reqs);
        free(sl->pos);
        free(sl->sched);
        free(sl->admitted);
        free(sl->plp_req);
        free(sl->plp_pos);
        free(sl->plp_tgt);
    }
    team_free(r->team);
    free(r->rk);
    free(r->order);
    free(r->hook_logits);
    free(r->hook_req);
    free(r->hook_pos);
    free(r);
}

int64_t runner_cache_bytes(const struct runner *r, int64_t *state_bytes) {
    if (state_bytes) *state_bytes = r->state_bytes;
    return r->kv_bytes;
}

int runner_graphs_captured(const struct runner *r) { return r->num_graphs; }

int runner_plp_failed(const struct runner *r) { return r->plp_failed; }

// Every rank's logits of every row of a step (the forward's all_rows), for
// the hook and for prompt log-probs.
static int alloc_logits_all(struct runner *r) {
    int rc = 0;
    for (int k = 0; k < r->tp; k++) {
        struct rank *rk = &r->rk[k];
        backend_bind(rk->be);
        if (!rk->logits_all)
            rk->logits_all = dev_alloc(rk, sizeof(float) * (size_t)r->cfg.max_num_batched_tokens * r->vocab, &rc,
                                       "the logits of every row of a step");
    }
    backend_bind(r->rk[0].be);
    return rc;
}

// The prompt log-prob buffers, at the first step that computes any: rank 0's
// results on the device and each step slot's host copies. After a failed
// allocation the next step tries again for what is missing.
static int runner_plp_alloc(struct runner *r) {
    if (r->plp_ready) return VLLM_OK;
    int T = r->cfg.max_num_batched_tokens, mt = r->rk[0].dev_out.max_top, rc = alloc_logits_all(r);
    struct rank *k = &r->rk[0];
    if (!k->plp_lp) k->plp_lp = dev_alloc(k, sizeof(float) * T, &rc, "prompt log-probs");
    if (!k->plp_rank) k->plp_rank = dev_alloc(k, sizeof(int32_t) * T, &rc, "prompt log-prob ranks");
    if (!k->plp_top_ids) k->plp_top_ids = dev_alloc(k, sizeof(int32_t) * (size_t)T * mt, &rc, "prompt top log-probs");
    if (!k->plp_top_lp) k->plp_top_lp = dev_alloc(k, sizeof(float) * (size_t)T * mt, &rc, "prompt top log-probs");
    for (int i = 0; i < RUNNER_INFLIGHT; i++) {
        struct step_slot *sl = &r->slots[i];
        if (!sl->plp_lp) sl->plp_lp = host_alloc(r, sizeof(float) * T, &rc);
        if (!sl->plp_rank) sl->plp_rank = host_alloc(r, sizeof(int32_t) * T, &rc);
        if (!sl->plp_top_ids) sl->plp_top_ids = host_alloc(r, sizeof(int32_t) * (size_t)T * mt, &rc);
        if (!sl->plp_top_lp) sl->plp_top_lp = host_alloc(r, sizeof(float) * (size_t)T * mt, &rc);
        if (!sl->plp_req) {
            sl->plp_req = xcalloc(T, sizeof(struct request *));
            sl->plp_pos = xcalloc(T, sizeof(int32_t));
            sl->plp_tgt = xcalloc(T, sizeof(int32_t));
        }
    }
    r->plp_ready = rc == 0;
    return rc;
}

void runner_set_logits_hook(struct runner *r, runner_logits_hook fn, void *user) {
    int T = r->cfg.max_num_batched_tokens;
    r->hook = fn;
    r->hook_user = user;
    if (fn && !r->hook_logits) {
        alloc_logits_all(r);
        r->hook_logits = xmalloc(sizeof(float) * (size_t)T * r->vocab);
        r->hook_req = xmalloc(sizeof(struct request *) * T);
        r->hook_pos = xmalloc(sizeof(int32_t) * T);
    }
}

static void fill_sample_params(struct runner *r, const struct request *q, struct sample_params *p) {
    const struct vllm_sampling_params *sp = &q->sp;
    p->temperature = sp->temperature;
    p->top_p = sp->top_p;
    p->min_p = sp->min_p;
    p->top_k = sp->top_k;
    p->repetition_penalty = sp->repetition_penalty;
    p->presence_penalty = sp->presence_penalty;
    p->frequency_penalty = sp->frequency_penalty;
    p->row_base = q->row * r->cfg.max_model_len;
    p->num_prompt = q->num_prompt;
    p->num_tokens = q->num_tokens;
    p->num_logprobs = sp->logprobs < 0 ? -1 : MIN(sp->logprobs, r->rk[0].dev_out.max_top);
    p->seed_lo = (uint32_t)q->seed;
    p->seed_hi = (uint32_t)(q->seed >> 32);
    p->step = (uint32_t)req_num_output(q);
}

// Metadata of a padding row of a recorded decode batch: one token that
// writes no KV, reads and writes the pad state slot, and samples into the
// pad row of the token table.
static void pad_row(struct runner *r, int32_t *st, const struct meta_layout *l, int s, int mb,
                    struct sample_params *sp) {
    int base = r->pad_row * r->cfg.max_model_len;
    st[l->qsl + s] = s;
    st[l->ctx + s] = 0;
    st[l->seq_lens + s] = 1;
    st[l->state + s] = r->pad_slot;
    st[l->state_src + s] = r->pad_slot;
    st[l->ckpt_dst + s] = -1;
    for (int j = 0; j < mb; j++) st[l->btab + s * mb + j] = 0;
    st[l->pos + s] = 0;
    st[l->slot_map + s] = -1;
    st[l->src + s] = base;
    st[l->srows + s] = s;
    memset(sp, 0, sizeof *sp);
    sp->top_p = 1;
    sp->repetition_penalty = 1;
    sp->row_base = base;
    sp->num_prompt = sp->num_tokens = 1;
    sp->num_logprobs = -1;
}

// The rows of q's entry (batch rows [t0, t0 + n), positions from ctx) whose
// logits give prompt log-probs: position p's are about prompt token p + 1.
static void plp_rows(struct runner *r, struct step_slot *sl, const struct request *q, int t0, int ctx, int n) {
    if (q->sp.prompt_logprobs < 0 || q->plp_sent) return;
    int32_t *rows = sl->staging + r->lay.plp;
    for (int i = 0; i < n && ctx + i + 1 < q->num_prompt; i++, sl->num_plp++) {
        rows[sl->num_plp] = t0 + i;
        sl->plp_tgt[sl->num_plp] = q->tokens[ctx + i + 1];
        sl->plp_req[sl->num_plp] = (struct request *)q;
        sl->plp_pos[sl->num_plp] = ctx + i + 1;
    }
    sl->plp_k = MAX(sl->plp_k, MIN(q->sp.prompt_logprobs, r->rk[0].dev_out.max_top));
}

// Whether a step computes prompt rows of a request asking for their log-probs.
static int any_plp(const struct sched_output *so) {
    for (int i = 0; i < so->num_entries; i++) {
        const struct request *q = so->entries[i].req;
        if (q->sp.prompt_logprobs >= 0 && !q->plp_sent && q->num_computed + 1 < q->num_prompt) return 1;
    }
    return 0;
}

// The state slot of checkpoint id: after the live slots and the pad slot.
static int ckpt_slot(const struct runner *r, int id) { return r->cfg.num_slots + 1 + id; }

// Fills the host image of the metadata in sl->staging and points b at the
// device copy. pad > 0: a pure-decode batch padded to `pad` rows for a graph.
static void build_batch(struct runner *r, const struct sched_output *so, struct step_slot *sl, int pad,
                        struct batch *b) {
    const struct meta_layout *l = &r->lay;
    int32_t *st = sl->staging, n = so->num_entries, nd = 0, k = 0;
    for (int i = 0; i < n; i++) // decode rows first, then prefills, each in scheduling order
        if (so->entries[i].is_decode) r->order[k++] = i;
    nd = k;
    for (int i = 0; i < n; i++)
        if (!so->entries[i].is_decode) r->order[k++] = i;
    int mb = 1;
    for (int i = 0; i < n; i++) mb = MAX(mb, so->entries[i].req->num_blocks);
    if (pad) mb = r->max_blocks; // a recorded graph keeps one stride
    memset(b, 0, sizeof *b);
    b->num_seqs = pad ? pad : n;
    b->num_decodes = pad ? pad : nd;
    b->num_prefills = n - nd;
    b->max_blocks_per_seq = mb;
    b->fixed_shapes = pad > 0;
    b->max_model_len = r->cfg.max_model_len;
    int t = 0, ns = 0, nc = 0, bs = r->cfg.block_size, has_kv = r->cfg.num_blocks > 0;
    struct sample_params *sp = (struct sample_params *)(st + l->sparams);
    sl->num_plp = sl->plp_k = 0;
    for (int s = 0; s < n; s++) {
        const struct sched_entry *e = &so->entries[r->order[s]];
        const struct request *q = e->req;
        int ctx = q->num_computed;
        st[l->qsl + s] = t;
        st[l->ctx + s] = ctx;
        st[l->seq_lens + s] = ctx + e->num_tokens;
        st[l->state + s] = q->slot < 0 ? 0 : q->slot;
        // initial state: zeros, this request's slot, or a checkpoint it hit
        st[l->state_src + s] = e->restore >= 0 ? ckpt_slot(r, e->restore) : ctx > 0 ? st[l->state + s] : -1;
        st[l->ckpt_start + s] = nc;
        // a decode's checkpoint (at most one: after its token) goes to ckpt_dst, a prefill's to the lists
        st[l->ckpt_dst + s] = e->is_decode && e->num_ckpt ? ckpt_slot(r, so->ckpt_id[e->ckpt0]) : -1;
        for (int k = e->ckpt0; !e->is_decode && k < e->ckpt0 + e->num_ckpt; k++, nc++) {
            st[l->ckpt_pos + nc] = so->ckpt_pos[k];
            st[l->ckpt_slot + nc] = ckpt_slot(r, so->ckpt_id[k]);
        }
        for (int j = 0; j < mb; j++) st[l->btab + s * mb + j] = j < q->num_blocks ? q->blocks[j] : 0;
        for (int i = 0; i < e->num_tokens; i++, t++) {
            int pos = ctx + i;
            st[l->pos + t] = pos;
            st[l->slot_map + t] = has_kv ? q->blocks[pos / bs] * bs + pos % bs : -1;
            st[l->src + t] = q->row * r->cfg.max_model_len + pos;
            if (r->hook) r->hook_req[t] = (struct request *)q, r->hook_pos[t] = pos;
        }
        if (r->plp_ready) plp_rows(r, sl, q, t - e->num_tokens, ctx, e->num_tokens);
        b->max_query_len = MAX(b->max_query_len, e->num_tokens);
        b->max_seq_len = MAX(b->max_seq_len, ctx + e->num_tokens);
        if (ctx + e->num_tokens == q->num_tokens) { // the whole sequence is in: sample its next token
            st[l->srows + ns] = t - 1;
            fill_sample_params(r, q, &sp[ns]);
            sl->reqs[ns] = (struct request *)q;
            sl->pos[ns++] = q->num_tokens;
        }
    }
    sl->num = ns;
    if (sl->num_plp) memcpy(st + l->plp + sl->num_plp, sl->plp_tgt, sizeof(int32_t) * sl->num_plp); // targets after the rows
    for (int s = n; s < pad; s++, t++, ns++) pad_row(r, st, l, s, mb, &sp[s]);
    for (int s = n; s <= b->num_seqs; s++) st[l->ckpt_start + s] = nc;
    st[l->qsl + b->num_seqs] = t;
    b->num_tokens = t;
    b->num_sample = ns;
    b->h_query_start_loc = st + l->qsl;
    b->h_seq_lens = st + l->seq_lens;
    b->h_context_lens = st + l->ctx;
    b->h_state_slots = st + l->state;
    b->h_state_src = st + l->state_src;
    b->h_sample_params = sp;
}

// Points b's device arrays at rank k's copy of the metadata.
static void point_batch(const struct runner *r, const struct rank *k, struct batch *b) {
    const struct meta_layout *l = &r->lay;
    int32_t *d = k->meta;
    b->query_start_loc = d + l->qsl;
    b->seq_lens = d + l->seq_lens;
    b->context_lens = d + l->ctx;
    b->positions = d + l->pos;
    b->slot_mapping = d + l->slot_map;
    b->block_tables = d + l->btab;
    b->state_slots = d + l->state;
    b->state_src = d + l->state_src;
    b->ckpt_start = d + l->ckpt_start;
    b->ckpt_pos = d + l->ckpt_pos;
    b->ckpt_slot = d + l->ckpt_slot;
    b->ckpt_dst = d + l->ckpt_dst;
    b->token_src = d + l->src;
    b->sample_rows = d + l->srows;
    b->sample_params = (struct sample_params *)(d + l->sparams);
    b->input_ids = k->input_ids;
}

static void diag_batch(struct runner *r, const struct sched_output *so, const struct batch *b, int graph) {
    diag_printf("step %llu: %d tokens, %d decodes, %d prefills, %d sampled%s\n", (unsigned long long)r->steps,
                b->num_tokens, b->num_decodes, b->num_prefills, b->num_sample, graph ? " (graph)" : "");
    for (int s = 0; s < so->num_entries; s++) {
        const struct request *q = so->entries[r->order[s]].req;
        diag_printf("  seq %d req %llu %s slot %d state_src %d tokens [%d, %d)\n", s, (unsigned long long)q->id,
                    s < b->num_decodes ? "decode" : "prefill", b->h_state_slots[s], b->h_state_src[s],
                    b->h_context_lens[s], b->h_seq_lens[s]);
    }
}

// The hook sees rank 0's logits (every rank holds the same all-gathered ones).
static void run_hook(struct runner *r, struct rank *k, const struct batch *b) {
    int T = b->num_tokens, V = r->vocab;
    k->be->ops->download(k->be, r->hook_logits, k->logits_all, sizeof(float) * (size_t)T * V);
    r->hook(r->hook_user, T, V, r->hook_logits, r->hook_req, r->hook_pos);
}

// gather input ids, forward, sample (not in a masked step: runner_sample):
// the part of a step a graph records. With the hook or prompt log-probs the
// forward makes every row's logits; the sampled rows are gathered from them,
// and rank 0 takes the prompt rows' log-probs from the raw logits.
static void run_step(struct runner *r, struct rank *k, const struct batch *b) {
    const struct backend_ops *op = k->be->ops;
    const struct step_slot *sl = r->job.sl;
    int all = r->hook || sl->num_plp, rank0 = k == &r->rk[0];
    op->gather_ids(k->be, b->input_ids, k->table, b->token_src, b->num_tokens);
    k->model->ops->forward(k->model, b, &k->caches, all ? k->logits_all : k->logits, all);
    if (r->hook && rank0) run_hook(r, k, b);
    if (all) op->gather_rows(k->be, k->logits, k->logits_all, b->sample_rows, b->num_sample, r->vocab);
    if (sl->num_plp && rank0) {
        const int32_t *d = k->meta + r->lay.plp; // rows, then targets
        op->token_logprobs(k->be, k->logits_all, r->vocab, d, d + sl->num_plp, sl->num_plp, sl->plp_k, k->plp_lp,
                           k->plp_rank, k->plp_top_ids, k->plp_top_lp);
    }
    if (b->num_sample && !sl->masked) op->sample(k->be, k->logits, r->vocab, k->table, b, &k->dev_out);
}

// Rank 0 queues the copies of the sampled ids (and log-probs) back.
static void queue_readback(struct rank *k, struct step_slot *sl, int ns) {
    struct backend *be = k->be;
    const struct backend_ops *op = be->ops;
    int mt = k->dev_out.max_top;
    if (ns) op->download_async(be, sl->ids, k->dev_out.ids, sizeof(int32_t) * ns);
    if (sl->any_logprobs) {
        op->download_async(be, sl->lp, k->dev_out.logprobs, sizeof(float) * ns);
        op->download_async(be, sl->top_ids, k->dev_out.top_ids, sizeof(int32_t) * ns * mt);
        op->download_async(be, sl->top_lp, k->dev_out.top_logprobs, sizeof(float) * ns * mt);
    }
    if (sl->num_plp) {
        size_t n = (size_t)sl->num_plp, nk = n * sl->plp_k;
        op->download_async(be, sl->plp_lp, k->plp_lp, sizeof(float) * n);
        op->download_async(be, sl->plp_rank, k->plp_rank, sizeof(int32_t) * n);
        if (nk) op->download_async(be, sl->plp_top_ids, k->plp_top_ids, sizeof(int32_t) * nk);
        if (nk) op->download_async(be, sl->plp_top_lp, k->plp_top_lp, sizeof(float) * nk);
    }
    sl->fence = op->fence(be);
}

// The padded batch size a pure-decode step replays a graph of, or 0.
static int graph_size(const struct runner *r, const struct sched_output *so) {
    const struct backend_ops *op = r->rk[0].be->ops;
    if (!r->cfg.use_graphs || !op->graph_begin || r->hook || diag_on("1") || diag_on("time")) return 0;
    for (int i = 0; i < so->num_entries; i++)
        if (!so->entries[i].is_decode) return 0;
    // padded rows must fit the step buffers: tokens, sequences, logit rows
    int n = so->num_entries, cap = MIN(MAX_GRAPH_BATCH, MIN(r->cfg.max_num_batched_tokens, r->cfg.max_num_seqs));
    if (n > cap) return 0;
    // sizes 1, 2, 4, then multiples of 8 (as vLLM captures): a step pads at
    // most 7 rows, where powers of two padded 129 sequences to 256
    int p = 1;
    while (p < n && p < 8) p *= 2;
    if (p < n) p = CDIV(n, 8) * 8;
    return MIN(p, cap);
}

// Rank k's part of a launch (on its own thread): the rows of admitted
// requests and the step's metadata up to its device, then the step, eagerly
// or through its graph. Rank 0 also queues the copies of the sampled ids back.
static void launch_rank(void *ctx, int rank) {
    struct runner *r = ctx;
    const struct launch *j = &r->job;
    struct step_slot *sl = j->sl;
    struct rank *k = &r->rk[rank];
    struct backend *be = k->be;
    const struct backend_ops *op = be->ops;
    backend_bind(be);
    for (int i = 0; i < sl->num_admitted; i++) {
        const struct request *q = sl->admitted[i];
        op->upload(be, k->table + (int64_t)q->row * r->cfg.max_model_len, q->tokens, sizeof(int32_t) * q->num_tokens);
    }
    op->upload(be, k->meta, sl->staging, j->meta_bytes); // the step's metadata, one copy
    if (!rank && sl->num_plp)
        op->upload(be, k->meta + r->lay.plp, sl->staging + r->lay.plp, sizeof(int32_t) * 2 * (size_t)sl->num_plp);
    struct batch b = j->b;
    point_batch(r, k, &b);
    if (j->replay) op->graph_launch(be, k->graphs[j->gi]);
    else if (j->record) {
        op->graph_begin(be);
        run_step(r, k, &b);
        k->graphs[j->gi] = op->graph_end(be);
        op->graph_launch(be, k->graphs[j->gi]);
    } else {
        run_step(r, k, &b);
    }
    if (!rank && !sl->masked) queue_readback(k, sl, b.num_sample);
}

// Rank k's part of runner_sample: the masks up, then mask_logits and sample
// behind the forward already queued.
static void sample_rank(void *ctx, int rank) {
    struct runner *r = ctx;
    const struct launch *j = &r->job;
    struct step_slot *sl = j->sl;
    struct rank *k = &r->rk[rank];
    struct backend *be = k->be;
    const struct backend_ops *op = be->ops;
    backend_bind(be);
    struct batch b = j->b;
    point_batch(r, k, &b);
    op->upload(be, k->mask, sl->mask, sizeof(uint32_t) * (size_t)b.num_sample * r->mask_words);
    op->mask_logits(be, k->logits, b.num_sample, r->vocab, k->mask);
    if (sl->num_bias) {
        op->upload(be, k->bias_idx, sl->bias_idx, sizeof(int64_t) * sl->num_bias);
        op->upload(be, k->bias_val, sl->bias_val, sizeof(float) * sl->num_bias);
        op->bias_logits(be, k->logits, sl->num_bias, k->bias_idx, k->bias_val);
    }
    op->sample(be, k->logits, r->vocab, k->table, &b, &k->dev_out);
    if (!rank) queue_readback(k, sl, b.num_sample);
}


// Whether a row this step samples has a constraint (a request samples when
// the step computes its last known token).
static int any_constrained(const struct sched_output *so) {
    for (int i = 0; i < so->num_entries; i++) {
        const struct request *q = so->entries[i].req;
        if ((q->has_cons || q->sp.num_logit_bias) && q->num_computed + so->entries[i].num_tokens == q->num_tokens)
            return 1;
    }
    return 0;
}

// The masks of the sampled rows, on the host: the constraint's for a
// constrained request, every id for the others.
// rows: the batch's sampled rows, graph padding included (padding rows
// allow every id: their samples go nowhere).
static void fill_masks(struct runner *r, struct step_slot *sl, int rows) {
    size_t W = (size_t)r->mask_words;
    for (int i = 0; i < rows; i++) {
        uint32_t *row = sl->mask + i * W;
        const struct request *q = i < sl->num ? sl->reqs[i] : NULL;
        int c = q && q->has_cons;
        memset(row, c ? 0 : 0xff, sizeof(uint32_t) * W);
        if (c) q->cons.fill_mask(q->cons.user, row, (int)W);
    }
}

// The logit_bias entries of the sampled rows (distinct ids per request,
// vllm_submit checked), as flat indices into the step's logits.
static void fill_bias(struct runner *r, struct step_slot *sl) {
    sl->num_bias = 0;
    for (int i = 0; i < sl->num; i++) {
        const struct request *q = sl->reqs[i];
        for (int j = 0; j < q->sp.num_logit_bias; j++, sl->num_bias++) {
            sl->bias_idx[sl->num_bias] = (int64_t)i * r->vocab + q->sp.logit_bias_ids[j];
            sl->bias_val[sl->num_bias] = q->sp.logit_bias_values[j];
        }
    }
}

int runner_needs_sample(const struct runner *r, int step) { return r->slots[step].masked; }

void runner_sample(struct runner *r, int step) {
    struct step_slot *sl = &r->slots[step];
    if (!sl->masked || r->job.sl != sl) return; // the last launch only: its batch is r->job's
    fill_masks(r, sl, r->job.b.num_sample);
    fill_bias(r, sl);
    team_run(r->team, sample_rank, r);
    backend_bind(r->rk[0].be);
}

int runner_launch(struct runner *r, const struct sched_output *so, int *step) {
    r->plp_failed = any_plp(so) && runner_plp_alloc(r) != VLLM_OK; // the others' step runs all the same
    int s = r->next_slot;
    r->next_slot = (s + 1) % RUNNER_INFLIGHT;
    struct step_slot *sl = &r->slots[s];
    sl->num_admitted = 0;
    for (int i = 0; i < so->num_entries; i++) { // a request given its row this step: upload all its tokens there
        const struct sched_entry *e = &so->entries[i];
        if (e->req->row < 0 || e->req->row >= r->cfg.max_num_seqs)
            return vllm_err(VLLM_ERR_INTERNAL, "request %llu has no token-table row", (unsigned long long)e->req->id);
        if (e->new_row) sl->admitted[sl->num_admitted++] = e->req;
        sl->sched[i] = e->req;
    }
    sl->num_sched = so->num_entries;
    sl->masked = any_constrained(so);
    int pad = graph_size(r, so);
    for (int k = 0; pad && k < r->tp; k++)
        if (r->rk[k].graph_epoch != r->rk[k].be->graph_epoch) free_graphs(r); // recorded buffers moved
    struct launch *j = &r->job;
    j->sl = sl;
    j->pad = pad;
    j->gi = pad + (sl->masked ? MAX_GRAPH_BATCH + 1 : 0);
    j->replay = pad && r->rk[0].graphs[j->gi];
    j->record = pad && !j->replay && r->seen[j->gi]; // second time at this size: record, then replay
    build_batch(r, so, sl, pad, &j->b);
    j->meta_bytes = sizeof(int32_t) * (r->lay.sparams + (size_t)j->b.num_sample * (sizeof(struct sample_params) / 4));
    sl->any_logprobs = 0;
    for (int i = 0; i < sl->num; i++) sl->any_logprobs |= j->b.h_sample_params[i].num_logprobs >= 0;
    if (diag_on("1")) diag_batch(r, so, &j->b, pad > 0);
    team_run(r->team, launch_rank, r);
    if (pad && !j->replay) r->seen[j->gi] = 1;
    r->num_graphs += j->record;
    r->steps++;
    *step = s;
    return VLLM_OK;
}

void runner_wait(struct runner *r, int step, struct step_out *out) {
    struct step_slot *sl = &r->slots[step];
    r->rk[0].be->ops->fence_wait(r->rk[0].be, sl->fence);
    out->num = sl->num;
    out->reqs = sl->reqs;
    out->pos = sl->pos;
    out->ids = sl->ids;
    out->logprobs = sl->lp;
    out->top_ids = sl->top_ids;
    out->top_logprobs = sl->top_lp;
    out->max_top = r->rk[0].dev_out.max_top;
    out->any_logprobs = sl->any_logprobs;
    out->scheduled = sl->sched;
    out->num_scheduled = sl->num_sched;
    out->num_plp = sl->num_plp;
    out->plp_reqs = sl->plp_req;
    out->plp_pos = sl->plp_pos;
    out->plp_lp = sl->plp_lp;
    out->plp_rank = sl->plp_rank;
    out->plp_top_ids = sl->plp_top_ids;
    out->plp_top_lp = sl->plp_top_lp;
    out->plp_k = sl->plp_k;
}
