// test_constraint.c - vllm_constraint through the engine on the tiny nh_dense
// fixture: every sampled id is one the mask allowed, accept sees the output
// ids in order, an EOS the mask allows ends the request (EOS), max_tokens
// still cuts it short (length), constrained and unconstrained requests share
// batches (the unconstrained keep their greedy ids), a pool small enough to
// preempt and two tensor-parallel ranks change nothing, and release runs exactly once (a failed submit
// included).
#include <pthread.h>

#include "core/common.h"
#include "test.h"
#include "util.h"

#define MAXOUT 64
// Output tokens of each request of the batch: 14 + 40 tokens are 4 blocks of
// 16, so any two requests running at once overflow a pool of 7 blocks; with
// 24 (2 blocks of output) a loaded machine that ran them one or two at a
// time could finish without a preemption.
#define OUT_TOKENS 40

// A constraint over ids: "stride" allows ids with id % mod == rem; "script"
// allows exactly script[n] at output n, then only EOS.
struct cons {
    int mod, rem;
    const int32_t *script;
    int num_script, eos;
    int32_t seen[MAXOUT];
    int num_seen, bad, released, vocab;
};

static int allowed(const struct cons *c, int32_t id) {
    if (c->script) return c->num_seen < c->num_script ? id == c->script[c->num_seen] : id == c->eos;
    return id % c->mod == c->rem;
}

static void c_fill(void *user, uint32_t *m, int words) {
    struct cons *c = user;
    for (int id = 0; id < c->vocab && id < words * 32; id++)
        if (allowed(c, id)) m[id >> 5] |= 1u << (id & 31);
}

static int c_accept(void *user, int32_t id) {
    struct cons *c = user;
    if (!allowed(c, id)) c->bad++;
    if (c->num_seen < MAXOUT) c->seen[c->num_seen] = id;
    c->num_seen++;
    return 0;
}

static void c_release(void *user) { ((struct cons *)user)->released++; }

static struct vllm_constraint make(struct cons *c) {
    struct vllm_constraint k = {c, c_fill, c_accept, c_release};
    return k;
}

struct run {
    struct vllm_engine *e;
    const int32_t *prompt;
    int np;
    struct vllm_sampling_params sp;
    int32_t *out;
    int n;
    vllm_finish_reason reason;
    int rc;
    pthread_barrier_t *start; // the batch's requests all submit at once (NULL: alone)
};

static void *run_one(void *arg) {
    struct run *r = arg;
    if (r->start) pthread_barrier_wait(r->start); // so the small pool holds them together: preemption
    r->rc = vllm_complete_tokens(r->e, r->prompt, r->np, &r->sp, &r->out, &r->n, &r->reason);
    return NULL;
}

static struct vllm_engine *load(int num_kv_blocks, int tp, int async) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    char *dir = tu_fixture("nh_dense");
    ep.model = dir;
    ep.num_threads = 1;
    ep.num_kv_blocks = num_kv_blocks;
    ep.tensor_parallel_size = tp;
    ep.max_model_len = 64;
    ep.async_scheduling = async;
    struct vllm_engine *e = NULL;
    if (vllm_engine_load(&ep, &e)) fprintf(stderr, "load: %s\n", vllm_last_error());
    free(dir);
    return e;
}

