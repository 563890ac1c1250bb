// layers_mixers.c - the mixers of the layer library (layers.h): attention,
// MLP, MoE and Mamba2, each loaded as this rank's shards and run through the
// backend's ops. A mixer's output is this rank's partial sum; the block
// loop all-reduces it (lm_forward).
#include <math.h>

#include "core/common.h"
#include "models/layers.h"

#define NAME(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

static int require_matmul(struct lm *m, const struct weight *w, const char *what) {
    return lm_require(m, (struct op_query){.op = OP_MATMUL, .w = w}, what);
}

// A bias of rows assembled from pieces of bias vectors (names[i] rows
// spans[i]), or rank 0's whole bias of a row-split projection (the partial
// sums get it once).
static int load_bias(struct loader *l, const char *const *names, const int64_t *lens, const struct span *spans, int n,
                     float **dev) {
    int64_t total = 0, maxn = 0;
    for (int i = 0; i < n; i++) total += spans[i].len, maxn = MAX(maxn, lens[i]);
    float *all = try_calloc((size_t)(total + maxn), sizeof(float), "a bias"), *tmp = all + total;
    if (!all) return vllm_err_prefix(VLLM_ERR_OUT_OF_MEMORY, "%s", names[0]);
    int64_t o = 0;
    int rc = VLLM_OK;
    for (int i = 0; i < n && !rc; i++) {
        rc = loader_read(l, names[i], 1, &lens[i], tmp, DUMMY_NORMAL, 0.02f);
        memcpy(all + o, tmp + spans[i].off, sizeof(float) * spans[i].len);
        o += spans[i].len;
    }
    if (!rc) rc = loader_upload_vector(l, all, total, dev);
    free(all);
    return rc;
}

static int load_row_bias(struct lm *m, struct loader *l, const char *name, int64_t n, float **dev) {
    if (m->rank) return VLLM_OK;
    struct span all = {0, n};
    return load_bias(l, &name, &n, &all, 1, dev);
}

// ------------------------------------------------------------ attention --

// A rank's attention: query heads [r*Hq/tp, ...) and the KV heads they
// read, [kv0, kv0 + d.kv_heads): a share of them, or one replicated KV head
// when there are fewer KV heads than ranks. q, k and v are stacked into one
// matrix: one matmul per layer.
int attn_load(struct lm *m, struct loader *l, const char *p, const struct attn_cfg *c, struct attn_layer *a) {
    int64_t D = m->hidden, Dh = c->head_dim, q = (int64_t)c->heads * Dh, kv = (int64_t)c->kv_heads * Dh;
    int kvh = MAX(c->kv_heads / m->tp, 1), kv0 = m->rank * c->kv_heads / m->tp;
    a->d = (struct attn_dims){c->heads / m->tp, kvh, c->head_dim, 0, c->scale > 0 ? c->scale : 1.0f / sqrtf((float)Dh),
                              1.0f, 1.0f};
    TRY(loader_kv_scales(l, p, &a->d.k_scale, &a->d.v_scale)); // the checkpoint's, for an fp8 KV cache
    a->rope = c->rope;
    a->norm_eps = c->norm_eps;
    struct span qs = lm_part(m, q), ks = {kv0 * Dh, kvh * Dh};
    char nq[256], nk[256], nv[256], n[256];
    struct wpiece pc[3] = {{NAME(nq, "%sq_proj.weight", p), 2, {q, D}, qs},
                           {NAME(nk, "%sk_proj.weight", p), 2, {kv, D}, ks},
                           {NAME(nv, "%sv_proj.weight", p), 2, {kv, D}, ks}};
    TRY(loader_weight(l, pc, 3, 0, 0, 0, 0, &a->qkv));
    if (c->qkv_bias) {
        const char *names[3] = {NAME(nq, "%sq_proj.bias", p), NAME(nk, "%sk_proj.bias", p), NAME(nv, "%sv_proj.bias", p)};
        int64_t lens[3] = {q, kv, kv};
        struct span spans[3] = {qs, ks, ks};
        TRY(load_bias(l, names, lens, spans, 3, &a->qkv.bias));
    }
    TRY(loader_matrix(l, NAME(n, "%so_proj.weight", p), D, q, (struct span){0, D}, qs.off, qs.off + qs.len, 0, &a->o));
    if (c->o_bias) TRY(load_row_bias(m, l, NAME(n, "%so_proj.bias", p), D, &a->o.bias));
    if (c->qk_norm) {
        struct span all = {0, Dh};
        TRY(loader_vector(l, NAME(n, "%sq_norm.weight", p), Dh, all, &a->q_norm, DUMMY_CONST, 1.0f));
        TRY(loader_vector(l, NAME(n, "%sk_norm.weight", p), Dh, all, &a->k_norm, DUMMY_CONST, 1.0f));
    }
    TRY(require_matmul(m, &a->qkv, "attention qkv"));
    TRY(require_matmul(m, &a->o, "attention o_proj"));
    return lm_require(m, (struct op_query){.op = OP_ATTN, .attn = &a->d}, "attention");
}

