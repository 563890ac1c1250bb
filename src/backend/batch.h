// batch.h - the metadata of one step's flat batch, built by the runner on the
// host and uploaded to the device in one copy.
//
// Sequences [0, num_decodes) are decodes (one token each, state present);
// [num_decodes, num_seqs) are prefills (a prompt chunk, or a recompute).
// Which is which comes from the scheduler, never from a token count: a
// one-token prompt is a prefill.
#ifndef VLLM_BACKEND_BATCH_H
#define VLLM_BACKEND_BATCH_H

#include <stdint.h>

// Sampling parameters of one sampled row (device side).
struct sample_params {
    float temperature; // 0: greedy
    float top_p, min_p;
    float repetition_penalty, presence_penalty, frequency_penalty;
    int32_t top_k;        // <= 0: off
    int32_t row_base;     // token-table index of the request's token 0
    int32_t num_prompt;   // prompt tokens
    int32_t num_tokens;   // tokens before this sample (prompt + output)
    int32_t num_logprobs; // < 0: none
    uint32_t seed_lo, seed_hi;
    uint32_t step; // index of the output token being sampled (Philox counter)
};

struct batch {
    int num_tokens, num_seqs, num_decodes, num_prefills, num_sample;
    int max_blocks_per_seq; // row stride of block_tables
    int max_query_len, max_seq_len;
    // Set when the step is recorded into a graph: launch shapes must not
    // depend on this step's contents (attention splits for max_model_len).
    int fixed_shapes, max_model_len;

    // Device arrays (pointers into the step's metadata buffer).
    int32_t *query_start_loc;   // [S+1] token offsets of the sequences
    int32_t *seq_lens;          // [S] context length after this step
    int32_t *context_lens;      // [S] tokens already computed (position of the first query token)
    int32_t *positions;         // [T]
    int32_t *slot_mapping;      // [T] KV slot (block * block_size + offset)
    int32_t *block_tables;      // [S, max_blocks_per_seq]
    int32_t *state_slots;       // [S] recurrent-state slot the step writes
    // [S] where a prefill's initial state is read: -1 zeros (a fresh slot),
    // its own slot (a continued prompt), or a checkpoint slot (a prefix hit:
    // the gather restores it). Decodes always continue their own slot.
    int32_t *state_src;
    // State checkpoints written by prefills: sequence s stores its state after
    // position ckpt_pos[k] - 1 into slot ckpt_slot[k], k in [ckpt_start[s],
    // ckpt_start[s+1]), ascending. Each position is in (context_lens[s],
    // seq_lens[s]] and a multiple of chunk_size: an SSD chunk boundary.
    int32_t *ckpt_start;        // [S+1]
    int32_t *ckpt_pos, *ckpt_slot;
    // [S] decodes: the checkpoint slot that also gets the state after this
    // step's token (the ops that update the state write both); -1: none
    // (graph padding rows too), and NULL for no row. Read for decode rows only.
    int32_t *ckpt_dst;
    int32_t *token_src;         // [T] token-table index of each input token
    int32_t *sample_rows;       // [num_sample] batch row whose logits are sampled
    struct sample_params *sample_params; // [num_sample]
    int32_t *input_ids;         // [T] gathered from the token table: the model reads only this

    // Host mirrors of the arrays above, for launch sizes and diagnostics.
    const int32_t *h_query_start_loc, *h_seq_lens, *h_context_lens, *h_state_slots, *h_state_src;
    const struct sample_params *h_sample_params;
};

// The checkpoint slot decode row s also writes its new state to, or -1.
static inline int batch_ckpt_dst(const struct batch *b, int s) { return b->ckpt_dst ? b->ckpt_dst[s] : -1; }

// Where the sampler writes (device arrays of the runner).
struct sample_out {
    int32_t *ids;         // [num_sample]
    float *logprobs;      // [num_sample] log-prob of the sampled id
    int32_t *top_ids;     // [num_sample, max_top]
    float *top_logprobs;  // [num_sample, max_top]
    int max_top;
};

#endif
