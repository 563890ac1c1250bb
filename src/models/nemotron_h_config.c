// nemotron_h_config.c - config.json of NemotronHForCausalLM.
//
// Key names changed over time; each value is read from the first alias
// present. A key the layers present need is an error when missing: a silent
// default would load a different model than the checkpoint's.
#include <math.h>

#include "core/common.h"
#include "core/json.h"
#include "models/nemotron_h.h"

struct reader {
    const json_t *j;
    const char *what;
};

static int get_int(struct reader *r, const char *const *keys, int min, int *out) {
    json_t *v = json_get_alias(r->j, keys);
    if (!v) return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"%s\"", r->what, keys[0]);
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > (1 << 30))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" must be an integer >= %d", r->what, keys[0], min);
    *out = (int)json_integer_value(v);
    return VLLM_OK;
}

static int get_float(struct reader *r, const char *const *keys, float *out) {
    json_t *v = json_get_alias(r->j, keys);
    double d;
    if (!v) return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"%s\"", r->what, keys[0]);
    if (json_as_double(v, &d)) return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" must be a number", r->what, keys[0]);
    *out = (float)d;
    return VLLM_OK;
}

static int get_bool(struct reader *r, const char *const *keys, int *out) {
    json_t *v = json_get_alias(r->j, keys);
    if (!v) return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"%s\"", r->what, keys[0]);
    if (!json_is_boolean(v)) return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" must be true or false", r->what, keys[0]);
    *out = json_is_true(v);
    return VLLM_OK;
}

#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})

static int parse_layers(struct reader *r, struct nh_config *c) {
    json_t *list = json_object_get(r->j, "layers_block_type");
    json_t *pat = json_object_get(r->j, "hybrid_override_pattern");
    if (list && !json_is_null(list)) {
        if (!json_is_array(list) || json_array_size(list) == 0)
            return vllm_err(VLLM_ERR_FORMAT, "%s: \"layers_block_type\" must be a non-empty list", r->what);
        c->num_layers = (int)json_array_size(list);
        c->kinds = xcalloc(c->num_layers, sizeof *c->kinds);
        for (int i = 0; i < c->num_layers; i++) {
            const char *s = json_string_value(json_array_get(list, i));
            if (!s) return vllm_err(VLLM_ERR_FORMAT, "%s: layers_block_type[%d] is not a string", r->what, i);
            if (!strcmp(s, "mamba") || !strcmp(s, "linear_attention")) c->kinds[i] = NH_MAMBA;
            else if (!strcmp(s, "attention") || !strcmp(s, "full_attention")) c->kinds[i] = NH_ATTN;
            else if (!strcmp(s, "mlp")) c->kinds[i] = NH_MLP;
            else if (!strcmp(s, "moe")) c->kinds[i] = NH_MOE;
            else return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: layers_block_type[%d] = \"%s\" is not mamba, "
                                 "linear_attention, attention, full_attention, mlp or moe", r->what, i, s);
        }
    } else if (pat && json_is_string(pat) && json_string_length(pat) > 0) {
        const char *s = json_string_value(pat);
        c->num_layers = (int)strlen(s);
        c->kinds = xcalloc(c->num_layers, sizeof *c->kinds);
        for (int i = 0; i < c->num_layers; i++) {
            switch (s[i]) {
            case 'M': c->kinds[i] = NH_MAMBA; break;
            case '*': c->kinds[i] = NH_ATTN; break;
            case '-': c->kinds[i] = NH_MLP; break;
            case 'E': c->kinds[i] = NH_MOE; break;
            default:
                return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: hybrid_override_pattern[%d] = '%c' is not M, *, - or E",
                                r->what, i, s[i]);
            }
        }
    } else {
        return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"layers_block_type\" (or \"hybrid_override_pattern\")",
                        r->what);
    }
    json_t *nl = json_object_get(r->j, "num_hidden_layers");
    if (json_is_integer(nl) && json_integer_value(nl) != c->num_layers)
        fprintf(stderr, "vllm: warning: %s: num_hidden_layers (%lld) differs from the %d layer types; using the types\n",
                r->what, (long long)json_integer_value(nl), c->num_layers);
    return VLLM_OK;
}

static int has_kind(const struct nh_config *c, enum nh_kind k) {
    for (int i = 0; i < c->num_layers; i++)
        if (c->kinds[i] == k) return 1;
    return 0;
}

