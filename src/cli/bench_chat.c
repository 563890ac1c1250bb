// bench_chat.c - `vllm bench --workload chat`: multi-turn chat through the C
// API, with prefix caching off and then on, in one run.
//
// N conversations share one system prompt; each then runs T turns of a user
// message and a reply (greedy, EOS ignored). Turn t's prompt is the system
// prompt, every earlier user message and reply, and the new user message, as
// a chat client re-sends it. Conversation 0 starts alone; the others start at
// its first token (the system prompt has been computed once), and each next
// turn goes in when its reply is complete. Reported per run: TTFT p50 / p99
// of the first turns and of the later ones, prompt tokens computed, prefix
// cache hits, and the tokens an ideal cache could reuse: for each request the
// longest prefix it shares with what earlier requests computed (their prompt
// and reply but its last token), rounded down to the block size (KV blocks
// are cached whole; recurrent state is checkpointed at every block boundary
// of a reply, and a turn's longest shared prefix ends in the reply before
// it), never its last token.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/common.h"

struct chat_result {
    double total_s, ttft1_p50, ttft1_p99, ttft2_p50, ttft2_p99; // TTFT of first turns, of later turns
    uint64_t prefill_tokens, queries, hits, reusable;
    int interval, block; // checkpoint interval in prompts; block size (what reusable is rounded to)
    int32_t **seqs; // [n] each turn's prompt + reply, to compare the runs
    int *lens;
};

struct turn {
    int32_t *ids; // prompt, then reply
    int plen, nreply;
    double t_submit, t_first;
    int started, first, done, status;
    int reusable;
    struct vllm_request *req;
};

struct chat {
    const struct chat_opts *o;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct turn *turns; // [conversation * T + turn]
};

struct tref {
    struct chat *c;
    struct turn *t;
};

