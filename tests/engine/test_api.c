// test_api.c - vllm.h end to end on the tiny fixtures: bad input gets a
// clear error, stops and cancels behave, resources return to the pools,
// seeded sampling is reproducible, and concurrent callers get exact results.
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "core/common.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "test.h"
#include "util.h"

static struct golden {
    int32_t prompt[64], greedy[64];
    int np, ng;
} gold[5];

static void load_golden(void) {
    char *p = tu_fixture("nh_dense/golden.json");
    json_t *j = NULL;
    json_load_path(p, &j);
    free(p);
    for (int i = 0; j && i < 5; i++) {
        json_t *a = json_array_get(json_object_get(j, "prompts"), i), *b = json_array_get(json_object_get(j, "greedy"), i);
        gold[i].np = (int)json_array_size(a);
        gold[i].ng = (int)json_array_size(b);
        for (int k = 0; k < gold[i].np; k++) gold[i].prompt[k] = (int32_t)json_integer_value(json_array_get(a, k));
        for (int k = 0; k < gold[i].ng; k++) gold[i].greedy[k] = (int32_t)json_integer_value(json_array_get(b, k));
    }
    json_decref(j);
}

static struct vllm_engine *load(const char *dir, int max_model_len) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir;
    ep.num_threads = 1;
    ep.max_model_len = max_model_len;
    struct vllm_engine *e = NULL;
    if (vllm_engine_load(&ep, &e)) fprintf(stderr, "load %s: %s\n", dir, vllm_last_error());
    return e;
}

static int load_fails(const char *dir, int status, const char *must) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir;
    struct vllm_engine *e = NULL;
    int rc = vllm_engine_load(&ep, &e);
    vllm_engine_free(e);
    int ok = rc == status && e == NULL && strstr(vllm_last_error(), must);
    if (!ok) fprintf(stderr, "  load %s: rc %d, error '%s' (wanted %d, '%s')\n", dir, rc, vllm_last_error(), status, must);
    return ok;
}

static void edit_arch(json_t *c) { json_object_set_new(c, "architectures", json_pack("[s]", "GPT2LMHeadModel")); }
static void edit_hidden(json_t *c) { json_object_set_new(c, "intermediate_size", json_integer(80)); }
static void edit_missing(json_t *c) { json_object_del(c, "ssm_state_size"); }
static void edit_eos(json_t *c) { json_object_set_new(c, "eos_token_id", json_integer(gold[0].greedy[3])); }

static void test_bad_models(void) {
    CHECK(load_fails("/nonexistent/model", VLLM_ERR_IO, "/nonexistent/model"));
    char *d = tu_model_copy("nh_dense", edit_arch);
    CHECK(load_fails(d, VLLM_ERR_UNSUPPORTED, "unknown architecture GPT2LMHeadModel"));
    tu_rmdir(d), free(d);
    d = tu_model_copy("nh_dense", edit_hidden);
    CHECK(load_fails(d, VLLM_ERR_FORMAT, "up_proj.weight"));
    CHECK(strstr(vllm_last_error(), "[96, 64]") && strstr(vllm_last_error(), "[80, 64]"));
    tu_rmdir(d), free(d);
    d = tu_model_copy("nh_dense", edit_missing);
    CHECK(load_fails(d, VLLM_ERR_FORMAT, "ssm_state_size"));
    tu_rmdir(d), free(d);
    d = tu_model_copy("nh_dense", NULL); // truncated safetensors
    char *p = path_join(d, "model.safetensors");
    CHECK(truncate(p, 4000) == 0);
    CHECK(load_fails(d, VLLM_ERR_FORMAT, "model.safetensors"));
    unlink(p);
    CHECK(load_fails(d, VLLM_ERR_IO, "safetensors"));
    free(p);
    tu_rmdir(d), free(d);
}

