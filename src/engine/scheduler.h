// scheduler.h - a vLLM V1 style scheduler: one token budget per step,
// continuous batching, chunked prefill, FCFS, preemption by recompute, and
// prefix caching (content-addressed KV blocks and state checkpoints).
#ifndef VLLM_ENGINE_SCHEDULER_H
#define VLLM_ENGINE_SCHEDULER_H

#include "engine/id_pool.h"
#include "engine/kv_cache.h"
#include "engine/request.h"

struct sched_entry {
    struct request *req;
    int num_tokens; // scheduled this step
    int is_decode;  // the one token left is a sampled one and state exists
    int new_row;    // the request got its token-table row this step: its tokens go there first
    int restore;    // state checkpoint the step copies into the slot first (a prefix hit); -1: none
    int ckpt0, num_ckpt; // its checkpoint writes: sched_output.ckpt_pos / ckpt_id [ckpt0, ckpt0 + num_ckpt)
    int commit0, commit1; // its blocks [commit0, commit1) committed when scheduled (for sched_launch_failed)
};

struct sched_output {
    struct sched_entry *entries; // in scheduling order (the runner puts decodes first)
    int num_entries, num_tokens;
    struct request **preempted;  // lost their KV blocks and state slot this step
    int num_preempted;
    // State checkpoints this step writes: after the token at ckpt_pos[k] - 1
    // the sequence's state goes to checkpoint ckpt_id[k] (ascending per entry;
    // a decode entry has at most one, after its token).
    int32_t *ckpt_pos, *ckpt_id;
    int num_ckpt;
};

struct sched_config {
    int max_num_seqs, max_num_batched_tokens, block_size;
    int num_blocks;  // 0: the model has no attention layers
    int num_slots;   // 0: the model has no recurrent state
    int prefix_caching;
    int num_ckpts;     // state checkpoints in the pool (with prefix caching and recurrent state)
    int ckpt_interval; // tokens between checkpoints: a multiple of block_size and of the SSD chunk
    int priority;      // 1: order by (sp.priority, arrival), preempt the least urgent; 0: FCFS
};

// State checkpoints one step writes, at most.
static inline int sched_max_ckpt_writes(const struct sched_config *c) {
    return c->num_ckpts && c->ckpt_interval ? c->max_num_batched_tokens / c->ckpt_interval + c->max_num_seqs : 0;
}

// Every resource a request holds comes from these pools and goes back in
// sched_free_resources: KV blocks, a recurrent-state slot, a row of the
// runner's token table (max_num_seqs of them), the state checkpoint it
// restored and those its launched steps write. A request that finished keeps
// them while a launched step still uses them, so admission waits for a free
// row as it waits for a free slot.
struct scheduler {
    struct sched_config cfg;
    struct kv_pool blocks, ckpts;
    struct id_pool slots, rows;
    struct request *wait_head, *wait_tail;
    int num_waiting;
    struct request **running;
    int num_running;
    struct sched_output out;
    uint64_t num_preemptions;
    uint64_t prefix_queries, prefix_hits; // tokens looked up at admission, and found
    uint64_t decode_ckpts;                // checkpoints planned by decode steps (plan_ckpts)
};

// VLLM_ERR_OUT_OF_MEMORY (nothing held) when the block pools' host index cannot be allocated.
int sched_init(struct scheduler *s, const struct sched_config *cfg);
void sched_release(struct scheduler *s);
void sched_add(struct scheduler *s, struct request *r); // to the back of the waiting queue
// Builds the next step. Preempted requests go back to the front of the queue.
// A prefill's full blocks are committed to the prefix cache as it is
// scheduled, so that a request admitted later in the same step starts from
// them (every layer writes the step's KV before its attention reads).
const struct sched_output *sched_schedule(struct scheduler *s);
// The step o never ran (its launch failed): the blocks it committed when
// scheduled hold nothing, so they are forgotten. Before its requests are freed.
void sched_launch_failed(struct scheduler *s, const struct sched_output *o);
// Takes a finished or aborted request out of the running set or the queue.
void sched_unschedule(struct scheduler *s, struct request *r);
// Returns its KV blocks, state slot, token-table row and checkpoints to the
// pools, first committing what its launched steps computed to the cache
// (once no launched step uses them; at once on preemption, which recomputes).
void sched_free_resources(struct scheduler *s, struct request *r);
int sched_has_work(const struct scheduler *s);
// KV blocks a sequence of n tokens needs.
int sched_blocks_for(const struct scheduler *s, int n);

#endif
