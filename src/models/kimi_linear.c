// kimi_linear.c - KimiLinearForCausalLM (Moonshot's Kimi-Linear): its config
// and its layer order over the layer library. Each layer is two blocks: a
// token mixer, KDA (Kimi Delta Attention, linear) or MLA (multi-head latent
// attention, NoPE), then a SwiGLU MLP (dense) or an MoE (sigmoid router with
// correction bias and grouped top-k, SwiGLU experts, a shared expert).
//
// Config keys as the Hub's config.json and transformers 5 write them; every
// value the model needs is required, an option this engine lacks is an error
// naming its key.
#include "core/common.h"
#include "models/config_reader.h"
#include "models/layers.h"

#define KEYS CFG_KEYS
#define KDA_CHUNK 64 // fla's chunk_kda chunk: state checkpoints sit at its multiples

extern const struct model_ops kimi_linear_ops;

struct kl_config {
    int vocab, hidden, layers, tie, max_position, num_eos;
    int32_t eos[8];
    float eps;
    unsigned char *kda, *moe; // [layers]: 1 where the mixer is KDA / the FFN an MoE
    int k_heads, k_head_dim, k_conv;                 // KDA
    int heads, nope, rope, v_dim, rank, q_lora;      // MLA
    int inter, moe_inter, experts, top_k, n_group, topk_group, norm_topk, shared; // MLP, MoE
    float routed_scale;
};

static void kl_config_free(void *p) {
    struct kl_config *c = p;
    if (c) free(c->kda), free(c->moe);
    free(c);
}

static int count(const unsigned char *v, int n) {
    int k = 0;
    for (int i = 0; i < n; i++) k += v[i];
    return k;
}

// A list of 1-indexed layer numbers (linear_attn_config's kda_layers /
// full_attn_layers): marks[i - 1] = val.
static int parse_index_list(const struct cfg_reader *r, const json_t *v, const char *key, int n, unsigned char *seen,
                            unsigned char *marks, unsigned char val) {
    if (!json_is_array(v))
        return vllm_err(VLLM_ERR_FORMAT, "%s: linear_attn_config.%s must be a list of layer numbers", r->what, key);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        json_int_t k = json_is_integer(e) ? json_integer_value(e) : 0;
        if (k < 1 || k > n || seen[k - 1])
            return vllm_err(VLLM_ERR_FORMAT, "%s: linear_attn_config.%s[%zu] is not a new layer number in [1, %d]",
                            r->what, key, i, n);
        seen[k - 1] = 1;
        marks[k - 1] = val;
    }
    return VLLM_OK;
}

// layer_types ("linear_attention" / "full_attention"), else
// linear_attn_config's kda_layers and full_attn_layers (1-indexed).
static int parse_mixers(const struct cfg_reader *r, const struct cfg_reader *la, struct kl_config *c) {
    const json_t *lt = cfg_get(r, KEYS("layer_types"));
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || json_array_size(lt) == 0 || json_array_size(lt) > CFG_MAX_LAYERS)
            return vllm_err(VLLM_ERR_FORMAT, "%s: \"layer_types\" must be a list of 1 to %d layer types", r->what,
                            CFG_MAX_LAYERS);
        c->layers = (int)json_array_size(lt);
        c->kda = xcalloc(c->layers, 1);
        for (int i = 0; i < c->layers; i++) {
            const char *s = json_string_value(json_array_get(lt, i));
            if (s && !strcmp(s, "linear_attention")) c->kda[i] = 1;
            else if (!s || strcmp(s, "full_attention"))
                return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: layer_types[%d] = \"%.64s\" is not linear_attention or "
                                "full_attention", r->what, i, s ? s : "?");
        }
        return VLLM_OK;
    }
    if (!la->j)
        return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"layer_types\" (or \"linear_attn_config\")", r->what);
    TRY(cfg_int(r, KEYS("num_hidden_layers"), 1, CFG_MAX_LAYERS, &c->layers));
    const json_t *kl = cfg_get(la, KEYS("kda_layers")), *fl = cfg_get(la, KEYS("full_attn_layers"));
    if (!kl || !fl)
        return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"linear_attn_config.%s\"", r->what,
                        kl ? "full_attn_layers" : "kda_layers");
    c->kda = xcalloc(c->layers, 1);
    unsigned char *seen = xcalloc(c->layers, 1);
    int rc = parse_index_list(r, kl, "kda_layers", c->layers, seen, c->kda, 1);
    if (!rc) rc = parse_index_list(r, fl, "full_attn_layers", c->layers, seen, c->kda, 0);
    if (!rc && count(seen, c->layers) != c->layers)
        rc = vllm_err(VLLM_ERR_FORMAT, "%s: linear_attn_config's kda_layers and full_attn_layers do not cover the "
                      "%d layers", r->what, c->layers);
    free(seen);
    return rc;
}