static void test_bad_requests(struct vllm_engine *e) {
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    int32_t *out;
    int n;
    int32_t ids[40] = {5, 6, 300};
    CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT &&
          strstr(vllm_last_error(), "300") && strstr(vllm_last_error(), "vocabulary"));
    ids[2] = -1;
    CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT);
    CHECK(vllm_complete_tokens(e, ids, 0, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 40; i++) ids[i] = 7;
    CHECK(vllm_complete_tokens(e, ids, 40, &sp, &out, &n, NULL) == VLLM_ERR_TOO_LONG && strstr(vllm_last_error(), "40") &&
          strstr(vllm_last_error(), "32"));
    struct { float *f; float v; } badf[] = {{&sp.temperature, -1}, {&sp.top_p, 0}, {&sp.top_p, 1.5f}, {&sp.min_p, 2},
                                            {&sp.repetition_penalty, 0}, {&sp.presence_penalty, 3}};
    for (size_t i = 0; i < sizeof badf / sizeof badf[0]; i++) {
        vllm_sampling_params_default(&sp);
        *badf[i].f = badf[i].v;
        CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT);
    }
    vllm_sampling_params_default(&sp);
    sp.logprobs = 21;
    CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT);
    sp.logprobs = -1;
    const char *stop[] = {"x"};
    sp.stop = stop;
    sp.num_stop = 1;
    CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT &&
          strstr(vllm_last_error(), "tokenizer"));
    // logit_bias: an id outside the vocabulary, twice, a NaN, too many
    vllm_sampling_params_default(&sp);
    int32_t bid[2] = {5, 300};
    float bval[2] = {1, 2};
    sp.logit_bias_ids = bid, sp.logit_bias_values = bval, sp.num_logit_bias = 2;
    CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT &&
          strstr(vllm_last_error(), "300"));
    bid[1] = 5;
    CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT &&
          strstr(vllm_last_error(), "twice"));
    bid[1] = 6, bval[1] = NAN;
    CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT &&
          strstr(vllm_last_error(), "finite"));
    sp.num_logit_bias = VLLM_MAX_LOGIT_BIAS + 1;
    CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_ERR_INVALID_ARGUMENT);
    // and honored: a +100 bias makes a greedy run that id
    bval[0] = 100, sp.num_logit_bias = 1, sp.temperature = 0, sp.max_tokens = 4;
    CHECK(vllm_complete_tokens(e, ids, 3, &sp, &out, &n, NULL) == VLLM_OK && n == 4);
    for (int i = 0; i < n && out; i++) CHECKF(out[i] == 5, "logit_bias +100 on id 5: output %d is %d", i, out[i]);
    vllm_free(out);
}

static int32_t *greedy_run(struct vllm_engine *e, int i, int max_tokens, int *n, vllm_finish_reason *why,
                           struct vllm_sampling_params *spp) {
    struct vllm_sampling_params sp;
    if (spp) sp = *spp;
    else {
        vllm_sampling_params_default(&sp);
        sp.temperature = 0;
        sp.ignore_eos = 1;
    }
    sp.max_tokens = max_tokens;
    int32_t *out = NULL;
    if (vllm_complete_tokens(e, gold[i].prompt, gold[i].np, &sp, &out, n, why)) return NULL;
    return out;
}

static void test_stops(struct vllm_engine *e) {
    int n;
    vllm_finish_reason why;
    int32_t *out = greedy_run(e, 0, 10, &n, &why, NULL);
    CHECK(out && n == 10 && why == VLLM_FINISH_LENGTH && !memcmp(out, gold[0].greedy, 40));
    vllm_free(out);
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = 0;
    int32_t stop_id = gold[0].greedy[5];
    int first = 0;
    while (gold[0].greedy[first] != stop_id) first++;
    sp.stop_token_ids = &stop_id;
    sp.num_stop_token_ids = 1;
    out = greedy_run(e, 0, 30, &n, &why, &sp);
    CHECKF(out && why == VLLM_FINISH_STOP && n == first + 1 && out[n - 1] == stop_id, "stop id: n %d why %d", n, why);
    vllm_free(out);
    sp.min_tokens = first + 2; // not before min_tokens
    out = greedy_run(e, 0, 30, &n, &why, &sp);
    CHECK(out && n > first + 1);
    vllm_free(out);
    // max_model_len caps generation (32 here, prompt 7 -> at most 25 tokens)
    out = greedy_run(e, 1, 100, &n, &why, NULL);
    CHECK(out && n == 32 - gold[1].np && why == VLLM_FINISH_LENGTH);
    vllm_free(out);
}

