// nemotron_h.h - NemotronH (NemotronHForCausalLM): hybrid Mamba2 (M),
// attention (*), relu^2 MLP (-) and MoE (E) layers, each h += mixer(norm(h)).
#ifndef VLLM_MODELS_NEMOTRON_H_H
#define VLLM_MODELS_NEMOTRON_H_H

#include <jansson.h>

#include "backend/backend.h"

enum nh_kind { NH_MAMBA, NH_ATTN, NH_MLP, NH_MOE };

struct nh_config {
    int vocab, hidden, num_layers;
    enum nh_kind *kinds; // [num_layers]
    float eps;
    int tie_embeddings;
    int max_position;
    int num_eos;
    int eos[8];
    // Mamba2
    int m_heads, m_head_dim, m_groups, m_state, m_conv, chunk;
    int conv_bias;
    float dt_min, dt_max;
    // attention
    int heads, kv_heads, head_dim;
    // relu^2 MLP
    int mlp_inter;
    // MoE
    int experts, top_k, moe_inter, shared_inter, n_group, topk_group, norm_topk, latent;
    float routed_scale;
};

// Parses config.json (both layer-type spellings, legacy key names, Python
// floats). Every key the model needs is required. `what` names the file.
int nh_config_parse(const json_t *j, const char *what, struct nh_config *c);
void nh_config_free(struct nh_config *c);
// Whether the model splits over tp tensor-parallel ranks; a clear error if not.
int nh_config_check_tp(const struct nh_config *c, int tp, const char *what);

#endif
