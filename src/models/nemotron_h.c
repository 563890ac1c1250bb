// nemotron_h.c - NemotronHForCausalLM: weights and the forward of one step.
//
// h = embed(ids); for each layer: h += mixer(rmsnorm(h)); logits =
// lm_head(rmsnorm_f(h)) for the rows that sample. Activations are fp32 rows of
// the flat batch: [T, hidden] with T = b->num_tokens.
//
// Tensor parallelism (Megatron style, docs/TENSOR_PARALLEL.md): a model
// instance holds one rank's shards, made from the backend's rank (be->tp_rank
// of be->tp_size). Each mixer's first projection is split by output rows
// (heads, channels, experts' rows), its last by input columns; the partial
// outputs are summed by an all-reduce, so h stays the same on every rank. The
// embedding, norms and router are replicated; lm_head is split by vocabulary
// rows and its logits all-gathered. With one rank every part is the whole.
#include <math.h>

#include "core/common.h"
#include "models/loader.h"
#include "models/model.h"
#include "models/nemotron_h.h"

extern const struct model_ops nemotron_h_ops;

struct nh_mamba {
    struct weight in_proj, out_proj; // [2I+2GN+H, D], [D, I]
    float *conv_w, *conv_b;          // [C, K], [C]
    float *dt_bias, *A, *D, *norm_w; // [H], [H] = -exp(A_log), [H], [I]
};

struct nh_attn {
    struct weight qkv, o; // [(Hq+2Hkv)*Dh, D] (q, k, v stacked), [D, Hq*Dh]
};

struct nh_mlp {
    struct weight up, down;
};

struct nh_moe {
    struct weight gate;        // [E, D] fp32: the router runs in fp32
    float *bias;               // [E] e_score_correction_bias
    struct moe_experts experts;
    struct weight shared_up, shared_down;
    struct weight fc1, fc2;    // latent projections (latent > 0)
};

struct nh_layer {
    enum nh_kind kind;
    float *norm_w;
    union {
        struct nh_mamba m;
        struct nh_attn a;
        struct nh_mlp f;
        struct nh_moe e;
    };
};

// Step workspace, rows = max_tokens.
struct nh_ws {
    float *res, *x, *mix;     // [T, D]
    float *proj;              // [T, max(in_proj, qkv, mlp, shared) width]
    float *y, *yn;            // [T, max(I, Hq*Dh, latent)]
    float *rlogits, *rw;      // [T, E], [T, k]
    int32_t *rids;            // [T, k]
    float *xl, *eo;           // [T, L] latent in / expert out
    float *sel;               // [logit rows, D]
    float *lg;                // [logit rows, vocab_part] this rank's logits before the all-gather (tp > 1)
    void *base;
};

struct nh_model {
    struct model base;
    struct nh_config c;
    struct backend *be;
    struct weight embed, lm_head; // lm_head: this rank's vocab_part rows
    float *norm_f;
    struct nh_layer *layers;
    struct nh_ws ws;
    struct mamba_dims md; // this rank's heads and groups
    struct attn_dims ad;  // this rank's heads and KV heads
    struct moe_route_cfg rc;
    int proj_dim, max_tokens, max_rows;
    int tp, rank;   // tensor parallelism: the shards of rank `rank` of tp
    int kv0;        // first KV head of this rank (replicated when kv_heads < tp)
    int vocab_part; // lm_head rows per rank (the last rank's padded with zero rows)
    // VLLM_DIAG=time: device time per part of the forward (synchronizes)
    int tdiag, tsteps;
    double tlast, tsum[16];
};

enum { T_EMBED, T_NORM, T_M_IN, T_M_CONV_SSD, T_M_OUT, T_ATTN_QKV, T_ATTN, T_ATTN_O, T_MLP, T_ROUTER, T_EXPERTS,
       T_SHARED, T_HEAD, T_COMM, T_N };
static const char *const t_names[T_N] = {"embed", "norms", "mamba in_proj", "mamba conv+ssd+gnorm", "mamba out_proj",
                                         "attn qkv", "attn core", "attn o_proj", "mlp", "moe router+latent",
                                         "moe experts", "moe shared", "norm_f+lm_head", "tp all-reduce"};

// Charges the device time since the last tick to part k (diagnostics only).
static void tick(struct nh_model *m, int k) {
    if (!m->tdiag) return;
    m->be->ops->sync(m->be);
    double t = now_s();
    if (k >= 0) m->tsum[k] += t - m->tlast;
    m->tlast = t;
}