static void test_eos(void) {
    char *d = tu_model_copy("nh_dense", edit_eos);
    struct vllm_engine *e = load(d, 0);
    CHECK(e != NULL);
    if (e) {
        int n, first = 0;
        vllm_finish_reason why;
        struct vllm_sampling_params sp;
        vllm_sampling_params_default(&sp);
        sp.temperature = 0;
        while (gold[0].greedy[first] != gold[0].greedy[3]) first++;
        int32_t *out = greedy_run(e, 0, 30, &n, &why, &sp);
        CHECK(out && why == VLLM_FINISH_EOS && n == first + 1);
        vllm_free(out);
        sp.ignore_eos = 1;
        out = greedy_run(e, 0, 30, &n, &why, &sp);
        CHECK(out && why == VLLM_FINISH_LENGTH && n == 30);
        vllm_free(out);
        vllm_engine_free(e);
    }
    tu_rmdir(d), free(d);
}

struct watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int tokens, done;
    vllm_finish_reason why;
    float lp0;
    int32_t top0, tok0;
    int ntop;
};

static void watch_cb(void *user, const struct vllm_output *o) {
    struct watch *w = user;
    pthread_mutex_lock(&w->mu);
    if (o->num_token_ids && w->tokens == 0 && o->logprobs) {
        w->lp0 = o->logprobs[0];
        w->top0 = o->top_ids[0];
        w->ntop = o->num_top_logprobs;
        w->tok0 = o->token_ids[0];
    }
    w->tokens += o->num_token_ids;
    if (o->finish_reason) w->done = 1, w->why = o->finish_reason;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void wait_for(struct watch *w, int tokens) {
    pthread_mutex_lock(&w->mu);
    while (!w->done && w->tokens < tokens) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

static int idle_pools(struct vllm_engine *e) {
    struct vllm_stats st;
    for (int i = 0; i < 200; i++) { // stats settle after the step that finished the last request
        vllm_engine_stats(e, &st);
        if (st.num_running == 0 && st.kv_blocks_used == 0 && st.state_slots_used == 0 && st.num_waiting == 0) return 1;
        usleep(1000);
    }
    fprintf(stderr, "  pools not idle: running %d waiting %d blocks %d slots %d\n", st.num_running, st.num_waiting,
            st.kv_blocks_used, st.state_slots_used);
    return 0;
}

// Golden prompt i, greedy, eos ignored, streamed to cb.
static vllm_status submit_greedy(struct vllm_engine *e, int i, int max_tokens, int logprobs, vllm_stream_fn cb,
                                 void *user, struct vllm_request **r) {
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.ignore_eos = 1;
    sp.max_tokens = max_tokens;
    sp.logprobs = logprobs;
    struct vllm_prompt p;
    vllm_prompt_default(&p);
    p.token_ids = gold[i].prompt;
    p.num_token_ids = gold[i].np;
    return vllm_submit(e, &p, &sp, cb, user, r);
}

static void test_cancel_and_logprobs(struct vllm_engine *e) {
    struct watch w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0};
    struct vllm_request *r;
    CHECK(submit_greedy(e, 0, 4000, 3, watch_cb, &w, &r) == 0); // far more tokens than a cancel takes to land
    wait_for(&w, 3);
    CHECK(vllm_request_cancel(r) == 0);
    wait_for(&w, 1 << 30);
    CHECKF(w.why == VLLM_FINISH_ABORT && w.tokens < 4000, "cancel: why %d tokens %d", w.why, w.tokens);
    CHECK(w.ntop == 3 && w.top0 == w.tok0 && w.top0 == gold[0].greedy[0] && w.lp0 < 0);
    vllm_request_free(r);
    CHECK(idle_pools(e));
    // dropping a running request aborts it and returns its resources
    struct watch w2 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0};
    CHECK(submit_greedy(e, 0, 4000, 3, NULL, &w2, &r) == 0);
    vllm_request_free(r);
    CHECK(idle_pools(e));
}