// mlp_layer_types ("dense" / "sparse"), else first_k_dense_replace (and moe_layer_freq).
static int parse_ffns(const struct cfg_reader *r, struct kl_config *c) {
    c->moe = xcalloc(c->layers, 1);
    const json_t *mt = cfg_get(r, KEYS("mlp_layer_types"));
    if (mt && !json_is_null(mt)) {
        if (!json_is_array(mt) || (int)json_array_size(mt) != c->layers)
            return vllm_err(VLLM_ERR_FORMAT, "%s: \"mlp_layer_types\" must list one type per layer (%d)", r->what,
                            c->layers);
        for (int i = 0; i < c->layers; i++) {
            const char *s = json_string_value(json_array_get(mt, i));
            if (s && !strcmp(s, "sparse")) c->moe[i] = 1;
            else if (!s || strcmp(s, "dense"))
                return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: mlp_layer_types[%d] = \"%.64s\" is not dense or sparse",
                                r->what, i, s ? s : "?");
        }
        return VLLM_OK;
    }
    int first = 0, freq = 1;
    TRY(cfg_int(r, KEYS("first_k_dense_replace"), 0, CFG_MAX_LAYERS, &first));
    TRY(cfg_int_opt(r, KEYS("moe_layer_freq"), 1, CFG_MAX_LAYERS, 1, &freq));
    for (int i = 0; i < c->layers; i++) c->moe[i] = i >= first && i % freq == 0;
    return VLLM_OK;
}

// A KDA size from linear_attn_config or its flat spelling (transformers 5).
static int kda_int(const struct cfg_reader *r, const struct cfg_reader *la, const char *nested, const char *flat,
                   int64_t max, int *out) {
    if (la->j && cfg_get(la, (const char *const[]){nested, NULL})) {
        char what[300];
        snprintf(what, sizeof what, "%s: linear_attn_config", r->what);
        struct cfg_reader sub = {la->j, what};
        return cfg_int(&sub, (const char *const[]){nested, NULL}, 1, max, out);
    }
    return cfg_int(r, (const char *const[]){flat, NULL}, 1, max, out);
}

