// test_logits.c - gate 1: logits against the transformers oracle, for every
// prompt position and every generated step, within 1e-4 (max abs).
//
// Two passes per fixture: (a) each prompt + its greedy tokens as one prompt
// (all positions in prefill, possibly chunked); (b) each prompt decoding its
// greedy tokens (positions after the prompt come from decode steps).
//
// Prefix caching: the shared-prefix sets (fixture/prefix) run with caching
// on, one request after another. Every request after the first must find
// cached tokens (the second pass finds them all warm), and the rows it did
// compute (not the cached ones) are held to the same bound.
#include <math.h>
#include <pthread.h>

#include "core/common.h"
#include "core/json.h"
#include "engine/engine.h"
#include "io/safetensors.h"
#include "test.h"
#include "util.h"

#define GATE 1e-4

struct ctx {
    struct st_set *ref;   // logits.safetensors
    uint64_t req_id;      // the request being checked
    int prompt;           // its fixture prompt index
    double max_err;
    long rows;
};

static void hook(void *user, int rows, int vocab, const float *logits, struct request *const *row_req,
                 const int32_t *row_pos) {
    struct ctx *c = user;
    char name[64];
    snprintf(name, sizeof name, "logits_%d", c->prompt);
    const struct st_tensor *t = st_find(c->ref, name);
    if (!t) return;
    const float *ref = t->data;
    for (int r = 0; r < rows; r++) {
        if (row_req[r]->id != c->req_id || row_pos[r] >= t->shape[0]) continue;
        const float *a = logits + (int64_t)r * vocab, *b = ref + (int64_t)row_pos[r] * t->shape[1];
        for (int v = 0; v < vocab; v++) c->max_err = fmax(c->max_err, fabs((double)a[v] - b[v]));
        c->rows++;
    }
}

static int run_fixture(const char *fx, int budget, int prefix) {
    char rel[128];
    const char *sub = prefix ? "/prefix" : "";
    snprintf(rel, sizeof rel, "%s%s/golden.json", fx, sub);
    char *gpath = tu_fixture(rel), *dir = tu_fixture(fx);
    snprintf(rel, sizeof rel, "%s%s/logits.safetensors", fx, sub);
    char *lpath = tu_fixture(rel);
    json_t *g = NULL;
    struct ctx c = {0};
    CHECK(json_load_path(gpath, &g) == 0);
    CHECK(st_open_file(lpath, &c.ref) == 0);
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir;
    ep.num_threads = 1;
    ep.max_num_batched_tokens = budget;
    ep.enable_prefix_caching = prefix;
    ep.tensor_parallel_size = getenv("VLLM_TEST_TP_SIZE") ? atoi(getenv("VLLM_TEST_TP_SIZE")) : 1; // tests/tp.cmake
    struct vllm_engine *e = NULL;
    CHECKF(vllm_engine_load(&ep, &e) == 0, "%s", vllm_last_error());
    if (!e || !g || !c.ref) return 1;
    engine_set_logits_hook(e, hook, &c);
    json_t *prompts = json_object_get(g, "prompts"), *greedy = json_object_get(g, "greedy");
    long expect_rows = 0, hits = 0, missed = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < json_array_size(prompts); i++) {
            json_t *p = json_array_get(prompts, i), *q = json_array_get(greedy, i);
            int np = (int)json_array_size(p), nq = (int)json_array_size(q);
            int32_t *seq = xmalloc(sizeof(int32_t) * (np + nq));
            for (int k = 0; k < np; k++) seq[k] = (int32_t)json_integer_value(json_array_get(p, k));
            for (int k = 0; k < nq; k++) seq[np + k] = (int32_t)json_integer_value(json_array_get(q, k));
            struct vllm_sampling_params sp;
            vllm_sampling_params_default(&sp);
            sp.temperature = 0;
            sp.ignore_eos = 1;
            // pass 0: the whole sequence as a prompt; pass 1: decode the greedy tokens
            int plen = pass == 0 ? np + nq : np;
            sp.max_tokens = pass == 0 ? 1 : nq;
            c.prompt = (int)i;
            // one request at a time, so ids are known before its first step
            pthread_mutex_lock(&e->mu);
            c.req_id = e->next_id;
            pthread_mutex_unlock(&e->mu);
            int32_t *out = NULL;
            int nout = 0;
            struct vllm_stats s0, s1;
            vllm_engine_stats(e, &s0);
            CHECK(vllm_complete_tokens(e, seq, plen, &sp, &out, &nout, NULL) == 0);
            vllm_engine_stats(e, &s1);
            long hit = (long)(s1.prefix_cache_hits - s0.prefix_cache_hits); // one request, never preempted
            hits += hit;
            missed += prefix && (pass || i) && hit == 0;
            if (pass == 1) {
                int same = nout == nq;
                for (int k = 0; same && k < nq; k++) same = out[k] == seq[np + k];
                CHECKF(same, "%s prompt %zu: decode diverged from the oracle's greedy tokens", fx, i);
            }
            expect_rows += (pass == 0 ? np + nq : np + nq - 1) - hit; // cached positions are not computed
            vllm_free(out);
            free(seq);
        }
    }
    printf("%s%s budget %d: %ld logit rows compared, max abs error %.3g (gate %.0e)", fx, sub, budget, c.rows, c.max_err,
           GATE);
    if (prefix) printf(", %ld prompt tokens from the prefix cache", hits);
    printf("\n");
    CHECKF(!missed, "%s%s: %ld requests after the first found nothing cached", fx, sub, missed);
    CHECKF(!prefix || hits > 0, "%s%s: no prefix cache hits", fx, sub);
    CHECKF(c.rows == expect_rows, "%s: compared %ld rows, expected %ld", fx, c.rows, expect_rows);
    CHECKF(c.max_err <= GATE, "%s: max abs logit error %.3g over %.0e", fx, c.max_err, GATE);
    vllm_engine_free(e);
    st_close(c.ref);
    json_decref(g);
    free(gpath);
    free(lpath);
    free(dir);
    return 0;
}

// argv[1]: the environment variable that lists the fixtures (default: the
// gate fixtures, or the tensor-parallel ones under VLLM_TEST_TP_SIZE > 1).
int main(int argc, char **argv) {
    char **fx;
    const char *tp = getenv("VLLM_TEST_TP_SIZE"), *list = tp && atoi(tp) > 1 ? "VLLM_TP2_FIXTURES" : "VLLM_GATE_FIXTURES";
    if (argc > 1) list = argv[1];
    int n = tu_fixture_list(list, &fx);
    CHECKF(n > 0, "no fixtures in %s", list);
    for (int i = 0; i < n; i++) {
        run_fixture(fx[i], 2048, 0);
        run_fixture(fx[i], 5, 0); // chunked prefill: chunk boundaries cut across the SSD chunks
    }
    for (int i = 0; i < n; i++) { // the fixtures with a shared-prefix set
        char rel[160];
        snprintf(rel, sizeof rel, "%s/prefix/golden.json", fx[i]);
        char *path = tu_fixture(rel);
        if (file_exists(path)) {
            run_fixture(fx[i], 2048, 1);
            run_fixture(fx[i], 5, 1);
        }
        free(path);
    }
    tu_list_free(fx, n);
    return test_summary("logits");
}