void attn_fwd(struct lm *m, const struct attn_layer *a, int cache, const struct batch *b, struct caches *c,
              const float *x, float *out) {
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct lm_ws *ws = &m->ws;
    int T = b->num_tokens, ld = (int)a->qkv.rows, nd = b->num_decodes;
    struct attn_dims d = a->d;
    d.block_size = c->block_size;
    op->matmul(be, ws->proj, x, &a->qkv, T);
    lm_tick(m, T_ATTN_QKV);
    // q/k head norms (Qwen3), RoPE of q | k by the batch's positions, the KV
    // write, for every attention family: one op over the prefill rows (the
    // rows after the decodes' one each); attn_decode runs the decode rows'
    // own, so that a GPU can run it inside its decode kernel
    struct attn_prep pr = {a->q_norm, a->k_norm, a->rope ? a->rope->table : NULL, a->norm_eps};
    if (b->num_prefills) op->qk_norm_rope(be, ws->proj, ld, &pr, c->k[cache], c->v[cache], b, nd, &d);
    if (nd) op->attn_decode(be, ws->y, ws->proj, ld, &pr, c->k[cache], c->v[cache], b, &d);
    if (b->num_prefills) op->attn_prefill(be, ws->y, ws->proj, ld, c->k[cache], c->v[cache], b, nd, b->num_seqs, &d);
    lm_tick(m, T_ATTN);
    op->matmul(be, out, ws->y, &a->o, T);
    lm_tick(m, T_ATTN_O);
}

// ------------------------------------------------------------------ MLP --

// up split by rows (gated: this rank's gate rows, then the same up rows),
// down by the same columns.
int mlp_load(struct lm *m, struct loader *l, const char *p, const struct mlp_cfg *c, struct mlp_layer *f) {
    int64_t D = m->hidden, I = c->inter;
    struct span s = lm_part(m, I);
    f->inter = (int)s.len;
    f->gated = c->gated;
    f->act = c->act;
    char nu[256], ng[256], n[256];
    struct wpiece pc[2] = {{NAME(ng, "%s%s", p, c->gated ? c->gate : c->up), 2, {I, D}, s},
                           {NAME(nu, "%s%s", p, c->up), 2, {I, D}, s}};
    TRY(loader_weight(l, pc, c->gated ? 2 : 1, 0, 0, 0, 0, &f->up));
    TRY(loader_matrix(l, NAME(n, "%s%s", p, c->down), D, I, (struct span){0, D}, s.off, s.off + s.len, 0, &f->down));
    if (c->bias) { // "x_proj.weight" -> "x_proj.bias"
        char bu[256], bg[256], bd[256];
        snprintf(bg, sizeof bg, "%.*sbias", (int)(strlen(ng) - 6), ng);
        snprintf(bu, sizeof bu, "%.*sbias", (int)(strlen(nu) - 6), nu);
        snprintf(bd, sizeof bd, "%.*sbias", (int)(strlen(n) - 6), n);
        const char *names[2] = {bg, bu};
        int64_t lens[2] = {I, I};
        struct span spans[2] = {s, s};
        TRY(load_bias(l, names, lens, spans, c->gated ? 2 : 1, &f->up.bias));
        TRY(load_row_bias(m, l, bd, D, &f->down.bias));
    }
    TRY(require_matmul(m, &f->up, "mlp up"));
    return require_matmul(m, &f->down, "mlp down");
}

