// model.h - the model registry's interface. A model declares what caches it
// needs per layer id, loads its weights onto a backend, and runs one flat
// batch per step through backend ops.
#ifndef VLLM_MODELS_MODEL_H
#define VLLM_MODELS_MODEL_H

#include <jansson.h>
#include <stdint.h>

#include "backend/backend.h"
#include "runner/batch.h"

// What the engine must allocate for one layer (a layer may need neither).
struct layer_cache_spec {
    int kv_heads, head_dim;              // attention: paged KV (0: none)
    int64_t conv_floats, ssm_floats;     // recurrent state per slot (0: none)
};

enum model_caps {
    MODEL_CAP_RECURRENT_STATE = 1 << 0, // has per-sequence state slots
    MODEL_CAP_PAGED_KV = 1 << 1,        // has attention layers
    MODEL_CAP_PREFIX_CACHING = 1 << 2,  // (none of ours yet: Mamba state is not paged)
};

struct model_spec {
    const char *arch;
    unsigned caps;
    int vocab_size;
    int hidden_size;
    int num_layers;
    int max_position_embeddings; // 0: unknown
    int num_eos;
    int32_t eos_ids[8];
    struct layer_cache_spec *layers; // [num_layers]
    int64_t weight_bytes;            // on the device
};

// Caches addressed by layer id (NULL where a layer has none).
struct caches {
    int num_layers;
    void **k, **v;       // [num_layers] -> [num_blocks, block_size, kv_heads, head_dim]
    float **conv, **ssm; // [num_layers] -> [num_slots, ...] fp32
    int block_size, num_blocks, num_slots;
};

struct model_load_opts {
    enum dtype weight_dtype;
    int dummy;           // random weights from the config alone
    uint64_t seed;
    int max_tokens;      // rows of the step workspace (max_num_batched_tokens)
    int max_logit_rows;  // rows of logits one forward may produce
};

struct model;
struct model_ops {
    const char *arch;
    int (*load)(const char *dir, const json_t *config, const struct model_load_opts *o, struct backend *be,
                struct model **out);
    void (*free)(struct model *m);
    // One step. Reads only b->input_ids; writes logits [rows, vocab] for the
    // batch rows b->sample_rows, or for every row when all_rows is set.
    void (*forward)(struct model *m, const struct batch *b, struct caches *c, float *logits, int all_rows);
};

struct model {
    const struct model_ops *ops;
    struct model_spec spec;
};

// Registry: architecture name (config.json "architectures"[0]) to model.
const struct model_ops *model_find(const char *arch);
// Loads config.json from dir and the model it names.
int model_load(const char *dir, const json_t *config_override, const struct model_load_opts *o,
               struct backend *be, struct model **out);
void model_free(struct model *m);

#endif
