// test_tp_engine.c - the engine split over 2 and 4 ranks runs the same
// requests to the same tokens as on one: greedy and seeded sampling, with
// log-probs, batched, in chunked prefill (a small token budget) and with a
// small KV pool that forces preemption. The model is a random mixed one
// (Mamba2, attention with 2 KV heads, MLP, MoE) whose widths split over 4
// ranks and whose vocabulary does not.
//
// VLLM_TP_DEVICE / VLLM_TP_DTYPE pick the device (default cpu: the CPU
// stand-in of the collectives) and dtype; VLLM_TP_SIZES the rank counts
// (default "2,4").
#include <math.h>
#include <pthread.h>

#include "core/common.h"
#include "test.h"
#include "tp_model.h"
#include "util.h"
#include "vllm.h"

#define NREQ 5
#define NTOK 12

struct req_out {
    int32_t ids[NTOK];
    float lp[NTOK];
    int n, done;
};

struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct req_out out[NREQ];
    int finished;
    uint64_t preemptions;
};

struct cb_arg {
    struct run *run;
    int i;
};

static void on_event(void *user, const struct vllm_output *o) {
    struct cb_arg *a = user;
    struct run *r = a->run;
    pthread_mutex_lock(&r->mu);
    struct req_out *q = &r->out[a->i];
    for (int k = 0; k < o->num_token_ids && q->n < NTOK; k++) {
        q->lp[q->n] = o->logprobs ? o->logprobs[k] : 0;
        q->ids[q->n++] = o->token_ids[k];
    }
    if (o->finish_reason != VLLM_FINISH_NONE) {
        q->done = 1;
        if (++r->finished == NREQ) pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

// Runs NREQ requests at once on the model split over tp ranks.
static int run_engine(const char *dir, int tp, const char *device, const char *dtype, int budget, int blocks,
                      struct run *r) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir, ep.device = device, ep.dtype = dtype;
    ep.num_threads = tp;
    ep.tensor_parallel_size = tp;
    ep.max_num_batched_tokens = budget;
    ep.block_size = 4;
    ep.num_kv_blocks = blocks;
    ep.max_model_len = 32;
    struct vllm_engine *e = NULL;
    if (vllm_engine_load(&ep, &e)) {
        fprintf(stderr, "load at tp %d: %s\n", tp, vllm_last_error());
        return -1;
    }
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    struct cb_arg args[NREQ];
    struct vllm_request *req[NREQ];
    for (int i = 0; i < NREQ; i++) {
        int32_t prompt[24];
        int np = 3 + 4 * i;
        for (int k = 0; k < np; k++) prompt[k] = (i * 29 + k * 7 + 2) % 66;
        struct vllm_prompt p;
        vllm_prompt_default(&p);
        p.token_ids = prompt, p.num_token_ids = np;
        struct vllm_sampling_params sp;
        vllm_sampling_params_default(&sp);
        sp.max_tokens = NTOK;
        sp.ignore_eos = 1;
        sp.logprobs = 1;
        if (i % 2) sp.temperature = 0; // greedy
        else sp.temperature = 0.8f, sp.top_p = 0.9f, sp.seed = 11 + i;
        args[i] = (struct cb_arg){r, i};
        if (vllm_submit(e, &p, &sp, on_event, &args[i], &req[i])) {
            fprintf(stderr, "submit: %s\n", vllm_last_error());
            return -1;
        }
    }
    pthread_mutex_lock(&r->mu);
    while (r->finished < NREQ) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < NREQ; i++) vllm_request_free(req[i]);
    struct vllm_stats st;
    vllm_engine_stats(e, &st);
    r->preemptions = st.num_preemptions;
    vllm_engine_free(e);
    return 0;
}

int main(void) {
    const char *device = getenv("VLLM_TP_DEVICE") ? getenv("VLLM_TP_DEVICE") : "cpu";
    const char *dtype = getenv("VLLM_TP_DTYPE") ? getenv("VLLM_TP_DTYPE") : "float32";
    const char *sizes = getenv("VLLM_TP_SIZES") ? getenv("VLLM_TP_SIZES") : "2,4";
    struct tpm_cfg c = tpm_default("M*-EM*E");
    char *dir = tpm_write(&c, 5);
    CHECK(dir != NULL);
    struct {
        const char *name;
        int budget, blocks;
    } modes[] = {{"batched", 256, 0}, {"chunked prefill (budget 5)", 5, 0}, {"preemption (12 KV blocks)", 64, 12}};
    for (size_t m = 0; dir && m < sizeof modes / sizeof modes[0]; m++) {
        struct run ref, got;
        CHECK(run_engine(dir, 1, device, dtype, modes[m].budget, modes[m].blocks, &ref) == 0);
        if (modes[m].blocks) CHECKF(ref.preemptions > 0, "%s: no preemption", modes[m].name);
        for (const char *s = sizes; *s;) {
            int tp = (int)strtol(s, (char **)&s, 10);
            if (*s == ',') s++;
            if (tp < 2) break;
            if (run_engine(dir, tp, device, dtype, modes[m].budget, modes[m].blocks, &got)) {
                CHECKF(0, "engine at tp %d", tp);
                continue;
            }
            int same = 0, total = 0;
            double lp_err = 0;
            for (int i = 0; i < NREQ; i++) {
                CHECK(got.out[i].n == NTOK && ref.out[i].n == NTOK);
                for (int k = 0; k < NTOK; k++, total++) {
                    same += got.out[i].ids[k] == ref.out[i].ids[k];
                    lp_err = fmax(lp_err, fabs(got.out[i].lp[k] - ref.out[i].lp[k]));
                }
            }
            CHECKF(same == total && total > 0, "%s tp %d: %d of %d tokens as at tp 1", modes[m].name, tp, same, total);
            CHECKF(lp_err < 1e-4, "%s tp %d: log-probs differ by %.2e", modes[m].name, tp, lp_err);
            printf("%-28s tp %d: %d/%d tokens as at tp 1 (greedy and seeded sampling), log-probs within %.1e\n",
                   modes[m].name, tp, same, total, lp_err);
        }
    }
    if (dir) tu_rmdir(dir), free(dir);
    return test_summary("tp_engine");
}
