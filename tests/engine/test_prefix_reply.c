// test_prefix_reply.c - prefix caching through a reply (decode checkpoints):
// request A decodes a reply to its prompt; request B re-sends A's prompt,
// A's reply and a new tail, as a chat client's next turn does. With caching
// on, B must hit past A's prompt into the reply, up to the last full block
// A computed (decode steps checkpoint the recurrent state at every block
// boundary; A's prompt alone holds no interval-aligned checkpoint past its
// start), and B's greedy tokens and sampled rows' logits must be those of
// caching off (1e-4 max abs). B also runs in chunks of 5 tokens after its
// hit. Fixtures: NemotronH (attention + Mamba2), Kimi-Linear (KDA + MLA) and
// a pure Mamba2 of random weights (no KV: checkpoints alone).
// Usage: test_prefix_reply [--device cuda] (the GPU run is in fp32).
#include <math.h>
#include <pthread.h>

#include "core/common.h"
#include "engine/engine.h"
#include "test.h"
#include "util.h"

#define GATE 1e-4
#define LA 37    // A's prompt
#define REPLY 26 // A's reply: A computes 37 + 25 tokens, so B can hit 60 (blocks of 4; 60 is no interval multiple)
#define TAIL 5
#define BOUT 6 // B's reply
#define BS 4

static const char *device = "cpu";

struct cap {
    uint64_t req_id; // the request whose sampled rows are kept
    int from;        // its first sampled position (its prompt's last token)
    int vocab;
    float *rows;     // [BOUT, vocab]
    int seen[BOUT];
};

static void hook(void *user, int rows, int vocab, const float *logits, struct request *const *row_req,
                 const int32_t *row_pos) {
    struct cap *c = user;
    for (int r = 0; r < rows; r++) {
        int k = row_pos[r] - c->from;
        if (row_req[r]->id != c->req_id || k < 0 || k >= BOUT) continue;
        memcpy(c->rows + (size_t)k * vocab, logits + (size_t)r * vocab, sizeof(float) * vocab);
        c->seen[k] = 1;
    }
}

static struct vllm_engine *load(const char *dir, int dummy, int prefix, int budget) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir;
    ep.device = device;
    ep.dtype = "float32";
    ep.num_threads = 1;
    ep.load_format = dummy ? "dummy" : "auto";
    ep.seed = 3;
    ep.block_size = BS;
    ep.max_model_len = 256;
    ep.max_num_seqs = 4;
    ep.num_kv_blocks = 256;
    ep.max_num_batched_tokens = budget;
    ep.enable_prefix_caching = prefix;
    struct vllm_engine *e = NULL;
    CHECKF(vllm_engine_load(&ep, &e) == 0, "%s", vllm_last_error());
    return e;
}

// One request, greedy: its output into out (n tokens), its hits.
static long complete(struct vllm_engine *e, const int32_t *ids, int n, int max_tokens, int32_t *out) {
    struct vllm_sampling_params sp;
    vllm_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.ignore_eos = 1;
    sp.max_tokens = max_tokens;
    struct vllm_stats s0, s1;
    vllm_engine_stats(e, &s0);
    int32_t *o = NULL;
    int no = 0;
    CHECKF(vllm_complete_tokens(e, ids, n, &sp, &o, &no, NULL) == 0, "%s", vllm_last_error());
    CHECKF(no == max_tokens, "%d of %d tokens", no, max_tokens);
    if (o) memcpy(out, o, sizeof(int32_t) * MIN(no, max_tokens));
    vllm_free(o);
    vllm_engine_stats(e, &s1);
    return (long)(s1.prefix_cache_hits - s0.prefix_cache_hits);
}

struct other {
    struct vllm_engine *e;
    int32_t ids[LA + 4], out[REPLY + 5];
};

static void *run_other(void *arg) {
    struct other *o = arg;
    complete(o->e, o->ids, LA + 4, REPLY + 5, o->out);
    return NULL;
}