static int check_act(struct reader *r, const char *key, const char *want) {
    json_t *v = json_object_get(r->j, key);
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), want)))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: \"%s\" must be \"%s\"", r->what, key, want);
    return VLLM_OK;
}

static int parse_mamba(struct reader *r, struct nh_config *c) {
    TRY(get_int(r, KEYS("mamba_num_heads", "mamba_n_heads"), 1, &c->m_heads));
    TRY(get_int(r, KEYS("mamba_head_dim"), 1, &c->m_head_dim));
    TRY(get_int(r, KEYS("ssm_state_size", "mamba_d_state"), 1, &c->m_state));
    TRY(get_int(r, KEYS("n_groups", "mamba_n_groups"), 1, &c->m_groups));
    TRY(get_int(r, KEYS("conv_kernel", "mamba_d_conv"), 1, &c->m_conv));
    TRY(get_int(r, KEYS("chunk_size", "mamba_chunk_size"), 1, &c->chunk));
    TRY(get_bool(r, KEYS("use_conv_bias", "mamba_conv_bias"), &c->conv_bias));
    int bias;
    TRY(get_bool(r, KEYS("use_bias", "mamba_proj_bias"), &bias));
    if (bias) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: Mamba projections with bias (use_bias) are not supported", r->what);
    TRY(check_act(r, "mamba_hidden_act", "silu"));
    if (c->m_heads % c->m_groups)
        return vllm_err(VLLM_ERR_FORMAT, "%s: mamba_num_heads (%d) is not a multiple of n_groups (%d)", r->what,
                        c->m_heads, c->m_groups);
    if (c->m_heads * c->m_head_dim % c->m_groups)
        return vllm_err(VLLM_ERR_FORMAT, "%s: the Mamba width is not a multiple of n_groups", r->what);
    c->dt_min = 0.0f;
    c->dt_max = INFINITY;
    json_t *lim = json_get_alias(r->j, KEYS("time_step_limit", "mamba_dt_limit"));
    if (lim && !json_is_null(lim)) {
        double lo, hi;
        if (!json_is_array(lim) || json_array_size(lim) != 2 || json_as_double(json_array_get(lim, 0), &lo) ||
            json_as_double(json_array_get(lim, 1), &hi))
            return vllm_err(VLLM_ERR_FORMAT, "%s: \"time_step_limit\" must be [min, max]", r->what);
        c->dt_min = (float)lo;
        c->dt_max = (float)hi;
    }
    return VLLM_OK;
}

static int parse_moe(struct reader *r, struct nh_config *c) {
    TRY(get_int(r, KEYS("n_routed_experts", "num_local_experts"), 1, &c->experts));
    TRY(get_int(r, KEYS("num_experts_per_tok"), 1, &c->top_k));
    TRY(get_int(r, KEYS("moe_intermediate_size"), 1, &c->moe_inter));
    TRY(get_int(r, KEYS("moe_shared_expert_intermediate_size"), 1, &c->shared_inter));
    TRY(get_int(r, KEYS("n_group"), 1, &c->n_group));
    TRY(get_int(r, KEYS("topk_group"), 1, &c->topk_group));
    TRY(get_bool(r, KEYS("norm_topk_prob"), &c->norm_topk));
    TRY(get_float(r, KEYS("routed_scaling_factor"), &c->routed_scale));
    TRY(check_act(r, "mlp_hidden_act", "relu2"));
    json_t *lat = json_object_get(r->j, "moe_latent_size");
    c->latent = 0; // absent or null: experts work at hidden_size
    if (lat && !json_is_null(lat)) TRY(get_int(r, KEYS("moe_latent_size"), 1, &c->latent));
    if (c->experts > 1024) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: more than 1024 experts", r->what);
    if (c->experts % c->n_group || c->topk_group > c->n_group || c->experts / c->n_group < 2)
        return vllm_err(VLLM_ERR_FORMAT, "%s: n_routed_experts (%d) must split into n_group (%d) groups of >= 2 "
                        "with topk_group (%d) <= n_group", r->what, c->experts, c->n_group, c->topk_group);
    if (c->top_k > c->topk_group * (c->experts / c->n_group))
        return vllm_err(VLLM_ERR_FORMAT, "%s: num_experts_per_tok (%d) exceeds the experts of topk_group groups",
                        r->what, c->top_k);
    return VLLM_OK;
}