static int parse_kda(const struct cfg_reader *r, const struct cfg_reader *la, struct kl_config *c) {
    TRY(kda_int(r, la, "num_heads", "linear_num_heads", CFG_MAX_HEADS, &c->k_heads));
    TRY(kda_int(r, la, "head_dim", "linear_head_dim", CFG_MAX_HEAD_DIM, &c->k_head_dim));
    TRY(kda_int(r, la, "short_conv_kernel_size", "linear_conv_kernel_dim", CFG_MAX_CONV, &c->k_conv));
    // separate value heads / dims (a later transformers spelling) must match the keys'
    int vh = c->k_heads, vd = c->k_head_dim;
    TRY(cfg_int_opt(r, KEYS("linear_attn_value_heads"), 1, CFG_MAX_HEADS, c->k_heads, &vh));
    TRY(cfg_int_opt(r, KEYS("linear_attn_value_head_dim"), 1, CFG_MAX_HEAD_DIM, c->k_head_dim, &vd));
    if (vh != c->k_heads || vd != c->k_head_dim)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: linear_attn_value_heads / linear_attn_value_head_dim other than "
                        "the key heads and head_dim are not supported", r->what);
    const json_t *lb = cfg_get(r, KEYS("forget_gate_lower_bound"));
    const json_t *glb = la->j ? cfg_get(la, KEYS("gate_lower_bound", "lower_bound")) : NULL;
    const json_t *safe = la->j ? cfg_get(la, KEYS("safe_gate")) : NULL;
    if ((lb && !json_is_null(lb)) || (glb && !json_is_null(glb)) || json_is_true(safe))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: a lower-bounded KDA forget gate (forget_gate_lower_bound, "
                        "linear_attn_config.gate_lower_bound / safe_gate) is not supported", r->what);
    int full = 0;
    TRY(cfg_bool_opt(r, KEYS("use_full_rank_output_gate"), 0, &full));
    if (full) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: use_full_rank_output_gate is not supported", r->what);
    int64_t HK = cfg_mul(c->k_heads, c->k_head_dim);
    TRY(cfg_limit(r, "the KDA width 3*num_heads*head_dim + num_heads", cfg_add(cfg_mul(3, HK), c->k_heads),
                  CFG_MAX_WIDTH));
    TRY(cfg_limit(r, "the KDA projections (their width * hidden_size)", cfg_mul(cfg_mul(4, HK), c->hidden),
                  CFG_MAX_MATRIX));
    return cfg_limit(r, "the KDA state per sequence num_heads*head_dim^2", cfg_mul(HK, c->k_head_dim), CFG_MAX_STATE);
}

static int parse_mla(const struct cfg_reader *r, struct kl_config *c) {
    TRY(cfg_int(r, KEYS("num_attention_heads"), 1, CFG_MAX_HEADS, &c->heads));
    // num_key_value_heads is not read: kv_b_proj makes every head's K and V from the one latent
    TRY(cfg_int(r, KEYS("kv_lora_rank"), 1, CFG_MAX_HEAD_DIM, &c->rank));
    TRY(cfg_int_opt(r, KEYS("q_lora_rank"), 1, CFG_MAX_HIDDEN, 0, &c->q_lora));
    if (!cfg_get(r, KEYS("q_lora_rank")))
        return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"q_lora_rank\" (null or a rank)", r->what);
    TRY(cfg_int(r, KEYS("qk_nope_head_dim"), 1, CFG_MAX_HEAD_DIM, &c->nope));
    const json_t *rp = cfg_get(r, KEYS("qk_rope_head_dim"));
    if (!rp) return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"qk_rope_head_dim\"", r->what);
    TRY(cfg_int_opt(r, KEYS("qk_rope_head_dim"), 0, CFG_MAX_HEAD_DIM, 0, &c->rope));
    TRY(cfg_int(r, KEYS("v_head_dim"), 1, CFG_MAX_HEAD_DIM, &c->v_dim));
    // Kimi-Linear's MLA is NoPE: the rope part of q and k is used unrotated
    int nope = 1;
    TRY(cfg_bool_opt(r, KEYS("mla_use_nope"), 1, &nope));
    if (!nope && c->rope)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: mla_use_nope false (rotary MLA) is not supported", r->what);
    int64_t qw = cfg_mul(c->heads, cfg_add(c->nope, c->rope));
    TRY(cfg_limit(r, "the MLA q width num_attention_heads*(qk_nope_head_dim + qk_rope_head_dim)", qw, CFG_MAX_WIDTH));
    TRY(cfg_limit(r, "the MLA q projection", cfg_mul(qw, c->q_lora ? c->q_lora : c->hidden), CFG_MAX_MATRIX));
    return cfg_limit(r, "kv_b_proj num_attention_heads*(qk_nope_head_dim + v_head_dim)*kv_lora_rank",
                     cfg_mul(cfg_mul(c->heads, cfg_add(c->nope, c->v_dim)), c->rank), CFG_MAX_MATRIX);
}

