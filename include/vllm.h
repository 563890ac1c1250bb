// vllm.h - the stable C11 ABI of libvllm.
//
// Conventions:
// - Handles are opaque. Every call that can fail returns a vllm_status; on
//   failure vllm_last_error() holds a message for the calling thread.
// - Structs are initialized with their *_default() function, then edited.
// - All functions are thread-safe. Stream callbacks run on the engine's own
//   thread; they may call vllm_submit / vllm_request_cancel, and must return
//   quickly (a callback that blocks stalls every request). The exception:
//   vllm_engine_free sends the last (abort) events of requests still running
//   from the thread that calls it, after the engine thread has stopped.
#ifndef VLLM_H
#define VLLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum vllm_status {
    VLLM_OK = 0,
    VLLM_ERR_INVALID_ARGUMENT = 1, // a bad parameter or request field
    VLLM_ERR_IO = 2,               // a file is missing or unreadable
    VLLM_ERR_FORMAT = 3,           // a malformed file, header or config
    VLLM_ERR_UNSUPPORTED = 4,      // unknown architecture or component
    VLLM_ERR_OUT_OF_MEMORY = 5,    // host or device allocation failed
    VLLM_ERR_TOO_LONG = 6,         // prompt (+ max_tokens) over max_model_len
    VLLM_ERR_QUEUE_FULL = 7,       // more waiting requests than max_queued
    VLLM_ERR_CANCELLED = 8,        // the request was cancelled
    VLLM_ERR_BACKEND = 9,          // a device (CUDA) call failed
    VLLM_ERR_INTERNAL = 10,        // a bug: please report it
    VLLM_ERR_SHUTDOWN = 11,        // the engine is stopping
} vllm_status;

typedef enum vllm_finish_reason {
    VLLM_FINISH_NONE = 0,   // still running
    VLLM_FINISH_STOP = 1,   // a stop string or stop token id
    VLLM_FINISH_LENGTH = 2, // max_tokens or max_model_len reached
    VLLM_FINISH_EOS = 3,    // the model's end-of-sequence token
    VLLM_FINISH_ABORT = 4,  // cancelled, or the engine shut down
    VLLM_FINISH_ERROR = 5,  // see vllm_output.status
} vllm_finish_reason;

// Thread-local message of the last failed call on this thread ("" if none).
const char *vllm_last_error(void);
// Library version, "MAJOR.MINOR.PATCH".
const char *vllm_version(void);
// Frees memory that a vllm_* call returned to the caller.
void vllm_free(void *p);
const char *vllm_status_string(vllm_status s);
const char *vllm_finish_reason_string(vllm_finish_reason r);

// ---------------------------------------------------------------- engine --

struct vllm_engine;

struct vllm_engine_params {
    const char *model;          // model directory (config.json, *.safetensors)
    const char *device;         // "cpu" (default) or "cuda"
    const char *dtype;          // weights: "auto", "float32", "bfloat16" or "float16"
    const char *load_format;    // "auto" (safetensors) or "dummy" (random weights)
    int block_size;             // tokens per KV block (default 16)
    int64_t kv_cache_bytes;     // KV pool budget in bytes (0: default)
    int num_kv_blocks;          // exact KV block count (0: from kv_cache_bytes)
    int max_num_seqs;           // running requests at most (default 64)
    int max_num_batched_tokens; // token budget of one step (default 2048)
    int max_model_len;          // prompt + output at most (0: from config)
    int max_queued;             // waiting requests at most (0: unlimited)
    int num_threads;            // CPU threads (0: the cores present)
    int tensor_parallel_size;   // ranks the model is split over: GPUs (default 1)
    uint64_t seed;              // dummy weights and unseeded sampling
    // "auto" (the weights' 16-bit type on CUDA, float32 on the CPU), "float32",
    // "bfloat16" (CUDA), or "fp8" / "fp8_e4m3": e4m3 codes (half the bytes of
    // bf16, so twice the blocks in a budget) of x / k_scale and x / v_scale,
    // the checkpoint's per-layer scales or 1 (docs/QUANTIZATION.md)
    const char *kv_cache_dtype;
    // Prefix caching: a request reuses the KV blocks and recurrent-state
    // checkpoints of a prefix that earlier requests computed.
    int enable_prefix_caching;     // default 0 (`vllm serve` turns it on)
    int64_t prefix_state_bytes;    // state checkpoint pool in bytes (0: a quarter of the KV budget)
    int state_checkpoint_interval; // tokens between state checkpoints (0: the least common multiple of
                                   // block_size and the SSD chunk size); a multiple of that
    // "fcfs" (NULL, the default): requests run in arrival order and the last
    // admitted is preempted first. "priority": by (vllm_sampling_params.priority,
    // arrival), lower first; the least urgent running request is preempted first.
    const char *scheduling_policy;
    // generation_config.json: "auto" (NULL: the model directory's, if any),
    // "vllm" (none), or a directory holding one. Its eos_token_id entries stop
    // every request; its sampling keys are vllm_model_info.generation_defaults.
    const char *generation_config;
    // "auto" (the checkpoint's; NULL too), "none", "fp8", "nvfp4", "fp8_block":
    // a checkpoint must be quantized so; dummy weights are made so (docs/QUANTIZATION.md)
    const char *quantization;
    // (0, 1]: the fraction of the device's memory (RAM on the CPU) this engine
    // may hold; the KV pool (and the state checkpoints) get what the weights,
    // workspace and state slots leave of it. 0: kv_cache_bytes, or 2 GiB.
    // Ignored when kv_cache_bytes or num_kv_blocks is set.
    float gpu_memory_utilization;
    // Async scheduling: step N+1 is launched before step N is waited for, so
    // the host schedules and postprocesses while the device computes. -1 (the
    // default): on with CUDA; off on the CPU, whose ops finish inside the
    // launch, so each token would go out a step late. 1 on (the CPU too: the
    // path CUDA runs, for tests), 0 off.
    int async_scheduling;
};
void vllm_engine_params_default(struct vllm_engine_params *p);