// out = down(act(up x)) or down(act(gate x) * up x), through proj (and hid)
void mlp_fwd(struct lm *m, const struct mlp_layer *f, const float *x, float *out, int T) {
    struct lm_ws *ws = &m->ws;
    backend_mlp(m->be, out, x, &f->up, &f->down, f->gated, f->act, f->gated ? ws->hid : ws->proj, ws->proj, T);
}

// ------------------------------------------------------------------ MoE --

// Routed experts, one piece per expert (and per gate / up half) of this
// rank's rows [lo, lo + len) of each expert's I, from per-expert tensors (the
// Hub's checkpoints) or fused [E, U, L] ones (transformers 5 in memory). A
// rank holds every expert, each split like the MLP (see
// docs/TENSOR_PARALLEL.md for why not expert parallelism).
static int load_experts(struct lm *m, struct loader *l, const char *p, const struct moe_cfg *c, struct moe_experts *x) {
    int64_t E = c->route.num_experts, I = c->inter, L = c->latent ? c->latent : m->hidden, U = c->gated ? 2 * I : I;
    int g = c->gated ? 2 : 1;
    struct span is = lm_part(m, I);
    *x = (struct moe_experts){.num_experts = (int)E, .inter = (int)is.len, .dim = (int)L, .gated = c->gated, .act = c->act};
    const struct expert_names *nm = &c->names;
    char probe[256], fu[256], fd[256];
    snprintf(probe, sizeof probe, "%s", p);
    snprintf(probe + strlen(probe), sizeof probe - strlen(probe), nm->up, 0);
    int per = loader_has(l, probe) || !nm->fused_up;
    NAME(fu, "%s%s", p, nm->fused_up ? nm->fused_up : "");
    NAME(fd, "%s%s", p, nm->fused_down ? nm->fused_down : "");
    struct wpiece *pc = xcalloc((size_t)E * g, sizeof *pc);
    char(*names)[256] = xcalloc((size_t)E * g, sizeof *names);
    for (int64_t e = 0; e < E; e++)
        for (int k = 0; k < g; k++) { // gated: the gate half first
            struct wpiece *q = &pc[e * g + k];
            const char *fmt = g == 2 && k == 0 ? nm->gate : nm->up;
            if (per) {
                snprintf(names[e * g + k], sizeof names[0], "%s", p);
                snprintf(names[e * g + k] + strlen(p), sizeof names[0] - strlen(p), fmt, (int)e);
                *q = (struct wpiece){names[e * g + k], 2, {I, L}, is};
            } else {
                *q = (struct wpiece){fu, 3, {E, U, L}, {e * U + k * I + is.off, is.len}};
            }
        }
    int rc = loader_weight(l, pc, (int)E * g, 0, 0, 0, 0, &x->up);
    for (int64_t e = 0; e < E && !rc; e++) {
        if (per) {
            snprintf(names[e], sizeof names[0], "%s", p);
            snprintf(names[e] + strlen(p), sizeof names[0] - strlen(p), nm->down, (int)e);
            pc[e] = (struct wpiece){names[e], 2, {L, I}, {0, L}};
        } else {
            pc[e] = (struct wpiece){fd, 3, {E, L, I}, {e * L, L}};
        }
    }
    if (!rc) rc = loader_weight(l, pc, (int)E, is.off, is.off + is.len, 0, 0, &x->down);
    free(pc);
    free(names);
    return rc;
}

