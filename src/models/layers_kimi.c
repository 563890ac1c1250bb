// layers_kimi.c - Kimi-Linear's mixers over the layer library (layers.h):
// Kimi Delta Attention (KDA) and multi-head latent attention (MLA, NoPE).
// Tensor parallelism splits both by heads (kimi_linear.c checks they divide).
#include <math.h>

#include "core/common.h"
#include "models/layers.h"

#define NAME(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

static int require_matmul(struct lm *m, const struct weight *w, const char *what) {
    return lm_require(m, (struct op_query){.op = OP_MATMUL, .w = w}, what);
}

static int64_t wbytes(const struct weight *w) { return w->data ? w->rows * w->cols * (int64_t)wfmt_size(w->fmt) : 0; }

static void free_weight(struct backend *be, struct weight *w) {
    if (w->data) be->ops->free(be, w->data);
    if (w->bias) be->ops->free(be, w->bias);
    w->data = NULL;
    w->bias = NULL;
}

// ------------------------------------------------------------------ KDA --

// Reads channels cs of the three [C, 1, K] conv taps (q, k, v) into one
// [3 * cs.len, K] device array.
static int load_kda_conv(struct loader *l, const char *p, int64_t C, int64_t K, struct span cs, float **dev) {
    static const char *const which[3] = {"q", "k", "v"};
    // all: [C, K] one conv, dst: [3 cs.len, K]; sized by the config before
    // the file's shapes are checked, so they may fail.
    float *all = try_calloc((size_t)(C * K), sizeof(float), "the q/k/v conv1d taps");
    float *dst = all ? try_calloc((size_t)(3 * cs.len * K), sizeof(float), "this rank's q/k/v conv1d taps") : NULL;
    if (!dst) {
        free(all);
        return vllm_err_prefix(VLLM_ERR_OUT_OF_MEMORY, "%sq_conv1d.weight [%lld, 1, %lld]", p, (long long)C, (long long)K);
    }
    char n[256];
    int rc = VLLM_OK;
    for (int i = 0; i < 3 && !rc; i++) {
        rc = loader_read(l, NAME(n, "%s%s_conv1d.weight", p, which[i]), 3, (int64_t[]){C, 1, K}, all, DUMMY_NORMAL,
                         0.2f);
        if (!rc) memcpy(dst + i * cs.len * K, all + cs.off * K, sizeof(float) * (size_t)(cs.len * K));
    }
    if (!rc) rc = loader_upload_vector(l, dst, 3 * cs.len * K, dev);
    free(all);
    free(dst);
    return rc;
}

// A rank's KDA part: heads [r*H/tp, ...) with their q, k, v channels, beta
// rows, gate rows, conv channels, A_log and dt_bias; the gates' low-rank
// inputs (f_a, g_a) are replicated, o_proj split by the same columns.
int kda_load(struct lm *m, struct loader *l, const char *p, const struct kda_cfg *c, struct kda_layer *w) {
    int64_t H = c->heads, K = c->head_dim, HK = H * K, D = m->hidden;
    struct span hs = lm_part(m, H), cs = {hs.off * K, hs.len * K}; // this rank's heads, their channels
    int64_t HKr = cs.len;
    w->d = (struct kda_dims){(int)hs.len, c->head_dim, c->conv_kernel, c->chunk_size};
    // conv1d_fwd reads its channels at column heads*head_dim of a row: 0 here
    w->conv = (struct mamba_dims){.conv_kernel = c->conv_kernel, .chunk_size = c->chunk_size, .conv_dim = (int)(3 * HKr)};
    char nq[256], nk[256], nv[256], nb[256], n[256];
    struct wpiece in[4] = {{NAME(nq, "%sq_proj.weight", p), 2, {HK, D}, cs},
                           {NAME(nk, "%sk_proj.weight", p), 2, {HK, D}, cs},
                           {NAME(nv, "%sv_proj.weight", p), 2, {HK, D}, cs},
                           {NAME(nb, "%sb_proj.weight", p), 2, {H, D}, hs}};
    TRY(loader_weight(l, in, 4, 0, 0, 0, 0, &w->in_proj));
    struct span all_k = {0, K};
    TRY(loader_matrix(l, NAME(n, "%sf_a_proj.weight", p), K, D, all_k, 0, 0, 0, &w->f_a));
    TRY(loader_matrix(l, NAME(n, "%sf_b_proj.weight", p), HK, K, cs, 0, 0, 0, &w->f_b));
    TRY(loader_matrix(l, NAME(n, "%sg_a_proj.weight", p), K, D, all_k, 0, 0, 0, &w->g_a));
    TRY(loader_matrix(l, NAME(n, "%sg_b_proj.weight", p), HK, K, cs, 0, 0, 0, &w->g_b));
    TRY(loader_matrix(l, NAME(n, "%so_proj.weight", p), D, HK, (struct span){0, D}, cs.off, cs.off + cs.len, 0, &w->o));
    TRY(load_kda_conv(l, p, HK, c->conv_kernel, cs, &w->conv_w));
    // A_log is stored [1, 1, H, 1]; size-1 dims are ignored
    TRY(loader_vector(l, NAME(n, "%sA_log", p), H, hs, &w->A_log, DUMMY_ALOG, 0));
    TRY(loader_vector(l, NAME(n, "%sdt_bias", p), HK, cs, &w->dt_bias, DUMMY_CONST, 1.0f));
    TRY(loader_vector(l, NAME(n, "%so_norm.weight", p), K, all_k, &w->norm_w, DUMMY_CONST, 1.0f));
    const struct weight *ws[] = {&w->in_proj, &w->f_a, &w->f_b, &w->g_a, &w->g_b, &w->o};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) TRY(require_matmul(m, ws[i], "KDA projection"));
    return lm_require(m, (struct op_query){.op = OP_KDA, .kda = &w->d}, "Kimi Delta Attention");
}

