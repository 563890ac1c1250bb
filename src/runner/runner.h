// runner.h - the model runner: owns the caches and the token table on the
// backend's device, builds one flat batch per step (decodes first), runs the
// model and samples.
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
};

struct step_out {
    int num;                 // sampled requests
    struct request **reqs;   // [num]
    int32_t *ids;            // [num]
    float *logprobs;         // [num]
    int32_t *top_ids;        // [num, max_top]
    float *top_logprobs;     // [num, max_top]
    int max_top;
    int any_logprobs;
};

// Test hook: when set, the model computes logits for every row and the hook
// sees them (host copy) with each row's request and position.
typedef void (*runner_logits_hook)(void *user, int rows, int vocab, const float *logits,
                                   struct request *const *row_req, const int32_t *row_pos);

struct runner;

int runner_create(struct backend *be, struct model *m, const struct runner_config *cfg, struct runner **out);
void runner_free(struct runner *r);
int64_t runner_cache_bytes(const struct runner *r, int64_t *state_bytes);
// Releases a request's token-table row (finish, abort, preemption).
void runner_remove(struct runner *r, struct request *req);
// One step: rows for new requests (their tokens uploaded), metadata up in one
// copy, input ids gathered on the device, forward, sample, sampled ids down.
int runner_execute(struct runner *r, const struct sched_output *so, struct step_out *out);
void runner_set_logits_hook(struct runner *r, runner_logits_hook fn, void *user);
struct caches *runner_caches(struct runner *r);

#endif