vllm_status vllm_engine_load(const struct vllm_engine_params *p, struct vllm_engine **out);
// Aborts what is still running (callbacks get VLLM_FINISH_ABORT), then frees.
void vllm_engine_free(struct vllm_engine *e);

struct vllm_model_info {
    const char *architecture; // e.g. "NemotronHForCausalLM"
    const char *model_name;   // the model directory's base name
    int vocab_size;
    int max_model_len;
    int num_eos_token_ids;
    const int32_t *eos_token_ids;
    int has_tokenizer;        // tokenizer.json was found and loaded
    int has_chat_template;
    int num_kv_blocks;        // KV capacity, in blocks
    int block_size;
    int num_state_slots;      // recurrent-state slots (max_num_seqs)
    int64_t kv_cache_bytes;
    int64_t state_bytes;
    int64_t weight_bytes;
    int prefix_caching;            // enabled
    int num_state_checkpoints;     // checkpoint pool capacity (0: no recurrent state, or caching off)
    int state_checkpoint_interval; // tokens (0: none)
    int64_t checkpoint_bytes;      // of the pool, over all ranks
    // generation_config.json's sampling defaults (temperature, top_p, top_k,
    // min_p, repetition_penalty, max_new_tokens), a JSON object ("{}": none),
    // for callers that apply them as vLLM does to requests not setting them.
    // eos_token_ids above also holds its eos_token_id and the tokenizer's.
    const char *generation_defaults;
    const char *kv_cache_dtype; // what the KV cache holds: "float32", "bfloat16" or "fp8_e4m3"
};
// The struct stays valid until vllm_engine_free.
vllm_status vllm_engine_info(struct vllm_engine *e, struct vllm_model_info *out);

#define VLLM_ITERATION_TOKEN_BOUNDS {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
#define VLLM_NUM_ITERATION_BOUNDS 13

struct vllm_stats {
    int num_running;
    int num_waiting;
    int kv_blocks_total;
    int kv_blocks_used;
    int state_slots_total;
    int state_slots_used;
    uint64_t prompt_tokens_total;     // prompt tokens processed (recompute included)
    uint64_t generation_tokens_total; // tokens sampled
    uint64_t requests_finished;
    uint64_t num_preemptions;
    uint64_t num_steps;
    uint64_t prefix_cache_queries; // prompt tokens looked up in the prefix cache (recompute included)
    uint64_t prefix_cache_hits;    // of those, tokens found there (not computed)
    int state_checkpoints_total;
    int state_checkpoints_used;    // holding a checkpoint or held by a request
    // Steps by the tokens they scheduled (vLLM's vllm:iteration_tokens_total):
    // iteration_tokens[k] counts those with at most VLLM_ITERATION_TOKEN_BOUNDS[k]
    // tokens and more than the bound before; the last, more than every bound.
    uint64_t iteration_tokens[VLLM_NUM_ITERATION_BOUNDS + 1];
    uint64_t iteration_tokens_sum;
};
vllm_status vllm_engine_stats(struct vllm_engine *e, struct vllm_stats *out);
// No step starts between vllm_engine_pause and vllm_engine_resume (a step
// already under way finishes): requests submitted meanwhile are scheduled
// together when it resumes, as one offline batch (`vllm generate --batch`).
// Requests keep their resources while paused; blocking calls wait.
vllm_status vllm_engine_pause(struct vllm_engine *e);
vllm_status vllm_engine_resume(struct vllm_engine *e);