void kda_fwd(struct lm *m, const struct kda_layer *w, int cache, const struct batch *b, struct caches *c,
             const float *x, float *out) {
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct lm_ws *ws = &m->ws;
    const struct kda_dims *d = &w->d;
    int T = b->num_tokens, HK = d->heads * d->head_dim, ld = (int)w->in_proj.rows, nd = b->num_decodes;
    float *conv = c->state[cache][0], *st = c->state[cache][1];
    float *g = ws->hid, *og = ws->hid + (int64_t)T * HK; // [T, HK] each: log-decays, output gate
    op->matmul(be, ws->proj, x, &w->in_proj, T);         // [T, q | k | v | b]
    op->matmul(be, ws->xl, x, &w->f_a, T);
    op->matmul(be, g, ws->xl, &w->f_b, T);
    op->kda_gate(be, g, w->A_log, w->dt_bias, T, d);
    op->matmul(be, ws->xl, x, &w->g_a, T);
    op->matmul(be, og, ws->xl, &w->g_b, T);
    lm_tick(m, T_M_IN);
    if (nd) {
        op->conv1d_update(be, ws->proj, ld, w->conv_w, NULL, conv, b, &w->conv);
        op->kda_decode(be, ws->y, ws->proj, ld, g, st, b, d);
    }
    if (b->num_prefills) {
        op->conv1d_fwd(be, ws->proj, ld, w->conv_w, NULL, conv, b, nd, b->num_seqs, &w->conv);
        op->kda_prefill(be, ws->y, ws->proj, ld, g, st, b, nd, b->num_seqs, d);
    }
    op->head_norm_gate(be, ws->y, og, w->norm_w, T, d->heads, d->head_dim, m->eps);
    lm_tick(m, T_M_CONV_SSD);
    op->matmul(be, out, ws->y, &w->o, T);
    lm_tick(m, T_M_OUT);
}

// ------------------------------------------------------------------ MLA --

