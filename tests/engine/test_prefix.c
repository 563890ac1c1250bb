// test_prefix.c - prefix caching under pressure (property test): random
// prompt sets made of shared segments (so prompts share prefixes, repeat
// exactly, and hold equal blocks after different parents) run through an
// engine with caching on and a tiny KV pool and checkpoint pool (eviction,
// preemption and hits interleaved, chunked prefill, arrivals at once, after
// a first token, or after the previous request finished), and through one
// with caching off. Every output must be the same, and afterwards no block,
// checkpoint or slot may still be held. On the NemotronH fixture (attention +
// Mamba2: blocks and checkpoints), a pure Mamba2 model of random weights (no
// KV: checkpoints alone) and the Qwen3 fixture (attention alone: blocks),
// with steps of 7 tokens and of 64 (requests arriving together in one step:
// blocks computed in it are hit in it). Each set runs again as next turns
// (prompt + reply + new tokens), which hit the blocks and the checkpoints
// that decode steps wrote.
#include <pthread.h>
#include <time.h>

#include "core/common.h"
#include "engine/engine.h"
#include "test.h"
#include "util.h"

#define NREQ 48
#define SEG 8 // segment tokens: a multiple of the checkpoint interval (blocks of 4, SSD chunk 8)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static int rnd(int n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (int)((rng >> 33) % (uint64_t)n);
}

struct job {
    int32_t prompt[64];
    int plen, max_tokens, arrival; // arrival 0: with the previous, 1: after its first token, 2: after it finished
    int base; // a next turn: the earlier request's prompt length (its reply follows); 0 otherwise
    int32_t out[2][16];
    int nout[2], first[2], done[2], status[2], cached[2];
};

struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *job;
    int k; // 0: caching off, 1: on
};

struct ref {
    struct run *run;
    struct job *job;
};

static void on_out(void *user, const struct vllm_output *o) {
    struct ref *rf = user;
    struct job *j = rf->job;
    int k = rf->run->k;
    pthread_mutex_lock(&rf->run->mu);
    for (int i = 0; i < o->num_token_ids && j->nout[k] < 16; i++) j->out[k][j->nout[k]++] = o->token_ids[i];
    if (o->num_token_ids) j->first[k] = 1;
    j->cached[k] = o->num_cached_tokens;
    if (o->finish_reason != VLLM_FINISH_NONE) j->done[k] = 1, j->status[k] = o->status;
    pthread_cond_broadcast(&rf->run->cv);
    pthread_mutex_unlock(&rf->run->mu);
}

static void run_all(struct vllm_engine *e, struct job *jobs, int k) {
    struct run run = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, jobs, k};
    struct ref refs[NREQ];
    struct vllm_request *reqs[NREQ] = {0};
    for (int i = 0; i < NREQ; i++) {
        struct job *j = &jobs[i];
        if (i > 0 && j->arrival && k) { // caching off runs everything at once: its outputs do not depend on it
            pthread_mutex_lock(&run.mu);
            while (!(j->arrival == 1 ? jobs[i - 1].first[k] || jobs[i - 1].done[k] : jobs[i - 1].done[k]))
                pthread_cond_wait(&run.cv, &run.mu);
            pthread_mutex_unlock(&run.mu);
        }
        struct vllm_sampling_params sp;
        vllm_sampling_params_default(&sp);
        sp.temperature = 0;
        sp.ignore_eos = 1;
        sp.max_tokens = j->max_tokens;
        struct vllm_prompt p;
        vllm_prompt_default(&p);
        p.token_ids = j->prompt;
        p.num_token_ids = j->plen;
        refs[i] = (struct ref){&run, j};
        CHECKF(vllm_submit(e, &p, &sp, on_out, &refs[i], &reqs[i]) == 0, "%s", vllm_last_error());
    }
    pthread_mutex_lock(&run.mu);
    for (int i = 0; i < NREQ; i++)
        while (reqs[i] && !jobs[i].done[k]) pthread_cond_wait(&run.cv, &run.mu);
    pthread_mutex_unlock(&run.mu);
    for (int i = 0; i < NREQ; i++) vllm_request_free(reqs[i]);
}