int moe_load(struct lm *m, struct loader *l, const char *p, const struct moe_cfg *c, struct moe_layer *e) {
    int64_t E = c->route.num_experts, D = m->hidden;
    char n[256];
    e->route = c->route;
    e->latent = c->latent;
    TRY(loader_matrix(l, NAME(n, "%sgate.weight", p), E, D, (struct span){0, E}, 0, 0, WL_F32, &e->gate));
    if (c->correction_bias)
        TRY(loader_vector(l, NAME(n, "%sgate.e_score_correction_bias", p), E, (struct span){0, E}, &e->bias, DUMMY_CONST,
                          0.0f));
    TRY(load_experts(m, l, p, c, &e->experts));
    if (c->shared.inter) { // an MLP, held as one expert: moe_experts may run it beside the routed ones
        struct mlp_layer f = {0};
        int rc = mlp_load(m, l, NAME(n, "%sshared_experts.", p), &c->shared, &f);
        e->has_shared = 1; // its weights are the layer's to free from here, loaded or not
        e->shared = (struct moe_experts){.up = f.up, .down = f.down, .num_experts = 1, .inter = f.inter,
                                         .dim = (int)D, .gated = f.gated, .act = f.act};
        TRY(rc);
    }
    if (c->latent) { // replicated: the experts of every rank read all of the latent input
        struct span lat = {0, c->latent}, all = {0, D};
        TRY(loader_matrix(l, NAME(n, "%sfc1_latent_proj.weight", p), c->latent, D, lat, 0, 0, 0, &e->fc1));
        TRY(loader_matrix(l, NAME(n, "%sfc2_latent_proj.weight", p), D, c->latent, all, 0, 0, 0, &e->fc2));
        TRY(require_matmul(m, &e->fc1, "moe latent projection"));
    }
    TRY(require_matmul(m, &e->gate, "moe router"));
    TRY(lm_require(m, (struct op_query){.op = OP_MOE_ROUTE, .route = &e->route}, "moe router"));
    return lm_require(m, (struct op_query){.op = OP_MOE_EXPERTS, .route = &e->route, .moe = &e->experts}, "moe experts");
}

void moe_fwd(struct lm *m, const struct moe_layer *e, const float *x, float *out, int T) {
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct lm_ws *ws = &m->ws;
    op->matmul(be, ws->rlogits, x, &e->gate, T); // fp32 router
    op->moe_route(be, ws->rids, ws->rw, ws->rlogits, e->bias, T, &e->route);
    lm_tick(m, T_ROUTER);
    // The shared expert reads the un-projected input: moe_experts runs it
    // (and may fuse it with the routed experts) unless a latent fc2 comes
    // between, when it is added after. Routed and shared parts of a rank
    // reduce at once.
    struct moe_shared sh = {&e->shared, e->shared.gated ? ws->hid : ws->proj, ws->proj, ws->y};
    const struct moe_shared *fused = e->has_shared && !e->latent ? &sh : NULL;
    if (e->latent) {
        op->matmul(be, ws->xl, x, &e->fc1, T);
        op->moe_experts(be, ws->eo, ws->xl, &e->experts, ws->rids, ws->rw, T, e->route.top_k, NULL);
        op->matmul(be, out, ws->eo, &e->fc2, T);
        if (e->has_shared) {
            moe_shared_fwd(be, &sh, x, T);
            op->add(be, out, ws->y, (int64_t)T * m->hidden);
        }
    } else
        op->moe_experts(be, out, x, &e->experts, ws->rids, ws->rw, T, e->route.top_k, fused);
    lm_tick(m, T_EXPERTS);
}

// --------------------------------------------------------------- Mamba2 --

