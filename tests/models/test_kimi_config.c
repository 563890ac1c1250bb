// test_kimi_config.c - KimiLinearForCausalLM's config.json: both fixtures
// load; each key's other spelling (linear_attn_config vs flat keys vs
// layer_types, mlp_layer_types vs first_k_dense_replace, the MoE aliases)
// loads the same model; an option this engine lacks, or a key the model
// needs that is missing, is an error naming that key; so are heads that do not
// split over the tensor-parallel ranks.
#include "core/common.h"
#include "core/json.h"
#include "models/model.h"
#include "test.h"
#include "util.h"
#include "vllm.h"

// Loads fixture fx with config cfg; returns the status, the message in msg.
static int try_load(struct backend *be, const char *fx, json_t *cfg, char *msg, size_t n) {
    char *dir = tu_fixture(fx);
    struct model_load_opts o = {.weight_fmt = WF_F32, .max_tokens = 64, .max_logit_rows = 8};
    struct model *m = NULL;
    vllm_err_clear();
    int rc = model_load(dir, cfg, &o, be, &m);
    snprintf(msg, n, "%s", rc ? vllm_last_error() : "");
    if (!rc) model_free(m);
    free(dir);
    return rc;
}

// edits: "key=value" (Python JSON; "key=" deletes; "a.b=v" inside object a)
static json_t *edited(const json_t *base, const char *const *edits) {
    json_t *c = json_deep_copy(base);
    for (; *edits; edits++) {
        char key[128];
        const char *eq = strchr(*edits, '=');
        snprintf(key, sizeof key, "%.*s", (int)(eq - *edits), *edits);
        json_t *obj = c;
        char *dot = strchr(key, '.');
        if (dot) *dot = 0, obj = json_object_get(c, key);
        const char *k = dot ? dot + 1 : key;
        if (!eq[1]) {
            json_object_del(obj, k);
            continue;
        }
        char buf[256];
        json_t *v = NULL;
        snprintf(buf, sizeof buf, "{\"v\": %s}", eq + 1);
        if (json_parse_python(buf, strlen(buf), "test", &v)) continue;
        json_object_set(obj, k, json_object_get(v, "v"));
        json_decref(v);
    }
    return c;
}

#define E(...) ((const char *const[]){__VA_ARGS__, NULL})

struct ok_case {
    const char *fx, *what;
    const char *const *edits;
};
struct bad_case {
    const char *fx;
    const char *const *edits;
    const char *needle; // the key the error must name
};