static struct vllm_engine *load(const char *dir, int prefix, int dummy, int64_t state_bytes, int budget) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir;
    ep.num_threads = 1;
    ep.load_format = dummy ? "dummy" : "auto";
    ep.seed = 5;
    if (prefix) { // tiny pools: 24 blocks of 4 for up to 4 sequences of up to 63 tokens
        ep.enable_prefix_caching = 1;
        ep.block_size = 4;
        ep.num_kv_blocks = 24;
        ep.max_num_seqs = 4;
        ep.max_num_batched_tokens = budget;
        ep.max_model_len = 64;
        ep.prefix_state_bytes = state_bytes; // a handful of checkpoints
    }
    struct vllm_engine *e = NULL;
    CHECKF(vllm_engine_load(&ep, &e) == 0, "%s", vllm_last_error());
    return e;
}

static void reset_outputs(struct job *jobs) {
    for (int i = 0; i < NREQ; i++) {
        struct job *j = &jobs[i];
        memset(j->out, 0, sizeof j->out);
        j->nout[0] = j->nout[1] = j->first[0] = j->first[1] = j->done[0] = j->done[1] = 0;
        j->cached[0] = j->cached[1] = 0;
    }
}

// Next turns: each request's prompt, its reply (caching off's) and 0-3 new
// tokens, cut to fit 64 with its own 1-8 output tokens; latest first (in a
// tiny pool only the latest requests' blocks and checkpoints are left).
static void next_turns(const struct job *src, struct job *dst) {
    for (int i = 0; i < NREQ; i++) {
        const struct job *a = &src[NREQ - 1 - i];
        struct job *j = &dst[i];
        memset(j, 0, sizeof *j);
        int n = a->plen + a->nout[0], tail = rnd(4);
        memcpy(j->prompt, a->prompt, sizeof(int32_t) * a->plen);
        memcpy(j->prompt + a->plen, a->out[0], sizeof(int32_t) * a->nout[0]);
        for (int t = 0; t < tail && n + t < 64; t++) j->prompt[n + t] = rnd(256);
        j->max_tokens = 1 + rnd(8);
        j->plen = MIN(n + tail, 64 - j->max_tokens);
        j->arrival = rnd(3);
        j->base = a->plen;
    }
}

// Runs jobs through both engines; the requests whose outputs agree.
static int run_both(const char *name, struct vllm_engine *off, struct vllm_engine *on, struct job *jobs) {
    reset_outputs(jobs);
    run_all(off, jobs, 0);
    run_all(on, jobs, 1);
    int same = 0;
    for (int i = 0; i < NREQ; i++) {
        struct job *j = &jobs[i];
        int ok = j->status[0] == 0 && j->status[1] == 0 && j->nout[0] == j->max_tokens && j->nout[1] == j->nout[0] &&
                 !memcmp(j->out[0], j->out[1], sizeof(int32_t) * j->nout[0]);
        CHECKF(ok, "%s request %d (%d prompt tokens): caching on gave other tokens than caching off", name, i, j->plen);
        same += ok;
    }
    return same;
}

