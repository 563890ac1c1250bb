// mamba2.c - Mamba2ForCausalLM: a stack of Mamba2 mixer blocks (the
// layer library's, as NemotronH's M layers) between the embedding and the
// final norm. The residual stays fp32 (residual_in_fp32 or not: fp32 is
// what the engine keeps). transformers' gated norm spans all heads at once
// (MambaRMSNormGated without groups), so the mixer's norm has one group.
#include <math.h>

#include "core/common.h"
#include "models/config_reader.h"
#include "models/layers.h"

extern const struct model_ops mamba2_ops;

struct m2_config {
    int vocab, hidden, layers, tie, num_eos;
    int32_t eos[8];
    float eps;
    struct mamba2_cfg mc;
};

static int parse(const struct cfg_reader *r, struct m2_config *c) {
    struct mamba2_cfg *m = &c->mc;
    int expand, bias;
    TRY(cfg_int(r, CFG_KEYS("vocab_size"), 1, CFG_MAX_VOCAB, &c->vocab));
    TRY(cfg_int(r, CFG_KEYS("hidden_size"), 1, CFG_MAX_HIDDEN, &c->hidden));
    TRY(cfg_int(r, CFG_KEYS("num_hidden_layers"), 1, CFG_MAX_LAYERS, &c->layers));
    TRY(cfg_float(r, CFG_KEYS("layer_norm_epsilon"), CFG_POSITIVE(1), &c->eps));
    TRY(cfg_int(r, CFG_KEYS("num_heads"), 1, CFG_MAX_HEADS, &m->heads));
    TRY(cfg_int(r, CFG_KEYS("head_dim"), 1, CFG_MAX_HEAD_DIM, &m->head_dim));
    TRY(cfg_int(r, CFG_KEYS("state_size"), 1, CFG_MAX_HEAD_DIM, &m->state));
    TRY(cfg_int(r, CFG_KEYS("n_groups"), 1, m->heads, &m->groups));
    TRY(cfg_int(r, CFG_KEYS("conv_kernel"), 1, CFG_MAX_CONV, &m->conv_kernel));
    TRY(cfg_int(r, CFG_KEYS("chunk_size"), 1, CFG_MAX_CHUNK, &m->chunk_size));
    TRY(cfg_int(r, CFG_KEYS("expand"), 1, 64, &expand));
    TRY(cfg_bool(r, CFG_KEYS("use_conv_bias"), &m->conv_bias));
    TRY(cfg_bool(r, CFG_KEYS("use_bias"), &bias));
    TRY(cfg_bool_opt(r, CFG_KEYS("tie_word_embeddings"), 0, &c->tie));
    if (bias) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: Mamba projections with bias (use_bias) are not supported", r->what);
    if ((int64_t)expand * c->hidden != (int64_t)m->heads * m->head_dim)
        return vllm_err(VLLM_ERR_FORMAT, "%s: hidden_size * expand (%lld) must equal num_heads * head_dim (%lld)",
                        r->what, (long long)expand * c->hidden, (long long)m->heads * m->head_dim);
    if (m->heads % m->groups)
        return vllm_err(VLLM_ERR_FORMAT, "%s: num_heads (%d) is not a multiple of n_groups (%d)", r->what, m->heads,
                        m->groups);
    const char *act = NULL;
    TRY(cfg_str_opt(r, CFG_KEYS("hidden_act"), &act));
    if (act && strcmp(act, "silu"))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu)", r->what, act);
    m->dt_min = 0.0f;
    m->dt_max = INFINITY;
    const json_t *lim = cfg_get(r, CFG_KEYS("time_step_limit"));
    if (lim && !json_is_null(lim)) {
        double lo, hi;
        if (!json_is_array(lim) || json_array_size(lim) != 2)
            return vllm_err(VLLM_ERR_FORMAT, "%s: \"time_step_limit\" must be [min, max]", r->what);
        TRY(cfg_number(r, "time_step_limit[0]", json_array_get(lim, 0), CFG_CLOSED(0, INFINITY), &lo));
        TRY(cfg_number(r, "time_step_limit[1]", json_array_get(lim, 1), CFG_CLOSED(lo, INFINITY), &hi));
        m->dt_min = (float)lo, m->dt_max = (float)hi;
    }
    m->norm_groups = 1;
    TRY(cfg_limit(r, "vocab_size * hidden_size", cfg_mul(c->vocab, c->hidden), CFG_MAX_MATRIX));
    return cfg_eos(r, c->vocab, 8, c->eos, &c->num_eos);
}

static int load_weights(struct lm *m, struct loader *l, const void *arg) {
    const struct m2_config *c = arg;
    TRY(lm_load_embed_head(m, l, "backbone.embeddings.weight", "lm_head.weight", c->tie));
    TRY(lm_load_norm(m, l, "backbone.norm_f.weight", &m->norm_f));
    for (int i = 0; i < c->layers; i++) {
        char p[96], n[128];
        snprintf(p, sizeof p, "backbone.layers.%d.", i);
        struct block *b = lm_add_block(m, BLK_MAMBA2);
        snprintf(n, sizeof n, "%smixer.", p);
        int rc = mamba2_load(m, l, n, &c->mc, &b->m);
        snprintf(n, sizeof n, "%snorm.weight", p);
        if (!rc) rc = lm_load_norm(m, l, n, &b->norm_w);
        if (rc) return vllm_err_prefix(rc, "layer %d", i);
    }
    return VLLM_OK;
}

static int m2_load(const char *dir, const json_t *config, const struct model_load_opts *o, struct backend *be,
                   struct model **out) {
    char *what = path_join(dir, "config.json");
    struct cfg_reader r = {config, what};
    struct m2_config *c = xcalloc(1, sizeof *c);
    int rc = json_is_object(config) ? parse(&r, c) : vllm_err(VLLM_ERR_FORMAT, "%s: not a JSON object", what);
    if (!rc && be->tp_size > 1)
        rc = vllm_err(VLLM_ERR_UNSUPPORTED, "%s: Mamba2ForCausalLM's gated norm spans every head: tensor parallelism "
                      "is not supported", what);
    free(what);
    if (rc) {
        free(c);
        return rc;
    }
    struct lm_spec s = {.ops = &mamba2_ops, .arch = "Mamba2ForCausalLM", .config = c, .config_free = free,
                        .hidden = c->hidden, .vocab = c->vocab, .eps = c->eps, .eos = c->eos, .num_eos = c->num_eos,
                        .load_weights = load_weights, .arg = c};
    return lm_load(be, dir, o, &s, out);
}

const struct model_ops mamba2_ops = {.load = m2_load, .free = lm_free, .forward = lm_forward};
