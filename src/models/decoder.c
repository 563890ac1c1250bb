// decoder.c - config and wiring of the pre-norm transformer decoder families
// (decoder.h) over the layer library.
#include "core/common.h"
#include "models/config_reader.h"
#include "models/decoder.h"
#include "models/layers.h"

struct dec_config {
    int vocab, hidden, layers, heads, kv_heads, head_dim, inter, tie, max_position;
    float eps;
    int attn_bias, o_bias, mlp_bias;
    int num_eos;
    int32_t eos[8];
    // MoE (Qwen3-MoE)
    int experts, top_k, moe_inter, norm_topk, sparse_step;
    unsigned char *dense; // [layers]: 1 where the layer's MLP is dense
};

static void dec_config_free(void *p) {
    struct dec_config *c = p;
    if (c) free(c->dense);
    free(c);
}

// Options a model needs that this engine does not implement are errors
// naming them, never a silent approximation.
static int check_unsupported(const struct cfg_reader *r, const struct dec_config *c) {
    const char *act = NULL;
    TRY(cfg_str_opt(r, CFG_KEYS("hidden_act"), &act));
    if (act && strcmp(act, "silu"))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: hidden_act \"%s\" is not supported (silu)", r->what, act);
    int sw = 0;
    TRY(cfg_bool_opt(r, CFG_KEYS("use_sliding_window"), 0, &sw));
    const json_t *w = cfg_get(r, CFG_KEYS("sliding_window"));
    int has_use = cfg_get(r, CFG_KEYS("use_sliding_window")) != NULL;
    if (sw || (!has_use && w && !json_is_null(w)))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: sliding-window attention (sliding_window) is not supported", r->what);
    // transformers requires one entry per layer: a list of another length is not this model's
    const json_t *lt = cfg_get(r, CFG_KEYS("layer_types"));
    if (lt && !json_is_null(lt) && (!json_is_array(lt) || json_array_size(lt) != (size_t)c->layers))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"layer_types\" must list one type per layer (num_hidden_layers %d)",
                        r->what, c->layers);
    for (size_t i = 0; lt && i < json_array_size(lt); i++) {
        const char *s = json_string_value(json_array_get(lt, i));
        if (!s || strcmp(s, "full_attention"))
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: layer_types[%zu] = \"%s\" is not supported (full_attention)",
                            r->what, i, s ? s : "?");
    }
    return VLLM_OK;
}

static int parse_moe(const struct cfg_reader *r, struct dec_config *c) {
    TRY(cfg_int(r, CFG_KEYS("num_experts", "num_local_experts"), 1, CFG_MAX_EXPERTS, &c->experts));
    TRY(cfg_int(r, CFG_KEYS("num_experts_per_tok"), 1, c->experts, &c->top_k));
    TRY(cfg_int(r, CFG_KEYS("moe_intermediate_size"), 1, CFG_MAX_WIDTH, &c->moe_inter));
    TRY(cfg_bool(r, CFG_KEYS("norm_topk_prob"), &c->norm_topk));
    TRY(cfg_int_opt(r, CFG_KEYS("decoder_sparse_step"), 1, CFG_MAX_LAYERS, 1, &c->sparse_step));
    int shared = 0;
    TRY(cfg_int_opt(r, CFG_KEYS("shared_expert_intermediate_size"), 0, CFG_MAX_WIDTH, 0, &shared));
    if (shared) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: shared_expert_intermediate_size is not supported", r->what);
    for (int i = 0; i < c->layers; i++) c->dense[i] = (i + 1) % c->sparse_step != 0;
    const json_t *only = cfg_get(r, CFG_KEYS("mlp_only_layers"));
    if (only && !json_is_null(only) && !json_is_array(only))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"mlp_only_layers\" must be a list of layer indices", r->what);
    for (size_t i = 0; only && i < json_array_size(only); i++) {
        const json_t *v = json_array_get(only, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= c->layers)
            return vllm_err(VLLM_ERR_FORMAT, "%s: mlp_only_layers[%zu] is not a layer index below %d", r->what, i,
                            c->layers);
        c->dense[json_integer_value(v)] = 1;
    }
    return VLLM_OK;
}