static int parse_moe(const struct cfg_reader *r, struct kl_config *c) {
    TRY(cfg_int(r, KEYS("num_experts", "num_local_experts", "n_routed_experts"), 1, CFG_MAX_EXPERTS, &c->experts));
    TRY(cfg_int(r, KEYS("num_experts_per_token", "num_experts_per_tok"), 1, c->experts, &c->top_k));
    TRY(cfg_int(r, KEYS("moe_intermediate_size"), 1, CFG_MAX_WIDTH, &c->moe_inter));
    TRY(cfg_bool(r, KEYS("moe_renormalize", "norm_topk_prob"), &c->norm_topk));
    TRY(cfg_int(r, KEYS("num_expert_group", "n_group"), 1, c->experts, &c->n_group));
    TRY(cfg_int(r, KEYS("topk_group"), 1, c->n_group, &c->topk_group));
    TRY(cfg_float(r, KEYS("routed_scaling_factor"), CFG_POSITIVE(1e4), &c->routed_scale));
    TRY(cfg_int_opt(r, KEYS("num_shared_experts", "n_shared_experts"), 0, 64, 0, &c->shared));
    // use_grouped_topk false asks for one top-k over every expert, which
    // transformers' router does not do (it always groups): the same only with one group
    int grouped = 1;
    TRY(cfg_bool_opt(r, KEYS("use_grouped_topk"), 1, &grouped));
    if (!grouped && c->n_group > 1)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: use_grouped_topk false with num_expert_group %d > 1 is ambiguous "
                        "(transformers groups anyway): not supported", r->what, c->n_group);
    const char *fn = NULL;
    TRY(cfg_str_opt(r, KEYS("moe_router_activation_func", "scoring_func"), &fn));
    if (fn && strcmp(fn, "sigmoid"))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: moe_router_activation_func \"%.64s\" is not supported (sigmoid)",
                        r->what, fn);
    if (c->experts % c->n_group || c->experts / c->n_group < 2)
        return vllm_err(VLLM_ERR_FORMAT, "%s: num_experts (%d) must split into num_expert_group (%d) groups of >= 2",
                        r->what, c->experts, c->n_group);
    if (c->top_k > c->topk_group * (c->experts / c->n_group))
        return vllm_err(VLLM_ERR_FORMAT, "%s: num_experts_per_token (%d) exceeds the experts of topk_group groups",
                        r->what, c->top_k);
    TRY(cfg_limit(r, "moe_intermediate_size*num_shared_experts", cfg_mul(c->moe_inter, c->shared), CFG_MAX_WIDTH));
    return cfg_limit(r, "the experts of one layer num_experts*moe_intermediate_size*hidden_size",
                     cfg_mul(c->experts, cfg_mul(2 * (int64_t)c->moe_inter, c->hidden)), CFG_MAX_LAYER_PARAMS);
}

// Options of the architecture this engine does not implement.
static int check_unsupported(const struct cfg_reader *r) {
    const char *act = NULL;
    TRY(cfg_str_opt(r, KEYS("hidden_act"), &act));
    if (act && strcmp(act, "silu"))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: hidden_act \"%.64s\" is not supported (silu)", r->what, act);
    int arb = 0;
    TRY(cfg_int_opt(r, KEYS("attn_res_block_size"), 0, 1 << 30, 0, &arb));
    if (arb > 0) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: attn_res_block_size %d > 0 is not supported", r->what, arb);
    // later Kimi variants' options: present and set (not false / null / 0), they change the model
    static const char *const later[] = {"mla_use_output_gate", "routed_expert_hidden_size", "latent_moe_use_norm",
                                        "use_full_rank_gate", "swiglu_limit", "mhc"};
    for (size_t i = 0; i < sizeof later / sizeof later[0]; i++) {
        const json_t *v = cfg_get(r, (const char *const[]){later[i], NULL});
        if (v && !json_is_null(v) && !json_is_false(v) && !(json_is_integer(v) && !json_integer_value(v)))
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: \"%s\" is not supported", r->what, later[i]);
    }
    int bias = 0;
    TRY(cfg_bool_opt(r, KEYS("attention_bias"), 0, &bias));
    if (bias) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: attention_bias is not supported", r->what);
    return VLLM_OK;
}