// A (with another request decoding beside it, its blocks ending elsewhere:
// a checkpoint written from the wrong row shows) then B on e; B's reply and
// sampled logits into bout / c. Returns B's hits.
static long run_turns(struct vllm_engine *e, struct cap *c, int32_t *seq, int32_t *bout) {
    struct other o = {e, {0}, {0}};
    for (int i = 0; i < LA + 4; i++) o.ids[i] = (seq[i % LA] * 5 + 1) % c->vocab;
    pthread_t th;
    pthread_create(&th, NULL, run_other, &o);
    complete(e, seq, LA, REPLY, seq + LA); // A: no hook, so a GPU replays graphs of its decode steps
    pthread_join(th, NULL);
    pthread_mutex_lock(&e->mu); // one request at a time: B's id is the next one
    c->req_id = e->next_id;
    pthread_mutex_unlock(&e->mu);
    c->from = LA + REPLY + TAIL - 1;
    memset(c->seen, 0, sizeof c->seen);
    engine_set_logits_hook(e, hook, c);
    long hit = complete(e, seq, LA + REPLY + TAIL, BOUT, bout);
    engine_set_logits_hook(e, NULL, NULL);
    return hit;
}

static void run_fixture(const char *name, const char *dir, int dummy, int budget) {
    struct vllm_engine *off = load(dir, dummy, 0, budget), *on = load(dir, dummy, 1, budget);
    if (!off || !on) return;
    struct vllm_model_info info;
    vllm_engine_info(on, &info);
    int V = info.vocab_size, iv = info.state_checkpoint_interval;
    int32_t seq[2][LA + REPLY + TAIL], bout[2][BOUT];
    uint64_t r = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < LA; i++) r ^= r << 13, r ^= r >> 7, r ^= r << 17, seq[0][i] = (int32_t)(r % (uint64_t)V);
    memcpy(seq[1], seq[0], sizeof(int32_t) * LA);
    struct cap c[2];
    long hit[2];
    struct vllm_engine *e[2] = {off, on};
    for (int k = 0; k < 2; k++) {
        c[k] = (struct cap){.vocab = V, .rows = xcalloc((size_t)BOUT * V, sizeof(float))};
        // the reply goes in by run_turns (A's output lands after A's prompt), then the same tail
        for (int i = 0; i < TAIL; i++) seq[k][LA + REPLY + i] = (int32_t)((7 * i + 11) % V);
        hit[k] = run_turns(e[k], &c[k], seq[k], bout[k]);
    }
    int same = !memcmp(seq[0], seq[1], sizeof seq[0]) && !memcmp(bout[0], bout[1], sizeof bout[0]);
    double err = 0;
    int rows = 0;
    for (int k = 0; k < BOUT; k++) {
        if (!c[0].seen[k] || !c[1].seen[k]) continue;
        rows++;
        for (int v = 0; v < V; v++)
            err = fmax(err, fabs((double)c[0].rows[(size_t)k * V + v] - c[1].rows[(size_t)k * V + v]));
    }
    int ideal = (LA + REPLY - 1) / BS * BS; // A computed its prompt and reply but the last token
    printf("%s (%s, steps of %d): B hit %ld of %d prompt tokens (A's prompt %d, interval %d; ideal %d); "
           "%d sampled rows, max abs logit diff %.3g; tokens %s\n",
           name, device, budget, hit[1], LA + REPLY + TAIL, LA, iv, ideal, rows, err, same ? "identical" : "DIFFER");
    CHECKF(same, "%s: caching on gave other tokens than caching off", name);
    CHECKF(hit[0] == 0, "%s: hits with caching off", name);
    CHECKF(iv > 0 && hit[1] > LA / iv * iv, "%s: B's hit %ld does not reach into A's reply (prompt %d, interval %d)", name,
           hit[1], LA, iv);
    CHECKF(hit[1] == ideal, "%s: B's hit %ld is not A's last full block %d", name, hit[1], ideal);
    CHECKF(rows == BOUT, "%s: compared %d sampled rows of %d", name, rows, BOUT);
    CHECKF(err <= GATE, "%s: max abs logit diff %.3g over %.0e", name, err, GATE);
    CHECKF(on->sched.decode_ckpts > 0, "%s: no decode checkpoint was planned", name);
    for (int k = 0; k < 2; k++) free(c[k].rows);
    vllm_engine_free(off);
    vllm_engine_free(on);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--device")) device = argv[2];
    const char *fx[] = {"nh_dense", "kimi_linear"};
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        char *dir = tu_fixture(fx[i]);
        run_fixture(fx[i], dir, 0, 2048);
        run_fixture(fx[i], dir, 0, 5); // B's prefill after its hit in chunks
        free(dir);
    }
    char *m2 = tu_mamba2_dir();
    run_fixture("mamba2", m2, 1, 2048);
    tu_rmdir(m2);
    free(m2);
    return test_summary("prefix_reply");
}