static void tick_report(struct nh_model *m, int T) {
    if (!m->tdiag || ++m->tsteps % 20) return;
    double tot = 0;
    for (int k = 0; k < T_N; k++) tot += m->tsum[k];
    if (m->rank) { // one report, rank 0's
        memset(m->tsum, 0, sizeof m->tsum);
        return;
    }
    diag_printf("time over 20 steps (last had %d tokens): %.3f ms per step\n", T, 1e3 * tot / 20);
    for (int k = 0; k < T_N; k++)
        if (m->tsum[k] > 0) diag_printf("  %-22s %8.3f ms %5.1f%%\n", t_names[k], 1e3 * m->tsum[k] / 20, 100 * m->tsum[k] / tot);
    memset(m->tsum, 0, sizeof m->tsum);
}

static int mamba_inner(const struct nh_config *c) { return c->m_heads * c->m_head_dim; }

// A rank's Mamba2 part: heads [r*H/tp, ...) with their channels, and the B/C
// groups [r*G/tp, ...) those heads read (G % tp == 0: groups never straddle
// ranks, so the gated norm's groups stay whole). in_proj rows are taken per
// segment z | x | B | C | dt, conv channels per x | B | C.
static int load_mamba(struct nh_model *m, struct loader *l, const char *p, struct nh_mamba *w, enum dtype dt) {
    const struct nh_config *c = &m->c;
    int64_t I = mamba_inner(c), GN = (int64_t)c->m_groups * c->m_state, C = I + 2 * GN, H = c->m_heads, K = c->m_conv;
    int tp = m->tp, r = m->rank;
    struct span hs = span_part(H, tp, r), is = span_part(I, tp, r), gs = span_part(GN, tp, r);
    struct span proj[5] = {is, {I + is.off, is.len}, {2 * I + gs.off, gs.len}, {2 * I + GN + gs.off, gs.len},
                           {2 * I + 2 * GN + hs.off, hs.len}};
    struct span conv[3] = {is, {I + gs.off, gs.len}, {I + GN + gs.off, gs.len}};
    struct shard in_rows = {proj, 5, 0, 0, 0}, out_cols = {NULL, 0, is.off, is.off + is.len, 0};
    struct shard conv_rows = {conv, 3, 0, 0, 0}, heads = {&hs, 1, 0, 0, 0}, chans = {&is, 1, 0, 0, 0};
    char n[256];
    snprintf(n, sizeof n, "%smixer.in_proj.weight", p);
    TRY(loader_matrix_part(l, n, 2 * I + 2 * GN + H, c->hidden, &in_rows, dt, &w->in_proj, 0.02f));
    snprintf(n, sizeof n, "%smixer.out_proj.weight", p);
    TRY(loader_matrix_part(l, n, c->hidden, I, &out_cols, dt, &w->out_proj, 0.02f));
    float *tmp = loader_tmp(l, (size_t)C * K);
    snprintf(n, sizeof n, "%smixer.conv1d.weight", p);
    TRY(loader_read(l, n, 3, (int64_t[]){C, 1, K}, tmp, DUMMY_NORMAL, 0.2f));
    TRY(loader_upload_vector(l, tmp, shard_select(tmp, C, K, &conv_rows) * K, &w->conv_w));
    if (c->conv_bias) {
        snprintf(n, sizeof n, "%smixer.conv1d.bias", p);
        TRY(loader_vector_part(l, n, C, &conv_rows, &w->conv_b, DUMMY_NORMAL, 0.1f));
    }
    snprintf(n, sizeof n, "%smixer.dt_bias", p);
    TRY(loader_vector_part(l, n, H, &heads, &w->dt_bias, DUMMY_DTBIAS, 0));
    snprintf(n, sizeof n, "%smixer.D", p);
    TRY(loader_vector_part(l, n, H, &heads, &w->D, DUMMY_CONST, 1.0f));
    snprintf(n, sizeof n, "%smixer.norm.weight", p);
    TRY(loader_vector_part(l, n, I, &chans, &w->norm_w, DUMMY_CONST, 1.0f));
    snprintf(n, sizeof n, "%smixer.A_log", p);
    tmp = loader_tmp(l, H);
    TRY(loader_read(l, n, 1, (int64_t[]){H}, tmp, DUMMY_ALOG, 0));
    int64_t nh = shard_select(tmp, H, 1, &heads);
    for (int h = 0; h < nh; h++) tmp[h] = -expf(tmp[h]); // A = -exp(A_log), once at load
    return loader_upload_vector(l, tmp, nh, &w->A);
}