static void test_seeded(struct vllm_engine *e) {
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = 1.0f;
    sp.top_k = 50;
    sp.seed = 42;
    sp.ignore_eos = 1;
    int n1, n2, n3;
    int32_t *a = greedy_run(e, 2, 12, &n1, NULL, &sp), *b = greedy_run(e, 2, 12, &n2, NULL, &sp);
    sp.seed = 43;
    int32_t *c = greedy_run(e, 2, 12, &n3, NULL, &sp);
    CHECK(a && b && c && n1 == 12 && n2 == 12 && !memcmp(a, b, 48));
    CHECK(c && memcmp(a, c, 48) != 0);
    vllm_free(a), vllm_free(b), vllm_free(c);
}

// Paused, the engine takes no step: requests submitted meanwhile wait, then
// run together and exactly once it resumes.
static void test_pause(struct vllm_engine *e) {
    struct vllm_stats s0, s1;
    struct watch w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0};
    struct vllm_request *r = NULL;
    CHECK(vllm_engine_pause(NULL) == VLLM_ERR_INVALID_ARGUMENT);
    CHECK(vllm_engine_pause(e) == 0);
    usleep(20000); // a step under way when it paused (async scheduling) ends
    CHECK(vllm_engine_stats(e, &s0) == 0);
    CHECK(submit_greedy(e, 1, gold[1].ng, 1, watch_cb, &w, &r) == 0); // logprobs: the watch keeps the first token
    usleep(50000);
    CHECK(vllm_engine_stats(e, &s1) == 0);
    pthread_mutex_lock(&w.mu);
    int tokens = w.tokens;
    pthread_mutex_unlock(&w.mu);
    // the step count is what a pause holds; the request was submitted after
    // it, so it has no token whatever a late step did
    CHECKF(tokens == 0 && s1.num_waiting == 1 && s1.num_steps <= s0.num_steps + 1,
           "paused: %llu -> %llu steps, %d tokens, %d waiting", (unsigned long long)s0.num_steps,
           (unsigned long long)s1.num_steps, tokens, s1.num_waiting);
    CHECK(vllm_engine_resume(e) == 0);
    wait_for(&w, 1 << 30);
    CHECKF(w.tokens == gold[1].ng && w.tok0 == gold[1].greedy[0], "resumed: %d tokens", w.tokens);
    vllm_request_free(r);
    CHECK(idle_pools(e));
}

struct worker {
    struct vllm_engine *e;
    int id, ok;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    w->ok = 1;
    for (int k = 0; k < 4; k++) {
        int i = (w->id + k) % 5, n;
        int32_t *out = greedy_run(w->e, i, 12, &n, NULL, NULL);
        w->ok &= out && n == 12 && !memcmp(out, gold[i].greedy, 48);
        vllm_free(out);
    }
    return NULL;
}

static void test_threads(struct vllm_engine *e) {
    pthread_t th[4];
    struct worker ws[4];
    for (int i = 0; i < 4; i++) ws[i] = (struct worker){e, i, 0}, pthread_create(&th[i], NULL, worker_main, &ws[i]);
    int ok = 1;
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL), ok &= ws[i].ok;
    CHECK(ok);
    CHECK(idle_pools(e));
}