// A rank's MLA part: heads [r*H/tp, ...): their q rows, kv_b rows and
// o_proj columns; the latent (kv_a, its norm, q_a and its norm) is
// replicated, so every rank caches the whole latent.
int mla_load(struct lm *m, struct loader *l, const char *p, const struct mla_cfg *c, struct mla_layer *w) {
    int64_t H = c->heads, N = c->nope, P = c->rope, V = c->v_dim, R = c->rank, Q = c->q_lora, D = m->hidden;
    struct span hs = lm_part(m, H), qs = {hs.off * (N + P), hs.len * (N + P)};
    int64_t qw = H * (N + P);
    w->d = (struct mla_dims){(int)hs.len, c->nope, c->rope, c->v_dim, c->rank, 0, 1.0f / sqrtf((float)(N + P))};
    w->q_lora = c->q_lora;
    w->norm_eps = c->norm_eps;
    char n[256];
    if (Q) {
        TRY(loader_matrix(l, NAME(n, "%sq_a_proj.weight", p), Q, D, (struct span){0, Q}, 0, 0, 0, &w->q_a));
        TRY(loader_vector(l, NAME(n, "%sq_a_layernorm.weight", p), Q, (struct span){0, Q}, &w->q_a_norm, DUMMY_CONST,
                          1.0f));
        TRY(loader_matrix(l, NAME(n, "%sq_b_proj.weight", p), qw, Q, qs, 0, 0, 0, &w->q_b));
        TRY(require_matmul(m, &w->q_a, "MLA q_a_proj"));
        TRY(require_matmul(m, &w->q_b, "MLA q_b_proj"));
    } else {
        TRY(loader_matrix(l, NAME(n, "%sq_proj.weight", p), qw, D, qs, 0, 0, 0, &w->q));
        TRY(require_matmul(m, &w->q, "MLA q_proj"));
    }
    TRY(loader_matrix(l, NAME(n, "%skv_a_proj_with_mqa.weight", p), R + P, D, (struct span){0, R + P}, 0, 0, 0,
                      &w->kv_a));
    TRY(loader_vector(l, NAME(n, "%skv_a_layernorm.weight", p), R, (struct span){0, R}, &w->kv_a_norm, DUMMY_CONST,
                      1.0f));
    int64_t per = (N + V) * R; // one head's kv_b rows
    float *tmp = loader_tmp(l, (size_t)(H * per));
    if (!tmp) return vllm_err_prefix(VLLM_ERR_OUT_OF_MEMORY, "%skv_b_proj.weight", p);
    TRY(loader_read(l, NAME(n, "%skv_b_proj.weight", p), 2, (int64_t[]){H * (N + V), R}, tmp, DUMMY_NORMAL, 0.05f));
    TRY(loader_upload_vector(l, tmp + hs.off * per, hs.len * per, &w->kv_b));
    TRY(loader_matrix(l, NAME(n, "%so_proj.weight", p), D, H * V, (struct span){0, D}, hs.off * V, (hs.off + hs.len) * V,
                      0, &w->o));
    TRY(require_matmul(m, &w->kv_a, "MLA kv_a_proj_with_mqa"));
    TRY(require_matmul(m, &w->o, "MLA o_proj"));
    return lm_require(m, (struct op_query){.op = OP_MLA, .mla = &w->d}, "multi-head latent attention");
}

void mla_fwd(struct lm *m, const struct mla_layer *w, int cache, const struct batch *b, struct caches *c,
             const float *x, float *out) {
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct lm_ws *ws = &m->ws;
    struct mla_dims d = w->d;
    d.block_size = c->block_size;
    int T = b->num_tokens, W = d.rank + d.rope;
    float *lat = ws->hid; // [T, R + P]
    op->matmul(be, lat, x, &w->kv_a, T);
    op->head_rmsnorm(be, lat, W, T, 1, d.rank, w->kv_a_norm, w->norm_eps); // the latent, not the rope part
    if (w->q_lora) {
        op->matmul(be, ws->xl, x, &w->q_a, T);
        op->rmsnorm(be, ws->xl, ws->xl, w->q_a_norm, T, w->q_lora, w->norm_eps);
        op->matmul(be, ws->proj, ws->xl, &w->q_b, T);
    } else {
        op->matmul(be, ws->proj, x, &w->q, T);
    }
    lm_tick(m, T_ATTN_QKV);
    op->mla_kv_write(be, c->k[cache], lat, W, b, &d);
    op->mla_attn(be, ws->y, ws->proj, c->k[cache], w->kv_b, b, 0, b->num_seqs, &d);
    lm_tick(m, T_ATTN);
    op->matmul(be, out, ws->y, &w->o, T);
    lm_tick(m, T_ATTN_O);
}

// ------------------------------------------------- the library's switches --