static void check_batch(int num_kv_blocks, int tp, int async) {
    struct vllm_engine *e = load(num_kv_blocks, tp, async);
    CHECK(e != NULL);
    if (!e) return;
    struct vllm_model_info info;
    vllm_engine_info(e, &info);
    int32_t prompt[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    int32_t script[] = {40, 41, 42, 7};
    enum { N = 6 };
    struct cons cs[N] = {{0}};
    struct vllm_constraint ks[N];
    struct run runs[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        struct run *r = &runs[i];
        memset(r, 0, sizeof *r);
        r->e = e;
        r->prompt = prompt + i % 3;
        r->np = 14;
        vllm_sampling_params_default(&r->sp);
        r->sp.temperature = i % 2 ? 0.8f : 0.0f;
        r->sp.seed = 100 + i;
        r->sp.max_tokens = OUT_TOKENS;
        r->sp.repetition_penalty = i == 3 || i == 4 ? 1.5f : 1.0f; // penalties on masked rows too (-inf stays)
        r->sp.frequency_penalty = i == 2 ? 1.0f : 0.0f;
        r->sp.presence_penalty = i == 2 ? -0.5f : 0.0f;
        r->sp.logprobs = i == 4 ? 2 : -1;
        cs[i].vocab = info.vocab_size;
        cs[i].eos = info.eos_token_ids[0];
        if (i == 0 || i == 3) continue; // unconstrained
        if (i == 5) cs[i].script = script, cs[i].num_script = 4;
        else cs[i].mod = 5 + i, cs[i].rem = i;
        ks[i] = make(&cs[i]);
        r->sp.constraint = &ks[i];
    }
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, N);
    for (int i = 0; i < N; i++) runs[i].start = &start, pthread_create(&th[i], NULL, run_one, &runs[i]);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < N; i++) {
        struct run *r = &runs[i];
        CHECKF(r->rc == VLLM_OK, "request %d: %s", i, vllm_last_error());
        if (i == 0 || i == 3) continue;
        struct cons *c = &cs[i];
        CHECKF(c->bad == 0, "request %d: %d sampled ids the mask did not allow", i, c->bad);
        CHECKF(c->num_seen == r->n, "request %d: accept saw %d ids, the output has %d", i, c->num_seen, r->n);
        int same = c->num_seen == r->n;
        for (int k = 0; same && k < r->n && k < MAXOUT; k++) same = c->seen[k] == r->out[k];
        CHECKF(same, "request %d: accept's ids are the output ids", i);
        if (i == 5)
            CHECKF(r->reason == VLLM_FINISH_EOS && r->n == 5 && r->out[3] == 7, "script: reason %d, %d ids", r->reason,
                   r->n);
        else
            CHECKF(r->reason == VLLM_FINISH_LENGTH && r->n == OUT_TOKENS, "stride %d: reason %d, %d ids", i, r->reason, r->n);
    }
    // the unconstrained greedy request matches its run alone
    struct run alone = runs[0];
    alone.out = NULL, alone.start = NULL;
    run_one(&alone);
    CHECK(alone.rc == VLLM_OK && alone.n == runs[0].n && !memcmp(alone.out, runs[0].out, sizeof(int32_t) * alone.n));
    vllm_free(alone.out);
    struct vllm_stats st;
    vllm_engine_stats(e, &st);
    printf("  kv blocks %d, tp %d: %llu preemptions\n", num_kv_blocks, tp, (unsigned long long)st.num_preemptions);
    if (num_kv_blocks) CHECKF(st.num_preemptions > 0, "the small pool preempted nothing");
    for (int i = 0; i < N; i++) vllm_free(runs[i].out);
    // a failed submit releases the constraint too
    struct cons bad = {0};
    struct vllm_constraint kb = make(&bad);
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = -1;
    sp.constraint = &kb;
    struct vllm_prompt pr;
    vllm_prompt_default(&pr);
    pr.token_ids = prompt, pr.num_token_ids = 4;
    struct vllm_request *rq = NULL;
    CHECK(vllm_submit(e, &pr, &sp, NULL, NULL, &rq) == VLLM_ERR_INVALID_ARGUMENT && bad.released == 1);
    vllm_engine_free(e); // the engine's last references go (release runs when the last holder lets go)
    for (int i = 1; i < N; i++)
        if (i != 3) CHECKF(cs[i].released == 1, "request %d: released %d times", i, cs[i].released);
}

int main(void) {
    check_batch(0, 1, -1); // the CPU's default: each step postprocessed before the next is scheduled
    check_batch(0, 1, 1);  // async scheduling (CUDA's default): a masked step's sampler waits for the one before
    check_batch(7, 1, 1); // 7 blocks of 16 for 6 requests of up to 38 tokens (3 blocks each): preemption
    check_batch(0, 2, 1); // two tensor-parallel ranks: each samples under the same masks
    return test_summary("constraint");
}