// A rank's attention part: query heads [r*Hq/tp, ...) and the KV heads they
// read, [kv0, kv0 + ad.kv_heads): a share of them, or one replicated KV head
// when there are fewer KV heads than ranks.
static int load_attn(struct nh_model *m, struct loader *l, const char *p, struct nh_attn *w, enum dtype dt) {
    const struct nh_config *c = &m->c;
    int64_t D = c->hidden, Dh = c->head_dim, q = c->heads * Dh, kv = c->kv_heads * Dh;
    struct span qs = span_part(q, m->tp, m->rank), ks = {m->kv0 * Dh, m->ad.kv_heads * Dh};
    struct span rows_qkv[3] = {qs, {q + ks.off, ks.len}, {q + kv + ks.off, ks.len}};
    struct shard qkv = {rows_qkv, 3, 0, 0, 0}, o_cols = {NULL, 0, qs.off, qs.off + qs.len, 0};
    char n[256];
    if (!l->st) { // dummy: made on the device
        snprintf(n, sizeof n, "%smixer.qkv_proj.weight", p);
        TRY(loader_matrix_part(l, n, q + 2 * kv, D, &qkv, dt, &w->qkv, 0.02f));
    } else {
        float *tmp = loader_tmp(l, (size_t)(q + 2 * kv) * D);
        const char *names[3] = {"q_proj", "k_proj", "v_proj"};
        int64_t rows[3] = {q, kv, kv}, off = 0;
        for (int i = 0; i < 3; i++) { // stack q, k, v into one matrix: one matmul per layer
            snprintf(n, sizeof n, "%smixer.%s.weight", p, names[i]);
            TRY(loader_read(l, n, 2, (int64_t[]){rows[i], D}, tmp + off * D, DUMMY_NORMAL, 0.02f));
            off += rows[i];
        }
        TRY(loader_upload_matrix(l, tmp, shard_select(tmp, q + 2 * kv, D, &qkv), D, dt, &w->qkv));
    }
    snprintf(n, sizeof n, "%smixer.o_proj.weight", p);
    return loader_matrix_part(l, n, D, q, &o_cols, dt, &w->o, 0.02f);
}

// relu^2 MLP: up split by rows, down by the same columns.
static int load_mlp(const struct nh_model *m, struct loader *l, const char *p, int64_t D, int64_t inter,
                    struct weight *up, struct weight *down, enum dtype dt) {
    struct span s = span_part(inter, m->tp, m->rank);
    struct shard rows = {&s, 1, 0, 0, 0}, cols = {NULL, 0, s.off, s.off + s.len, 0};
    char n[256];
    snprintf(n, sizeof n, "%sup_proj.weight", p);
    TRY(loader_matrix_part(l, n, inter, D, &rows, dt, up, 0.02f));
    snprintf(n, sizeof n, "%sdown_proj.weight", p);
    return loader_matrix_part(l, n, D, inter, &cols, dt, down, 0.02f);
}

