// layers.c - the layer library: a model as a stack of blocks, its
// workspace, the embedding / final norm / lm_head, tensor-parallel loading
// and the forward of one step (layers.h). Mixers are in layers_mixers.c.
#include <math.h>

#include "core/common.h"
#include "models/layers.h"

static struct lm *lm_create(struct backend *be, const struct model_load_opts *o, const struct model_ops *ops) {
    struct lm *m = xcalloc(1, sizeof *m);
    m->base.ops = ops;
    m->be = be;
    m->tp = be->tp_size;
    m->rank = be->tp_rank;
    m->max_tokens = o->max_tokens;
    m->max_rows = o->max_logit_rows;
    m->max_seq_len = o->max_seq_len;
    m->tdiag = diag_on("time");
    m->diag_state = diag_on("1");
    return m;
}

struct block *lm_add_block(struct lm *m, enum blk_kind kind) {
    xgrow((void **)&m->blocks, &m->blocks_cap, m->num_blocks + 1, sizeof *m->blocks);
    struct block *b = &m->blocks[m->num_blocks++];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->cache = -1;
    switch (kind) {
    case BLK_ATTN:
    case BLK_MAMBA2:
    case BLK_KDA:
    case BLK_MLA: b->cache = m->num_caches++; break;
    case BLK_MLP:
    case BLK_MOE: break;
    }
    return b;
}

struct span lm_part(const struct lm *m, int64_t n) { return span_part(n, m->tp, m->rank); }

int lm_require(struct lm *m, struct op_query q, const char *what) {
    q.max_tokens = m->max_tokens;
    q.max_seq_len = m->max_seq_len;
    q.max_seqs = m->max_rows;
    int rc = m->be->ops->supports(m->be, &q);
    return rc ? vllm_err_prefix(rc, "%s", what) : VLLM_OK;
}

// ---------------------------------------------------------------- timers --

static const char *const t_names[T_N] = {"embed", "norms", "mamba in_proj", "mamba conv+ssd+gnorm", "mamba out_proj",
                                         "attn qkv", "attn core", "attn o_proj", "mlp", "moe router+latent",
                                         "moe experts+shared", "norm_f+lm_head", "tp all-reduce"};

void lm_tick(struct lm *m, int k) {
    if (!m->tdiag) return;
    m->be->ops->sync(m->be);
    double t = now_s();
    if (k >= 0) m->tsum[m->tkind][k] += t - m->tlast;
    m->tlast = t;
}

static void tick_report(struct lm *m, int T) {
    int pk = m->tkind;
    double *sum = m->tsum[pk];
    if (!m->tdiag || ++m->tsteps[pk] % 20) return;
    double tot = 0;
    for (int k = 0; k < T_N; k++) tot += sum[k];
    if (!m->rank) { // one report, rank 0's
        diag_printf("time over 20 %s steps (last had %d tokens): %.3f ms per step\n", pk ? "prefill" : "decode", T,
                    1e3 * tot / 20);
        for (int k = 0; k < T_N; k++)
            if (sum[k] > 0) diag_printf("  %-22s %8.3f ms %5.1f%%\n", t_names[k], 1e3 * sum[k] / 20, 100 * sum[k] / tot);
    }
    memset(sum, 0, sizeof m->tsum[pk]);
}

void lm_all_reduce(struct lm *m, float *x, int64_t n) {
    if (m->tp == 1) return;
    m->be->ops->all_reduce(m->be, x, n);
    lm_tick(m, T_COMM);
}

// ------------------------------------------------ embedding, norms, head --

int lm_load_norm(struct lm *m, struct loader *l, const char *name, float **w) {
    return loader_vector(l, name, m->hidden, (struct span){0, m->hidden}, w, DUMMY_CONST, 1.0f);
}