// A rank's Mamba2 part: heads [r*H/tp, ...) with their channels, and the B/C
// groups [r*G/tp, ...) those heads read (G % tp == 0: groups never straddle
// ranks, so the gated norm's groups stay whole). in_proj rows are taken per
// segment z | x | B | C | dt, conv channels per x | B | C.
int mamba2_load(struct lm *m, struct loader *l, const char *p, const struct mamba2_cfg *c, struct mamba2_layer *w) {
    int64_t I = (int64_t)c->heads * c->head_dim, GN = (int64_t)c->groups * c->state, C = I + 2 * GN, H = c->heads;
    int64_t K = c->conv_kernel, D = m->hidden;
    int tp = m->tp;
    struct span hs = lm_part(m, H), is = lm_part(m, I), gs = lm_part(m, GN);
    int Hr = c->heads / tp, Gr = c->groups / tp, Ir = Hr * c->head_dim, GNr = Gr * c->state;
    w->d = (struct mamba_dims){Hr, c->head_dim, Gr, c->state, c->conv_kernel, c->chunk_size, Ir + 2 * GNr, c->dt_min,
                               c->dt_max};
    w->proj_dim = 2 * Ir + 2 * GNr + Hr;
    w->norm_group = (int)(I / c->norm_groups);
    char n[256];
    int64_t rows = 2 * I + 2 * GN + H;
    NAME(n, "%sin_proj.weight", p);
    struct wpiece in[5] = {{n, 2, {rows, D}, is}, {n, 2, {rows, D}, {I + is.off, is.len}},
                           {n, 2, {rows, D}, {2 * I + gs.off, gs.len}}, {n, 2, {rows, D}, {2 * I + GN + gs.off, gs.len}},
                           {n, 2, {rows, D}, {2 * I + 2 * GN + hs.off, hs.len}}};
    TRY(loader_weight(l, in, 5, 0, 0, 0, 0, &w->in_proj));
    TRY(loader_matrix(l, NAME(n, "%sout_proj.weight", p), D, I, (struct span){0, D}, is.off, is.off + is.len, 0,
                      &w->out_proj));
    struct span conv[3] = {is, {I + gs.off, gs.len}, {I + GN + gs.off, gs.len}};
    // tmp: [C, K] the whole conv, dst: [conv_dim, K] this rank's channels; sized
    // by the config before the file's shape is checked, so they may fail.
    float *tmp = try_calloc((size_t)C * K, sizeof(float), "the conv1d taps");
    float *dst = tmp ? try_calloc((size_t)w->d.conv_dim * K, sizeof(float), "this rank's conv1d taps") : NULL;
    if (!dst) {
        free(tmp);
        return vllm_err_prefix(VLLM_ERR_OUT_OF_MEMORY, "%sconv1d.weight [%lld, 1, %lld]", p, (long long)C, (long long)K);
    }
    int rc = loader_read(l, NAME(n, "%sconv1d.weight", p), 3, (int64_t[]){C, 1, K}, tmp, DUMMY_NORMAL, 0.2f);
    for (int i = 0, o = 0; i < 3 && !rc; o += (int)conv[i].len, i++)
        memcpy(dst + (int64_t)o * K, tmp + conv[i].off * K, sizeof(float) * conv[i].len * K);
    if (!rc) rc = loader_upload_vector(l, dst, (int64_t)w->d.conv_dim * K, &w->conv_w);
    if (!rc && c->conv_bias) {
        const char *bn = NAME(n, "%sconv1d.bias", p);
        const char *names[3] = {bn, bn, bn};
        int64_t lens[3] = {C, C, C};
        rc = load_bias(l, names, lens, conv, 3, &w->conv_b);
    }
    free(dst);
    free(tmp);
    TRY(rc);
    TRY(loader_vector(l, NAME(n, "%sdt_bias", p), H, hs, &w->dt_bias, DUMMY_DTBIAS, 0));
    TRY(loader_vector(l, NAME(n, "%sD", p), H, hs, &w->D, DUMMY_CONST, 1.0f));
    TRY(loader_vector(l, NAME(n, "%snorm.weight", p), I, is, &w->norm_w, DUMMY_CONST, 1.0f));
    float *a = loader_tmp(l, H);
    if (!a) return vllm_err_prefix(VLLM_ERR_OUT_OF_MEMORY, "%sA_log", p);
    TRY(loader_read(l, NAME(n, "%sA_log", p), 1, (int64_t[]){H}, a, DUMMY_ALOG, 0));
    for (int64_t h = 0; h < hs.len; h++) a[h] = -expf(a[hs.off + h]); // A = -exp(A_log), once at load
    TRY(loader_upload_vector(l, a, hs.len, &w->A));
    TRY(require_matmul(m, &w->in_proj, "mamba in_proj"));
    TRY(require_matmul(m, &w->out_proj, "mamba out_proj"));
    return lm_require(m, (struct op_query){.op = OP_MAMBA, .mamba = &w->d}, "Mamba2");
}