// budget: tokens a step (7: chunked prefill everywhere; 64: prompts arriving
// together share one step, so later ones start from blocks computed in it).
// A second round sends each request's next turn (prompt + reply + new
// tokens) to the warm engine: hits that reach into a reply start from the
// blocks and checkpoints its decode steps wrote.
static void run_model(const char *name, const char *dir, int dummy, int64_t state_bytes, int budget,
                      struct job *jobs) {
    struct vllm_engine *off = load(dir, 0, dummy, 0, budget), *on = load(dir, 1, dummy, state_bytes, budget);
    if (!off || !on) return;
    struct vllm_model_info info;
    vllm_engine_info(on, &info);
    if (state_bytes)
        CHECKF(info.num_state_checkpoints >= 3 && info.num_state_checkpoints <= 12 &&
                   info.state_checkpoint_interval == 8,
               "%s: %d checkpoints every %d tokens", name, info.num_state_checkpoints, info.state_checkpoint_interval);
    int same = run_both(name, off, on, jobs);
    struct job *next = xcalloc(NREQ, sizeof *next);
    next_turns(jobs, next);
    same += run_both(name, off, on, next);
    int into_reply = 0; // next turns whose hit ends past the last interval of the earlier prompt
    for (int i = 0; i < NREQ; i++) into_reply += next[i].cached[1] > next[i].base / 8 * 8;
    free(next);
    struct vllm_stats st;
    for (int t = 0; t < 5000; t++) { // the last event goes out before the resources come back
        vllm_engine_stats(on, &st);
        if (st.num_running == 0 && st.kv_blocks_used == 0 && st.state_slots_used == 0) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&on->mu); // the engine is idle: its scheduler can be read
    struct scheduler *s = &on->sched;
    printf("prefix pressure, %s, steps of %d: %d/%d requests identical; %llu of %llu prompt tokens hit, %d next turns "
           "into the reply, %llu decode checkpoints, %llu preemptions, %llu block and %llu checkpoint evictions\n",
           name, budget, same, 2 * NREQ, (unsigned long long)st.prefix_cache_hits,
           (unsigned long long)st.prefix_cache_queries, into_reply, (unsigned long long)s->decode_ckpts,
           (unsigned long long)st.num_preemptions, (unsigned long long)s->blocks.evictions,
           (unsigned long long)s->ckpts.evictions);
    CHECK(st.prefix_cache_hits > 0 && (!state_bytes || s->ckpts.evictions > 0));
    CHECKF(into_reply > 0, "%s: no next turn hit into its reply", name);
    CHECKF(!state_bytes || s->decode_ckpts > 0, "%s: no decode checkpoint", name);
    if (s->blocks.total) CHECK(st.num_preemptions > 0 && s->blocks.evictions > 0); // no KV: nothing to preempt for
    CHECKF(kv_pool_used(&s->blocks) == 0 && kv_pool_available(&s->blocks) == s->blocks.total, "blocks still held");
    CHECKF(kv_pool_used(&s->ckpts) == 0 && kv_pool_available(&s->ckpts) == s->ckpts.total, "checkpoints still held");
    CHECK(st.state_slots_used == 0 && st.kv_blocks_used == 0 && s->num_running == 0);
    pthread_mutex_unlock(&on->mu);
    vllm_engine_free(off);
    vllm_engine_free(on);
}

int main(void) {
    int32_t seg[6][SEG];
    for (int s = 0; s < 6; s++)
        for (int i = 0; i < SEG; i++) seg[s][i] = rnd(256);
    struct job *jobs = xcalloc(NREQ, sizeof *jobs);
    for (int i = 0; i < NREQ; i++) { // 1-5 segments of 6, then 0-7 tokens of its own
        struct job *j = &jobs[i];
        int ns = 1 + rnd(5), tail = rnd(8);
        for (int s = 0; s < ns; s++) memcpy(j->prompt + s * SEG, seg[rnd(i % 3 ? 3 : 6)], sizeof seg[0]);
        for (int t = 0; t < tail; t++) j->prompt[ns * SEG + t] = rnd(256);
        j->plen = ns * SEG + tail;
        j->max_tokens = 1 + rnd(14);
        j->arrival = rnd(3);
    }
    // the last request decodes long and arrives alone: its next turn (the first of the second round) finds its blocks
    // and decode checkpoints
    jobs[NREQ - 1].max_tokens = 14, jobs[NREQ - 1].arrival = 2;
    char *dir = tu_fixture("nh_dense"), *m2 = tu_mamba2_dir();
    run_model("nh_dense", dir, 0, 100000, 7, jobs); // checkpoints of 17 KB
    run_model("nh_dense", dir, 0, 100000, 64, jobs);
    run_model("mamba2", m2, 1, 20000, 7, jobs); // of 3.5 KB
    char *q3 = tu_fixture("qwen3");
    run_model("qwen3", q3, 0, 0, 7, jobs); // attention alone: blocks only
    run_model("qwen3", q3, 0, 0, 64, jobs);
    free(q3);
    tu_rmdir(m2);
    free(m2);
    free(jobs);
    free(dir);
    return test_summary("prefix_pressure");
}
