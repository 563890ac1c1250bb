// generate.c - `vllm generate`: prompt ids in, ids out; and the golden gates
// that check greedy tokens against an oracle in each scheduling mode.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "core/common.h"
#include "core/json.h"
#include "engine/engine.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: vllm generate --model DIR (--prompt-ids 1,2,3 | --golden FILE) [options]\n\n"
            "  --prompt-ids LIST            one prompt, comma-separated token ids\n"
            "  --prompt TEXT                one prompt as text (needs tokenizer.json)\n"
            "  --max-tokens N               tokens to generate (default 16)\n"
            "  --temperature X --top-p X --top-k N --min-p X --sampling-seed N\n"
            "  --ignore-eos                 do not stop at the end-of-sequence token\n"
            "  --dump-logits FILE           write the raw logits of every prompt position as JSON\n"
            "                               {\"prompt_ids\": [ids], \"logits\": [[vocab floats] per position]}\n"
            "golden gates:\n"
            "  --golden FILE                JSON {\"prompts\": [[ids]], \"greedy\": [[ids]]}: run every prompt\n"
            "                               len(greedy[i]) greedy steps; print STRICT PASS k/k, or the first\n"
            "                               divergence and exit 1; exit 3 when nothing was compared\n"
            "  --fresh-prefill              every token from a new request (prompt + tokens so far)\n"
            "  --both-modes                 decode, then fresh-prefill, on one load\n"
            "  --batch                      submit all prompts at once\n"
            "  --staggered K                submit prompt i+1 once prompt i has K tokens (arrivals during decode)\n"
            "  --require-preemption         fail unless the run preempted at least once\n"
            "  --golden-key K               compare against golden[K] (default greedy; e.g. greedy_bf16)\n"
            "  --margin-key K --min-margin X  compare each prompt only while the oracle's top-2 margin\n"
            "                               golden[K][i][step] >= X\n"
            "  --modes-agree                run decode and fresh-prefill and also compare them to each other\n"
            "  --warm                       run every prompt once first (uncompared), so that the compared\n"
            "                               runs start from a warm prefix cache\n"
            "  --require-hits               fail unless every request after a run's first found cached\n"
            "                               prompt tokens (needs --enable-prefix-caching)\n\n"
            "engine:\n%s",
            cli_engine_help);
}

struct job {
    int32_t *prompt;
    int plen, want;
    int32_t *got;
    int ngot;
    int done, status;
    char error[256];
    int cached; // prompt tokens the prefix cache held
};

struct jobs {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;
};

struct job_ref {
    struct jobs *all;
    struct job *job;
};

static void job_cb(void *user, const struct vllm_output *o) {
    struct job_ref *ref = user;
    struct job *j = ref->job;
    pthread_mutex_lock(&ref->all->mu);
    for (int i = 0; i < o->num_token_ids && j->ngot < j->want; i++) j->got[j->ngot++] = o->token_ids[i];
    if (o->finish_reason != VLLM_FINISH_NONE) {
        j->done = 1;
        j->cached = o->num_cached_tokens;
        j->status = o->status;
        if (o->error) snprintf(j->error, sizeof j->error, "%s", o->error);
        ref->all->pending--;
    }
    pthread_cond_broadcast(&ref->all->cv);
    pthread_mutex_unlock(&ref->all->mu);
}

// Requests of a mode's run, and those after its first that found no cached
// prompt tokens (--require-hits).
struct hits {
    int requests, missed;
};