// A sharded copy of the checkpoint gives the same tokens.
static void test_sharded(void) {
    char *src = tu_fixture("nh_dense/model.safetensors"), *d = tu_model_copy("nh_dense", NULL);
    struct st_set *s = NULL;
    CHECK(st_open_file(src, &s) == 0);
    if (!s) return;
    int n = st_count(s), half = n / 2;
    struct tu_tensor *t = xcalloc(n, sizeof *t);
    json_t *wm = json_object();
    for (int i = 0; i < n; i++) {
        const struct st_tensor *x = st_at(s, i);
        t[i] = (struct tu_tensor){x->name, st_dtype_name(x->dtype), x->ndim, {0}, x->data, x->nbytes};
        for (int k = 0; k < x->ndim; k++) t[i].shape[k] = x->shape[k];
        json_object_set_new(wm, x->name, json_string(i < half ? "a.safetensors" : "b.safetensors"));
    }
    char *pa = path_join(d, "a.safetensors"), *pb = path_join(d, "b.safetensors"), *pm = path_join(d, "model.safetensors");
    tu_write_safetensors(pa, t, half);
    tu_write_safetensors(pb, t + half, n - half);
    unlink(pm);
    json_t *idx = json_pack("{s:o}", "weight_map", wm);
    char *txt = json_dumps(idx, 0);
    tu_write(d, "model.safetensors.index.json", txt, strlen(txt));
    struct vllm_engine *e = load(d, 0);
    CHECK(e != NULL);
    if (e) {
        int nn;
        int32_t *out = greedy_run(e, 3, 16, &nn, NULL, NULL);
        CHECK(out && nn == 16 && !memcmp(out, gold[3].greedy, 64));
        vllm_free(out);
        vllm_engine_free(e);
    }
    st_close(s);
    json_decref(idx);
    free(txt), free(t), free(pa), free(pb), free(pm), free(src);
    tu_rmdir(d), free(d);
}

// When a token goes out: with async scheduling off (the CPU's default) in
// the step that sampled it, before the next step runs; on, one step later
// (postprocessed while the next step runs). num_steps counts a step before
// its tokens go out, so at token k it is k (off) or k + 1 (on) past the
// count at submit.
struct lag {
    struct watch w;
    struct vllm_engine *e;
    uint64_t steps0;
    int want, bad;
};

static void lag_cb(void *user, const struct vllm_output *o) {
    struct lag *l = user;
    struct vllm_stats st;
    vllm_engine_stats(l->e, &st);
    for (int i = 0; i < o->num_token_ids; i++) // w.tokens: written on this (the engine's) thread alone
        l->bad += st.num_steps - l->steps0 != (uint64_t)(l->w.tokens + i + 1 + l->want);
    watch_cb(&l->w, o);
}

static void test_token_timing(const char *dir) {
    for (int async = 0; async < 2; async++) {
        struct vllm_engine_params ep;
        vllm_engine_params_default(&ep);
        ep.model = dir;
        ep.num_threads = 1;
        ep.async_scheduling = async ? 1 : -1; // -1: the default, off on the CPU
        struct vllm_engine *e = NULL;
        CHECKF(vllm_engine_load(&ep, &e) == 0, "%s", vllm_last_error());
        if (!e) continue;
        struct lag l = {{PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0}, e, 0, async, 0};
        struct vllm_stats st;
        vllm_engine_stats(e, &st);
        l.steps0 = st.num_steps;
        struct vllm_request *r;
        CHECK(submit_greedy(e, 0, 8, -1, lag_cb, &l, &r) == 0);
        wait_for(&l.w, 1 << 30);
        CHECKF(l.w.tokens == 8 && l.bad == 0, "async %d: %d tokens, %d out of their step", async, l.w.tokens, l.bad);
        vllm_request_free(r);
        vllm_engine_free(e);
    }
}

int main(void) {
    load_golden();
    CHECK(gold[4].ng == 32);
    test_bad_models();
    char *dir = tu_fixture("nh_dense");
    struct vllm_engine *e = load(dir, 32);
    CHECK(e != NULL);
    if (e) {
        struct vllm_model_info info;
        CHECK(vllm_engine_info(e, &info) == 0 && info.vocab_size == 256 && info.max_model_len == 32 &&
              !strcmp(info.architecture, "NemotronHForCausalLM") && info.num_kv_blocks > 0 && info.num_state_slots == 64);
        test_bad_requests(e);
        test_stops(e);
        vllm_engine_free(e);
    }
    e = load(dir, 0);
    if (e) {
        test_cancel_and_logprobs(e);
        test_seeded(e);
        test_pause(e);
        test_threads(e);
        vllm_engine_free(e);
    }
    test_token_timing(dir);
    test_eos();
    test_sharded();
    free(dir);
    return test_summary("api");
}
