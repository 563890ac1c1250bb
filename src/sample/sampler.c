// sampler.c - reference sampling of one row (used by the CPU backend).
#include <float.h>
#include <math.h>

#include "core/common.h"
#include "sample/philox.h"
#include "sample/sampler.h"

size_t sample_scratch_bytes(int vocab) { return (size_t)vocab * (3 * sizeof(float) + sizeof(int32_t)); }

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// Indices of the k largest values of x, largest first (ties: lower index).
static void top_indices(const float *x, int n, int k, int32_t *out) {
    for (int j = 0; j < k; j++) out[j] = -1;
    for (int i = 0; i < n; i++) {
        if (k == 0) break;
        if (out[k - 1] >= 0 && !(x[i] > x[out[k - 1]])) continue;
        int j = k - 1;
        while (j > 0 && (out[j - 1] < 0 || x[i] > x[out[j - 1]])) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = i;
    }
}

static void apply_penalties(float *l, int vocab, const int32_t *tokens, const struct sample_params *p,
                            float *count) {
    int rep = p->repetition_penalty != 1.0f;
    int pf = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (!rep && !pf) return;
    memset(count, 0, sizeof(float) * vocab);
    // count > 0 marks prompt-or-output presence for the repetition penalty
    // (sign bit trick avoided: a second pass keeps it readable)
    if (rep) {
        for (int i = 0; i < p->num_tokens; i++) {
            int32_t t = tokens[i];
            if (t >= 0 && t < vocab && count[t] == 0) {
                count[t] = 1;
                l[t] = l[t] > 0 ? l[t] / p->repetition_penalty : l[t] * p->repetition_penalty;
            }
        }
        memset(count, 0, sizeof(float) * vocab);
    }
    if (pf) {
        for (int i = p->num_prompt; i < p->num_tokens; i++) {
            int32_t t = tokens[i];
            if (t >= 0 && t < vocab) count[t] += 1;
        }
        for (int i = 0; i < vocab; i++)
            if (count[i] > 0) l[i] -= p->frequency_penalty * count[i] + p->presence_penalty;
    }
}

static float log_sum_exp(const float *x, int n) {
    float mx = x[argmax(x, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return mx + (float)log(sum);
}

void logprob_row(const float *logits, int vocab, int32_t target, int k, float *lp, int32_t *rank, int32_t *top_ids,
                 float *top_lp) {
    float lse = log_sum_exp(logits, vocab), t = logits[target];
    int32_t n = 0;
    for (int i = 0; i < vocab; i++) n += logits[i] >= t;
    *lp = t - lse;
    *rank = n;
    top_indices(logits, vocab, k, top_ids);
    for (int j = 0; j < k; j++) top_lp[j] = top_ids[j] >= 0 ? logits[top_ids[j]] - lse : -INFINITY;
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *x = ctx;
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (x[i] > x[j]) return -1;
    if (x[i] < x[j]) return 1;
    return i < j ? -1 : i > j;
}

int32_t sample_row(const float *logits, int vocab, const int32_t *tokens, const struct sample_params *p,
                   void *scratch, float *lp, int32_t *top_ids, float *top_lp, int max_top) {
    float *l = scratch, *prob = l + vocab, *count = prob + vocab;
    int32_t *idx = (int32_t *)(count + vocab);
    memcpy(l, logits, sizeof(float) * vocab);
    apply_penalties(l, vocab, tokens, p, count);

    int32_t id;
    if (p->temperature <= 0.0f) {
        id = argmax(l, vocab);
    } else {
        float mx = l[argmax(l, vocab)], sum = 0;
        for (int i = 0; i < vocab; i++) sum += prob[i] = expf((l[i] - mx) / p->temperature);
        for (int i = 0; i < vocab; i++) prob[i] /= sum;
        float pmax = 0;
        for (int i = 0; i < vocab; i++) pmax = prob[i] > pmax ? prob[i] : pmax;
        if (p->min_p > 0)
            for (int i = 0; i < vocab; i++)
                if (prob[i] < p->min_p * pmax) prob[i] = 0;
        int k = p->top_k > 0 && p->top_k < vocab ? p->top_k : vocab;
        if (k < vocab || p->top_p < 1.0f) {
            for (int i = 0; i < vocab; i++) idx[i] = i;
            qsort_r(idx, vocab, sizeof(int32_t), cmp_desc, prob);
            for (int j = k; j < vocab; j++) prob[idx[j]] = 0;
            if (p->top_p < 1.0f) { // keep the smallest prefix whose mass reaches top_p
                float total = 0, cum = 0;
                for (int j = 0; j < k; j++) total += prob[idx[j]];
                for (int j = 0; j < k; j++) {
                    if (cum >= p->top_p * total && j > 0) prob[idx[j]] = 0;
                    cum += prob[idx[j]];
                }
            }
        }
        id = 0;
        float best = -1;
        for (int i = 0; i < vocab; i++) {
            if (prob[i] <= 0) continue;
            float e = -logf(philox_uniform(p->seed_lo, p->seed_hi, p->step, (uint32_t)i));
            float score = prob[i] / e;
            if (score > best) best = score, id = i;
        }
    }

    if (p->num_logprobs >= 0) {
        float lse = log_sum_exp(logits, vocab);
        *lp = logits[id] - lse;
        int n = MIN(p->num_logprobs, max_top);
        top_indices(logits, vocab, n, top_ids);
        for (int j = 0; j < max_top; j++) {
            if (j < n && top_ids[j] >= 0) top_lp[j] = logits[top_ids[j]] - lse;
            else top_ids[j] = -1, top_lp[j] = -INFINITY;
        }
    }
    return id;
}