// Runs jobs[0..n): all at once (stagger 0), one at a time (stagger < 0), or
// each once the one before has `stagger` tokens.
static int run_jobs(struct vllm_engine *e, struct job *jobs, int n, const struct vllm_sampling_params *base, int stagger,
                    struct hits *hc) {
    struct jobs all = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    struct job_ref *refs = xcalloc(n, sizeof *refs);
    struct vllm_request **reqs = xcalloc(n, sizeof *reqs);
    int rc = 0;
    if (stagger == 0) vllm_engine_pause(e); // a batch: every request in before the first step
    for (int i = 0; i < n && !rc; i++) {
        if (i > 0 && stagger != 0) { // wait for the previous job to be far enough
            pthread_mutex_lock(&all.mu);
            while (!jobs[i - 1].done && (stagger < 0 || jobs[i - 1].ngot < stagger)) pthread_cond_wait(&all.cv, &all.mu);
            pthread_mutex_unlock(&all.mu);
        }
        if (jobs[i].want == 0) { // nothing to compare for this prompt
            jobs[i].done = 1;
            continue;
        }
        struct vllm_sampling_params sp = *base;
        sp.max_tokens = jobs[i].want;
        struct vllm_prompt p;
        vllm_prompt_default(&p);
        p.token_ids = jobs[i].prompt;
        p.num_token_ids = jobs[i].plen;
        refs[i] = (struct job_ref){&all, &jobs[i]};
        pthread_mutex_lock(&all.mu);
        all.pending++;
        pthread_mutex_unlock(&all.mu);
        rc = vllm_submit(e, &p, &sp, job_cb, &refs[i], &reqs[i]);
        if (rc) {
            fprintf(stderr, "vllm generate: submit failed: %s\n", vllm_last_error());
            pthread_mutex_lock(&all.mu);
            all.pending--;
            pthread_mutex_unlock(&all.mu);
        }
    }
    if (stagger == 0) vllm_engine_resume(e);
    pthread_mutex_lock(&all.mu);
    while (all.pending > 0) pthread_cond_wait(&all.cv, &all.mu);
    pthread_mutex_unlock(&all.mu);
    for (int i = 0; i < n; i++) {
        if (reqs[i]) vllm_request_free(reqs[i]);
        if (jobs[i].done && jobs[i].status && !rc) {
            fprintf(stderr, "vllm generate: request %d failed: %s\n", i, jobs[i].error);
            rc = jobs[i].status;
        }
        if (jobs[i].want > 0 && hc->requests++ > 0 && jobs[i].cached == 0) hc->missed++;
    }
    free(refs);
    free(reqs);
    return rc;
}

struct golden {
    int n;
    int32_t **prompts, **greedy;
    int *plen, *glen;
};

static int read_ids(json_t *a, int32_t **ids) {
    if (!json_is_array(a)) return -1;
    int n = (int)json_array_size(a);
    *ids = xcalloc(n ? n : 1, sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) return -1;
        (*ids)[i] = (int32_t)json_integer_value(v);
    }
    return n;
}

struct golden_opts {
    const char *key, *margin_key; // tokens to compare; per-step top-2 margins of the oracle
    float min_margin;             // compare each prompt only while its margin >= this
};

// The steps of prompt i to compare: all, or those before the oracle's first
// step whose own top-2 margin is under min_margin (its choice is a coin toss).
static int cut_at_margin(json_t *margins, int i, int n, float min_margin) {
    json_t *m = json_array_get(margins, i);
    for (int k = 0; k < n; k++) {
        double v;
        if (json_as_double(json_array_get(m, k), &v) || v < min_margin) return k;
    }
    return n;
}

static int load_golden(const char *path, const struct golden_opts *o, struct golden *g) {
    json_t *j;
    if (json_load_path(path, &j)) {
        fprintf(stderr, "vllm generate: %s\n", vllm_last_error());
        return -1;
    }
    json_t *p = json_object_get(j, "prompts"), *q = json_object_get(j, o->key);
    json_t *mg = o->margin_key ? json_object_get(j, o->margin_key) : NULL;
    if (o->margin_key && !json_is_array(mg)) {
        fprintf(stderr, "vllm generate: %s has no \"%s\" list\n", path, o->margin_key);
        json_decref(j);
        return -1;
    }
    int rc = 0;
    if (!json_is_array(p) || !json_is_array(q) || json_array_size(p) != json_array_size(q)) rc = -1;
    g->n = rc ? 0 : (int)json_array_size(p);
    g->prompts = xcalloc(g->n + 1, sizeof(int32_t *));
    g->greedy = xcalloc(g->n + 1, sizeof(int32_t *));
    g->plen = xcalloc(g->n + 1, sizeof(int));
    g->glen = xcalloc(g->n + 1, sizeof(int));
    for (int i = 0; i < g->n && !rc; i++) {
        g->plen[i] = read_ids(json_array_get(p, i), &g->prompts[i]);
        g->glen[i] = read_ids(json_array_get(q, i), &g->greedy[i]);
        if (g->plen[i] < 0 || g->glen[i] < 0) rc = -1;
        else if (mg) g->glen[i] = cut_at_margin(mg, i, g->glen[i], o->min_margin);
    }
    json_decref(j);
    if (rc)
        fprintf(stderr, "vllm generate: %s: expected {\"prompts\": [[ids]], \"%s\": [[ids]]} of equal length\n", path,
                o->key);
    return rc;
}

