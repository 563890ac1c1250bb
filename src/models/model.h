// model.h - the model registry's interface. A model declares what caches it
// needs per cache layer, loads its weights onto a backend, and runs one flat
// batch per step through backend ops (src/models/layers.h).
#ifndef VLLM_MODELS_MODEL_H
#define VLLM_MODELS_MODEL_H

#include <jansson.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/batch.h"

#define MAX_STATE_BUFS 4 // recurrent-state buffers of one layer, at most

// What the engine must allocate for one cache layer (a layer may need neither).
struct layer_cache_spec {
    // Paged KV: elements per token of this rank's K and V (0: none). K and V
    // differ where a model caches a latent (MLA: K holds it, V is empty).
    int64_t k_per_token, v_per_token;
    // Recurrent state: named fp32 buffers of `floats` per slot.
    int num_states;
    struct {
        const char *name;
        int64_t floats;
    } states[MAX_STATE_BUFS];
    // Positions where the ops can checkpoint the state are multiples of this
    // (Mamba2: chunk_size, the SSD scan's chunk boundaries); 0: no state.
    int state_align;
};

// What a step costs, from the shapes (vllm bench's roofline): bytes of
// weights every token reads, and per MoE layer the bytes of one expert (a
// step reads each expert its tokens route to once); FLOPs per token; per
// token of context, the KV bytes (K + V over all layers) and attention FLOPs.
struct model_cost {
    int64_t dense_bytes;         // weights read whatever the routing (this rank's)
    int64_t expert_bytes;        // one routed expert of one MoE layer
    int moe_layers, experts, top_k;
    double dense_flops;          // per token: 2 x the dense weights' elements
    double expert_flops;         // per token per routed expert
    int64_t kv_elems_per_token;  // K + V elements over all layers
    int64_t state_bytes_per_seq; // recurrent state, read and written once a step
    double attn_flops_per_ctx;   // per query token per context token (QK^T and PV)
};

struct model_spec {
    const char *arch;
    int vocab_size;
    int hidden_size;
    int num_layers;              // cache layers: entries of layers[]
    int max_position_embeddings; // 0: unknown
    int num_eos;
    int32_t eos_ids[8];
    struct layer_cache_spec *layers; // [num_layers]
    int64_t weight_bytes;            // on the device
    struct model_cost cost;
};

// Caches addressed by cache layer (NULL where a layer has none).
struct caches {
    int num_layers;
    void **k, **v; // [num_layers] -> [num_blocks, block_size, per-token K / V] in the backend's kv_dtype
    float ***state; // [num_layers][num_states] -> [num_slots, floats] fp32
    int block_size, num_blocks, num_slots;
};

// Allocates every cache layer's KV (num_blocks of block_size tokens, in the
// backend's kv_dtype) and recurrent state (num_slots slots) for a model of
// spec sp; adds the bytes to *kv_bytes / *state_bytes when given.
int caches_alloc(struct backend *be, const struct model_spec *sp, int num_blocks, int block_size, int num_slots,
                 struct caches *c, int64_t *kv_bytes, int64_t *state_bytes);
void caches_release(struct backend *be, struct caches *c);

struct model_load_opts {
    enum wfmt weight_fmt;
    int dummy;          // random weights from the config alone
    uint64_t seed;
    int max_tokens;     // rows of the step workspace (max_num_batched_tokens)
    int max_logit_rows; // rows of logits one forward may produce
    int max_seq_len;    // tokens of one sequence, at most (0: the config's max_position_embeddings)
    int quantization;   // enum quant_mode (models/quant.h): --quantization
};

struct model;
struct model_ops {
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

// The registry: one entry per family, with every config.json
// "architectures" name it answers to.
struct model_family {
    const char *name;           // e.g. "nemotron_h"
    const char *const *archs;   // NULL-terminated; archs[0] is the canonical name
    const struct model_ops *ops;
};
const struct model_family *model_families(int *n);
// The family of an architecture name, or NULL.
const struct model_family *model_find(const char *arch);
// The registry's own copy of an architecture name (it outlives the config), or NULL.
const char *model_arch_name(const char *arch);
// Loads config.json from dir (or config_override) and the model it names.
int model_load(const char *dir, const json_t *config_override, const struct model_load_opts *o,
               struct backend *be, struct model **out);
void model_free(struct model *m);

#endif
