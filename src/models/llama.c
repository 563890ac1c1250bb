// llama.c - LlamaForCausalLM (Llama 3.x, and Mistral-style configs of the
// same architecture) and Qwen2ForCausalLM: the decoder (decoder.h). Llama's
// attention_bias / mlp_bias add biases; Qwen2 has q/k/v biases always.
#include "models/decoder.h"
#include "models/layers.h"

extern const struct model_ops llama_ops, qwen2_ops;

static const struct dec_family llama = {.arch = "LlamaForCausalLM", .attention_bias = 1, .mlp_bias = 1};
static const struct dec_family qwen2 = {.arch = "Qwen2ForCausalLM", .qkv_bias = 1};

static int load_llama(const char *dir, const json_t *config, const struct model_load_opts *o, struct backend *be,
                      struct model **out) {
    return dec_load(&llama, &llama_ops, dir, config, o, be, out);
}

static int load_qwen2(const char *dir, const json_t *config, const struct model_load_opts *o, struct backend *be,
                      struct model **out) {
    return dec_load(&qwen2, &qwen2_ops, dir, config, o, be, out);
}

const struct model_ops llama_ops = {.load = load_llama, .free = lm_free, .forward = lm_forward};
const struct model_ops qwen2_ops = {.load = load_qwen2, .free = lm_free, .forward = lm_forward};
