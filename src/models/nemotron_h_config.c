// nemotron_h_config.c - config.json of NemotronHForCausalLM.
//
// Key names changed over time; each value is read from the first alias
// present. A key the layers present need is an error when missing: a silent
// default would load a different model than the checkpoint's. Every value is
// range-checked here, and every size the model derives from them is checked
// in 64 bits against the limits of models/config_reader.h, so that loading
// never computes an overflowing size.
#include <float.h>
#include <math.h>

#include "core/common.h"
#include "core/json.h"
#include "models/config_reader.h"
#include "models/nemotron_h.h"

#define KEYS CFG_KEYS

static int parse_layers(const struct cfg_reader *r, struct nh_config *c) {
    const json_t *list = cfg_get(r, KEYS("layers_block_type"));
    const json_t *pat = cfg_get(r, KEYS("hybrid_override_pattern"));
    if (list && !json_is_null(list)) {
        if (!json_is_array(list) || json_array_size(list) == 0 || json_array_size(list) > CFG_MAX_LAYERS)
            return vllm_err(VLLM_ERR_FORMAT, "%s: \"layers_block_type\" must be a list of 1 to %d layer types",
                            r->what, CFG_MAX_LAYERS);
        c->num_layers = (int)json_array_size(list);
        c->kinds = xcalloc(c->num_layers, sizeof *c->kinds);
        for (int i = 0; i < c->num_layers; i++) {
            const char *s = json_string_value(json_array_get(list, i));
            if (!s) return vllm_err(VLLM_ERR_FORMAT, "%s: layers_block_type[%d] is not a string", r->what, i);
            if (!strcmp(s, "mamba") || !strcmp(s, "linear_attention")) c->kinds[i] = NH_MAMBA;
            else if (!strcmp(s, "attention") || !strcmp(s, "full_attention")) c->kinds[i] = NH_ATTN;
            else if (!strcmp(s, "mlp")) c->kinds[i] = NH_MLP;
            else if (!strcmp(s, "moe")) c->kinds[i] = NH_MOE;
            else return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: layers_block_type[%d] = \"%.64s\" is not mamba, "
                                 "linear_attention, attention, full_attention, mlp or moe", r->what, i, s);
        }
    } else if (pat && json_is_string(pat) && json_string_length(pat) > 0) {
        const char *s = json_string_value(pat);
        if (json_string_length(pat) > CFG_MAX_LAYERS)
            return vllm_err(VLLM_ERR_FORMAT, "%s: \"hybrid_override_pattern\" has %zu layers, more than %d", r->what,
                            json_string_length(pat), CFG_MAX_LAYERS);
        c->num_layers = (int)json_string_length(pat);
        c->kinds = xcalloc(c->num_layers, sizeof *c->kinds);
        for (int i = 0; i < c->num_layers; i++) {
            switch (s[i]) {
            case 'M': c->kinds[i] = NH_MAMBA; break;
            case '*': c->kinds[i] = NH_ATTN; break;
            case '-': c->kinds[i] = NH_MLP; break;
            case 'E': c->kinds[i] = NH_MOE; break;
            default:
                return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: hybrid_override_pattern[%d] = 0x%02x is not M, *, - or E",
                                r->what, i, (unsigned char)s[i]);
            }
        }
    } else {
        return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"layers_block_type\" (or \"hybrid_override_pattern\")",
                        r->what);
    }
    const json_t *nl = cfg_get(r, KEYS("num_hidden_layers"));
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

static int check_act(const struct cfg_reader *r, const char *key, const char *want) {
    const char *s;
    TRY(cfg_str_opt(r, (const char *const[]){key, NULL}, &s));
    if (s && strcmp(s, want))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: \"%s\" = \"%.64s\" must be \"%s\"", r->what, key, s, want);
    return VLLM_OK;
}

// time_step_limit: [lo, hi] with 0 <= lo <= hi; hi may be +inf (no clamp).
static int parse_dt_limit(const struct cfg_reader *r, struct nh_config *c) {
    c->dt_min = 0.0f;
    c->dt_max = INFINITY;
    const json_t *lim = cfg_get(r, KEYS("time_step_limit", "mamba_dt_limit"));
    if (!lim || json_is_null(lim)) return VLLM_OK;
    char b[64];
    if (!json_is_array(lim) || json_array_size(lim) != 2)
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"time_step_limit\" = %s must be [min, max]", r->what,
                        cfg_show(lim, b, sizeof b));
    double lo, hi;
    TRY(cfg_number(r, "time_step_limit[0]", json_array_get(lim, 0), CFG_CLOSED(0, FLT_MAX), &lo));
    TRY(cfg_number(r, "time_step_limit[1]", json_array_get(lim, 1), CFG_CLOSED(0, INFINITY), &hi));
    if (lo > hi)
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"time_step_limit\" = [%g, %g]: min exceeds max", r->what, lo, hi);
    c->dt_min = (float)lo;
    c->dt_max = (float)hi;
    return VLLM_OK;
}