// lm_head: vocabulary rows [r*Vp, r*Vp + Vp) of this rank, cut at vocab and
// padded back to Vp with zero rows.
int lm_load_embed_head(struct lm *m, struct loader *l, const char *embed, const char *head, int tie) {
    int64_t V = m->vocab, D = m->hidden, Vp = CDIV(V, m->tp), lo = MIN((int64_t)m->rank * Vp, V);
    m->vocab_part = (int)Vp;
    struct span all = {0, V}, vs = {lo, MIN(Vp, V - lo)};
    TRY(loader_matrix(l, embed, V, D, all, 0, 0, WL_EMBED, &m->embed));
    TRY(lm_require(m, (struct op_query){.op = OP_EMBED, .w = &m->embed}, "the embedding"));
    struct wpiece p = {head, 2, {V, D}, vs};
    if (loader_has(l, head)) TRY(loader_weight(l, &p, 1, 0, 0, Vp - vs.len, WL_NOQUANT, &m->lm_head));
    else if (tie && m->tp == 1) m->lm_head = m->embed;
    else if (tie) {
        p.name = embed;
        TRY(loader_weight(l, &p, 1, 0, 0, Vp - vs.len, WL_EMBED, &m->lm_head));
    } else return vllm_err(VLLM_ERR_FORMAT, "checkpoint has no tensor %s and tie_word_embeddings is false", head);
    TRY(lm_require(m, (struct op_query){.op = OP_MATMUL, .w = &m->lm_head}, "lm_head"));
    return lm_require(m, (struct op_query){.op = OP_SAMPLE, .vocab = (int)V}, "the sampler"); // its logits' rows
}

// --------------------------------------------------------------- the spec --

static void fill_cache_spec(const struct lm *m, const struct block *b, struct layer_cache_spec *s) {
    switch (b->kind) {
    case BLK_ATTN:
        s->k_per_token = s->v_per_token = (int64_t)b->a.d.kv_heads * b->a.d.head_dim;
        break;
    case BLK_MAMBA2: {
        const struct mamba_dims *d = &b->m.d;
        s->num_states = 2;
        s->states[0].name = "conv";
        s->states[0].floats = (int64_t)(d->conv_kernel - 1) * d->conv_dim;
        s->states[1].name = "ssm";
        s->states[1].floats = (int64_t)d->heads * d->head_dim * d->state;
        s->state_align = d->chunk_size;
        break;
    }
    case BLK_KDA:
    case BLK_MLA: kimi_cache_spec(b, s); break;
    case BLK_MLP:
    case BLK_MOE: break;
    }
    (void)m;
}

// The workspace's widths: the widest use of each buffer over the blocks.
static void plan_ws(struct lm *m) {
    struct lm_ws *w = &m->ws;
    w->mid = m->hidden; // y also takes the shared expert's [T, D] output
    for (int i = 0; i < m->num_blocks; i++) {
        const struct block *b = &m->blocks[i];
        switch (b->kind) {
        case BLK_ATTN:
            w->wide = MAX(w->wide, b->a.qkv.rows);
            w->mid = MAX(w->mid, (int64_t)b->a.d.heads * b->a.d.head_dim);
            break;
        case BLK_MLP:
            w->wide = MAX(w->wide, b->f.up.rows);
            if (b->f.gated) w->hidw = MAX(w->hidw, b->f.inter);
            break;
        case BLK_MOE:
            w->experts = MAX(w->experts, b->e.route.num_experts);
            w->topk = MAX(w->topk, b->e.route.top_k);
            w->latent = MAX(w->latent, b->e.latent);
            if (b->e.has_shared) {
                w->wide = MAX(w->wide, b->e.shared.up.rows);
                if (b->e.shared.gated) w->hidw = MAX(w->hidw, b->e.shared.inter);
            }
            break;
        case BLK_MAMBA2:
            w->wide = MAX(w->wide, b->m.proj_dim);
            w->mid = MAX(w->mid, (int64_t)b->m.d.heads * b->m.d.head_dim);
            break;
        case BLK_KDA:
        case BLK_MLA: kimi_plan_ws(b, w); break;
        }
    }
}

