// runner.h - the model runner: owns the caches and the token table on the
// backend's device, builds one flat batch per step (decodes first), runs the
// model and samples. Steps are launched and waited for separately, so the
// host can schedule step N+1 while the device runs step N.
#ifndef VLLM_RUNNER_RUNNER_H
#define VLLM_RUNNER_RUNNER_H

#include "backend/backend.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "models/model.h"

struct runner_config {
    int max_num_seqs, max_model_len, max_num_batched_tokens;
    int block_size, num_blocks, num_slots;
    int max_top_logprobs;
    int use_graphs; // record pure-decode steps into device graphs, when the backend can
    int num_ckpts;       // state checkpoint slots, after the live slots and the pad slot
    int max_ckpt_writes; // checkpoints one step writes, at most (sched_max_ckpt_writes)
};

#define RUNNER_INFLIGHT 2 // steps launched and not yet waited for, at most

struct step_out {
    int num;                 // sampled requests
    struct request **reqs;   // [num]
    int32_t *pos;            // [num] index of the sampled token in each request's token list
    int32_t *ids;            // [num]
    float *logprobs;         // [num]
    int32_t *top_ids;        // [num, max_top]
    float *top_logprobs;     // [num, max_top]
    int max_top;
    int any_logprobs;
    struct request **scheduled; // every request the step ran (sampled or not)
    int num_scheduled;
    // Prompt log-probs of the prompt rows the step computed for requests
    // asking for them (request.sp.prompt_logprobs >= 0, not yet streamed).
    int num_plp;
    struct request **plp_reqs; // [num_plp]
    int32_t *plp_pos;          // [num_plp] the prompt token each is about (>= 1)
    float *plp_lp;             // [num_plp]
    int32_t *plp_rank;         // [num_plp]
    int32_t *plp_top_ids;      // [num_plp, plp_k]
    float *plp_top_lp;         // [num_plp, plp_k]
    int plp_k;
};

// Test hook: when set, the model computes logits for every row and the hook
// sees them (host copy) with each row's request and position.
typedef void (*runner_logits_hook)(void *user, int rows, int vocab, const float *logits,
                                   struct request *const *row_req, const int32_t *row_pos);

struct runner;

// tp tensor-parallel ranks: be[k] and m[k] (rank k's shards) of one group;
// every rank gets caches of cfg's blocks and slots at its shards' sizes.
int runner_create(int tp, struct backend *const *be, struct model *const *m, const struct runner_config *cfg,
                  struct runner **out);
void runner_free(struct runner *r);
// Bytes of KV cache (and of recurrent state) over all ranks.
int64_t runner_cache_bytes(const struct runner *r, int64_t *state_bytes);
// Launches one step: the tokens of requests the scheduler gave a token-table
// row this step (sched_entry.new_row) uploaded into it, the
// metadata up in one copy, input ids gathered on the device, forward and
// sample (replayed from a graph for pure-decode batches), and the sampled ids
// copied back without waiting. Returns the step's handle in *step.
int runner_launch(struct runner *r, const struct sched_output *so, int *step);
// A step with a constrained row (request.has_cons) is launched without its
// sampler: the forward runs on the device while the host postprocesses the
// step before, whose tokens the constraints must see first; then
// runner_sample fills the masks and queues mask_logits and the sampler (and
// the copies back). Call it for the last launched step only, before
// runner_wait on it.
int runner_needs_sample(const struct runner *r, int step);
void runner_sample(struct runner *r, int step);
// Waits for a launched step; *out is valid until that handle is launched again.
void runner_wait(struct runner *r, int step, struct step_out *out);
void runner_set_logits_hook(struct runner *r, runner_logits_hook fn, void *user);
// After runner_launch: nonzero when the step has prompt rows of a request
// asking for their log-probs but the buffers for them could not be allocated
// (vllm_last_error says why): the step ran without them.
int runner_plp_failed(const struct runner *r);
int runner_graphs_captured(const struct runner *r);

#endif
