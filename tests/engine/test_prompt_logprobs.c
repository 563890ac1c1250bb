// test_prompt_logprobs.c - vllm_sampling_params.prompt_logprobs against the
// transformers oracle's logits (nh_dense: Mamba2 + attention), each prompt
// (a golden prompt with its greedy tokens) in one prefill chunk and in chunks
// of 5 tokens over many steps, the second with prefix caching on and the
// prompt already cached (a request asking for prompt log-probs reads no
// cached prefix: every row is computed). Checked: one delivery, with the
// first output token; each token's log-prob within 1e-4 of the oracle's
// log-softmax; its rank and the top k within the oracle's near-ties; the two
// runs within 1e-4 of each other; and all prompts at once in a KV pool too
// small for them (preemption recomputes prompts). VLLM_TEST_DEVICE=cuda runs it on the GPU
// (fp32 weights), VLLM_CPU_REFERENCE=1 on the CPU's reference ops,
// VLLM_TEST_TP_SIZE=2 over two tensor-parallel ranks.
#include <math.h>
#include <pthread.h>

#include "core/common.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "test.h"
#include "util.h"
#include "vllm.h"

#define K 5
#define GATE 1e-4
#define TIE 1e-3 // logits this close may be ordered either way

struct got {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, deliveries, first_event, n;
    float *lp, *top_lp;
    int32_t *rank, *top_ids;
};

