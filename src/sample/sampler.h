// sampler.h - the reference sampler for one row of logits. Order, as vLLM:
// log-probs of the raw logits; repetition, frequency and presence penalties;
// greedy when temperature is 0; else temperature, min-p, top-k, top-p, and an
// exponential race (argmax p_i / E_i, E_i ~ Exp(1) from Philox(seed, step, i)),
// so a seeded request samples the same tokens on every backend.
#ifndef VLLM_SAMPLE_SAMPLER_H
#define VLLM_SAMPLE_SAMPLER_H

#include <stdint.h>

#include "backend/batch.h"

// Scratch of sample_row: 3 * vocab floats + vocab ints.
size_t sample_scratch_bytes(int vocab);

// tokens: the request's token-table row (prompt then output tokens).
// Returns the sampled id; fills lp (log-prob of it) and the top-n arrays when
// p->num_logprobs >= 0 (n = min(num_logprobs, max_top), rest set to -1 / -inf).
int32_t sample_row(const float *logits, int vocab, const int32_t *tokens, const struct sample_params *p,
                   void *scratch, float *lp, int32_t *top_ids, float *top_lp, int max_top);

// Prompt log-probs of one row of raw logits [vocab] (the reference of every
// backend's token_logprobs): *lp = log_softmax(logits)[target] (sums in
// double), *rank = the ids whose logit is >= the target's (vLLM's rank: 1 is
// the most likely), and the k largest (ids largest first, ties: lower id)
// with their log-probs.
void logprob_row(const float *logits, int vocab, int32_t target, int k, float *lp, int32_t *rank, int32_t *top_ids,
                 float *top_lp);

#endif