// -------------------------------------------------------------- requests --

// Top log-probs a request may ask for per token, at most.
#define VLLM_MAX_LOGPROBS 20
// logit_bias entries a request may carry, at most.
#define VLLM_MAX_LOGIT_BIAS 300

// Constrained decoding (structured output, guided choices, allowed ids): a
// per-request callback set the engine asks, before each token it samples,
// which ids may come next. The engine applies the mask to the logits (-inf)
// before log-probs, penalties and temperature (vLLM's order), on every
// backend. Callbacks run on the engine thread, one request at a time.
struct vllm_constraint {
    void *user;
    // Writes the allowed ids of the next token: bitmask has num_words =
    // CDIV(vocab_size, 32) words, zeroed; bit (id % 32) of word (id / 32) set
    // = allowed. An EOS id the mask allows ends the request where the
    // constraint accepts (an EOS the mask never allows cannot end it).
    void (*fill_mask)(void *user, uint32_t *bitmask, int num_words);
    // The token sampled under the last mask (in order). Nonzero: rejected,
    // and the request ends with VLLM_FINISH_ERROR.
    int (*accept)(void *user, int32_t id);
    // Called exactly once, when the engine drops the request (or at once when
    // vllm_submit fails): frees user. May be NULL.
    void (*release)(void *user);
};

struct vllm_sampling_params {
    float temperature;        // 0: greedy (default 1.0)
    float top_p;              // (0, 1], default 1
    int top_k;                // 0 or -1: off
    float min_p;              // [0, 1], default 0
    float repetition_penalty; // > 0, default 1 (prompt and output tokens)
    float presence_penalty;   // [-2, 2], default 0 (output tokens)
    float frequency_penalty;  // [-2, 2], default 0 (output tokens)
    int64_t seed;             // < 0: from the engine's seed
    int max_tokens;           // default 16
    int min_tokens;           // eos and stop ids are ignored before this
    int ignore_eos;
    const int32_t *stop_token_ids;
    int num_stop_token_ids;
    const char *const *stop;  // stop strings (text; needs a tokenizer)
    int num_stop;
    int include_stop_str_in_output;
    int logprobs;             // < 0: none; n >= 0: sampled + n top logprobs
    int skip_special_tokens;  // in text output (default 1)
    const char *cache_salt;   // prefix caching: requests share cached prefixes only with the same salt
                              // (NULL or "": the unsalted ones)
    int priority;             // lower runs first; must be 0 unless scheduling_policy is "priority"
    // NULL: none. Copied at vllm_submit, which takes over constraint->user
    // (its release is called once, on failure too).
    const struct vllm_constraint *constraint;
    // OpenAI's logit_bias: values[i] is added to the logit of ids[i] (each
    // id once, at most VLLM_MAX_LOGIT_BIAS) before log-probs, penalties and
    // temperature, as the constraint's mask. Copied at vllm_submit.
    const int32_t *logit_bias_ids;
    const float *logit_bias_values;
    int num_logit_bias;
    // vLLM's prompt_logprobs: < 0 none (the default); k >= 0: the log-prob of
    // each prompt token after the first under the raw logits of the position
    // before it (full-vocabulary log-softmax), its rank, and the k most
    // likely ids (k <= VLLM_MAX_LOGPROBS). Delivered once, with the first
    // output token (vllm_output.prompt_logprobs). The request reads no
    // cached prefix (every prompt row is computed), as in vLLM.
    int prompt_logprobs;
};
void vllm_sampling_params_default(struct vllm_sampling_params *p);