static int parse_parts(const struct cfg_reader *r, struct kl_config *c) {
    TRY(check_unsupported(r));
    TRY(cfg_int(r, KEYS("vocab_size"), 1, CFG_MAX_VOCAB, &c->vocab));
    TRY(cfg_int(r, KEYS("hidden_size"), 1, CFG_MAX_HIDDEN, &c->hidden));
    TRY(cfg_limit(r, "the embedding size vocab_size*hidden_size", cfg_mul(c->vocab, c->hidden), CFG_MAX_MATRIX));
    TRY(cfg_float(r, KEYS("rms_norm_eps"), CFG_POSITIVE(1), &c->eps));
    const json_t *laj = cfg_get(r, KEYS("linear_attn_config"));
    if (laj && !json_is_null(laj) && !json_is_object(laj))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"linear_attn_config\" must be an object", r->what);
    struct cfg_reader la = {laj && json_is_object(laj) ? laj : NULL, r->what};
    TRY(parse_mixers(r, &la, c));
    TRY(parse_ffns(r, c));
    if (count(c->kda, c->layers)) TRY(parse_kda(r, &la, c));
    if (count(c->kda, c->layers) < c->layers) TRY(parse_mla(r, c));
    if (count(c->moe, c->layers) < c->layers) {
        TRY(cfg_int(r, KEYS("intermediate_size"), 1, CFG_MAX_WIDTH, &c->inter));
        TRY(cfg_limit(r, "intermediate_size*hidden_size", cfg_mul(c->inter, c->hidden), CFG_MAX_MATRIX));
    }
    if (count(c->moe, c->layers)) TRY(parse_moe(r, c));
    TRY(cfg_bool_opt(r, KEYS("tie_word_embeddings"), 0, &c->tie));
    TRY(cfg_int_opt(r, KEYS("max_position_embeddings", "model_max_length"), 1, CFG_MAX_POSITION, 0, &c->max_position));
    return cfg_eos(r, c->vocab, 8, c->eos, &c->num_eos);
}

// ----------------------------------------------------------------- model --

static int load_layer(struct lm *m, struct loader *l, const struct kl_config *c, int i) {
    char p[128], n[192];
    snprintf(p, sizeof p, "model.layers.%d.", i);
    struct block *b;
    snprintf(n, sizeof n, "%sself_attn.", p);
    if (c->kda[i]) {
        b = lm_add_block(m, BLK_KDA);
        struct kda_cfg kc = {c->k_heads, c->k_head_dim, c->k_conv, KDA_CHUNK};
        TRY(kda_load(m, l, n, &kc, &b->k));
    } else {
        b = lm_add_block(m, BLK_MLA);
        // the latent norms are RMSNorms of transformers' default epsilon, not rms_norm_eps
        struct mla_cfg ac = {c->heads, c->nope, c->rope, c->v_dim, c->rank, c->q_lora, 1e-6f};
        TRY(mla_load(m, l, n, &ac, &b->l));
    }
    snprintf(n, sizeof n, "%sinput_layernorm.weight", p);
    TRY(lm_load_norm(m, l, n, &b->norm_w));
    // transformers 5 saves every FFN under block_sparse_moe; the Hub's dense layers sit under mlp
    snprintf(n, sizeof n, "%smlp.gate_proj.weight", p);
    snprintf(n, sizeof n, "%s%s", p, loader_has(l, n) ? "mlp." : "block_sparse_moe.");
    struct mlp_cfg swiglu = {c->inter, ACT_SILU, 1, 0, "up_proj.weight", "gate_proj.weight", "down_proj.weight"};
    if (c->moe[i]) {
        b = lm_add_block(m, BLK_MOE);
        struct moe_cfg ec = {
            .route = {ROUTE_SIGMOID_GROUPED, c->experts, c->top_k, c->n_group, c->topk_group, c->norm_topk,
                      c->routed_scale},
            .inter = c->moe_inter, .gated = 1, .act = ACT_SILU, .correction_bias = 1,
            .names = {"experts.%d.w3.weight", "experts.%d.w1.weight", "experts.%d.w2.weight", "experts.gate_up_proj",
                      "experts.down_proj"},
            .shared = swiglu};
        ec.shared.inter = c->moe_inter * c->shared;
        TRY(moe_load(m, l, n, &ec, &b->e));
    } else {
        b = lm_add_block(m, BLK_MLP);
        TRY(mlp_load(m, l, n, &swiglu, &b->f));
    }
    snprintf(n, sizeof n, "%spost_attention_layernorm.weight", p);
    return lm_load_norm(m, l, n, &b->norm_w);
}

