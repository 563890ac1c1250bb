// forced_logits.h - teacher forcing for the logit gates: each of a golden
// file's first prompts, with the oracle's greedy tokens appended, runs as one
// prompt of one output token, and the engine's logits hook keeps every row.
#ifndef VLLM_TESTS_FORCED_LOGITS_H
#define VLLM_TESTS_FORCED_LOGITS_H

#include <jansson.h>
#include <math.h>
#include <pthread.h>

#include "core/common.h"
#include "engine/engine.h"
#include "test.h"

#define FL_PROMPTS 8
#define FL_POSITIONS 256

// per prompt: v [n, vocab] logits by position
struct fl_rows {
    float *v[FL_PROMPTS];
    int n[FL_PROMPTS];
    int vocab, prompt;
    uint64_t req; // the request whose rows are kept
};

// The ids of JSON array a (n of them; caller frees).
static inline int32_t *fl_ids(json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int32_t *v = xmalloc(sizeof(int32_t) * (*n + 1));
    for (int k = 0; k < *n; k++) v[k] = (int32_t)json_integer_value(json_array_get(a, k));
    return v;
}

static void fl_hook(void *user, int nrows, int vocab, const float *logits, struct request *const *row_req,
                    const int32_t *row_pos) {
    struct fl_rows *c = user;
    c->vocab = vocab;
    for (int r = 0; r < nrows; r++) {
        if (row_req[r]->id != c->req || row_pos[r] >= FL_POSITIONS) continue;
        if (!c->v[c->prompt]) c->v[c->prompt] = xcalloc((size_t)FL_POSITIONS * vocab, sizeof(float));
        memcpy(c->v[c->prompt] + (int64_t)row_pos[r] * vocab, logits + (int64_t)r * vocab, sizeof(float) * vocab);
        c->n[c->prompt] = MAX(c->n[c->prompt], row_pos[r] + 1);
    }
}

// The first nprompts of golden g ("prompts", "greedy") through e, which is
// freed here; out gets a row for every position of each.
static void fl_forced(struct vllm_engine *e, json_t *g, int nprompts, struct fl_rows *out) {
    memset(out, 0, sizeof *out);
    if (!e) return;
    engine_set_logits_hook(e, fl_hook, out);
    json_t *prompts = json_object_get(g, "prompts"), *greedy = json_object_get(g, "greedy");
    for (int i = 0; i < (int)json_array_size(prompts) && i < MIN(nprompts, FL_PROMPTS); i++) {
        json_t *p = json_array_get(prompts, i), *q = json_array_get(greedy, i);
        int np = (int)json_array_size(p), nq = (int)json_array_size(q);
        int32_t *seq = xmalloc(sizeof(int32_t) * (np + nq + 1));
        for (int k = 0; k < np; k++) seq[k] = (int32_t)json_integer_value(json_array_get(p, k));
        for (int k = 0; k < nq; k++) seq[np + k] = (int32_t)json_integer_value(json_array_get(q, k));
        struct vllm_sampling_params sp;
        vllm_sampling_params_default(&sp);
        sp.temperature = 0, sp.ignore_eos = 1, sp.max_tokens = 1;
        out->prompt = i;
        pthread_mutex_lock(&e->mu);
        out->req = e->next_id;
        pthread_mutex_unlock(&e->mu);
        int32_t *o = NULL;
        int no = 0;
        CHECK(vllm_complete_tokens(e, seq, np + nq, &sp, &o, &no, NULL) == 0);
        CHECKF(out->n[i] == MIN(np + nq, FL_POSITIONS), "prompt %d: %d logit rows, expected %d", i, out->n[i], np + nq);
        vllm_free(o);
        free(seq);
    }
    vllm_engine_free(e);
}

// max |a - b| over the rows both have (NaN if any is NaN); count += values
static double fl_max_diff(const struct fl_rows *a, const struct fl_rows *b, int nprompts, long *count) {
    double m = 0;
    for (int i = 0; i < MIN(nprompts, FL_PROMPTS); i++)
        for (int64_t k = 0; a->v[i] && b->v[i] && k < (int64_t)MIN(a->n[i], b->n[i]) * a->vocab; k++) {
            double d = fabs((double)a->v[i][k] - b->v[i][k]);
            m = d > m || d != d ? d : m;
            (*count)++;
        }
    return m;
}

static void fl_free(struct fl_rows *r) {
    for (int i = 0; i < FL_PROMPTS; i++) free(r->v[i]);
}

#endif