static int parse(const struct dec_family *f, const struct cfg_reader *r, struct dec_config *c) {
    TRY(cfg_int(r, CFG_KEYS("vocab_size"), 1, CFG_MAX_VOCAB, &c->vocab));
    TRY(cfg_int(r, CFG_KEYS("hidden_size"), 1, CFG_MAX_HIDDEN, &c->hidden));
    TRY(cfg_int(r, CFG_KEYS("num_hidden_layers"), 1, CFG_MAX_LAYERS, &c->layers));
    TRY(cfg_int(r, CFG_KEYS("num_attention_heads"), 1, CFG_MAX_HEADS, &c->heads));
    TRY(cfg_int_opt(r, CFG_KEYS("num_key_value_heads"), 1, c->heads, c->heads, &c->kv_heads));
    if (c->heads % c->kv_heads)
        return vllm_err(VLLM_ERR_FORMAT, "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                        r->what, c->heads, c->kv_heads);
    if (!cfg_get(r, CFG_KEYS("head_dim")) && c->hidden % c->heads)
        return vllm_err(VLLM_ERR_FORMAT, "%s: no head_dim, and hidden_size (%d) is not a multiple of "
                        "num_attention_heads (%d)", r->what, c->hidden, c->heads);
    TRY(cfg_int_opt(r, CFG_KEYS("head_dim"), 2, CFG_MAX_HEAD_DIM, c->hidden / c->heads, &c->head_dim));
    TRY(cfg_limit(r, "num_attention_heads * head_dim", cfg_mul(c->heads, c->head_dim), CFG_MAX_WIDTH));
    TRY(cfg_int(r, CFG_KEYS("intermediate_size"), 1, CFG_MAX_WIDTH, &c->inter));
    TRY(cfg_float(r, CFG_KEYS("rms_norm_eps"), CFG_POSITIVE(1), &c->eps));
    TRY(cfg_bool_opt(r, CFG_KEYS("tie_word_embeddings"), f->tie_default, &c->tie));
    TRY(cfg_int_opt(r, CFG_KEYS("max_position_embeddings"), 1, CFG_MAX_POSITION, 0, &c->max_position));
    TRY(cfg_limit(r, "vocab_size * hidden_size", cfg_mul(c->vocab, c->hidden), CFG_MAX_MATRIX));
    int ab = 0;
    if (f->attention_bias) TRY(cfg_bool_opt(r, CFG_KEYS("attention_bias"), 0, &ab));
    c->attn_bias = f->qkv_bias || ab;
    c->o_bias = ab;
    if (f->mlp_bias) TRY(cfg_bool_opt(r, CFG_KEYS("mlp_bias"), 0, &c->mlp_bias));
    TRY(cfg_eos(r, c->vocab, 8, c->eos, &c->num_eos));
    TRY(check_unsupported(r, c));
    c->dense = xcalloc(c->layers, 1);
    memset(c->dense, 1, c->layers);
    if (f->moe) TRY(parse_moe(r, c));
    return VLLM_OK;
}

// Heads split whole over the ranks; KV heads split, or replicated when
// fewer than ranks; every width leaves each rank a part.
static int check_tp(const struct cfg_reader *r, const struct dec_config *c, int tp) {
    if (tp == 1) return VLLM_OK;
    if (c->heads % tp)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: num_attention_heads (%d) is not divisible by tensor_parallel_size %d",
                        r->what, c->heads, tp);
    if (c->kv_heads % tp && tp % c->kv_heads)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: num_key_value_heads (%d) and tensor_parallel_size %d: one must "
                        "divide the other", r->what, c->kv_heads, tp);
    if (c->inter < tp || c->vocab < tp || (c->experts && c->moe_inter < tp))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: a width (intermediate_size, moe_intermediate_size or vocab_size) "
                        "is smaller than tensor_parallel_size %d", r->what, tp);
    return VLLM_OK;
}

static const struct mlp_cfg swiglu = {0, ACT_SILU, 1, 0, "up_proj.weight", "gate_proj.weight", "down_proj.weight"};

