// tp_model.h - tiny random NemotronH checkpoints for the tensor-parallel
// tests: any layer pattern, at widths chosen to split over 2, 3, 4 or 8 ranks.
#ifndef VLLM_TESTS_TP_MODEL_H
#define VLLM_TESTS_TP_MODEL_H

#include <jansson.h>
#include <stdint.h>

struct tpm_cfg {
    const char *pattern; // hybrid_override_pattern: M * - E
    int vocab, hidden;
    int m_heads, m_head_dim, m_groups, m_state, m_conv, chunk;
    int heads, kv_heads, head_dim;
    int mlp_inter;
    int experts, top_k, moe_inter, shared_inter, latent, n_group, topk_group;
    int tie;        // tie_word_embeddings, no lm_head.weight
    int experts_3d; // experts.up_proj as one [E, I, L] tensor (else experts.{e}.up_proj.weight)
};

// A default config with every width divisible by 4 and a vocabulary that
// is not (the last vocabulary shard is padded).
struct tpm_cfg tpm_default(const char *pattern);
// Its config.json (new reference).
json_t *tpm_config(const struct tpm_cfg *c);
// Writes config.json and model.safetensors of random weights into a fresh
// temporary directory (tu_rmdir it); NULL on failure.
char *tpm_write(const struct tpm_cfg *c, uint64_t seed);

#endif