static int load_weights(struct lm *m, struct loader *l, const void *arg) {
    const struct kl_config *c = arg;
    TRY(lm_load_embed_head(m, l, "model.embed_tokens.weight", "lm_head.weight", c->tie));
    TRY(lm_load_norm(m, l, "model.norm.weight", &m->norm_f));
    for (int i = 0; i < c->layers; i++) {
        int rc = load_layer(m, l, c, i);
        if (rc) return vllm_err_prefix(rc, "layer %d", i);
    }
    return VLLM_OK;
}

// Tensor parallelism splits KDA and MLA heads whole (docs/TENSOR_PARALLEL.md);
// MLP and expert widths split unevenly but must leave every rank a part.
static int check_tp(const struct kl_config *c, const struct backend *be, const char *what) {
    int tp = be->tp_size, any_kda = count(c->kda, c->layers), any_moe = count(c->moe, c->layers);
    const char *why = "tensor_parallel_size";
    if (tp == 1) return VLLM_OK;
    if (!be->ops->all_reduce || !be->ops->all_gather)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "backend %s has no collectives: it cannot run %s %d", be->ops->name, why, tp);
    if (any_kda && c->k_heads % tp)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: linear_attn_config.num_heads (%d) is not divisible by %s %d", what,
                        c->k_heads, why, tp);
    if (any_kda < c->layers && c->heads % tp)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: num_attention_heads (%d) is not divisible by %s %d", what, c->heads,
                        why, tp);
    struct {
        int on, n;
        const char *key;
    } widths[] = {{1, c->vocab, "vocab_size"},
                  {any_moe < c->layers, c->inter, "intermediate_size"},
                  {any_moe > 0, c->moe_inter, "moe_intermediate_size"}};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i].on && widths[i].n < tp)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: %s (%d) is smaller than %s %d: a rank would hold none of it",
                            what, widths[i].key, widths[i].n, why, tp);
    return VLLM_OK;
}

static int kl_load(const char *dir, const json_t *config, const struct model_load_opts *o, struct backend *be,
                   struct model **out) {
    struct kl_config *c = xcalloc(1, sizeof *c);
    char *what = path_join(dir, "config.json");
    int rc = json_is_object(config) ? VLLM_OK : vllm_err(VLLM_ERR_FORMAT, "%s: not a JSON object", what);
    struct cfg_reader r = {config, what};
    if (!rc) rc = parse_parts(&r, c);
    if (!rc) rc = check_tp(c, be, what);
    free(what);
    if (rc) {
        kl_config_free(c);
        return rc;
    }
    struct lm_spec s = {.ops = &kimi_linear_ops, .arch = "KimiLinearForCausalLM", .config = c,
                        .config_free = kl_config_free, .hidden = c->hidden, .vocab = c->vocab,
                        .max_position = c->max_position, .eps = c->eps, .eos = c->eos, .num_eos = c->num_eos,
                        .keep_fp32 = "e_score_correction_bias", // fp32 in a bf16 model, as transformers keeps it
                        .load_weights = load_weights, .arg = c};
    return lm_load(be, dir, o, &s, out);
}

const struct model_ops kimi_linear_ops = {
    .load = kl_load,
    .free = lm_free,
    .forward = lm_forward,
};
