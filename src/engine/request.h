// request.h - one request inside the engine.
#ifndef VLLM_ENGINE_REQUEST_H
#define VLLM_ENGINE_REQUEST_H

#include <stdint.h>

#include "vllm.h"

enum req_state { REQ_WAITING, REQ_RUNNING, REQ_FINISHED };

struct text_stream;
struct vllm_engine;

struct request {
    uint64_t id;
    struct vllm_engine *engine;
    // prompt then output ids: the host's copy, learned from the device after
    // each step for output and stop checks. The model never reads it: input
    // ids come from the runner's token table on the device. With a step in
    // flight, num_tokens already counts its sampled token (-1 here until the
    // step's output arrives).
    int32_t *tokens;
    int num_prompt, num_tokens, cap_tokens;
    int num_computed; // tokens whose KV / state is in the caches
    enum req_state state;
    int *blocks; // KV block ids
    int num_blocks, cap_blocks;
    int slot;    // recurrent-state slot, -1 when none
    int row;     // token-table row in the runner, -1 when none
    // Prefix caching (engine/kv_cache.h): the chain hash of each full block of
    // known tokens, from the salt's root; blocks[0, num_committed) are in the
    // block pool's table (committed by this request, or hits).
    uint64_t salt;
    uint64_t *hashes;
    int num_hashed, cap_hashes, num_committed;
    int ckpt_hit;      // state checkpoint restored at admission, held until freed; -1: none
    int restore;       // the next step restores ckpt_hit into the slot
    int num_cached;    // prompt tokens found in the cache at the first admission; -1 before it
    int32_t *pend;     // pairs (position, checkpoint id) launched steps write, held until committed
    int num_pend, cap_pend;

    struct vllm_sampling_params sp; // arrays below owned
    // Constrained decoding (vllm.h): the caller's callbacks, released with
    // the request. The runner asks fill_mask for each row it samples; the
    // engine feeds accept each sampled id in order, so the constraint's
    // state always matches the output ids (preemption by recompute keeps
    // them: nothing to replay).
    struct vllm_constraint cons;
    int has_cons;
    int32_t *stop_ids;
    int32_t *bias_ids; // logit_bias, owned
    float *bias_vals;
    char **stop_strs;
    uint64_t seed;
    int max_tokens; // clamped to what max_model_len leaves
    int delivered;  // output tokens streamed to the caller (tokens in flight are not)
    int32_t stop_token; // the stop_token_ids entry that finished it; -1: none

    vllm_stream_fn cb;
    void *user;
    struct text_stream *ts; // NULL without a tokenizer

    int refs;          // caller + engine, under the engine mutex
    int cancel;        // asked to abort
    int finished;      // the last event went out (written by the engine thread, under the
                       // engine mutex); launched steps may still use its resources
    int inflight;      // launched steps not yet postprocessed that schedule it
    int length_done;   // the tokens in flight already reach max_tokens / max_model_len
    double t_submit, t_first, t_last;
    double t_sched; // the first admission (0 before)
    struct request *next; // waiting-queue link
};

static inline int req_num_output(const struct request *r) { return r->num_tokens - r->num_prompt; }

#endif