static int parse_mamba(const struct cfg_reader *r, struct nh_config *c) {
    TRY(cfg_int(r, KEYS("mamba_num_heads", "mamba_n_heads"), 1, CFG_MAX_HEADS, &c->m_heads));
    TRY(cfg_int(r, KEYS("mamba_head_dim"), 1, CFG_MAX_HEAD_DIM, &c->m_head_dim));
    TRY(cfg_int(r, KEYS("ssm_state_size", "mamba_d_state"), 1, CFG_MAX_HEAD_DIM, &c->m_state));
    TRY(cfg_int(r, KEYS("n_groups", "mamba_n_groups"), 1, CFG_MAX_HEADS, &c->m_groups));
    TRY(cfg_int(r, KEYS("conv_kernel", "mamba_d_conv"), 1, CFG_MAX_CONV, &c->m_conv));
    TRY(cfg_int(r, KEYS("chunk_size", "mamba_chunk_size"), 1, CFG_MAX_CHUNK, &c->chunk));
    TRY(cfg_bool(r, KEYS("use_conv_bias", "mamba_conv_bias"), &c->conv_bias));
    int bias;
    TRY(cfg_bool(r, KEYS("use_bias", "mamba_proj_bias"), &bias));
    if (bias) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: Mamba projections with bias (use_bias) are not supported", r->what);
    TRY(check_act(r, "mamba_hidden_act", "silu"));
    if (c->m_heads % c->m_groups)
        return vllm_err(VLLM_ERR_FORMAT, "%s: mamba_num_heads (%d) is not a multiple of n_groups (%d)", r->what,
                        c->m_heads, c->m_groups);
    int64_t I = cfg_mul(c->m_heads, c->m_head_dim), GN = cfg_mul(c->m_groups, c->m_state);
    int64_t width = cfg_add(cfg_add(cfg_mul(2, I), cfg_mul(2, GN)), c->m_heads);
    TRY(cfg_limit(r, "the Mamba in_proj width 2*mamba_num_heads*mamba_head_dim + 2*n_groups*ssm_state_size + "
                  "mamba_num_heads", width, CFG_MAX_WIDTH));
    TRY(cfg_limit(r, "the Mamba in_proj size (its width * hidden_size)", cfg_mul(width, c->hidden), CFG_MAX_MATRIX));
    TRY(cfg_limit(r, "the SSM state per sequence mamba_num_heads*mamba_head_dim*ssm_state_size",
                  cfg_mul(I, c->m_state), CFG_MAX_STATE));
    if (I % c->m_groups)
        return vllm_err(VLLM_ERR_FORMAT, "%s: the Mamba width is not a multiple of n_groups", r->what);
    return parse_dt_limit(r, c);
}