static void free_golden(struct golden *g) {
    for (int i = 0; i < g->n; i++) free(g->prompts[i]), free(g->greedy[i]);
    free(g->prompts);
    free(g->greedy);
    free(g->plen);
    free(g->glen);
}

// Decode mode: each prompt is one request generating all its steps.
static int run_decode(struct vllm_engine *e, const struct golden *g, const struct vllm_sampling_params *sp, int batch,
                      int stagger, int32_t **got, struct hits *hc, int *cached) {
    struct job *jobs = xcalloc(g->n, sizeof *jobs);
    for (int i = 0; i < g->n; i++)
        jobs[i] = (struct job){g->prompts[i], g->plen[i], g->glen[i], got[i], 0, 0, 0, "", 0};
    int rc = run_jobs(e, jobs, g->n, sp, batch ? 0 : stagger ? stagger : -1, hc);
    for (int i = 0; i < g->n && cached; i++) cached[i] = jobs[i].cached;
    free(jobs);
    return rc;
}

// Fresh-prefill mode: token j of prompt i comes from a new request whose
// prompt is prompt i + its first j generated tokens; no decode step runs.
static int run_fresh(struct vllm_engine *e, const struct golden *g, const struct vllm_sampling_params *sp, int batch,
                     int32_t **got, struct hits *hc) {
    int maxg = 0, rc = 0;
    for (int i = 0; i < g->n; i++) maxg = MAX(maxg, g->glen[i]);
    struct job *jobs = xcalloc(g->n, sizeof *jobs);
    int32_t **seq = xcalloc(g->n, sizeof *seq);
    for (int i = 0; i < g->n; i++) {
        seq[i] = xmalloc(sizeof(int32_t) * (g->plen[i] + g->glen[i] + 1));
        memcpy(seq[i], g->prompts[i], sizeof(int32_t) * g->plen[i]);
    }
    for (int j = 0; j < maxg && !rc; j++) {
        int n = 0;
        int idx[g->n];
        for (int i = 0; i < g->n; i++) {
            if (j >= g->glen[i]) continue;
            jobs[n] = (struct job){seq[i], g->plen[i] + j, 1, &got[i][j], 0, 0, 0, "", 0};
            idx[n++] = i;
        }
        rc = run_jobs(e, jobs, n, sp, batch ? 0 : -1, hc);
        for (int k = 0; k < n && !rc; k++) {
            if (jobs[k].ngot != 1) rc = 1;
            else seq[idx[k]][g->plen[idx[k]] + j] = got[idx[k]][j];
        }
    }
    for (int i = 0; i < g->n; i++) free(seq[i]);
    free(seq);
    free(jobs);
    return rc;
}

static int compare(const char *mode, const struct golden *g, int32_t **got, int *compared) {
    for (int i = 0; i < g->n; i++)
        for (int j = 0; j < g->glen[i]; j++) {
            (*compared)++;
            if (got[i][j] != g->greedy[i][j]) {
                printf("DIVERGE mode=%s prompt=%d step=%d expected=%d got=%d\n", mode, i, j, g->greedy[i][j], got[i][j]);
                return 1;
            }
        }
    return 0;
}

struct golden_run {
    const char *path;
    struct golden_opts o;
    int fresh, both, batch, stagger, require_preempt;
    int modes_agree; // decode and fresh-prefill must give the same tokens
    int warm, require_hits;
};