// Routed experts come as experts.{e}.up_proj.weight (checkpoints on the Hub)
// or as one experts.up_proj [E, I, L] tensor (transformers 5 in memory).
// A rank holds every expert, each split like the MLP: rows [lo, lo + len) of
// each expert's up, the same columns of its down (see docs/TENSOR_PARALLEL.md
// for why not expert parallelism).
static int load_experts(const struct nh_model *m, struct loader *l, const char *p, struct moe_experts *x,
                        enum dtype dt) {
    const struct nh_config *c = &m->c;
    int64_t E = c->experts, I = c->moe_inter, L = c->latent ? c->latent : c->hidden;
    struct span is = span_part(I, m->tp, m->rank), *up_rows = xcalloc(E, sizeof *up_rows);
    for (int64_t e = 0; e < E; e++) up_rows[e] = (struct span){e * I + is.off, is.len};
    struct shard parts[2] = {{up_rows, (int)E, 0, 0, 0}, {NULL, 0, is.off, is.off + is.len, 0}};
    x->num_experts = (int)E;
    x->inter = (int)is.len;
    x->dim = (int)L;
    const char *proj[2] = {"up_proj", "down_proj"};
    int64_t r[2] = {I, L}, cl[2] = {L, I};
    struct weight *dst[2] = {&x->up, &x->down};
    char n[256];
    int rc = VLLM_OK;
    for (int k = 0; k < 2 && !rc; k++) {
        snprintf(n, sizeof n, "%smixer.experts.%s", p, proj[k]);
        if (!l->st) { // dummy weights are made on the device, no host copy
            rc = loader_matrix_part(l, n, E * r[k], cl[k], &parts[k], dt, dst[k], 0.02f);
            continue;
        }
        float *tmp = loader_tmp(l, (size_t)E * I * L);
        if (loader_has(l, n)) {
            rc = loader_read(l, n, 3, (int64_t[]){E, r[k], cl[k]}, tmp, DUMMY_NORMAL, 0.02f);
        } else {
            for (int64_t e = 0; e < E && !rc; e++) {
                snprintf(n, sizeof n, "%smixer.experts.%lld.%s.weight", p, (long long)e, proj[k]);
                rc = loader_read(l, n, 2, (int64_t[]){r[k], cl[k]}, tmp + e * I * L, DUMMY_NORMAL, 0.02f);
            }
        }
        if (!rc) {
            int64_t rows = shard_select(tmp, E * r[k], cl[k], &parts[k]);
            rc = loader_upload_matrix(l, tmp, rows, k ? is.len : cl[k], dt, dst[k]);
        }
    }
    free(up_rows);
    return rc;
}

static int load_moe(struct nh_model *m, struct loader *l, const char *p, struct nh_moe *w, enum dtype dt) {
    const struct nh_config *c = &m->c;
    char n[256], q[256];
    snprintf(n, sizeof n, "%smixer.gate.weight", p);
    TRY(loader_matrix(l, n, c->experts, c->hidden, DT_F32, &w->gate, 0.05f));
    snprintf(n, sizeof n, "%smixer.gate.e_score_correction_bias", p);
    TRY(loader_vector(l, n, c->experts, &w->bias, DUMMY_CONST, 0.0f));
    TRY(load_experts(m, l, p, &w->experts, dt));
    snprintf(q, sizeof q, "%smixer.shared_experts.", p);
    TRY(load_mlp(m, l, q, c->hidden, c->shared_inter, &w->shared_up, &w->shared_down, dt));
    if (c->latent) { // replicated: the experts of every rank read all of the latent input
        snprintf(n, sizeof n, "%smixer.fc1_latent_proj.weight", p);
        TRY(loader_matrix(l, n, c->latent, c->hidden, dt, &w->fc1, 0.02f));
        snprintf(n, sizeof n, "%smixer.fc2_latent_proj.weight", p);
        TRY(loader_matrix(l, n, c->hidden, c->latent, dt, &w->fc2, 0.02f));
    }
    return VLLM_OK;
}

static int load_weights(struct nh_model *m, struct loader *l, enum dtype dt) {
    const struct nh_config *c = &m->c;
    const char *root = loader_prefix(l, "backbone.", "model.", "embeddings.weight");
    char n[256], p[128];
    snprintf(n, sizeof n, "%sembeddings.weight", root);
    TRY(loader_matrix(l, n, c->vocab, c->hidden, DT_F32, &m->embed, 1.0f));
    // lm_head: vocabulary rows [r*Vp, r*Vp + Vp) of this rank, cut at vocab and padded back to Vp
    int64_t Vp = m->vocab_part, lo = MIN((int64_t)m->rank * Vp, c->vocab);
    struct span vs = {lo, MIN(Vp, c->vocab - lo)};
    struct shard vocab = {&vs, 1, 0, 0, Vp - vs.len};
    if (loader_has(l, "lm_head.weight")) TRY(loader_matrix_part(l, "lm_head.weight", c->vocab, c->hidden, &vocab, dt, &m->lm_head, 0.05f));
    else if (c->tie_embeddings && m->tp == 1) m->lm_head = m->embed;
    else if (c->tie_embeddings) TRY(loader_matrix_part(l, n, c->vocab, c->hidden, &vocab, DT_F32, &m->lm_head, 1.0f));
    else return vllm_err(VLLM_ERR_FORMAT, "checkpoint has no tensor lm_head.weight and tie_word_embeddings is false");
    snprintf(n, sizeof n, "%snorm_f.weight", root);
    TRY(loader_vector(l, n, c->hidden, &m->norm_f, DUMMY_CONST, 1.0f));
    for (int i = 0; i < c->num_layers; i++) {
        struct nh_layer *ly = &m->layers[i];
        ly->kind = c->kinds[i];
        snprintf(p, sizeof p, "%slayers.%d.", root, i);
        snprintf(n, sizeof n, "%snorm.weight", p);
        TRY(loader_vector(l, n, c->hidden, &ly->norm_w, DUMMY_CONST, 1.0f));
        switch (ly->kind) {
        case NH_MAMBA: TRY(load_mamba(m, l, p, &ly->m, dt)); break;
        case NH_ATTN: TRY(load_attn(m, l, p, &ly->a, dt)); break;
        case NH_MLP:
            snprintf(n, sizeof n, "%smixer.", p);
            TRY(load_mlp(m, l, n, c->hidden, c->mlp_inter, &ly->f.up, &ly->f.down, dt));
            break;
        case NH_MOE: TRY(load_moe(m, l, p, &ly->e, dt)); break;
        }
    }
    return VLLM_OK;
}