static int parse_eos(struct reader *r, struct nh_config *c) {
    json_t *v = json_object_get(r->j, "eos_token_id");
    c->num_eos = 0;
    if (json_is_integer(v)) c->eos[c->num_eos++] = (int)json_integer_value(v);
    else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (json_is_integer(e) && c->num_eos < 8) c->eos[c->num_eos++] = (int)json_integer_value(e);
        }
    }
    return VLLM_OK;
}

int nh_config_parse(const json_t *j, const char *what, struct nh_config *c) {
    memset(c, 0, sizeof *c);
    struct reader r = {j, what};
    int rc = parse_layers(&r, c);
    if (!rc) rc = get_int(&r, KEYS("vocab_size"), 1, &c->vocab);
    if (!rc) rc = get_int(&r, KEYS("hidden_size"), 1, &c->hidden);
    if (!rc) rc = get_float(&r, KEYS("layer_norm_epsilon", "rms_norm_eps"), &c->eps);
    if (!rc && has_kind(c, NH_MAMBA)) rc = parse_mamba(&r, c);
    if (!rc && has_kind(c, NH_ATTN)) {
        rc = get_int(&r, KEYS("num_attention_heads"), 1, &c->heads);
        if (!rc) rc = get_int(&r, KEYS("num_key_value_heads"), 1, &c->kv_heads);
        if (!rc) rc = get_int(&r, KEYS("head_dim", "attention_head_dim"), 1, &c->head_dim);
        if (!rc && c->heads % c->kv_heads)
            rc = vllm_err(VLLM_ERR_FORMAT, "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                          what, c->heads, c->kv_heads);
    }
    if (!rc && (has_kind(c, NH_MLP) || has_kind(c, NH_MOE))) {
        int bias;
        rc = get_bool(&r, KEYS("mlp_bias"), &bias);
        if (!rc && bias) rc = vllm_err(VLLM_ERR_UNSUPPORTED, "%s: MLP layers with bias (mlp_bias) are not supported", what);
    }
    if (!rc && has_kind(c, NH_MLP)) {
        rc = get_int(&r, KEYS("intermediate_size"), 1, &c->mlp_inter);
        if (!rc) rc = check_act(&r, "mlp_hidden_act", "relu2");
    }
    if (!rc && has_kind(c, NH_MOE)) rc = parse_moe(&r, c);
    if (!rc) {
        json_t *t = json_object_get(j, "tie_word_embeddings");
        c->tie_embeddings = json_is_true(t);
        json_t *mp = json_object_get(j, "max_position_embeddings");
        c->max_position = json_is_integer(mp) ? (int)json_integer_value(mp) : 0;
        rc = parse_eos(&r, c);
    }
    if (rc) nh_config_free(c);
    return rc;
}

void nh_config_free(struct nh_config *c) {
    free(c->kinds);
    c->kinds = NULL;
}

// Tensor parallelism splits heads and groups whole (docs/TENSOR_PARALLEL.md);
// widths split unevenly but must leave every rank a part.
int nh_config_check_tp(const struct nh_config *c, int tp, const char *what) {
    const char *why = "tensor_parallel_size";
    if (tp == 1) return VLLM_OK;
    if (has_kind(c, NH_MAMBA)) {
        if (c->m_heads % tp)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: mamba_num_heads (%d) is not divisible by %s %d", what, c->m_heads,
                            why, tp);
        if (c->m_groups % tp)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: n_groups (%d) is not divisible by %s %d: each rank's Mamba heads "
                            "must hold whole B/C groups, which the gated norm normalizes over", what, c->m_groups, why, tp);
    }
    if (has_kind(c, NH_ATTN)) {
        if (c->heads % tp)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: num_attention_heads (%d) is not divisible by %s %d", what,
                            c->heads, why, tp);
        if (c->kv_heads % tp && tp % c->kv_heads)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: num_key_value_heads (%d) and %s %d: one must divide the other "
                            "(KV heads are split over the ranks, or replicated when fewer)", what, c->kv_heads, why, tp);
    }
    struct {
        int on, n;
        const char *key;
    } widths[] = {{1, c->vocab, "vocab_size"},
                  {has_kind(c, NH_MLP), c->mlp_inter, "intermediate_size"},
                  {has_kind(c, NH_MOE), c->moe_inter, "moe_intermediate_size"},
                  {has_kind(c, NH_MOE), c->shared_inter, "moe_shared_expert_intermediate_size"}};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i].on && widths[i].n < tp)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: %s (%d) is smaller than %s %d: a rank would hold none of it",
                            what, widths[i].key, widths[i].n, why, tp);
    return VLLM_OK;
}
