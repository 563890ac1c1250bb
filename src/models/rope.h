// rope.h - rotary position embeddings: the config's rope parameters (the
// Hub's rope_theta + rope_scaling, or transformers 5's rope_parameters) and
// the cos / sin table the backend's rope op reads.
#ifndef VLLM_MODELS_ROPE_H
#define VLLM_MODELS_ROPE_H

#include "models/config_reader.h"
#include "models/loader.h"

enum rope_type { ROPE_DEFAULT, ROPE_LINEAR, ROPE_LLAMA3, ROPE_YARN };

struct rope {
    enum rope_type type;
    int head_dim;
    double theta, factor;
    double low_freq_factor, high_freq_factor; // llama3
    double beta_fast, beta_slow, attention_factor; // yarn (attention_factor scales cos and sin)
    int original_max, truncate;
    int max_pos;  // rows of the table
    float *table; // device [max_pos, head_dim]: head_dim/2 cosines, then head_dim/2 sines
};

// Reads the rope parameters of a config whose heads are head_dim wide; a rope
// type outside default / linear / llama3 / yarn, or partial rotary, is an
// error naming it.
int rope_parse(const struct cfg_reader *r, int head_dim, int max_position, struct rope *out);
// Host table [max_pos, head_dim] as transformers computes it (fp32 inverse
// frequencies, fp32 position products).
void rope_table(const struct rope *p, int max_pos, float *out);
// Makes the device table for positions [0, max_pos).
int rope_upload(struct rope *p, struct loader *l, int max_pos);

#endif
