// test_config_values.c - every config.json value is range-checked when read
// (models/config_reader.h), the error names the file, the key and the value,
// and every size derived from the config stays under the stated limits.
// Real models' dimensions pass.
#include <math.h>

#include "core/common.h"
#include "core/json.h"
#include "models/config_reader.h"
#include "models/nemotron_h.h"
#include "test.h"
#include "util.h"

// base with key = value (Python JSON text; NULL deletes the key)
static json_t *with(const json_t *base, const char *key, const char *value) {
    json_t *k = json_deep_copy(base);
    if (!value) {
        json_object_del(k, key);
        return k;
    }
    json_t *v = NULL;
    char buf[256];
    snprintf(buf, sizeof buf, "{\"v\": %s}", value);
    if (json_parse_python(buf, strlen(buf), "test", &v)) {
        fprintf(stderr, "bad test value %s\n", value);
        return k;
    }
    if (!strcmp(key, "+")) json_object_update(k, json_object_get(v, "v"));
    else json_object_set(k, key, json_object_get(v, "v"));
    json_decref(v);
    return k;
}

// A bad value: VLLM_ERR_FORMAT naming the file, the key and `shown`.
struct bad {
    const char *fixture, *key, *value, *shown;
};

static const struct bad bads[] = {
    // item 3: values that used to run to garbage
    {"nh_dense", "layer_norm_epsilon", "NaN", "nan"},
    {"nh_dense", "layer_norm_epsilon", "-1", "-1"},
    {"nh_dense", "layer_norm_epsilon", "Infinity", "inf"},
    {"nh_dense", "layer_norm_epsilon", "{\"__float__\": \"-Infinity\"}", "-inf"},
    {"nh_dense", "layer_norm_epsilon", "0", "0"},
    {"nh_dense", "layer_norm_epsilon", "1e-50", "1e-50"}, // 0 as a float
    {"nh_dense", "layer_norm_epsilon", "\"1e-5\"", "1e-5"},
    {"nh_dense", "layer_norm_epsilon", "true", "true"},
    {"nh_latent", "routed_scaling_factor", "NaN", "nan"},
    {"nh_latent", "routed_scaling_factor", "1e39", "1e+39"},
    {"nh_latent", "routed_scaling_factor", "-2.5", "-2.5"},
    {"nh_dense", "time_step_limit", "[NaN, -1]", "nan"},
    {"nh_dense", "time_step_limit", "[0.0, -1]", "-1"},
    {"nh_dense", "time_step_limit", "[0.5, 0.1]", "min exceeds max"},
    {"nh_dense", "time_step_limit", "[-0.5, 1]", "-0.5"},
    {"nh_dense", "time_step_limit", "[Infinity, Infinity]", "inf"},
    {"nh_dense", "time_step_limit", "[0.0]", "[0.0]"},
    {"nh_dense", "time_step_limit", "\"fast\"", "fast"},
    {"nh_dense", "eos_token_id", "-1", "-1"},
    {"nh_dense", "eos_token_id", "1099511627776", "1099511627776"},
    {"nh_dense", "eos_token_id", "256", "256"}, // == vocab_size
    {"nh_dense", "eos_token_id", "[1, 2, 3, 4, 5, 6, 7, 8, 9]", "9 ids"},
    {"nh_dense", "eos_token_id", "[1, -2]", "-2"},
    {"nh_dense", "eos_token_id", "[1, \"2\"]", "\"2\""},
    {"nh_dense", "eos_token_id", "\"2\"", "\"2\""},
    {"nh_dense", "max_position_embeddings", "\"4096\"", "\"4096\""},
    {"nh_dense", "max_position_embeddings", "-1", "-1"},
    {"nh_dense", "max_position_embeddings", "0", "0"},
    {"nh_dense", "max_position_embeddings", "2147483647", "2147483647"},
    {"nh_dense", "max_position_embeddings", "4096.5", "4096.5"},
    // item 1: sizes that overflowed
    {"nh_dense", "hidden_size", "1000000000", "1000000000"},
    {"nh_dense", "head_dim", "1000000000", "1000000000"},
    {"nh_dense", "mamba_head_dim", "268435456", "268435456"},
    {"nh_dense", "vocab_size", "1073741824", "1073741824"},
    {"nh_dense", "chunk_size", "1000000000", "1000000000"},
    {"nh_dense", "chunk_size", "65536", "65536"},
    {"nh_dense", "intermediate_size", "2147483648", "2147483648"},
    {"nh_dense", "intermediate_size", "-96", "-96"},
    {"nh_dense", "num_attention_heads", "0", "0"},
    {"nh_dense", "ssm_state_size", "99999999999999999999", "1e+20"}, // past int64: a real
    {"nh_dense", "conv_kernel", "4.0", "4"},
    {"nh_dense", "hidden_size", "\"64\"", "\"64\""},
    {"nh_dense", "hidden_size", "true", "true"},
    {"nh_dense", "hidden_size", "null", "null"},
    {"nh_dense", "use_conv_bias", "1", "1"},
    {"nh_dense", "tie_word_embeddings", "\"yes\"", "\"yes\""},
    {"nh_dense", "mlp_hidden_act", "7", "7"},
    {"nh_latent", "n_routed_experts", "100000", "100000"},
    {"nh_latent", "num_experts_per_tok", "17", "17"},
    {"nh_latent", "moe_latent_size", "-3", "-3"},
    {"nh_latent", "topk_group", "5", "5"},
    // products within each key's range that exceed a derived limit
    // (key "+": the value's keys are merged into the config)
    {"nh_dense", "+", "{\"vocab_size\": 16777216, \"hidden_size\": 1048576}", "vocab_size*hidden_size"},
    {"nh_dense", "+", "{\"mamba_num_heads\": 16384, \"mamba_head_dim\": 16384}", "in_proj width"},
    {"nh_dense", "+", "{\"mamba_head_dim\": 16384, \"ssm_state_size\": 16384}", "SSM state"},
    {"nh_dense", "+", "{\"num_attention_heads\": 16384, \"num_key_value_heads\": 16384, \"head_dim\": 16384}",
     "attention width"},
    {"nh_dense", "+", "{\"intermediate_size\": 16777216, \"hidden_size\": 1048576, \"vocab_size\": 2}",
     "intermediate_size *"},
    {"nh_latent", "+", "{\"n_routed_experts\": 1024, \"moe_intermediate_size\": 262144, \"moe_latent_size\": 16384}",
     "experts of one layer"},
};