int main(void) {
    struct backend *be;
    if (backend_create("cpu", 1, DT_F32, &be)) return 1;
    json_t *base[2] = {tu_fixture_config("kimi_linear"), tu_fixture_config("kimi_linear_qlora")};
    CHECKF(base[0] && base[1], "the kimi_linear fixtures' config.json");
    if (!base[0] || !base[1]) return test_summary("kimi_config");
    const char *fxs[2] = {"kimi_linear", "kimi_linear_qlora"};
    const struct ok_case oks[] = {
        {"kimi_linear", "as saved", E("x=0")},
        {"kimi_linear_qlora", "as saved", E("x=0")},
        {"kimi_linear", "linear_attn_config's layer lists instead of layer_types", E("layer_types=")},
        {"kimi_linear_qlora", "linear_attn_config's layer lists instead of layer_types", E("layer_types=")},
        {"kimi_linear", "flat KDA keys", E("linear_attn_config.head_dim=", "linear_attn_config.num_heads=",
                                           "linear_attn_config.short_conv_kernel_size=")},
        {"kimi_linear", "linear_attn_config's KDA keys", E("linear_head_dim=", "linear_num_heads=",
                                                           "linear_conv_kernel_dim=")},
        {"kimi_linear", "first_k_dense_replace", E("mlp_layer_types=", "first_k_dense_replace=1")},
        {"kimi_linear", "transformers' MoE names",
         E("num_experts=", "num_local_experts=8", "num_experts_per_token=", "num_experts_per_tok=2", "moe_renormalize=",
           "norm_topk_prob=true", "num_expert_group=", "n_group=2", "num_shared_experts=", "n_shared_experts=1")},
        {"kimi_linear", "use_grouped_topk false with one group, later options off",
         E("use_grouped_topk=false", "num_expert_group=1", "topk_group=1", "mla_use_output_gate=false",
           "routed_expert_hidden_size=null")},
        {"kimi_linear", "num_key_value_heads 1 (MLA: every head from the one latent)", E("num_key_value_heads=1")},
        {"kimi_linear", "qk_rope_head_dim 0 (NoPE without the shared part)", E("qk_rope_head_dim=0", "x=0")},
    };
    char msg[1024];
    for (size_t i = 0; i < sizeof oks / sizeof oks[0]; i++) {
        json_t *c = edited(base[strcmp(oks[i].fx, "kimi_linear") != 0], oks[i].edits);
        int rc = try_load(be, oks[i].fx, c, msg, sizeof msg);
        // qk_rope_head_dim 0 changes the q and kv_a shapes: the checkpoint must be refused, by name
        if (strstr(oks[i].what, "NoPE")) {
            CHECKF(rc && strstr(msg, "self_attn.q_proj.weight has shape"), "%s: %s: a shape error naming the tensor: %s", oks[i].fx,
                   oks[i].what, msg);
        } else {
            CHECKF(rc == 0, "%s: %s loads: %s", oks[i].fx, oks[i].what, msg);
        }
        json_decref(c);
    }
    const struct bad_case bads[] = {
        {"kimi_linear", E("hidden_act=\"situ\""), "hidden_act"},
        {"kimi_linear", E("attn_res_block_size=4"), "attn_res_block_size"},
        {"kimi_linear", E("mla_use_output_gate=true"), "mla_use_output_gate"},
        {"kimi_linear", E("use_grouped_topk=false"), "use_grouped_topk"},
        {"kimi_linear", E("routed_expert_hidden_size=32"), "routed_expert_hidden_size"},
        {"kimi_linear", E("moe_router_activation_func=\"softmax\""), "moe_router_activation_func"},
        {"kimi_linear", E("mla_use_nope=false"), "mla_use_nope"},
        {"kimi_linear", E("forget_gate_lower_bound=-5.0"), "forget_gate_lower_bound"},
        {"kimi_linear", E("use_full_rank_output_gate=true"), "use_full_rank_output_gate"},
        {"kimi_linear", E("linear_attn_value_head_dim=8"), "linear_attn_value_head_dim"},
        {"kimi_linear", E("layer_types=[\"linear_attention\", \"mamba\", \"linear_attention\", \"linear_attention\"]"),
         "layer_types[1]"},
        {"kimi_linear", E("mlp_layer_types=[\"dense\", \"sparse\", \"moe\", \"sparse\"]"), "mlp_layer_types[2]"},
        {"kimi_linear", E("layer_types=", "linear_attn_config.kda_layers=[1, 3, 5]"), "kda_layers"},
        {"kimi_linear", E("layer_types=", "linear_attn_config.full_attn_layers=[]"), "full_attn_layers"},
        {"kimi_linear", E("layer_types=", "linear_attn_config="), "layer_types"},
        {"kimi_linear", E("mlp_layer_types="), "first_k_dense_replace"},
        {"kimi_linear", E("kv_lora_rank="), "kv_lora_rank"},
        {"kimi_linear", E("q_lora_rank="), "q_lora_rank"},
        {"kimi_linear", E("qk_nope_head_dim="), "qk_nope_head_dim"},
        {"kimi_linear", E("qk_rope_head_dim="), "qk_rope_head_dim"},
        {"kimi_linear", E("v_head_dim="), "v_head_dim"},
        {"kimi_linear", E("num_experts="), "num_experts"},
        {"kimi_linear", E("num_experts_per_token="), "num_experts_per_token"},
        {"kimi_linear", E("moe_renormalize="), "moe_renormalize"},
        {"kimi_linear", E("num_expert_group="), "num_expert_group"},
        {"kimi_linear", E("topk_group="), "topk_group"},
        {"kimi_linear", E("routed_scaling_factor="), "routed_scaling_factor"},
        {"kimi_linear", E("moe_intermediate_size="), "moe_intermediate_size"},
        {"kimi_linear", E("intermediate_size="), "intermediate_size"},
        {"kimi_linear", E("rms_norm_eps="), "rms_norm_eps"},
        {"kimi_linear", E("linear_attn_config.head_dim=", "linear_head_dim="), "linear_head_dim"},
        {"kimi_linear", E("routed_scaling_factor=NaN"), "routed_scaling_factor"},
        {"kimi_linear_qlora", E("q_lora_rank=0"), "q_lora_rank"},
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        int q = strcmp(bads[i].fx, "kimi_linear") != 0;
        json_t *c = edited(base[q], bads[i].edits);
        int rc = try_load(be, fxs[q], c, msg, sizeof msg);
        CHECKF(rc != 0 && strstr(msg, bads[i].needle), "%s %s: an error naming %s, got %d \"%s\"", bads[i].fx,
               bads[i].edits[0], bads[i].needle, rc, msg);
        json_decref(c);
    }
    // tensor parallelism: 3 ranks do not split 4 KDA heads; the error names the key (rank 0 of a 3-rank CPU group)
    struct backend *grp[3];
    if (!backend_create_group("cpu", 3, 3, DT_F32, grp)) {
        int rc = try_load(grp[0], "kimi_linear", base[0], msg, sizeof msg);
        CHECKF(rc != 0 && strstr(msg, "num_heads") && strstr(msg, "tensor_parallel_size"),
               "tp 3: an error naming num_heads and tensor_parallel_size: %s", msg);
        for (int i = 0; i < 3; i++) backend_free(grp[i]);
    } else {
        CHECKF(0, "a 3-rank CPU group: %s", vllm_last_error());
    }
    json_decref(base[0]);
    json_decref(base[1]);
    backend_free(be);
    return test_summary("kimi_config");
}