// One device allocation for every activation buffer of a step, at this
// rank's widths.
static int alloc_ws(struct nh_model *m) {
    const struct nh_config *c = &m->c;
    int64_t T = m->max_tokens, D = c->hidden, R = m->max_rows, tp = m->tp;
    int64_t I = (int64_t)m->md.heads * m->md.head_dim, q = (int64_t)m->ad.heads * c->head_dim;
    int64_t qkv = q + 2LL * m->ad.kv_heads * c->head_dim, L = c->latent ? c->latent : D;
    int64_t wide = MAX(MAX(m->proj_dim, qkv), MAX(CDIV(c->mlp_inter, tp), CDIV(c->shared_inter, tp)));
    int64_t mid = MAX(MAX(I, q), MAX(L, D)); // y also takes the shared expert's [T, D] output
    int64_t k = MAX(c->top_k, 1), E = MAX(c->experts, 1), lg = tp > 1 ? R * m->vocab_part : 0;
    int64_t sizes[] = {T * D, T * D, T * D, T * wide, T * mid, T * mid, T * E, T * k, T * k, T * L, T * L, R * D, lg};
    float **dst[] = {&m->ws.res, &m->ws.x, &m->ws.mix, &m->ws.proj, &m->ws.y, &m->ws.yn, &m->ws.rlogits, &m->ws.rw,
                     (float **)&m->ws.rids, &m->ws.xl, &m->ws.eo, &m->ws.sel, &m->ws.lg};
    int64_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += (sizes[i] + 63) & ~63LL; // 256-byte aligned
    m->ws.base = m->be->ops->alloc(m->be, sizeof(float) * total);
    if (!m->ws.base)
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate the %lld-byte step workspace", (long long)(4 * total));
    float *p = m->ws.base;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *dst[i] = p;
        p += (sizes[i] + 63) & ~63LL;
    }
    return VLLM_OK;
}

static void nh_free(struct model *base);

static void fill_spec(struct nh_model *m) {
    const struct nh_config *c = &m->c;
    struct model_spec *s = &m->base.spec;
    s->arch = "NemotronHForCausalLM";
    s->vocab_size = c->vocab;
    s->hidden_size = c->hidden;
    s->num_layers = c->num_layers;
    s->max_position_embeddings = c->max_position;
    s->num_eos = c->num_eos;
    for (int i = 0; i < c->num_eos; i++) s->eos_ids[i] = c->eos[i];
    s->layers = xcalloc(c->num_layers, sizeof *s->layers);
    for (int i = 0; i < c->num_layers; i++) {
        if (c->kinds[i] == NH_ATTN) { // caches of this rank's heads
            s->layers[i].kv_heads = m->ad.kv_heads;
            s->layers[i].head_dim = c->head_dim;
            s->caps |= MODEL_CAP_PAGED_KV;
        } else if (c->kinds[i] == NH_MAMBA) {
            s->layers[i].conv_floats = (int64_t)(c->m_conv - 1) * m->md.conv_dim;
            s->layers[i].ssm_floats = (int64_t)m->md.heads * c->m_head_dim * c->m_state;
            s->caps |= MODEL_CAP_RECURRENT_STATE;
        }
    }
}