void kimi_cache_spec(const struct block *b, struct layer_cache_spec *s) {
    switch (b->kind) {
    case BLK_KDA: {
        const struct kda_dims *d = &b->k.d;
        s->num_states = 2;
        s->states[0].name = "conv";
        s->states[0].floats = (int64_t)(d->conv_kernel - 1) * 3 * d->heads * d->head_dim;
        s->states[1].name = "kda";
        s->states[1].floats = (int64_t)d->heads * d->head_dim * d->head_dim;
        s->state_align = d->chunk_size;
        break;
    }
    case BLK_MLA: s->k_per_token = b->l.d.rank + b->l.d.rope; break; // the latent: V is empty
    case BLK_ATTN:
    case BLK_MLP:
    case BLK_MOE:
    case BLK_MAMBA2: break;
    }
}

void kimi_plan_ws(const struct block *b, struct lm_ws *w) {
    switch (b->kind) {
    case BLK_KDA: {
        int64_t HK = (int64_t)b->k.d.heads * b->k.d.head_dim;
        w->wide = MAX(w->wide, b->k.in_proj.rows);
        w->mid = MAX(w->mid, HK);
        w->hidw = MAX(w->hidw, 2 * HK);         // log-decays | output gate
        w->latent = MAX(w->latent, b->k.f_a.rows); // the gates' low-rank inner rows
        break;
    }
    case BLK_MLA: {
        const struct mla_dims *d = &b->l.d;
        w->wide = MAX(w->wide, (int64_t)d->heads * (d->nope + d->rope));
        w->mid = MAX(w->mid, (int64_t)d->heads * d->v_dim);
        w->hidw = MAX(w->hidw, (int64_t)d->rank + d->rope);
        w->latent = MAX(w->latent, b->l.q_lora);
        break;
    }
    case BLK_ATTN:
    case BLK_MLP:
    case BLK_MOE:
    case BLK_MAMBA2: break;
    }
}

void kimi_cost(const struct block *b, struct model_cost *c, int64_t *dense, double *flops) {
    const struct weight *ws[6] = {NULL};
    switch (b->kind) {
    case BLK_KDA: {
        const struct kda_layer *k = &b->k;
        const struct weight *kw[6] = {&k->in_proj, &k->f_a, &k->f_b, &k->g_a, &k->g_b, &k->o};
        memcpy(ws, kw, sizeof kw);
        int64_t HK = (int64_t)k->d.heads * k->d.head_dim;
        c->state_bytes_per_seq += 4 * ((k->d.conv_kernel - 1) * 3 * HK + HK * k->d.head_dim);
        break;
    }
    case BLK_MLA: {
        const struct mla_layer *l = &b->l;
        const struct mla_dims *d = &l->d;
        const struct weight *lw[6] = {&l->q, &l->q_a, &l->q_b, &l->kv_a, &l->o, NULL};
        memcpy(ws, lw, sizeof lw);
        int64_t kvb = (int64_t)d->heads * (d->nope + d->v_dim) * d->rank;
        *dense += 4 * kvb, *flops += 2.0 * kvb; // absorbed into q and o once per token
        c->kv_elems_per_token += d->rank + d->rope;
        c->attn_flops_per_ctx += 2.0 * d->heads * (2 * d->rank + d->rope);
        break;
    }
    case BLK_ATTN:
    case BLK_MLP:
    case BLK_MOE:
    case BLK_MAMBA2: break;
    }
    for (int i = 0; i < 6; i++)
        if (ws[i] && ws[i]->data) *dense += wbytes(ws[i]), *flops += 2.0 * ws[i]->rows * ws[i]->cols;
}

void kimi_free_block(struct backend *be, struct block *b) {
    switch (b->kind) {
    case BLK_KDA: {
        struct kda_layer *k = &b->k;
        struct weight *ws[] = {&k->in_proj, &k->f_a, &k->f_b, &k->g_a, &k->g_b, &k->o};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) free_weight(be, ws[i]);
        float *v[] = {k->conv_w, k->A_log, k->dt_bias, k->norm_w};
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) be->ops->free(be, v[i]);
        break;
    }
    case BLK_MLA: {
        struct mla_layer *l = &b->l;
        struct weight *ws[] = {&l->q, &l->q_a, &l->q_b, &l->kv_a, &l->o};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) free_weight(be, ws[i]);
        float *v[] = {l->q_a_norm, l->kv_a_norm, l->kv_b};
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) be->ops->free(be, v[i]);
        break;
    }
    case BLK_ATTN:
    case BLK_MLP:
    case BLK_MOE:
    case BLK_MAMBA2: break;
    }
}
