// qwen3.c - Qwen3ForCausalLM and Qwen3MoeForCausalLM: the decoder
// (decoder.h) with per-head q/k RMSNorm before RoPE; Qwen3-MoE's sparse
// layers route by softmax top-k (renormalized when norm_topk_prob) to SwiGLU
// experts, with no shared expert.
#include "models/decoder.h"
#include "models/layers.h"

extern const struct model_ops qwen3_ops, qwen3_moe_ops;

static const struct dec_family qwen3 = {.arch = "Qwen3ForCausalLM", .attention_bias = 1, .qk_norm = 1};
static const struct dec_family qwen3_moe = {.arch = "Qwen3MoeForCausalLM", .attention_bias = 1, .qk_norm = 1, .moe = 1};

static int load_qwen3(const char *dir, const json_t *config, const struct model_load_opts *o, struct backend *be,
                      struct model **out) {
    return dec_load(&qwen3, &qwen3_ops, dir, config, o, be, out);
}

static int load_qwen3_moe(const char *dir, const json_t *config, const struct model_load_opts *o, struct backend *be,
                          struct model **out) {
    return dec_load(&qwen3_moe, &qwen3_moe_ops, dir, config, o, be, out);
}

const struct model_ops qwen3_ops = {.load = load_qwen3, .free = lm_free, .forward = lm_forward};
const struct model_ops qwen3_moe_ops = {.load = load_qwen3_moe, .free = lm_free, .forward = lm_forward};