static int nh_load(const char *dir, const json_t *config, const struct model_load_opts *o, struct backend *be,
                   struct model **out) {
    struct nh_model *m = xcalloc(1, sizeof *m);
    m->be = be;
    m->tp = be->tp_size;
    m->rank = be->tp_rank;
    char *what = path_join(dir, "config.json");
    int rc = nh_config_parse(config, what, &m->c);
    if (!rc) {
        rc = nh_config_check_tp(&m->c, m->tp, what);
        if (!rc && m->tp > 1 && (!be->ops->all_reduce || !be->ops->all_gather))
            rc = vllm_err(VLLM_ERR_UNSUPPORTED, "backend %s has no collectives: it cannot run tensor_parallel_size %d",
                          be->ops->name, m->tp);
        if (rc) nh_config_free(&m->c);
    }
    free(what);
    if (rc) {
        free(m);
        return rc;
    }
    m->base.ops = &nemotron_h_ops;
    const struct nh_config *c = &m->c;
    int tp = m->tp, H = c->m_heads / tp, G = c->m_groups / tp, I = H * c->m_head_dim, GN = G * c->m_state;
    m->md = (struct mamba_dims){H, c->m_head_dim, G, c->m_state, c->m_conv, c->chunk, I + 2 * GN, c->dt_min, c->dt_max};
    m->proj_dim = 2 * I + 2 * GN + H;
    int kvh = c->heads ? MAX(c->kv_heads / tp, 1) : 0;
    m->kv0 = m->rank * c->kv_heads / tp;
    m->ad = (struct attn_dims){c->heads / tp, kvh, c->head_dim, 0, c->head_dim ? 1.0f / sqrtf((float)c->head_dim) : 0};
    m->vocab_part = CDIV(c->vocab, tp);
    m->rc = (struct moe_route_cfg){c->experts, c->top_k, c->n_group, c->topk_group, c->norm_topk, c->routed_scale};
    m->max_tokens = o->max_tokens;
    m->tdiag = diag_on("time");
    m->max_rows = o->max_logit_rows;
    m->layers = xcalloc(c->num_layers, sizeof *m->layers);
    fill_spec(m);

    struct loader l;
    rc = loader_open(&l, dir, o->dummy, o->seed, be);
    // bf16: the parameters kept in fp32 on the device (norms, conv, dt_bias, D,
    // A_log, embeddings, router) hold bf16 values too, as when a model is cast to
    // bf16; the MoE correction bias stays fp32, as transformers and vLLM keep it
    l.round_bf16 = o->weight_dtype == DT_BF16;
    l.keep_fp32 = "e_score_correction_bias";
    if (!rc) rc = load_weights(m, &l, o->weight_dtype);
    m->base.spec.weight_bytes = l.device_bytes;
    loader_close(&l);
    if (!rc) rc = alloc_ws(m);
    if (rc) {
        nh_free(&m->base);
        return rc;
    }
    *out = &m->base;
    return VLLM_OK;
}

static void free_weight(struct backend *be, struct weight *w) {
    if (w->data) be->ops->free(be, w->data);
    w->data = NULL;
}

static void nh_free(struct model *base) {
    struct nh_model *m = (struct nh_model *)base;
    struct backend *be = m->be;
    for (int i = 0; m->layers && i < m->c.num_layers; i++) {
        struct nh_layer *ly = &m->layers[i];
        be->ops->free(be, ly->norm_w);
        switch (ly->kind) {
        case NH_MAMBA: {
            struct nh_mamba *w = &ly->m;
            free_weight(be, &w->in_proj);
            free_weight(be, &w->out_proj);
            float *v[] = {w->conv_w, w->conv_b, w->dt_bias, w->A, w->D, w->norm_w};
            for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) be->ops->free(be, v[k]);
            break;
        }
        case NH_ATTN: free_weight(be, &ly->a.qkv); free_weight(be, &ly->a.o); break;
        case NH_MLP: free_weight(be, &ly->f.up); free_weight(be, &ly->f.down); break;
        case NH_MOE: {
            struct nh_moe *w = &ly->e;
            struct weight *ws[] = {&w->gate, &w->experts.up, &w->experts.down, &w->shared_up, &w->shared_down,
                                   &w->fc1, &w->fc2};
            for (size_t k = 0; k < sizeof ws / sizeof ws[0]; k++) free_weight(be, ws[k]);
            be->ops->free(be, w->bias);
            break;
        }
        }
    }
    if (m->lm_head.data != m->embed.data) free_weight(be, &m->lm_head);
    free_weight(be, &m->embed);
    be->ops->free(be, m->norm_f);
    be->ops->free(be, m->ws.base);
    free(m->layers);
    free(m->base.spec.layers);
    nh_config_free(&m->c);
    free(m);
}

