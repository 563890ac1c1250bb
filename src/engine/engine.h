// engine.h - the engine behind vllm.h: a thread that repeats
// step() = schedule, run, postprocess, while requests arrive from any thread.
#ifndef VLLM_ENGINE_ENGINE_H
#define VLLM_ENGINE_ENGINE_H

#include <pthread.h>

#include "backend/backend.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "models/model.h"
#include "runner/runner.h"
#include "vllm.h"

struct tokenizer;
struct chat_template;

struct vllm_engine {
    int priority; // scheduling_policy "priority"
    struct vllm_engine_params params; // strings below owned
    char *model_dir, *model_name;
    int tp;               // tensor-parallel ranks (1: none)
    struct backend **be;  // [tp] rank k's device (one group)
    struct model **model; // [tp] rank k's shards of the model
    struct runner *runner;
    struct scheduler sched;
    struct tokenizer *tok;          // NULL without tokenizer.json
    struct chat_template *chat;     // NULL without a chat template
    struct vllm_model_info info;
    int max_model_len;
    int64_t kv_budget; // bytes for the KV pool: kv_cache_bytes, from gpu_memory_utilization, or 2 GiB
    int32_t eos[16]; // config.json's, generation_config.json's and the tokenizer's eos ids (gen_config.c)
    int num_eos;
    char *gen_defaults; // info.generation_defaults

    pthread_t thread;
    pthread_mutex_t mu;             // guards everything below
    pthread_cond_t cv;
    struct request *inbox_head, *inbox_tail; // submitted, not yet seen by the scheduler
    int num_inbox;
    int num_cancel;                 // requests with cancel set, not yet handled
    int stop;
    int paused;        // vllm_engine_pause: no step starts until vllm_engine_resume
    int inflight_step; // runner handle of the step on the device, -1 when none
    int async;         // launch step N+1 before waiting for step N (params.async_scheduling)
    uint64_t next_id;
    struct vllm_stats stats;
};

// The model's cost (rank 0's shards) and the KV element size, for vllm
// bench's roofline; the device's limits measured now (VLLM_ERR_UNSUPPORTED
// when the backend does not measure them).
void engine_cost(const struct vllm_engine *e, struct model_cost *c, int *kv_elem_bytes);
int engine_peaks(struct vllm_engine *e, double *bytes_per_s, double *flops_per_s);

// gen_config.c: the eos ids and generation_config.json's sampling defaults.
int engine_generation_config(struct vllm_engine *e);

// Internal hooks for tests (not part of the ABI).
void engine_set_logits_hook(struct vllm_engine *e, runner_logits_hook fn, void *user);
void request_release(struct vllm_engine *e, struct request *r); // drops one reference (under e->mu)
void engine_thread_start(struct vllm_engine *e);
// Aborts what is left (inbox, waiting, running) with VLLM_FINISH_ABORT.
void engine_abort_all(struct vllm_engine *e);

#endif
