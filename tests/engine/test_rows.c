// test_rows.c - token-table rows are a scheduler resource: on a model
// without recurrent state (no slots to mask it), requests that stop on a
// token while the next step is already in flight keep their row until that
// step is done, so admission must wait for a row rather than fail the step.
// max_num_seqs 2, eight concurrent requests stopping at different tokens;
// every output must equal the oracle's greedy tokens up to its stop.
#include <pthread.h>
#include <unistd.h>

#include "core/common.h"
#include "core/json.h"
#include "test.h"
#include "util.h"

#define NREQ 8

struct job {
    struct vllm_engine *e;
    const int32_t *prompt, *greedy;
    int np, stop_at, rc, nout, same;
};

static void *run(void *arg) {
    struct job *j = arg;
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = 32;
    int32_t stop = j->greedy[j->stop_at];
    sp.stop_token_ids = &stop;
    sp.num_stop_token_ids = 1;
    int32_t *out = NULL;
    j->rc = vllm_complete_tokens(j->e, j->prompt, j->np, &sp, &out, &j->nout, NULL);
    int first = 0; // the stop token's first occurrence in the greedy tokens
    while (j->greedy[first] != stop) first++;
    j->same = !j->rc && j->nout == first + 1;
    for (int k = 0; j->same && k < j->nout; k++) j->same = out[k] == j->greedy[k];
    vllm_free(out);
    return NULL;
}

int main(void) {
    char **fx;
    int n = tu_fixture_list("VLLM_GATE_FIXTURES", &fx), tried = 0;
    for (int f = 0; f < n; f++) {
        char rel[256];
        snprintf(rel, sizeof rel, "%s/golden.json", fx[f]);
        char *gp = tu_fixture(rel), *dir = tu_fixture(fx[f]);
        json_t *g = NULL;
        CHECK(json_load_path(gp, &g) == 0);
        struct vllm_engine_params ep;
        vllm_engine_params_default(&ep);
        ep.model = dir;
        ep.num_threads = 1;
        ep.max_num_seqs = 2;
        ep.async_scheduling = 1; // the step in flight is the point (the CPU's default is off)
        struct vllm_engine *e = NULL;
        CHECKF(vllm_engine_load(&ep, &e) == 0, "%s", vllm_last_error());
        struct vllm_model_info info;
        vllm_engine_info(e, &info);
        if (info.num_state_slots) { // slots hide the defect: only models without recurrent state
            vllm_engine_free(e), json_decref(g), free(gp), free(dir);
            continue;
        }
        json_t *ps = json_object_get(g, "prompts"), *gs = json_object_get(g, "greedy");
        int np = (int)json_array_size(ps);
        int32_t prompt[NREQ][128], greedy[NREQ][64];
        struct job jobs[NREQ];
        pthread_t th[NREQ];
        for (int i = 0; i < NREQ; i++) {
            json_t *p = json_array_get(ps, i % np), *q = json_array_get(gs, i % np);
            int lp = (int)MIN(json_array_size(p), 128), lq = (int)MIN(json_array_size(q), 64);
            for (int k = 0; k < lp; k++) prompt[i][k] = (int32_t)json_integer_value(json_array_get(p, k));
            for (int k = 0; k < lq; k++) greedy[i][k] = (int32_t)json_integer_value(json_array_get(q, k));
            jobs[i] = (struct job){e, prompt[i], greedy[i], lp, 2 + (5 * i) % 20, 0, 0, 0};
            pthread_create(&th[i], NULL, run, &jobs[i]);
        }
        int ok = 0;
        for (int i = 0; i < NREQ; i++) {
            pthread_join(th[i], NULL);
            if (!jobs[i].same)
                fprintf(stderr, "%s request %d: rc %d (%s), %d tokens\n", fx[f], i, jobs[i].rc,
                        jobs[i].rc ? vllm_last_error() : "", jobs[i].nout);
            ok += jobs[i].same;
        }
        struct vllm_stats st; // resources go back after the last event, at the end of the engine's step
        for (int w = 0; w < 200; w++) {
            vllm_engine_stats(e, &st);
            if (!st.kv_blocks_used && !st.num_running) break;
            usleep(10000);
        }
        printf("%s: %d/%d requests exact at max_num_seqs 2; KV blocks in use after: %d\n", fx[f], ok, NREQ,
               st.kv_blocks_used);
        CHECKF(ok == NREQ, "%s: %d of %d requests exact", fx[f], ok, NREQ);
        CHECK(st.kv_blocks_used == 0 && st.num_running == 0);
        tried++;
        vllm_engine_free(e), json_decref(g), free(gp), free(dir);
    }
    CHECKF(tried > 0, "no fixture without recurrent state in VLLM_GATE_FIXTURES");
    tu_list_free(fx, n);
    return test_summary("rows");
}
