// config_reader.h - validating reads of a model's config.json, shared by
// every model family's config parser.
//
// Each getter takes a NULL-terminated list of key aliases (the first present
// wins; messages name keys[0]) and a range, and fails with VLLM_ERR_FORMAT
// naming the file, the key and the offending value:
//   config.json: "layer_norm_epsilon" = nan is out of range (0, 1]
// Integers must be JSON integers: "4096", 4096.5, true are errors. Floats take
// every form Python's json writes (core/json.h); NaN is always an error, and
// an infinity only where the range's bound is itself infinite.
#ifndef VLLM_MODELS_CONFIG_READER_H
#define VLLM_MODELS_CONFIG_READER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

// Limits on what a config may ask for. Real checkpoints sit far below them
// (Llama-3-405B: hidden 16384, vocab 128256, 128 heads, intermediate 53248;
// Nemotron-H 56B: in_proj width ~37k; Qwen3-235B: 128 experts), and with
// every factor bounded, every product a model derives from them is computed
// in int64 without overflow and every row width fits an int. CFG_MAX_MATRIX
// is 2^32 elements (16 GiB as fp32): the largest real matrix is about 2.1e9
// (Llama-3-405B's embedding).
#define CFG_MAX_HIDDEN (1 << 20)      // hidden_size, moe_latent_size
#define CFG_MAX_VOCAB (1 << 24)       // vocab_size
#define CFG_MAX_HEADS (1 << 14)       // attention / KV / Mamba heads, Mamba groups
#define CFG_MAX_HEAD_DIM (1 << 14)    // head_dim, mamba_head_dim, ssm_state_size
#define CFG_MAX_LAYERS (1 << 12)      // layers
#define CFG_MAX_CONV 256              // conv_kernel
#define CFG_MAX_CHUNK (1 << 12)       // Mamba chunk_size (the scan's scratch grows with its square)
#define CFG_MAX_EXPERTS 1024          // routed experts (the router's limit)
#define CFG_MAX_POSITION (1 << 24)    // max_position_embeddings
#define CFG_MAX_WIDTH (1 << 24)       // any row width: intermediate sizes, in_proj, conv_dim, heads*head_dim
#define CFG_MAX_MATRIX ((int64_t)1 << 32) // elements of one weight matrix (vocab*hidden, in_proj, qkv, ...)
#define CFG_MAX_STATE ((int64_t)1 << 28)  // floats of one layer's recurrent state per sequence
#define CFG_MAX_LAYER_PARAMS ((int64_t)1 << 40) // elements of one layer (experts*moe_inter*hidden)

struct cfg_reader {
    const json_t *j;  // the config object
    const char *what; // the file, for messages
};

#define CFG_KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})

// A float range: [min, max], or (min, max] with min_open.
struct cfg_range {
    double min, max;
    int min_open;
};
#define CFG_CLOSED(lo, hi) ((struct cfg_range){(lo), (hi), 0})
#define CFG_POSITIVE(hi) ((struct cfg_range){0, (hi), 1}) // (0, hi]

// The value of the first alias present, or NULL.
const json_t *cfg_get(const struct cfg_reader *r, const char *const *keys);

// Required integer in [min, max].
int cfg_int(const struct cfg_reader *r, const char *const *keys, int64_t min, int64_t max, int *out);
// Absent or null: dflt; otherwise as cfg_int.
int cfg_int_opt(const struct cfg_reader *r, const char *const *keys, int64_t min, int64_t max, int dflt, int *out);
// Required number in the range; it must stay there once rounded to float.
int cfg_float(const struct cfg_reader *r, const char *const *keys, struct cfg_range range, float *out);
int cfg_float_opt(const struct cfg_reader *r, const char *const *keys, struct cfg_range range, float dflt,
                  float *out);
// A JSON number (any Python form) as a double in the range; `name` labels it
// in messages (e.g. "time_step_limit[1]").
int cfg_number(const struct cfg_reader *r, const char *name, const json_t *v, struct cfg_range range, double *out);
int cfg_bool(const struct cfg_reader *r, const char *const *keys, int *out);
int cfg_bool_opt(const struct cfg_reader *r, const char *const *keys, int dflt, int *out);
// Absent or null: *out = NULL; a non-string is an error. *out points into r->j.
int cfg_str_opt(const struct cfg_reader *r, const char *const *keys, const char **out);
// "eos_token_id": absent or null (none), an integer or a list of integers,
// each in [0, vocab); a list longer than max_ids is an error, never cut.
int cfg_eos(const struct cfg_reader *r, int vocab, int max_ids, int32_t *ids, int *num);

// A size derived from the config (`desc` says how, e.g. "vocab_size * hidden_size")
// must be at most max; compute it with cfg_mul / cfg_add, which saturate at
// INT64_MAX instead of overflowing.
int cfg_limit(const struct cfg_reader *r, const char *desc, int64_t value, int64_t max);
int64_t cfg_mul(int64_t a, int64_t b);
int64_t cfg_add(int64_t a, int64_t b);

// The value as short JSON text for messages ("nan", "\"64\"", "[1, 2]").
const char *cfg_show(const json_t *v, char *buf, size_t n);

#endif