static int run_golden(struct vllm_engine *e, const struct golden_run *gr, const struct vllm_sampling_params *base) {
    struct golden g;
    int fresh = gr->fresh, both = gr->both || gr->modes_agree, batch = gr->batch, stagger = gr->stagger;
    if (load_golden(gr->path, &gr->o, &g)) return 2;
    struct vllm_sampling_params sp = *base;
    sp.temperature = 0;
    sp.ignore_eos = 1;
    int32_t **got = xcalloc(g.n + 1, sizeof *got), **first = xcalloc(g.n + 1, sizeof *first);
    for (int i = 0; i < g.n; i++) got[i] = xcalloc(g.glen[i] + 1, sizeof(int32_t));
    for (int i = 0; i < g.n; i++) first[i] = xcalloc(g.glen[i] + 1, sizeof(int32_t));
    int compared = 0, diverged = 0, rc = 0, missed = 0, *cached = xcalloc(g.n + 1, sizeof(int));
    const char *modes[2] = {"decode", "fresh-prefill"};
    struct vllm_stats st0;
    if (gr->warm) { // every prompt once, one at a time: the compared runs find it all cached
        struct hits hc = {0, 0};
        rc = run_decode(e, &g, &sp, 0, 0, got, &hc, NULL);
    }
    vllm_engine_stats(e, &st0);
    for (int m = 0; m < 2 && !rc && !diverged; m++) {
        if ((m == 0 && fresh && !both) || (m == 1 && !fresh && !both)) continue;
        for (int i = 0; i < g.n; i++) memset(got[i], 0xff, sizeof(int32_t) * g.glen[i]);
        struct hits hc = {0, 0};
        rc = m == 0 ? run_decode(e, &g, &sp, batch, stagger, got, &hc, cached) : run_fresh(e, &g, &sp, batch, got, &hc);
        missed += hc.missed;
        if (!rc) diverged = compare(modes[m], &g, got, &compared);
        if (!rc && gr->modes_agree && m == 0)
            for (int i = 0; i < g.n; i++) memcpy(first[i], got[i], sizeof(int32_t) * g.glen[i]);
        if (!rc && !diverged && gr->modes_agree && m == 1) { // fresh-prefill against decode
            struct golden d = g;
            d.greedy = first;
            diverged = compare("fresh-prefill vs decode", &d, got, &compared);
        }
    }
    struct vllm_stats st;
    vllm_engine_stats(e, &st);
    printf("steps %llu, preemptions %llu, prompt tokens %llu, generated %llu, graphs recorded %d\n",
           (unsigned long long)st.num_steps, (unsigned long long)st.num_preemptions,
           (unsigned long long)st.prompt_tokens_total, (unsigned long long)st.generation_tokens_total,
           runner_graphs_captured(e->runner));
    struct vllm_model_info info;
    vllm_engine_info(e, &info);
    if (info.prefix_caching) {
        printf("prefix cache: %llu of %llu prompt tokens hit", (unsigned long long)(st.prefix_cache_hits - st0.prefix_cache_hits),
               (unsigned long long)(st.prefix_cache_queries - st0.prefix_cache_queries));
        if (!fresh || both) {
            printf(" (decode run, per prompt:");
            for (int i = 0; i < g.n; i++) printf(" %d", cached[i]);
            printf(")");
        }
        printf("\n");
    }
    free(cached);
    for (int i = 0; i < g.n; i++) free(got[i]), free(first[i]);
    free(got);
    free(first);
    free_golden(&g);
    if (rc) {
        fprintf(stderr, "vllm generate: %s\n", vllm_last_error());
        return 2;
    }
    if (diverged) return 1;
    if (compared == 0) {
        printf("NOTHING COMPARED\n");
        return 3;
    }
    if (gr->require_preempt && st.num_preemptions == 0) {
        printf("FAIL: --require-preemption, but no request was preempted\n");
        return 1;
    }
    if (gr->require_hits && (!info.prefix_caching || missed)) {
        printf("FAIL: --require-hits, but %d requests after the first found no cached prompt tokens%s\n", missed,
               info.prefix_caching ? "" : " (prefix caching is off)");
        return 1;
    }
    printf("STRICT PASS %d/%d\n", compared, compared);
    return 0;
}