static int load_layer(struct lm *m, struct loader *l, const struct dec_family *f, const struct dec_config *c, int i) {
    char p[96], n[160];
    snprintf(p, sizeof p, "model.layers.%d.", i);
    struct block *b = lm_add_block(m, BLK_ATTN);
    struct attn_cfg ac = {c->heads, c->kv_heads, c->head_dim, c->attn_bias, c->o_bias, f->qk_norm, c->eps, 0, &m->rope};
    snprintf(n, sizeof n, "%sself_attn.", p);
    TRY(attn_load(m, l, n, &ac, &b->a));
    snprintf(n, sizeof n, "%sinput_layernorm.weight", p);
    TRY(lm_load_norm(m, l, n, &b->norm_w));
    snprintf(n, sizeof n, "%smlp.", p);
    if (c->dense[i]) {
        b = lm_add_block(m, BLK_MLP);
        struct mlp_cfg fc = swiglu;
        fc.inter = c->inter;
        fc.bias = c->mlp_bias;
        TRY(mlp_load(m, l, n, &fc, &b->f));
    } else {
        b = lm_add_block(m, BLK_MOE);
        struct moe_cfg ec = {
            .route = {ROUTE_SOFTMAX_TOPK, c->experts, c->top_k, 1, 1, c->norm_topk, 1.0f},
            .inter = c->moe_inter, .gated = 1, .act = ACT_SILU,
            .names = {"experts.%d.up_proj.weight", "experts.%d.gate_proj.weight", "experts.%d.down_proj.weight",
                      "experts.gate_up_proj", "experts.down_proj"}};
        TRY(moe_load(m, l, n, &ec, &b->e));
    }
    snprintf(n, sizeof n, "%spost_attention_layernorm.weight", p);
    return lm_load_norm(m, l, n, &b->norm_w);
}

struct dec_load_arg {
    const struct dec_family *f;
    const struct dec_config *c;
};

static int load_weights(struct lm *m, struct loader *l, const void *arg) {
    const struct dec_family *f = ((const struct dec_load_arg *)arg)->f;
    const struct dec_config *c = ((const struct dec_load_arg *)arg)->c;
    TRY(lm_load_embed_head(m, l, "model.embed_tokens.weight", "lm_head.weight", c->tie));
    TRY(lm_load_norm(m, l, "model.norm.weight", &m->norm_f));
    TRY(rope_upload(&m->rope, l, m->max_seq_len));
    for (int i = 0; i < c->layers; i++) {
        int rc = load_layer(m, l, f, c, i);
        if (rc) return vllm_err_prefix(rc, "layer %d", i);
    }
    return VLLM_OK;
}

int dec_load(const struct dec_family *f, const struct model_ops *ops, const char *dir, const json_t *config,
             const struct model_load_opts *o, struct backend *be, struct model **out) {
    char *what = path_join(dir, "config.json");
    struct cfg_reader r = {config, what};
    struct dec_config *c = xcalloc(1, sizeof *c);
    struct rope rope;
    int rc = json_is_object(config) ? parse(f, &r, c) : vllm_err(VLLM_ERR_FORMAT, "%s: not a JSON object", what);
    if (!rc) rc = check_tp(&r, c, be->tp_size);
    if (!rc) rc = rope_parse(&r, c->head_dim, c->max_position, &rope);
    if (!rc && be->tp_size > 1 && !be->ops->all_reduce)
        rc = vllm_err(VLLM_ERR_UNSUPPORTED, "backend %s has no collectives: it cannot run tensor_parallel_size %d",
                      be->ops->name, be->tp_size);
    free(what);
    if (rc) {
        dec_config_free(c);
        return rc;
    }
    const char *named = json_string_value(json_array_get(json_object_get(config, "architectures"), 0));
    const char *arch = named ? model_arch_name(named) : NULL;
    struct dec_load_arg a = {f, c};
    struct lm_spec s = {.ops = ops, .arch = arch ? arch : f->arch, .config = c, .config_free = dec_config_free,
                        .hidden = c->hidden, .vocab = c->vocab, .max_position = c->max_position, .eps = c->eps,
                        .eos = c->eos, .num_eos = c->num_eos, .rope = rope, .load_weights = load_weights, .arg = &a};
    return lm_load(be, dir, o, &s, out);
}