// One device allocation for every activation buffer of a step.
static int alloc_ws(struct lm *m) {
    struct lm_ws *w = &m->ws;
    int64_t T = m->max_tokens, D = m->hidden, R = m->max_rows, lg = m->tp > 1 ? R * m->vocab_part : 0;
    int64_t sizes[] = {T * D, T * D, T * D, T * w->wide, T * w->mid, T * w->mid, T * w->hidw, T * w->experts,
                       T * w->topk, T * w->topk, T * w->latent, T * w->latent, R * D, lg};
    float **dst[] = {&w->res, &w->x, &w->mix, &w->proj, &w->y, &w->yn, &w->hid, &w->rlogits, &w->rw,
                     (float **)&w->rids, &w->xl, &w->eo, &w->sel, &w->lg};
    int64_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += (sizes[i] + 63) & ~63LL; // 256-byte aligned
    if (total <= 0 || total > ((int64_t)1 << 40))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "the step workspace (%lld floats) is out of range", (long long)total);
    w->base = m->be->ops->alloc(m->be, sizeof(float) * total);
    if (!w->base)
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate the %lld-byte step workspace", (long long)(4 * total));
    float *p = w->base;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *dst[i] = p;
        p += (sizes[i] + 63) & ~63LL;
    }
    return VLLM_OK;
}

static int64_t wbytes(const struct weight *w) { return w->data ? wfmt_weight_bytes(w->fmt, w->rows, w->cols) : 0; }

// The roofline's inputs (struct model_cost), this rank's shards.
static void fill_cost(struct lm *m) {
    struct model_cost *c = &m->base.spec.cost;
    memset(c, 0, sizeof *c);
    int64_t dense = wbytes(&m->lm_head) + (int64_t)m->hidden * 4; // one embedding row
    double flops = 2.0 * m->lm_head.rows * m->lm_head.cols;
    for (int i = 0; i < m->num_blocks; i++) {
        const struct block *b = &m->blocks[i];
        const struct weight *ws[4] = {NULL, NULL, NULL, NULL};
        switch (b->kind) {
        case BLK_ATTN:
            ws[0] = &b->a.qkv, ws[1] = &b->a.o;
            c->attn_flops_per_ctx += 4.0 * b->a.d.heads * b->a.d.head_dim;
            c->kv_elems_per_token += 2LL * b->a.d.kv_heads * b->a.d.head_dim;
            break;
        case BLK_MLP: ws[0] = &b->f.up, ws[1] = &b->f.down; break;
        case BLK_MAMBA2: {
            const struct mamba_dims *d = &b->m.d;
            ws[0] = &b->m.in_proj, ws[1] = &b->m.out_proj;
            c->state_bytes_per_seq += 4LL * ((int64_t)(d->conv_kernel - 1) * d->conv_dim + (int64_t)d->heads * d->head_dim * d->state);
            break;
        }
        case BLK_MOE: {
            const struct moe_layer *e = &b->e;
            ws[0] = &e->gate, ws[1] = &e->shared.up, ws[2] = &e->shared.down, ws[3] = e->latent ? &e->fc1 : NULL;
            if (e->latent) dense += wbytes(&e->fc2), flops += 2.0 * e->fc2.rows * e->fc2.cols;
            int64_t eb = (wbytes(&e->experts.up) + wbytes(&e->experts.down)) / e->experts.num_experts;
            c->expert_bytes = MAX(c->expert_bytes, eb);
            c->expert_flops = MAX(c->expert_flops, 2.0 * (e->experts.up.rows * e->experts.up.cols + e->experts.down.rows *
                                                          e->experts.down.cols) / e->experts.num_experts);
            c->moe_layers++;
            c->experts = e->route.num_experts, c->top_k = e->route.top_k;
            break;
        }
        case BLK_KDA:
        case BLK_MLA: kimi_cost(b, c, &dense, &flops); break;
        }
        for (int k = 0; k < 4; k++)
            if (ws[k] && ws[k]->data) dense += wbytes(ws[k]), flops += 2.0 * ws[k]->rows * ws[k]->cols;
    }
    c->dense_bytes = dense;
    c->dense_flops = flops;
}