static int run_one(struct vllm_engine *e, const int32_t *ids, int n, const char *text,
                   const struct vllm_sampling_params *sp) {
    if (text) {
        char *out;
        vllm_finish_reason why;
        if (vllm_complete_text(e, text, sp, &out, &why)) {
            fprintf(stderr, "vllm generate: %s\n", vllm_last_error());
            return 1;
        }
        printf("%s\n[finish: %s]\n", out, vllm_finish_reason_string(why));
        vllm_free(out);
        return 0;
    }
    int32_t *out;
    int nout;
    vllm_finish_reason why;
    if (vllm_complete_tokens(e, ids, n, sp, &out, &nout, &why)) {
        fprintf(stderr, "vllm generate: %s\n", vllm_last_error());
        return 1;
    }
    for (int i = 0; i < nout; i++) printf("%s%d", i ? " " : "", out[i]);
    printf("\n[finish: %s]\n", vllm_finish_reason_string(why));
    vllm_free(out);
    return 0;
}

// --dump-logits: the engine's logits hook keeps each prompt position's row
// (one request runs).
struct dump {
    int n, vocab;
    float *rows; // [n, vocab]
};

static void dump_hook(void *user, int rows, int vocab, const float *logits, struct request *const *row_req,
                      const int32_t *row_pos) {
    (void)row_req;
    struct dump *d = user;
    if (!d->rows) d->vocab = vocab, d->rows = xcalloc((size_t)d->n * vocab, sizeof(float));
    for (int r = 0; r < rows; r++)
        if (row_pos[r] < d->n) memcpy(d->rows + (size_t)row_pos[r] * vocab, logits + (size_t)r * vocab, sizeof(float) * vocab);
}

// Runs the prompt (text: tokenized as vllm_complete_text does) with the hook
// on, then writes the file.
static int dump_logits(struct vllm_engine *e, const int32_t *ids, int n, const char *text,
                       const struct vllm_sampling_params *sp, const char *path) {
    int32_t *tids = NULL;
    if (text && vllm_tokenize(e, text, strlen(text), 1, &tids, &n)) {
        fprintf(stderr, "vllm generate: %s\n", vllm_last_error());
        return 1;
    }
    if (text) ids = tids;
    struct dump d = {n, 0, NULL};
    engine_set_logits_hook(e, dump_hook, &d);
    int rc = run_one(e, ids, n, NULL, sp);
    FILE *f = rc ? NULL : fopen(path, "w");
    if (!rc && !f) fprintf(stderr, "vllm generate: --dump-logits: cannot write %s\n", path), rc = 1;
    if (f) {
        fprintf(f, "{\"prompt_ids\": [");
        for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", ids[i]);
        fprintf(f, "], \"logits\": [");
        for (int i = 0; i < n && d.rows; i++) {
            fprintf(f, "%s[", i ? ",\n" : "\n");
            for (int v = 0; v < d.vocab; v++) fprintf(f, "%s%.9g", v ? ", " : "", d.rows[(size_t)i * d.vocab + v]);
            fprintf(f, "]");
        }
        fprintf(f, "]}\n");
        if (fclose(f)) fprintf(stderr, "vllm generate: --dump-logits: cannot write %s\n", path), rc = 1;
    }
    free(d.rows);
    vllm_free(tids);
    return rc;
}

int cli_generate(int argc, char **argv) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = 0;
    const char *ids_s = NULL, *text = NULL, *dump = NULL, *v;
    struct golden_run gr = {NULL, {"greedy", NULL, 0.0f}, 0, 0, 0, 0, 0, 0, 0, 0};
    int x;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int r = cli_engine_flag(argc, argv, &i, &ep);
        if (r < 0) return 2;
        if (r) continue;