static void on_output(void *user, const struct vllm_output *o) {
    struct got *g = user;
    pthread_mutex_lock(&g->mu);
    if (o->prompt_logprobs) {
        g->deliveries++;
        g->first_event = o->num_output_tokens == 1 && o->num_token_ids == 1;
        int n = g->n = o->num_prompt_logprobs, k = o->num_prompt_top_logprobs;
        CHECK(k == K);
        g->lp = xmalloc(sizeof(float) * (n + 1));
        g->rank = xmalloc(sizeof(int32_t) * (n + 1));
        g->top_ids = xmalloc(sizeof(int32_t) * (n + 1) * K);
        g->top_lp = xmalloc(sizeof(float) * (n + 1) * K);
        memcpy(g->lp, o->prompt_logprobs, sizeof(float) * n);
        memcpy(g->rank, o->prompt_ranks, sizeof(int32_t) * n);
        memcpy(g->top_ids, o->prompt_top_ids, sizeof(int32_t) * n * K);
        memcpy(g->top_lp, o->prompt_top_logprobs, sizeof(float) * n * K);
    }
    if (o->finish_reason != VLLM_FINISH_NONE) {
        CHECKF(o->status == VLLM_OK, "%s", o->error ? o->error : "");
        g->done = 1;
        pthread_cond_signal(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

// Submits seq with prompt log-probs k (< 0: none) into g.
static struct vllm_request *submit(struct vllm_engine *e, const int32_t *seq, int n, int k, struct got *g) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = 0, sp.max_tokens = 2, sp.ignore_eos = 1, sp.prompt_logprobs = k;
    struct vllm_prompt p;
    vllm_prompt_default(&p);
    p.token_ids = seq, p.num_token_ids = n;
    struct vllm_request *r = NULL;
    CHECKF(vllm_submit(e, &p, &sp, on_output, g, &r) == 0, "%s", vllm_last_error());
    return r;
}

static void wait_done(struct vllm_request *r, struct got *g) {
    pthread_mutex_lock(&g->mu);
    while (r && !g->done) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    vllm_request_free(r);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
}

static void run(struct vllm_engine *e, const int32_t *seq, int n, int k, struct got *g) {
    wait_done(submit(e, seq, n, k, g), g);
}

static void got_free(struct got *g) { free(g->lp), free(g->rank), free(g->top_ids), free(g->top_lp); }

static int count(const float *x, int v, float above) {
    int c = 0;
    for (int i = 0; i < v; i++) c += x[i] > above;
    return c;
}

// g against the oracle's logits ref [>= n positions, vocab] of seq.
static double compare(const char *what, const struct got *g, const float *ref, int vocab, const int32_t *seq, int n) {
    double err = 0;
    CHECKF(g->deliveries == 1 && g->first_event, "%s: delivered %d times (with the first token: %d)", what,
           g->deliveries, g->first_event);
    CHECKF(g->n == n - 1, "%s: %d prompt log-probs for %d prompt tokens", what, g->n, n);
    if (g->n != n - 1) return INFINITY;
    for (int i = 0; i < n - 1; i++) {
        const float *x = ref + (int64_t)i * vocab; // position i's logits are about token i + 1
        double mx = x[0], s = 0;
        for (int v = 1; v < vocab; v++) mx = fmax(mx, x[v]);
        for (int v = 0; v < vocab; v++) s += exp(x[v] - mx);
        double lse = mx + log(s);
        float t = x[seq[i + 1]];
        err = fmax(err, fabs(g->lp[i] - (t - lse)));
        int lo = count(x, vocab, t + TIE) + 1, hi = count(x, vocab, t - TIE);
        CHECKF(g->rank[i] >= lo && g->rank[i] <= hi, "%s: token %d's rank %d, the oracle's is in [%d, %d]", what,
               i + 1, g->rank[i], lo, hi);
        for (int j = 0; j < K; j++) {
            int32_t id = g->top_ids[i * K + j];
            CHECKF(id >= 0 && id < vocab, "%s: token %d: top id %d", what, i + 1, id);
            if (id < 0 || id >= vocab) continue;
            err = fmax(err, fabs(g->top_lp[i * K + j] - (x[id] - lse)));
            // the j-th largest: at most j ids clearly above it, at least j + 1 at or near it
            CHECKF(count(x, vocab, x[id] + TIE) <= j && count(x, vocab, x[id] - TIE) >= j + 1,
                   "%s: token %d: top %d is id %d, not the oracle's", what, i + 1, j, id);
        }
    }
    return err;
}

#define NCASE 8

// The fixture's prompts with their greedy tokens, and the oracle's logits.
struct cases {
    int n;
    int32_t *seq[NCASE];
    int len[NCASE];
    const float *ref[NCASE];
};

static void load_cases(json_t *gold, struct st_set *ref, int vocab, struct cases *c) {
    json_t *prompts = json_object_get(gold, "prompts"), *greedy = json_object_get(gold, "greedy");
    c->n = 0;
    for (size_t i = 0; i < json_array_size(prompts) && c->n < NCASE; i++) {
        json_t *p = json_array_get(prompts, i), *q = json_array_get(greedy, i);
        int np = (int)json_array_size(p), nq = (int)json_array_size(q), n = np + nq;
        char name[32];
        snprintf(name, sizeof name, "logits_%zu", i);
        const struct st_tensor *t = st_find(ref, name);
        CHECKF(t && t->shape[0] >= n - 1 && t->shape[1] == vocab, "%s: no oracle logits for %d positions", name, n);
        if (!t || t->shape[0] < n - 1 || t->shape[1] != vocab) continue;
        int32_t *seq = c->seq[c->n] = xmalloc(sizeof(int32_t) * n);
        for (int k = 0; k < np; k++) seq[k] = (int32_t)json_integer_value(json_array_get(p, k));
        for (int k = 0; k < nq; k++) seq[np + k] = (int32_t)json_integer_value(json_array_get(q, k));
        c->len[c->n] = n;
        c->ref[c->n++] = t->data;
    }
}

// Each case alone: in one chunk, and in chunks of 5 with the prompt cached.
static void one_by_one(struct vllm_engine *whole, struct vllm_engine *chunked, const struct cases *c, int vocab) {
    double err_whole = 0, err_chunked = 0, err_between = 0;
    long tokens = 0;
    for (int i = 0; i < c->n; i++) {
        struct got a, b, warm;
        run(whole, c->seq[i], c->len[i], K, &a);
        run(chunked, c->seq[i], c->len[i], -1, &warm); // the whole prompt into the prefix cache
        CHECKF(warm.deliveries == 0, "prompt %d: prompt log-probs not asked for, but delivered", i);
        run(chunked, c->seq[i], c->len[i], K, &b);
        err_whole = fmax(err_whole, compare("one chunk", &a, c->ref[i], vocab, c->seq[i], c->len[i]));
        err_chunked = fmax(err_chunked, compare("chunks of 5, prompt cached", &b, c->ref[i], vocab, c->seq[i], c->len[i]));
        for (int k = 0; k < a.n && a.n == b.n; k++) err_between = fmax(err_between, fabs(a.lp[k] - b.lp[k]));
        tokens += c->len[i] - 1;
        got_free(&a), got_free(&b), got_free(&warm);
    }
    printf("%ld prompt tokens: max |log-prob - oracle| %.3g in one chunk, %.3g in chunks of 5 (cached prompt), "
           "%.3g between them (gate %.0e)\n",
           tokens, err_whole, err_chunked, err_between, GATE);
    CHECK(tokens > 0);
    CHECKF(err_whole <= GATE && err_chunked <= GATE && err_between <= GATE, "log-probs off by more than %.0e", GATE);
}

// Every case at once in a KV pool too small for them: preempted requests
// recompute their prompts (rows written again, or skipped once delivered).
// Whether two long ones overlap depends on how fast the submissions reach
// the engine (a loaded machine can run them one at a time), so the batch is
// sent again, up to 8 times, until one was preempted.
static void all_at_once(struct vllm_engine *e, const struct cases *c, int vocab) {
    struct got g[NCASE];
    struct vllm_request *r[NCASE];
    struct vllm_stats st = {0};
    double err = 0;
    for (int attempt = 0; attempt < 8 && st.num_preemptions == 0; attempt++) {
        for (int i = 0; i < c->n; i++) r[i] = submit(e, c->seq[i], c->len[i], K, &g[i]);
        for (int i = 0; i < c->n; i++) {
            wait_done(r[i], &g[i]);
            err = fmax(err, compare("all at once, preempted", &g[i], c->ref[i], vocab, c->seq[i], c->len[i]));
            got_free(&g[i]);
        }
        vllm_engine_stats(e, &st);
    }
    printf("%d requests at once: %llu preemptions, max |log-prob - oracle| %.3g\n", c->n,
           (unsigned long long)st.num_preemptions, err);
    CHECKF(st.num_preemptions > 0, "no request was preempted");
    CHECKF(err <= GATE, "log-probs off by %.3g with preemption", err);
}

int main(void) {
    char *dir = tu_fixture("nh_dense"), *gpath = tu_fixture("nh_dense/golden.json"),
         *lpath = tu_fixture("nh_dense/logits.safetensors");
    json_t *gold = NULL;
    struct st_set *ref = NULL;
    CHECK(json_load_path(gpath, &gold) == 0);
    CHECK(st_open_file(lpath, &ref) == 0);
    struct vllm_engine *whole = NULL, *chunked = NULL, *tight = NULL;
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir;
    ep.num_threads = 1;
    ep.tensor_parallel_size = getenv("VLLM_TEST_TP_SIZE") ? atoi(getenv("VLLM_TEST_TP_SIZE")) : 1; // tests/tp.cmake
    if (getenv("VLLM_TEST_DEVICE")) ep.device = getenv("VLLM_TEST_DEVICE"), ep.dtype = "float32"; // tests/cuda.cmake
    CHECKF(vllm_engine_load(&ep, &whole) == 0, "%s", vllm_last_error());
    ep.max_num_batched_tokens = 5;
    ep.enable_prefix_caching = 1;
    CHECKF(vllm_engine_load(&ep, &chunked) == 0, "%s", vllm_last_error());
    ep.max_num_batched_tokens = 64;
    ep.enable_prefix_caching = 0;
    ep.num_kv_blocks = 8; // 128 tokens: less than two of the longest sequences
    ep.max_model_len = 128;
    CHECKF(vllm_engine_load(&ep, &tight) == 0, "%s", vllm_last_error());
    if (!gold || !ref || !whole || !chunked || !tight) return test_summary("prompt_logprobs");
    struct vllm_model_info info;
    vllm_engine_info(whole, &info);
    struct cases c;
    load_cases(gold, ref, info.vocab_size, &c);
    one_by_one(whole, chunked, &c, info.vocab_size);
    all_at_once(tight, &c, info.vocab_size);
    // a one-token prompt has no prompt log-prob, and its event says so
    struct got one;
    int32_t bos = 1;
    run(whole, &bos, 1, K, &one);
    CHECKF(one.deliveries == 1 && one.n == 0, "one-token prompt: %d deliveries of %d log-probs", one.deliveries, one.n);
    got_free(&one);
    vllm_engine_free(whole);
    vllm_engine_free(chunked);
    vllm_engine_free(tight);
    for (int i = 0; i < c.n; i++) free(c.seq[i]);
    st_close(ref);
    json_decref(gold);
    free(dir), free(gpath), free(lpath);
    return test_summary("prompt_logprobs");
}