// One streaming event. Pointers are valid only during the callback.
struct vllm_output {
    uint64_t request_id;
    const int32_t *token_ids;  // new token ids (usually one)
    int num_token_ids;
    const char *text;          // new text (a whole number of UTF-8 chars)
    size_t text_len;
    const float *logprobs;     // [num_token_ids] or NULL
    int num_top_logprobs;      // per token
    const int32_t *top_ids;    // [num_token_ids * num_top_logprobs]
    const float *top_logprobs; // [num_token_ids * num_top_logprobs]
    int num_prompt_tokens;
    int num_output_tokens;     // streamed so far, these included
    vllm_finish_reason finish_reason; // != NONE on the last event
    vllm_status status;        // != OK with VLLM_FINISH_ERROR
    const char *error;         // message with a status != OK
    double ttft_s;             // seconds from submit to the first token (0 before)
    int num_cached_tokens;     // prompt tokens found in the prefix cache at the first admission
    double queue_s;            // seconds from submit to the first admission (0 before it)
    // With VLLM_FINISH_STOP on the last event: what stopped it (vLLM's
    // stop_reason), the stop string or the stop token id; NULL / -1 otherwise.
    const char *stop_str;
    int32_t stop_token_id;
    // With vllm_sampling_params.prompt_logprobs >= 0, on the event of the
    // first output token only (0 / NULL elsewhere): entry i is about prompt
    // token i + 1 (the first prompt token has none), i < num_prompt_logprobs
    // = num_prompt_tokens - 1.
    int num_prompt_logprobs;
    const float *prompt_logprobs;     // [num_prompt_logprobs] log-prob of the prompt token
    const int32_t *prompt_ranks;      // [num_prompt_logprobs] its rank: ids at least as likely (1: the most likely)
    int num_prompt_top_logprobs;      // k per token
    const int32_t *prompt_top_ids;    // [num_prompt_logprobs * num_prompt_top_logprobs], most likely first
    const float *prompt_top_logprobs; // [num_prompt_logprobs * num_prompt_top_logprobs]
};
typedef void (*vllm_stream_fn)(void *user, const struct vllm_output *out);

struct vllm_request;

struct vllm_prompt {
    const int32_t *token_ids; // either ids...
    int num_token_ids;
    const char *text;         // ...or text, tokenized with the model's tokenizer
    int add_special_tokens;   // for text: add BOS etc. (default 1)
};
void vllm_prompt_default(struct vllm_prompt *p);

// Submits a request; returns at once. cb (may be NULL) gets every event; the
// last one has finish_reason != NONE. The caller owns *out and must release it
// with vllm_request_free (after the last event, or to cancel and release).
vllm_status vllm_submit(struct vllm_engine *e, const struct vllm_prompt *prompt,
                        const struct vllm_sampling_params *sp, vllm_stream_fn cb,
                        void *user, struct vllm_request **out);
// Asks the engine to abort the request; its resources return to the pool
// within one step. The last event follows with VLLM_FINISH_ABORT.
vllm_status vllm_request_cancel(struct vllm_request *r);
uint64_t vllm_request_id(const struct vllm_request *r);
// Cancels the request if it still runs, and drops the caller's reference.
void vllm_request_free(struct vllm_request *r);

// Blocking: token ids in, token ids out. *out_ids is allocated (vllm_free).
vllm_status vllm_complete_tokens(struct vllm_engine *e, const int32_t *prompt, int num_prompt,
                                 const struct vllm_sampling_params *sp, int32_t **out_ids,
                                 int *num_out, vllm_finish_reason *reason);
// Blocking: text in, text out (*out_text allocated, NUL-terminated).
vllm_status vllm_complete_text(struct vllm_engine *e, const char *prompt,
                               const struct vllm_sampling_params *sp, char **out_text,
                               vllm_finish_reason *reason);

// ------------------------------------------------------------ tokenizer --

// Text to ids with the model's tokenizer. *ids allocated (vllm_free).
vllm_status vllm_tokenize(struct vllm_engine *e, const char *text, size_t len,
                          int add_special_tokens, int32_t **ids, int *num_ids);
// Ids to text. *text allocated, NUL-terminated (vllm_free).
vllm_status vllm_detokenize(struct vllm_engine *e, const int32_t *ids, int num_ids,
                            int skip_special_tokens, char **text);
// Renders the model's chat template. request_json is a JSON object with
// "messages" and optionally "add_generation_prompt", "tools" and any extra
// template variables. *out allocated, NUL-terminated (vllm_free).
vllm_status vllm_apply_chat_template(struct vllm_engine *e, const char *request_json,
                                     char **out);
// The same with another template's Jinja source (NULL: the model's), keeping
// the model's bos_token / eos_token.
vllm_status vllm_apply_chat_template_source(struct vllm_engine *e, const char *template_src,
                                            const char *request_json, char **out);

#ifdef __cplusplus
}
#endif
#endif // VLLM_H
