// decoder.h - the pre-norm transformer decoder (Llama, Mistral, Qwen2, Qwen3,
// Qwen3-MoE): per layer, h += attn(input_layernorm(h)) with RoPE, then h +=
// mlp(post_attention_layernorm(h)) with a SwiGLU MLP or a softmax-routed
// MoE. The families differ in a few knobs (struct dec_family); each is a
// short file (llama.c, qwen3.c) naming its knobs and its registry entry.
#ifndef VLLM_MODELS_DECODER_H
#define VLLM_MODELS_DECODER_H

#include "models/model.h"

struct dec_family {
    const char *arch;     // for the spec and messages
    int qkv_bias;         // q/k/v always have biases, o_proj none (Qwen2)
    int attention_bias;   // "attention_bias" sets q/k/v/o biases (Llama, Qwen3)
    int mlp_bias;         // "mlp_bias" sets the MLP's biases (Llama)
    int qk_norm;          // per-head RMSNorm of q and k before RoPE (Qwen3)
    int moe;              // sparse layers by decoder_sparse_step / mlp_only_layers (Qwen3-MoE)
    int tie_default;      // tie_word_embeddings when the config does not say (the class default)
};

int dec_load(const struct dec_family *f, const struct model_ops *ops, const char *dir, const json_t *config,
             const struct model_load_opts *o, struct backend *be, struct model **out);

#endif