static int check_bad(const struct bad *b) {
    json_t *base = tu_fixture_config(b->fixture);
    if (!base) return 0;
    json_t *k = with(base, b->key, b->value);
    struct nh_config c;
    int rc = nh_config_parse(k, "dir/config.json", &c);
    const char *e = vllm_last_error();
    int ok = rc == VLLM_ERR_FORMAT && strstr(e, "dir/config.json") && strstr(e, b->shown);
    if (ok && strcmp(b->key, "+") && !strstr(e, b->key)) ok = 0;
    if (!ok) fprintf(stderr, "  %s = %s: rc %d, error '%s'\n", b->key, b->value, rc, e);
    if (!rc) nh_config_free(&c);
    json_decref(k);
    json_decref(base);
    return ok;
}

// Values that must be accepted, and what they read as.
static void good_values(void) {
    json_t *base = tu_fixture_config("nh_dense");
    struct nh_config c;
    json_t *k = with(base, "eos_token_id", "[0, 255, 7, 7, 1, 2, 3, 4]"); // 8 ids: all kept
    CHECK(nh_config_parse(k, "t", &c) == 0 && c.num_eos == 8 && c.eos[1] == 255 && c.eos[7] == 4);
    nh_config_free(&c);
    json_decref(k);
    k = with(base, "eos_token_id", "null");
    CHECK(nh_config_parse(k, "t", &c) == 0 && c.num_eos == 0);
    nh_config_free(&c);
    json_decref(k);
    k = with(base, "max_position_embeddings", NULL);
    CHECK(nh_config_parse(k, "t", &c) == 0 && c.max_position == 0);
    nh_config_free(&c);
    json_decref(k);
    k = with(base, "time_step_limit", "[0.001, \"Infinity\"]");
    CHECK(nh_config_parse(k, "t", &c) == 0 && fabsf(c.dt_min - 0.001f) < 1e-9f && isinf(c.dt_max));
    nh_config_free(&c);
    json_decref(k);
    k = with(base, "rms_norm_eps", "1e-6");
    json_object_del(k, "layer_norm_epsilon");
    CHECK(nh_config_parse(k, "t", &c) == 0 && fabsf(c.eps - 1e-6f) < 1e-12f);
    nh_config_free(&c);
    json_decref(k);
    json_decref(base);
}