static int lm_finish(struct lm *m, const char *arch, int max_position, const int32_t *eos, int num_eos, int64_t weight_bytes) {
    struct model_spec *s = &m->base.spec;
    s->arch = arch;
    s->vocab_size = m->vocab;
    s->hidden_size = m->hidden;
    s->max_position_embeddings = max_position;
    s->num_eos = MIN(num_eos, 8);
    for (int i = 0; i < s->num_eos; i++) s->eos_ids[i] = eos[i];
    s->weight_bytes = weight_bytes;
    s->num_layers = m->num_caches;
    s->layers = xcalloc(MAX(m->num_caches, 1), sizeof *s->layers);
    for (int i = 0; i < m->num_blocks; i++)
        if (m->blocks[i].cache >= 0) fill_cache_spec(m, &m->blocks[i], &s->layers[m->blocks[i].cache]);
    fill_cost(m);
    plan_ws(m);
    return alloc_ws(m);
}

int lm_load(struct backend *be, const char *dir, const struct model_load_opts *o, const struct lm_spec *s,
            struct model **out) {
    struct lm *m = lm_create(be, o, s->ops);
    m->family = s->config;
    m->family_free = s->config_free;
    m->hidden = s->hidden;
    m->vocab = s->vocab;
    m->eps = s->eps;
    m->rope = s->rope;
    if (!m->max_seq_len) m->max_seq_len = s->max_position ? s->max_position : 4096;
    struct loader l;
    int rc = loader_open_opts(&l, dir, o, be);
    l.keep_fp32 = s->keep_fp32;
    if (!rc) rc = s->load_weights(m, &l, s->arg);
    int64_t bytes = l.device_bytes;
    loader_close(&l);
    if (!rc) rc = lm_finish(m, s->arch, s->max_position, s->eos, s->num_eos, bytes);
    if (rc) {
        lm_free(&m->base);
        return rc;
    }
    *out = &m->base;
    return VLLM_OK;
}

// ------------------------------------------------------------------ free --

static void free_weight(struct backend *be, struct weight *w) {
    if (w->data) be->ops->free(be, w->data);
    if (w->bias) be->ops->free(be, w->bias);
    if (w->scale) be->ops->free(be, w->scale);
    if (w->bscale) be->ops->free(be, w->bscale);
    w->data = NULL;
    w->bias = NULL;
    w->scale = NULL;
    w->bscale = NULL;
}

static void free_block(struct backend *be, struct block *b) {
    be->ops->free(be, b->norm_w);
    switch (b->kind) {
    case BLK_ATTN:
        free_weight(be, &b->a.qkv);
        free_weight(be, &b->a.o);
        be->ops->free(be, b->a.q_norm);
        be->ops->free(be, b->a.k_norm);
        break;
    case BLK_MLP:
        free_weight(be, &b->f.up);
        free_weight(be, &b->f.down);
        break;
    case BLK_MOE: {
        struct moe_layer *e = &b->e;
        struct weight *ws[] = {&e->gate, &e->experts.up, &e->experts.down, &e->shared.up, &e->shared.down,
                               &e->fc1, &e->fc2};
        for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) free_weight(be, ws[k]);
        be->ops->free(be, e->bias);
        break;
    }
    case BLK_MAMBA2: {
        struct mamba2_layer *w = &b->m;
        free_weight(be, &w->in_proj);
        free_weight(be, &w->out_proj);
        float *v[] = {w->conv_w, w->conv_b, w->dt_bias, w->A, w->D, w->norm_w};
        for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) be->ops->free(be, v[k]);
        break;
    }
    case BLK_KDA:
    case BLK_MLA: kimi_free_block(be, b); break;
    }
}