#define VAL() if (!(v = cli_value(argc, argv, &i))) return 2
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return usage(stdout), 0;
        else if (!strcmp(f, "--golden")) { VAL(); gr.path = v; }
        else if (!strcmp(f, "--golden-key")) { VAL(); gr.o.key = v; }
        else if (!strcmp(f, "--margin-key")) { VAL(); gr.o.margin_key = v; }
        else if (!strcmp(f, "--min-margin")) { VAL(); if (cli_float(f, v, 0, 1e30, &gr.o.min_margin)) return 2; }
        else if (!strcmp(f, "--modes-agree")) gr.modes_agree = 1;
        else if (!strcmp(f, "--prompt-ids")) { VAL(); ids_s = v; }
        else if (!strcmp(f, "--prompt")) { VAL(); text = v; }
        else if (!strcmp(f, "--max-tokens")) { VAL(); if (cli_int(f, v, 1, 1 << 24, &sp.max_tokens)) return 2; }
        else if (!strcmp(f, "--temperature")) { VAL(); if (cli_float(f, v, 0, 1e4, &sp.temperature)) return 2; }
        else if (!strcmp(f, "--top-p")) { VAL(); double d; if (cli_number(f, v, 0, 1, 1, &d)) return 2; sp.top_p = (float)d; }
        else if (!strcmp(f, "--top-k")) { VAL(); if (cli_int(f, v, -1, 1 << 30, &sp.top_k)) return 2; }
        else if (!strcmp(f, "--min-p")) { VAL(); if (cli_float(f, v, 0, 1, &sp.min_p)) return 2; }
        else if (!strcmp(f, "--sampling-seed")) { VAL(); if (cli_int(f, v, 0, 2147483647, &x)) return 2; sp.seed = x; }
        else if (!strcmp(f, "--ignore-eos")) sp.ignore_eos = 1;
        else if (!strcmp(f, "--dump-logits")) { VAL(); dump = v; }
        else if (!strcmp(f, "--fresh-prefill")) gr.fresh = 1;
        else if (!strcmp(f, "--both-modes")) gr.both = 1;
        else if (!strcmp(f, "--batch")) gr.batch = 1;
        else if (!strcmp(f, "--staggered")) { VAL(); if (cli_int(f, v, 1, 1 << 20, &gr.stagger)) return 2; }
        else if (!strcmp(f, "--require-preemption")) gr.require_preempt = 1;
        else if (!strcmp(f, "--warm")) gr.warm = 1;
        else if (!strcmp(f, "--require-hits")) gr.require_hits = 1;
        else {
            fprintf(stderr, "vllm generate: unknown option '%s'\n", f);
            usage(stderr);
            return 2;
        }
#undef VAL
    }
    const char *gp = getenv("VLLM_GATE_PREFIX"); // docs/ENVIRONMENT.md: every golden gate with a warm prefix cache
    if (gr.path && gp && !strcmp(gp, "warm")) ep.enable_prefix_caching = 1, gr.warm = 1;
    if (!ep.model || (!gr.path && !ids_s && !text)) {
        usage(stderr);
        return 2;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (ids_s && (n = cli_ids(ids_s, &ids)) <= 0) {
        fprintf(stderr, "vllm generate: --prompt-ids: '%s' is not a comma-separated list of ids\n", ids_s);
        return 2;
    }
    struct vllm_engine *e;
    if (vllm_engine_load(&ep, &e)) {
        fprintf(stderr, "vllm generate: %s\n", vllm_last_error());
        free(ids);
        return 2;
    }
    int rc = gr.path ? run_golden(e, &gr, &sp) : dump ? dump_logits(e, ids, n, text, &sp, dump) : run_one(e, ids, n, text, &sp);
    if (!gr.path && ep.enable_prefix_caching) {
        struct vllm_stats st;
        vllm_engine_stats(e, &st);
        printf("prefix cache: %llu of %llu prompt tokens hit\n", (unsigned long long)st.prefix_cache_hits,
               (unsigned long long)st.prefix_cache_queries);
    }
    vllm_engine_free(e);
    free(ids);
    return rc;
}