// VLLM_DIAG=1: the L2 of each sequence's SSM state as gathered (before the
// layer) or written (after it).
static void diag_state(struct nh_model *m, int layer, const struct batch *b, const float *ssm, const char *when) {
    int64_t n = (int64_t)m->md.heads * m->md.head_dim * m->md.state;
    for (int s = 0; s < b->num_seqs; s++) {
        int slot = b->h_state_slots[s], init = b->h_has_initial_state[s] || s < b->num_decodes;
        double l2 = (init || when[0] == 'o') ? sqrt(m->be->ops->sum_sq(m->be, ssm + slot * n, n)) : 0.0;
        diag_printf("layer %d mamba seq %d slot %d %s %s l2 %.6g\n", layer, s, slot,
                    s < b->num_decodes ? "decode" : "prefill", when, l2);
    }
}

// Sums the ranks' partial outputs of a split projection: x: [n] in place.
static void reduce(struct nh_model *m, float *x, int64_t n) {
    if (m->tp == 1) return;
    m->be->ops->all_reduce(m->be, x, n);
    tick(m, T_COMM);
}

// x: [T, D] normalized input -> m->ws.mix: [T, D]
static void mamba_fwd(struct nh_model *m, int li, const struct nh_mamba *w, const struct batch *b, struct caches *c) {
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct nh_ws *ws = &m->ws;
    int T = b->num_tokens, I = m->md.heads * m->md.head_dim, ld = m->proj_dim, nd = b->num_decodes;
    float *conv = c->conv[li], *ssm = c->ssm[li];
    int diag = diag_on("1");
    if (diag) diag_state(m, li, b, ssm, "in");
    op->matmul(be, ws->proj, ws->x, &w->in_proj, T); // [T, z | xBC | dt]
    tick(m, T_M_IN);
    if (nd) {
        op->conv1d_update(be, ws->proj, ld, w->conv_w, w->conv_b, conv, b, &m->md);
        op->ssd_decode(be, ws->y, ws->proj, ld, w->dt_bias, w->A, w->D, ssm, b, &m->md);
    }
    if (b->num_prefills) {
        op->conv1d_fwd(be, ws->proj, ld, w->conv_w, w->conv_b, conv, b, nd, b->num_seqs, &m->md);
        op->ssd_prefill(be, ws->y, ws->proj, ld, w->dt_bias, w->A, w->D, ssm, b, nd, b->num_seqs, &m->md);
    }
    if (diag) diag_state(m, li, b, ssm, "out");
    op->gated_rmsnorm(be, ws->yn, ws->y, ws->proj, ld, w->norm_w, T, I, I / m->md.groups, m->c.eps);
    tick(m, T_M_CONV_SSD);
    op->matmul(be, ws->mix, ws->yn, &w->out_proj, T);
    tick(m, T_M_OUT);
    reduce(m, ws->mix, (int64_t)T * m->c.hidden);
}

static void attn_fwd(struct nh_model *m, int li, const struct nh_attn *w, const struct batch *b, struct caches *c) {
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct nh_ws *ws = &m->ws;
    int T = b->num_tokens, ld = (int)w->qkv.rows, nd = b->num_decodes;
    struct attn_dims d = m->ad;
    d.block_size = c->block_size;
    op->matmul(be, ws->proj, ws->x, &w->qkv, T);
    tick(m, T_ATTN_QKV);
    op->kv_write(be, c->k[li], c->v[li], ws->proj, ld, b, &d);
    if (nd) op->attn_decode(be, ws->y, ws->proj, ld, c->k[li], c->v[li], b, &d);
    if (b->num_prefills) op->attn_prefill(be, ws->y, ws->proj, ld, c->k[li], c->v[li], b, nd, b->num_seqs, &d);
    tick(m, T_ATTN);
    op->matmul(be, ws->mix, ws->y, &w->o, T);
    tick(m, T_ATTN_O);
    reduce(m, ws->mix, (int64_t)T * m->c.hidden);
}

// out = down(relu(up(x))^2), through proj as the hidden buffer
static void mlp(struct nh_model *m, float *out, const float *x, const struct weight *up, const struct weight *down,
                int T) {
    const struct backend_ops *op = m->be->ops;
    op->matmul(m->be, m->ws.proj, x, up, T);
    op->relu2(m->be, m->ws.proj, (int64_t)T * up->rows);
    op->matmul(m->be, out, m->ws.proj, down, T);
}