void lm_free(struct model *base) {
    struct lm *m = (struct lm *)base;
    if (!m) return;
    struct backend *be = m->be;
    for (int i = 0; i < m->num_blocks; i++) free_block(be, &m->blocks[i]);
    if (m->lm_head.data != m->embed.data) free_weight(be, &m->lm_head);
    free_weight(be, &m->embed);
    be->ops->free(be, m->norm_f);
    be->ops->free(be, m->rope.table);
    be->ops->free(be, m->ws.base);
    free(m->blocks);
    free(m->base.spec.layers);
    if (m->family_free) m->family_free(m->family);
    free(m);
}

// --------------------------------------------------------------- forward --

// logits: [rows, vocab] = h: [rows, D] @ lm_head^T. Split: each rank's
// vocabulary part into ws.lg, all-gathered, max_rows rows at a time.
static void lm_head(struct lm *m, float *logits, const float *h, int rows) {
    const struct backend_ops *op = m->be->ops;
    int V = m->vocab, D = m->hidden;
    if (m->tp == 1) {
        op->matmul(m->be, logits, h, &m->lm_head, rows);
        lm_tick(m, T_HEAD);
        return;
    }
    for (int i = 0; i < rows; i += m->max_rows) {
        int n = MIN(m->max_rows, rows - i);
        op->matmul(m->be, m->ws.lg, h + (int64_t)i * D, &m->lm_head, n);
        lm_tick(m, T_HEAD);
        op->all_gather(m->be, logits + (int64_t)i * V, V, m->ws.lg, m->vocab_part, n);
        lm_tick(m, T_COMM);
    }
}

static void block_fwd(struct lm *m, const struct block *blk, const struct batch *b, struct caches *c) {
    struct lm_ws *ws = &m->ws;
    int T = b->num_tokens;
    switch (blk->kind) {
    case BLK_ATTN: attn_fwd(m, &blk->a, blk->cache, b, c, ws->x, ws->mix); break;
    case BLK_MAMBA2: mamba2_mixer_fwd(m, &blk->m, blk->cache, b, c, ws->x, ws->mix); break;
    case BLK_MLP:
        mlp_fwd(m, &blk->f, ws->x, ws->mix, T);
        lm_tick(m, T_MLP);
        break;
    case BLK_MOE: moe_fwd(m, &blk->e, ws->x, ws->mix, T); break;
    case BLK_KDA: kda_fwd(m, &blk->k, blk->cache, b, c, ws->x, ws->mix); break;
    case BLK_MLA: mla_fwd(m, &blk->l, blk->cache, b, c, ws->x, ws->mix); break;
    }
    lm_all_reduce(m, ws->mix, (int64_t)T * m->hidden);
}

void lm_forward(struct model *base, const struct batch *b, struct caches *c, float *logits, int all_rows) {
    struct lm *m = (struct lm *)base;
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct lm_ws *ws = &m->ws;
    int T = b->num_tokens, D = m->hidden;
    m->tkind = b->num_prefills > 0;
    lm_tick(m, -1);
    op->embed(be, ws->res, &m->embed, b->input_ids, T);
    lm_tick(m, T_EMBED);
    for (int i = 0; i < m->num_blocks; i++) {
        const struct block *blk = &m->blocks[i];
        if (i == 0) op->rmsnorm(be, ws->x, ws->res, blk->norm_w, T, D, m->eps);
        else op->add_rmsnorm(be, ws->res, ws->mix, ws->x, blk->norm_w, T, D, m->eps); // h += previous mixer
        lm_tick(m, T_NORM);
        block_fwd(m, blk, b, c);
    }
    op->add(be, ws->res, ws->mix, (int64_t)T * D);
    int rows = all_rows ? T : b->num_sample;
    if (!rows) return;
    float *h = ws->res; // all rows (a test hook): normalize the residual in place
    if (!all_rows) {
        op->gather_rows(be, ws->sel, ws->res, b->sample_rows, rows, D);
        h = ws->sel;
    }
    op->rmsnorm(be, h, h, m->norm_f, rows, D, m->eps);
    lm_head(m, logits, h, rows);
    tick_report(m, T);
}