// VLLM_DIAG=1: the L2 of each sequence's SSM state as gathered (before the
// layer: from state_src, 0 for a fresh slot) or written (after it).
static void diag_state(struct lm *m, int cache, const struct mamba_dims *d, const struct batch *b, const float *ssm,
                       const char *when) {
    int64_t n = (int64_t)d->heads * d->head_dim * d->state;
    for (int s = 0; s < b->num_seqs; s++) {
        int out = when[0] == 'o', slot = out || s < b->num_decodes ? b->h_state_slots[s] : b->h_state_src[s];
        double l2 = slot >= 0 ? sqrt(m->be->ops->sum_sq(m->be, ssm + slot * n, n)) : 0.0;
        diag_printf("layer %d mamba seq %d slot %d %s %s l2 %.6g\n", cache, s, slot,
                    s < b->num_decodes ? "decode" : "prefill", when, l2);
    }
}

void mamba2_mixer_fwd(struct lm *m, const struct mamba2_layer *w, int cache, const struct batch *b, struct caches *c,
                      const float *x, float *out) {
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct lm_ws *ws = &m->ws;
    const struct mamba_dims *d = &w->d;
    int T = b->num_tokens, I = d->heads * d->head_dim, ld = w->proj_dim, nd = b->num_decodes;
    float *conv = c->state[cache][0], *ssm = c->state[cache][1];
    if (m->diag_state) diag_state(m, cache, d, b, ssm, "in");
    op->matmul(be, ws->proj, x, &w->in_proj, T); // [T, z | xBC | dt]
    lm_tick(m, T_M_IN);
    if (nd) { // decode rows [0, nd), one token each: conv, state update and gated norm in one op
        struct mamba_params p = {w->conv_w, w->conv_b, w->dt_bias, w->A, w->D, w->norm_w, w->norm_group, m->eps};
        op->mamba_decode(be, ws->yn, ws->y, ws->proj, ld, &p, conv, ssm, b, d);
    }
    if (b->num_prefills) { // rows [nd, T)
        op->conv1d_fwd(be, ws->proj, ld, w->conv_w, w->conv_b, conv, b, nd, b->num_seqs, d);
        op->ssd_prefill(be, ws->y, ws->proj, ld, w->dt_bias, w->A, w->D, ssm, b, nd, b->num_seqs, d);
        op->gated_rmsnorm(be, ws->yn + (int64_t)nd * I, ws->y + (int64_t)nd * I, ws->proj + (int64_t)nd * ld, ld,
                          w->norm_w, T - nd, I, w->norm_group, m->eps);
    }
    if (m->diag_state) diag_state(m, cache, d, b, ssm, "out");
    lm_tick(m, T_M_CONV_SSD);
    op->matmul(be, out, ws->yn, &w->out_proj, T);
    lm_tick(m, T_M_OUT);
}