// The dimensions of real checkpoints parse (values from their config.json).
static void real_models(void) {
    const char *nemotron_h_56b =
        "{\"hybrid_override_pattern\": \"M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
        "M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-M-\", \"vocab_size\": 131072,"
        " \"hidden_size\": 8192, \"layer_norm_epsilon\": 1e-5, \"mamba_num_heads\": 256, \"mamba_head_dim\": 64,"
        " \"ssm_state_size\": 256, \"n_groups\": 8, \"conv_kernel\": 4, \"chunk_size\": 128, \"use_conv_bias\": true,"
        " \"use_bias\": false, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, \"head_dim\": 128,"
        " \"mlp_bias\": false, \"intermediate_size\": 32768, \"time_step_limit\": [0.0, Infinity],"
        " \"max_position_embeddings\": 8192, \"eos_token_id\": 2}";
    const char *nemotron_nano_moe =
        "{\"hybrid_override_pattern\": \"MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME\", \"vocab_size\": 131072,"
        " \"hidden_size\": 2688, \"layer_norm_epsilon\": 1e-5, \"mamba_num_heads\": 64, \"mamba_head_dim\": 64,"
        " \"ssm_state_size\": 128, \"n_groups\": 8, \"conv_kernel\": 4, \"chunk_size\": 128, \"use_conv_bias\": true,"
        " \"use_bias\": false, \"num_attention_heads\": 32, \"num_key_value_heads\": 2, \"head_dim\": 128,"
        " \"mlp_bias\": false, \"n_routed_experts\": 128, \"num_experts_per_tok\": 6, \"moe_intermediate_size\": 1856,"
        " \"moe_shared_expert_intermediate_size\": 3712, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true,"
        " \"routed_scaling_factor\": 2.5, \"max_position_embeddings\": 262144, \"eos_token_id\": [2, 11]}";
    // Llama-3-405B / Qwen3-235B widths on NemotronH layers: the limits hold them
    const char *wide =
        "{\"hybrid_override_pattern\": \"*-*E\", \"vocab_size\": 151936, \"hidden_size\": 16384,"
        " \"rms_norm_eps\": 1e-5, \"num_attention_heads\": 128, \"num_key_value_heads\": 8, \"head_dim\": 128,"
        " \"mlp_bias\": false, \"intermediate_size\": 53248, \"n_routed_experts\": 128, \"num_experts_per_tok\": 8,"
        " \"moe_intermediate_size\": 1536, \"moe_shared_expert_intermediate_size\": 1536, \"n_group\": 8,"
        " \"topk_group\": 4, \"norm_topk_prob\": true, \"routed_scaling_factor\": 1.0,"
        " \"max_position_embeddings\": 131072, \"eos_token_id\": [128001, 128008, 128009]}";
    const char *cfgs[] = {nemotron_h_56b, nemotron_nano_moe, wide};
    for (int i = 0; i < 3; i++) {
        json_t *j = NULL;
        struct nh_config c;
        CHECK(json_parse_python(cfgs[i], strlen(cfgs[i]), "real", &j) == 0);
        int rc = nh_config_parse(j, "real", &c);
        CHECKF(rc == 0, "real model %d: %s", i, vllm_last_error());
        if (!rc) nh_config_free(&c);
        json_decref(j);
    }
}

// The reader itself: aliases, null as absent, saturating products.
static void reader_unit(void) {
    const char *txt = "{\"a\": 3, \"b\": null, \"f\": {\"__float__\": \"Infinity\"}, \"s\": \"x\"}";
    json_t *j = NULL;
    CHECK(json_parse_python(txt, strlen(txt), "r", &j) == 0);
    struct cfg_reader r = {j, "r.json"};
    int v = 0;
    CHECK(cfg_int(&r, CFG_KEYS("zz", "a"), 1, 3, &v) == 0 && v == 3);
    CHECK(cfg_int(&r, CFG_KEYS("a"), 1, 2, &v) == VLLM_ERR_FORMAT && strstr(vllm_last_error(), "[1, 2]"));
    CHECK(cfg_int(&r, CFG_KEYS("b"), 1, 2, &v) == VLLM_ERR_FORMAT);
    CHECK(cfg_int_opt(&r, CFG_KEYS("b"), 1, 2, 7, &v) == 0 && v == 7);
    CHECK(cfg_int(&r, CFG_KEYS("zz"), 1, 2, &v) == VLLM_ERR_FORMAT && strstr(vllm_last_error(), "missing"));
    float f = 0;
    CHECK(cfg_float(&r, CFG_KEYS("f"), CFG_CLOSED(0, INFINITY), &f) == 0 && isinf(f));
    CHECK(cfg_float(&r, CFG_KEYS("f"), CFG_CLOSED(0, 1e30), &f) == VLLM_ERR_FORMAT);
    CHECK(cfg_float(&r, CFG_KEYS("a"), CFG_POSITIVE(1), &f) == VLLM_ERR_FORMAT &&
          strstr(vllm_last_error(), "(0, 1]"));
    const char *s = NULL;
    CHECK(cfg_str_opt(&r, CFG_KEYS("s"), &s) == 0 && s && !strcmp(s, "x"));
    CHECK(cfg_str_opt(&r, CFG_KEYS("a"), &s) == VLLM_ERR_FORMAT);
    CHECK(cfg_mul(INT64_MAX / 2, 3) == INT64_MAX && cfg_add(INT64_MAX, 1) == INT64_MAX && cfg_mul(1 << 20, 1 << 20) ==
          (int64_t)1 << 40);
    CHECK(cfg_limit(&r, "x*y", INT64_MAX, 10) == VLLM_ERR_FORMAT && strstr(vllm_last_error(), "overflows"));
    json_decref(j);
}

int main(void) {
    int n = (int)(sizeof bads / sizeof bads[0]), named = 0;
    for (int i = 0; i < n; i++) {
        int ok = check_bad(&bads[i]);
        CHECKF(ok, "%s = %s", bads[i].key, bads[i].value);
        named += ok;
    }
    printf("config_values: %d/%d bad values reported by file, key and value\n", named, n);
    good_values();
    real_models();
    reader_unit();
    return test_summary("config_values");
}