static void moe_fwd(struct nh_model *m, const struct nh_moe *w, const struct batch *b) {
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct nh_ws *ws = &m->ws;
    int T = b->num_tokens, k = m->c.top_k;
    op->matmul(be, ws->rlogits, ws->x, &w->gate, T); // fp32 router
    op->moe_route(be, ws->rids, ws->rw, ws->rlogits, w->bias, T, &m->rc);
    const float *xin = ws->x;
    if (m->c.latent) {
        op->matmul(be, ws->xl, ws->x, &w->fc1, T);
        xin = ws->xl;
    }
    float *eo = m->c.latent ? ws->eo : ws->mix;
    tick(m, T_ROUTER);
    op->moe_experts(be, eo, xin, &w->experts, ws->rids, ws->rw, T, k);
    if (m->c.latent) op->matmul(be, ws->mix, ws->eo, &w->fc2, T);
    tick(m, T_EXPERTS);
    mlp(m, ws->y, ws->x, &w->shared_up, &w->shared_down, T); // shared expert on the un-projected input
    op->add(be, ws->mix, ws->y, (int64_t)T * m->c.hidden);
    tick(m, T_SHARED);
    reduce(m, ws->mix, (int64_t)T * m->c.hidden); // routed (through fc2, linear) and shared parts at once
}

// logits: [rows, vocab] = h: [rows, D] @ lm_head^T. Split: each rank's
// vocabulary part into ws.lg, all-gathered, max_rows rows at a time.
static void lm_head(struct nh_model *m, float *logits, const float *h, int rows) {
    const struct backend_ops *op = m->be->ops;
    int V = m->c.vocab, D = m->c.hidden;
    if (m->tp == 1) {
        op->matmul(m->be, logits, h, &m->lm_head, rows);
        tick(m, T_HEAD);
        return;
    }
    for (int i = 0; i < rows; i += m->max_rows) {
        int n = MIN(m->max_rows, rows - i);
        op->matmul(m->be, m->ws.lg, h + (int64_t)i * D, &m->lm_head, n);
        tick(m, T_HEAD);
        op->all_gather(m->be, logits + (int64_t)i * V, V, m->ws.lg, m->vocab_part, n);
        tick(m, T_COMM);
    }
}

static void nh_forward(struct model *base, const struct batch *b, struct caches *c, float *logits, int all_rows) {
    struct nh_model *m = (struct nh_model *)base;
    struct backend *be = m->be;
    const struct backend_ops *op = be->ops;
    struct nh_ws *ws = &m->ws;
    int T = b->num_tokens, D = m->c.hidden;
    float eps = m->c.eps;
    tick(m, -1);
    op->embed(be, ws->res, &m->embed, b->input_ids, T);
    tick(m, T_EMBED);
    for (int i = 0; i < m->c.num_layers; i++) {
        struct nh_layer *ly = &m->layers[i];
        if (i == 0) op->rmsnorm(be, ws->x, ws->res, ly->norm_w, T, D, eps);
        else op->add_rmsnorm(be, ws->res, ws->mix, ws->x, ly->norm_w, T, D, eps); // h += previous mixer
        tick(m, T_NORM);
        switch (ly->kind) {
        case NH_MAMBA: mamba_fwd(m, i, &ly->m, b, c); break;
        case NH_ATTN: attn_fwd(m, i, &ly->a, b, c); break;
        case NH_MLP:
            mlp(m, ws->mix, ws->x, &ly->f.up, &ly->f.down, T);
            tick(m, T_MLP);
            reduce(m, ws->mix, (int64_t)T * D);
            break;
        case NH_MOE: moe_fwd(m, &ly->e, b); break;
        }
    }
    op->add(be, ws->res, ws->mix, (int64_t)T * D);
    int rows = all_rows ? T : b->num_sample;
    if (!rows) return;
    float *h = ws->res; // all rows (a test hook): normalize the residual in place
    if (!all_rows) {
        op->gather_rows(be, ws->sel, ws->res, b->sample_rows, rows, D);
        h = ws->sel;
    }
    op->rmsnorm(be, h, h, m->norm_f, rows, D, eps);
    lm_head(m, logits, h, rows);
    tick_report(m, T);
}

const struct model_ops nemotron_h_ops = {
    .arch = "NemotronHForCausalLM",
    .load = nh_load,
    .free = nh_free,
    .forward = nh_forward,
};