static void chat_cb(void *user, const struct vllm_output *o) {
    struct tref *r = user;
    struct turn *t = r->t;
    double now = now_s();
    pthread_mutex_lock(&r->c->mu);
    for (int i = 0; i < o->num_token_ids && t->nreply < r->c->o->reply_len; i++) t->ids[t->plen + t->nreply++] = o->token_ids[i];
    if (o->num_token_ids && !t->first) t->first = 1, t->t_first = now;
    if (o->finish_reason != VLLM_FINISH_NONE) t->done = 1, t->status = o->status;
    pthread_cond_broadcast(&r->c->cv);
    pthread_mutex_unlock(&r->c->mu);
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

// The prompt of turn k of conversation c: the previous turn's prompt and
// reply (or the system prompt), then a user message.
static void build_prompt(struct chat *ch, const int32_t *system, int c, int k, int vocab) {
    const struct chat_opts *o = ch->o;
    struct turn *t = &ch->turns[c * o->turns + k], *prev = k ? t - 1 : NULL;
    int base = prev ? prev->plen + prev->nreply : o->system_len;
    t->plen = base + o->user_len;
    t->ids = xmalloc(sizeof(int32_t) * (t->plen + o->reply_len));
    memcpy(t->ids, prev ? prev->ids : system, sizeof(int32_t) * base);
    uint64_t s = 0x5eed + 7919ull * (uint64_t)(c * o->turns + k);
    for (int i = 0; i < o->user_len; i++) t->ids[base + i] = (int32_t)(lcg(&s) % (uint64_t)vocab);
}

// What an ideal cache could give turn t (not started yet): its longest
// common prefix with what the requests started so far computed, rounded
// down to g.
static int reusable(const struct chat *ch, const struct turn *t, int g) {
    int best = 0, n = ch->o->conversations * ch->o->turns;
    for (int i = 0; i < n; i++) {
        const struct turn *u = &ch->turns[i];
        if (!u->started) continue;
        int m = MIN(u->plen + u->nreply - 1, t->plen - 1), k = 0;
        while (k < m && u->ids[k] == t->ids[k]) k++;
        best = MAX(best, k);
    }
    return best / g * g;
}

static int submit(struct vllm_engine *e, struct chat *ch, struct turn *t, struct tref *ref) {
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.ignore_eos = 1;
    sp.max_tokens = ch->o->reply_len;
    struct vllm_prompt p;
    vllm_prompt_default(&p);
    p.token_ids = t->ids;
    p.num_token_ids = t->plen;
    t->started = 1;
    t->t_submit = now_s();
    return vllm_submit(e, &p, &sp, chat_cb, ref, &t->req);
}

// One run on a fresh engine.
static int run_chat(const struct vllm_engine_params *ep, const struct chat_opts *o, struct chat_result *res) {
    struct vllm_engine *e;
    if (vllm_engine_load(ep, &e)) return fprintf(stderr, "vllm bench: %s\n", vllm_last_error()), 1;
    struct vllm_model_info info;
    vllm_engine_info(e, &info);
    int N = o->conversations, T = o->turns, n = N * T, rc = 0;
    int g = info.block_size;
    struct chat ch = {o, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, xcalloc(n, sizeof(struct turn))};
    struct tref *refs = xcalloc(n, sizeof *refs);
    int32_t *system = xmalloc(sizeof(int32_t) * o->system_len);
    uint64_t s = 0x51;
    for (int i = 0; i < o->system_len; i++) system[i] = (int32_t)(lcg(&s) % (uint64_t)info.vocab_size);
    for (int i = 0; i < n; i++) refs[i] = (struct tref){&ch, &ch.turns[i]};
    double t0 = now_s();
    pthread_mutex_lock(&ch.mu);
    build_prompt(&ch, system, 0, 0, info.vocab_size);
    rc = submit(e, &ch, &ch.turns[0], &refs[0]);
    int started_all = N == 1, finished = 0;
    while (!rc && finished < n) {
        pthread_cond_wait(&ch.cv, &ch.mu);
        if (!started_all && ch.turns[0].first) { // the system prompt is computed: the others begin
            started_all = 1;
            for (int c = 1; c < N && !rc; c++) {
                build_prompt(&ch, system, c, 0, info.vocab_size);
                ch.turns[c * T].reusable = reusable(&ch, &ch.turns[c * T], g);
                rc = submit(e, &ch, &ch.turns[c * T], &refs[c * T]);
            }
        }
        finished = 0;
        for (int i = 0; i < n && !rc; i++) {
            struct turn *t = &ch.turns[i];
            finished += t->done;
            if (t->done && t->status) rc = t->status;
            int k = i % T;
            if (t->done && k + 1 < T && !t[1].started) { // the reply is in: the next turn
                build_prompt(&ch, system, i / T, k + 1, info.vocab_size);
                t[1].reusable = reusable(&ch, &t[1], g);
                rc = submit(e, &ch, &t[1], &refs[i + 1]);
            }
        }
    }
    pthread_mutex_unlock(&ch.mu);
    res->total_s = now_s() - t0;
    struct vllm_stats st;
    vllm_engine_stats(e, &st);
    for (int i = 0; i < n; i++)
        if (ch.turns[i].req) vllm_request_free(ch.turns[i].req);
    vllm_engine_free(e); // every callback has returned
    double *first = xcalloc(n, sizeof(double)), *later = xcalloc(n, sizeof(double));
    int nf = 0, nl = 0;
    res->reusable = 0;
    for (int i = 0; i < n; i++) {
        struct turn *t = &ch.turns[i];
        double ttft = t->t_first - t->t_submit;
        if (i % T == 0) first[nf++] = ttft;
        else later[nl++] = ttft;
        res->reusable += t->reusable;
        res->seqs[i] = t->ids; // handed over
        res->lens[i] = t->plen + t->nreply;
    }
    res->ttft1_p50 = bench_pct(first, nf, 0.5), res->ttft1_p99 = bench_pct(first, nf, 0.99);
    res->ttft2_p50 = bench_pct(later, nl, 0.5), res->ttft2_p99 = bench_pct(later, nl, 0.99);
    res->prefill_tokens = st.prompt_tokens_total;
    res->queries = st.prefix_cache_queries;
    res->hits = st.prefix_cache_hits;
    res->interval = info.state_checkpoint_interval;
    res->block = g;
    free(first), free(later), free(refs), free(system), free(ch.turns);
    return rc;
}

static void print_row(const char *name, const struct chat_result *r) {
    printf("%-8s %8.2f %12llu %9llu/%-9llu %8.1f%% %9.1f/%-9.1f %9.1f/%-9.1f\n", name, r->total_s,
           (unsigned long long)r->prefill_tokens, (unsigned long long)r->hits, (unsigned long long)r->queries,
           r->reusable ? 100.0 * r->hits / r->reusable : 0.0, 1e3 * r->ttft1_p50, 1e3 * r->ttft1_p99,
           1e3 * r->ttft2_p50, 1e3 * r->ttft2_p99);
}

static void print_json(const char *name, const struct chat_result *r) {
    printf("\"%s\": {\"total_s\": %.3f, \"prefill_tokens\": %llu, \"prefix_cache_hits\": %llu, "
           "\"prefix_cache_queries\": %llu, \"reusable_tokens\": %llu, \"ttft_first_turn_ms\": [%.3f, %.3f], "
           "\"ttft_later_turns_ms\": [%.3f, %.3f]}",
           name, r->total_s, (unsigned long long)r->prefill_tokens, (unsigned long long)r->hits,
           (unsigned long long)r->queries, (unsigned long long)r->reusable, 1e3 * r->ttft1_p50, 1e3 * r->ttft1_p99,
           1e3 * r->ttft2_p50, 1e3 * r->ttft2_p99);
}

int bench_chat(const struct vllm_engine_params *base, const struct chat_opts *o, int json) {
    int n = o->conversations * o->turns, rc = 0;
    struct chat_result r[2];
    memset(r, 0, sizeof r);
    for (int k = 0; k < 2 && !rc; k++) { // off, then on
        struct vllm_engine_params ep = *base;
        ep.enable_prefix_caching = k;
        r[k].seqs = xcalloc(n, sizeof(int32_t *));
        r[k].lens = xcalloc(n, sizeof(int));
        rc = run_chat(&ep, o, &r[k]);
    }
    int same = !rc;
    for (int i = 0; i < n && same; i++)
        same = r[0].lens[i] == r[1].lens[i] && !memcmp(r[0].seqs[i], r[1].seqs[i], sizeof(int32_t) * r[0].lens[i]);
    double speedup = r[1].ttft2_p50 > 0 ? r[0].ttft2_p50 / r[1].ttft2_p50 : 0;
    if (rc) fprintf(stderr, "vllm bench: the chat workload failed: %s\n", vllm_last_error());
    else if (json) {
        printf("{\"workload\": \"chat\", \"model\": \"%s\", \"device\": \"%s\", \"conversations\": %d, "
               "\"turns\": %d, \"system_len\": %d, \"user_len\": %d, \"reply_len\": %d, \"interval\": %d, "
               "\"block_size\": %d, ",
               base->model, base->device, o->conversations, o->turns, o->system_len, o->user_len, o->reply_len,
               r[1].interval, r[1].block);
        print_json("off", &r[0]);
        printf(", ");
        print_json("on", &r[1]);
        printf(", \"ttft_later_turns_p50_ratio\": %.2f, \"outputs_identical\": %s}\n", speedup, same ? "true" : "false");
    } else {
        printf("chat: %d conversations x %d turns; system prompt %d, user %d, reply %d tokens; device %s\n",
               o->conversations, o->turns, o->system_len, o->user_len, o->reply_len, base->device);
        printf("hits are prompt tokens found in the cache; reusable: the shared prefixes, rounded down to the "
               "block (%d; checkpoint interval %d in prompts)\n", r[1].block, r[1].interval);
        printf("%-8s %8s %12s %19s %9s %19s %19s\n", "caching", "total s", "prefill tok", "hits/queries",
               "hit/reuse", "TTFT 1st p50/p99 ms", "TTFT 2nd+ p50/p99");
        print_row("off", &r[0]);
        print_row("on", &r[1]);
        printf("TTFT from the second turn on (p50): %.1fx lower with prefix caching; outputs %s\n", speedup,
               same ? "identical" : "DIFFER");
    }
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < n && r[k].seqs; i++) free(r[k].seqs[i]);
        free(r[k].seqs);
        free(r[k].lens);
    }
    return rc ? 1 : same ? 0 : 1;
}