static int parse_attn(const struct cfg_reader *r, struct nh_config *c) {
    TRY(cfg_int(r, KEYS("num_attention_heads"), 1, CFG_MAX_HEADS, &c->heads));
    TRY(cfg_int(r, KEYS("num_key_value_heads"), 1, CFG_MAX_HEADS, &c->kv_heads));
    TRY(cfg_int(r, KEYS("head_dim", "attention_head_dim"), 1, CFG_MAX_HEAD_DIM, &c->head_dim));
    if (c->heads % c->kv_heads)
        return vllm_err(VLLM_ERR_FORMAT, "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                        r->what, c->heads, c->kv_heads);
    int64_t qkv = cfg_mul(cfg_add(c->heads, 2 * (int64_t)c->kv_heads), c->head_dim);
    TRY(cfg_limit(r, "the attention width (num_attention_heads + 2*num_key_value_heads)*head_dim", qkv,
                  CFG_MAX_WIDTH));
    return cfg_limit(r, "the attention qkv size (its width * hidden_size)", cfg_mul(qkv, c->hidden), CFG_MAX_MATRIX);
}

// An MLP width (intermediate size) and its [inter, cols] matrices.
static int check_inter(const struct cfg_reader *r, const char *key, int inter, int64_t cols) {
    char d[128];
    snprintf(d, sizeof d, "%s * the width it projects from", key);
    return cfg_limit(r, d, cfg_mul(inter, cols), CFG_MAX_MATRIX);
}

static int parse_moe(const struct cfg_reader *r, struct nh_config *c) {
    TRY(cfg_int(r, KEYS("n_routed_experts", "num_local_experts"), 1, CFG_MAX_EXPERTS, &c->experts));
    TRY(cfg_int(r, KEYS("num_experts_per_tok"), 1, c->experts, &c->top_k));
    TRY(cfg_int(r, KEYS("moe_intermediate_size"), 1, CFG_MAX_WIDTH, &c->moe_inter));
    TRY(cfg_int(r, KEYS("moe_shared_expert_intermediate_size"), 1, CFG_MAX_WIDTH, &c->shared_inter));
    TRY(cfg_int(r, KEYS("n_group"), 1, c->experts, &c->n_group));
    TRY(cfg_int(r, KEYS("topk_group"), 1, c->n_group, &c->topk_group));
    TRY(cfg_bool(r, KEYS("norm_topk_prob"), &c->norm_topk));
    TRY(cfg_float(r, KEYS("routed_scaling_factor"), CFG_POSITIVE(1e4), &c->routed_scale));
    TRY(check_act(r, "mlp_hidden_act", "relu2"));
    // absent or null: experts work at hidden_size
    TRY(cfg_int_opt(r, KEYS("moe_latent_size"), 1, CFG_MAX_HIDDEN, 0, &c->latent));
    if (c->experts % c->n_group || c->experts / c->n_group < 2)
        return vllm_err(VLLM_ERR_FORMAT, "%s: n_routed_experts (%d) must split into n_group (%d) groups of >= 2 "
                        "with topk_group (%d) <= n_group", r->what, c->experts, c->n_group, c->topk_group);
    if (c->top_k > c->topk_group * (c->experts / c->n_group))
        return vllm_err(VLLM_ERR_FORMAT, "%s: num_experts_per_tok (%d) exceeds the experts of topk_group groups",
                        r->what, c->top_k);
    int64_t L = c->latent ? c->latent : c->hidden;
    TRY(check_inter(r, "moe_intermediate_size", c->moe_inter, L));
    TRY(check_inter(r, "moe_shared_expert_intermediate_size", c->shared_inter, c->hidden));
    return cfg_limit(r, "the experts of one layer n_routed_experts*moe_intermediate_size*(moe_latent_size or "
                     "hidden_size)", cfg_mul(c->experts, cfg_mul(c->moe_inter, L)), CFG_MAX_LAYER_PARAMS);
}

static int parse_parts(const struct cfg_reader *r, struct nh_config *c) {
    TRY(parse_layers(r, c));
    TRY(cfg_int(r, KEYS("vocab_size"), 1, CFG_MAX_VOCAB, &c->vocab));
    TRY(cfg_int(r, KEYS("hidden_size"), 1, CFG_MAX_HIDDEN, &c->hidden));
    TRY(cfg_limit(r, "the embedding size vocab_size*hidden_size", cfg_mul(c->vocab, c->hidden), CFG_MAX_MATRIX));
    TRY(cfg_float(r, KEYS("layer_norm_epsilon", "rms_norm_eps"), CFG_POSITIVE(1), &c->eps));
    if (has_kind(c, NH_MAMBA)) TRY(parse_mamba(r, c));
    if (has_kind(c, NH_ATTN)) TRY(parse_attn(r, c));
    if (has_kind(c, NH_MLP) || has_kind(c, NH_MOE)) {
        int bias;
        TRY(cfg_bool(r, KEYS("mlp_bias"), &bias));
        if (bias) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: MLP layers with bias (mlp_bias) are not supported", r->what);
    }
    if (has_kind(c, NH_MLP)) {
        TRY(cfg_int(r, KEYS("intermediate_size"), 1, CFG_MAX_WIDTH, &c->mlp_inter));
        TRY(check_inter(r, "intermediate_size", c->mlp_inter, c->hidden));
        TRY(check_act(r, "mlp_hidden_act", "relu2"));
    }
    if (has_kind(c, NH_MOE)) TRY(parse_moe(r, c));
    TRY(cfg_bool_opt(r, KEYS("tie_word_embeddings"), 0, &c->tie_embeddings));
    // absent or null: unknown (the engine picks a length)
    TRY(cfg_int_opt(r, KEYS("max_position_embeddings"), 1, CFG_MAX_POSITION, 0, &c->max_position));
    int32_t eos[8];
    TRY(cfg_eos(r, c->vocab, (int)(sizeof c->eos / sizeof c->eos[0]), eos, &c->num_eos));
    for (int i = 0; i < c->num_eos; i++) c->eos[i] = eos[i];
    return VLLM_OK;
}

int nh_config_parse(const json_t *j, const char *what, struct nh_config *c) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(j)) return vllm_err(VLLM_ERR_FORMAT, "%s: not a JSON object", what);
    struct cfg_reader r = {j, what};
    int rc = parse_parts(&r, c);
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
    if (tp < 1) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "%s %d must be >= 1", why, tp);
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
