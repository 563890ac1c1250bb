// test_config.c - NemotronH config.json: both layer spellings, legacy key
// names, Python floats, and a clear error for every missing required key.
#include <math.h>

#include "core/common.h"
#include "core/json.h"
#include "models/nemotron_h.h"
#include "test.h"
#include "util.h"

static int parse(json_t *j, struct nh_config *c) { return nh_config_parse(j, "cfg.json", c); }

static void rename_key(json_t *j, const char *from, const char *to) {
    json_t *v = json_object_get(j, from);
    if (!v) return;
    json_object_set(j, to, v);
    json_object_del(j, from);
}

int main(void) {
    struct nh_config c;
    json_t *j = tu_fixture_config("nh_latent");
    CHECK(j != NULL);
    if (!j) return test_summary("config");
    CHECK(parse(j, &c) == 0);
    enum nh_kind want[] = {NH_MAMBA, NH_MOE, NH_MAMBA, NH_ATTN, NH_MOE};
    int same = c.num_layers == 5;
    for (int i = 0; same && i < 5; i++) same = c.kinds[i] == want[i];
    CHECK(same);
    CHECK(c.experts == 16 && c.top_k == 4 && c.n_group == 4 && c.topk_group == 2 && c.latent == 32);
    CHECK(c.norm_topk == 1 && fabsf(c.routed_scale - 1.5f) < 1e-6f);
    CHECK(c.dt_min == 0.0f && isinf(c.dt_max)); // [0.0, {"__float__": "Infinity"}]
    CHECK(c.m_heads == 8 && c.m_head_dim == 8 && c.m_groups == 2 && c.m_state == 16 && c.m_conv == 4 && c.chunk == 8);
    nh_config_free(&c);

    // hybrid_override_pattern instead of layers_block_type, and legacy names
    json_t *k = json_deep_copy(j);
    json_object_del(k, "layers_block_type");
    json_object_set_new(k, "hybrid_override_pattern", json_string("MEM*E"));
    rename_key(k, "n_groups", "mamba_n_groups");
    rename_key(k, "conv_kernel", "mamba_d_conv");
    rename_key(k, "chunk_size", "mamba_chunk_size");
    rename_key(k, "use_conv_bias", "mamba_conv_bias");
    rename_key(k, "head_dim", "attention_head_dim");
    json_object_del(k, "time_step_limit");
    json_object_set_new(k, "mamba_dt_limit", json_pack("[fs]", 0.0, "Infinity"));
    CHECK(parse(k, &c) == 0);
    same = c.num_layers == 5;
    for (int i = 0; same && i < 5; i++) same = c.kinds[i] == want[i];
    CHECK(same && c.m_groups == 2 && c.m_conv == 4 && c.chunk == 8 && c.conv_bias == 1 && c.head_dim == 16);
    CHECK(isinf(c.dt_max));
    nh_config_free(&c);
    json_decref(k);

    // the older layer-type names
    k = json_deep_copy(j);
    json_object_set_new(k, "layers_block_type", json_pack("[sssss]", "mamba", "moe", "mamba", "attention", "moe"));
    CHECK(parse(k, &c) == 0 && c.kinds[3] == NH_ATTN && c.kinds[0] == NH_MAMBA);
    nh_config_free(&c);
    json_decref(k);

    // bare Infinity, as Python's json writes it
    const char *txt = "{\"architectures\": [\"NemotronHForCausalLM\"], \"hybrid_override_pattern\": \"M-\","
                      " \"vocab_size\": 10, \"hidden_size\": 8, \"layer_norm_epsilon\": 1e-5, \"mamba_num_heads\": 2,"
                      " \"mamba_head_dim\": 4, \"ssm_state_size\": 4, \"n_groups\": 1, \"conv_kernel\": 4,"
                      " \"chunk_size\": 4, \"use_conv_bias\": true, \"use_bias\": false, \"mlp_bias\": false,"
                      " \"intermediate_size\": 16, \"time_step_limit\": [0.0, Infinity]}";
    CHECK(json_parse_python(txt, strlen(txt), "t", &k) == 0);
    CHECK(parse(k, &c) == 0 && isinf(c.dt_max) && c.num_layers == 2 && c.kinds[1] == NH_MLP);
    nh_config_free(&c);
    json_decref(k);

    // every key the layers need is required
    const char *required[] = {"vocab_size", "hidden_size", "layer_norm_epsilon", "mamba_num_heads", "mamba_head_dim",
                              "ssm_state_size", "n_groups", "conv_kernel", "chunk_size", "use_conv_bias",
                              "num_attention_heads", "num_key_value_heads", "head_dim", "n_routed_experts",
                              "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
                              "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "mlp_bias",
                              "layers_block_type"};
    int n_req = (int)(sizeof required / sizeof required[0]), n_err = 0;
    for (int i = 0; i < n_req; i++) {
        k = json_deep_copy(j);
        json_object_del(k, required[i]);
        int rc = parse(k, &c);
        const char *key = !strcmp(required[i], "layers_block_type") ? "layers_block_type" : required[i];
        int named = rc == VLLM_ERR_FORMAT && strstr(vllm_last_error(), key) && strstr(vllm_last_error(), "cfg.json");
        CHECKF(named, "removing %s: rc %d, error '%s'", required[i], rc, vllm_last_error());
        n_err += named;
        json_decref(k);
    }
    printf("config: %d/%d missing keys reported by name\n", n_err, n_req);

    // wrong values
    k = json_deep_copy(j);
    json_object_set_new(k, "layers_block_type", json_pack("[ss]", "mamba", "conv"));
    CHECK(parse(k, &c) == VLLM_ERR_UNSUPPORTED && strstr(vllm_last_error(), "conv"));
    json_decref(k);
    k = json_deep_copy(j);
    json_object_set_new(k, "num_key_value_heads", json_integer(3));
    CHECK(parse(k, &c) == VLLM_ERR_FORMAT && strstr(vllm_last_error(), "num_key_value_heads"));
    json_decref(k);
    k = json_deep_copy(j);
    json_object_set_new(k, "hidden_size", json_string("64"));
    CHECK(parse(k, &c) == VLLM_ERR_FORMAT && strstr(vllm_last_error(), "hidden_size"));
    json_decref(k);
    json_decref(j);
    return test_summary("config");
}
