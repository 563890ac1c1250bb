// test_tp_layers.c - the tensor-parallel split of every NemotronH layer kind
// against the unsplit model, on the CPU stand-in of the collectives (ranks
// are threads of this process).
//
// One-layer models (Mamba2, attention with KV heads split or replicated, MLP,
// MoE, latent MoE), a mixed model and the oracle fixtures are loaded whole on
// one CPU backend and split over 2, 3, 4 or 8 ranks, and run the same steps
// with their own caches: two fresh prefills, a chunked prefill next to a
// decode, decodes, a new prefill next to a decode. Every row's logits of
// every rank must equal the whole model's within fp32 rounding, and be the
// same bits on every rank. The collectives themselves are checked first.
#include <math.h>

#include "backend/backend.h"
#include "core/common.h"
#include "core/team.h"
#include "models/model.h"
#include "test.h"
#include "tp_model.h"
#include "util.h"

#define MAXT 16 // tokens of a step, at most
#define NSLOT 4
#define BS 4    // KV block size
#define MB 8    // blocks per sequence (slot s owns blocks [s*MB, (s+1)*MB))

// ----------------------------------------------------------- collectives --

struct comm_ctx {
    struct backend **be;
    float x[3][10], out[3][2 * 10];
    float in[3][2 * 4];
};

static void comm_rank(void *arg, int r) {
    struct comm_ctx *c = arg;
    for (int i = 0; i < 10; i++) c->x[r][i] = (float)(r * 100 + i) + 0.25f;
    c->be[r]->ops->all_reduce(c->be[r], c->x[r], 10); // 10 over 3 ranks: uneven slices
    for (int i = 0; i < 8; i++) c->in[r][i] = (float)(r * 1000 + i);
    c->be[r]->ops->all_gather(c->be[r], c->out[r], 10, c->in[r], 4, 2); // 3 x 4 columns cut at 10
}

static void test_collectives(void) {
    struct backend *be[3];
    CHECK(backend_create_group("cpu", 3, 3, DT_F32, be) == 0);
    struct comm_ctx c = {be, {{0}}, {{0}}, {{0}}};
    struct team *t = team_create(3);
    team_run(t, comm_rank, &c);
    int bad = 0;
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 10; i++) bad += c.x[r][i] != (float)(300 + 3 * i) + 0.75f;
    CHECKF(bad == 0, "%d all-reduced values wrong", bad);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 2; i++)
            for (int col = 0; col < 10; col++) bad += c.out[r][i * 10 + col] != (float)((col / 4) * 1000 + i * 4 + col % 4);
    CHECKF(bad == 0, "%d all-gathered values wrong", bad);
    team_free(t);
    for (int r = 0; r < 3; r++) backend_free(be[r]);
}

// ------------------------------------------------------------- a model --

// A model whole (tp 1) or split over tp ranks, each with its caches.
struct inst {
    int tp;
    struct backend *be[8];
    struct model *m[8];
    struct caches c[8];
    float *logits[8]; // [MAXT, vocab]
    struct team *team;
    const struct batch *b; // the step being run
};

static int inst_load(struct inst *s, const char *dir, int tp) {
    memset(s, 0, sizeof *s);
    s->tp = tp;
    if (backend_create_group("cpu", tp, tp, DT_F32, s->be)) return -1;
    struct model_load_opts o = {WF_F32, 0, 0, MAXT, 4, 0, 0}; // 4 logit rows: lm_head runs in chunks of 4 rows
    for (int k = 0; k < tp; k++) {
        if (model_load(dir, NULL, &o, s->be[k], &s->m[k])) {
            fprintf(stderr, "load %s, rank %d of %d: %s\n", dir, k, tp, vllm_last_error());
            return -1;
        }
        if (caches_alloc(s->be[k], &s->m[k]->spec, NSLOT * MB, BS, NSLOT, &s->c[k], NULL, NULL)) return -1;
        s->logits[k] = xcalloc((size_t)MAXT * s->m[k]->spec.vocab_size, sizeof(float));
    }
    s->team = team_create(tp);
    return 0;
}

static void inst_free(struct inst *s) {
    for (int k = 0; k < s->tp; k++) {
        if (s->m[k]) caches_release(s->be[k], &s->c[k]);
        model_free(s->m[k]);
        backend_free(s->be[k]);
        free(s->logits[k]);
    }
    if (s->team) team_free(s->team);
}

static void forward_rank(void *arg, int k) {
    struct inst *s = arg;
    s->m[k]->ops->forward(s->m[k], s->b, &s->c[k], s->logits[k], 1);
}

// ------------------------------------------------------------- the steps --

struct hbatch {
    struct batch b;
    int32_t qsl[NSLOT + 1], seq_lens[NSLOT], ctx[NSLOT], slots[NSLOT], src[NSLOT], ck_start[NSLOT + 1], btab[NSLOT * MB];
    int32_t pos[MAXT], slot_map[MAXT], ids[MAXT];
};

// Sequences (decodes first) by state slot, tokens computed and new tokens.
static void make_step(struct hbatch *h, int n, int nd, const int *slot, const int *ctx, const int *qlen, int vocab) {
    memset(h, 0, sizeof *h);
    int t = 0;
    for (int s = 0; s < n; s++) {
        h->qsl[s] = t;
        h->ctx[s] = ctx[s];
        h->seq_lens[s] = ctx[s] + qlen[s];
        h->slots[s] = slot[s];
        h->src[s] = ctx[s] > 0 ? slot[s] : -1; // continue the slot, or zeros
        for (int j = 0; j < MB; j++) h->btab[s * MB + j] = slot[s] * MB + j;
        for (int i = 0; i < qlen[s]; i++, t++) {
            int p = ctx[s] + i;
            h->pos[t] = p;
            h->slot_map[t] = (slot[s] * MB + p / BS) * BS + p % BS;
            h->ids[t] = (slot[s] * 37 + p * 11 + 5) % vocab; // the token at position p of the slot's sequence
        }
    }
    h->qsl[n] = t;
    struct batch *b = &h->b;
    b->num_tokens = t, b->num_seqs = n, b->num_decodes = nd, b->num_prefills = n - nd;
    b->max_blocks_per_seq = MB;
    for (int s = 0; s < n; s++) b->max_query_len = MAX(b->max_query_len, qlen[s]), b->max_seq_len = MAX(b->max_seq_len, h->seq_lens[s]);
    b->max_model_len = MB * BS;
    b->query_start_loc = h->qsl, b->seq_lens = h->seq_lens, b->context_lens = h->ctx, b->positions = h->pos;
    b->slot_mapping = h->slot_map, b->block_tables = h->btab, b->state_slots = h->slots;
    b->state_src = h->src, b->ckpt_start = h->ck_start, b->input_ids = h->ids;
    b->h_query_start_loc = h->qsl, b->h_seq_lens = h->seq_lens, b->h_context_lens = h->ctx;
    b->h_state_slots = h->slots, b->h_state_src = h->src;
}

static double worst = 0; // largest relative error seen, for the log

// Runs the steps on the whole model and on its split over tp ranks.
static void compare(const char *what, const char *dir, int tp) {
    struct inst one, split;
    int ok = inst_load(&one, dir, 1) == 0 && inst_load(&split, dir, tp) == 0;
    CHECKF(ok, "%s: loading at tp %d", what, tp);
    if (!ok) {
        inst_free(&one), inst_free(&split);
        return;
    }
    int V = one.m[0]->spec.vocab_size;
    struct {
        int n, nd, slot[3], ctx[3], qlen[3];
    } steps[] = {
        {2, 0, {2, 0}, {0, 0}, {7, 5}},        // two fresh prefills
        {2, 1, {0, 2}, {5, 7}, {1, 6}},        // a decode next to a chunked prefill
        {2, 2, {2, 0}, {13, 6}, {1, 1}},       // decodes
        {2, 1, {0, 1}, {7, 0}, {1, 3}},        // a decode next to a new prefill
    };
    double err_max = 0;
    int same = 1;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        struct hbatch h;
        make_step(&h, steps[i].n, steps[i].nd, steps[i].slot, steps[i].ctx, steps[i].qlen, V);
        one.b = split.b = &h.b;
        team_run(one.team, forward_rank, &one);
        team_run(split.team, forward_rank, &split);
        size_t n = (size_t)h.b.num_tokens * V;
        double scale = 1e-6, err = 0;
        for (size_t j = 0; j < n; j++) scale = fmax(scale, fabs(one.logits[0][j]));
        for (size_t j = 0; j < n; j++) err = fmax(err, fabs((double)split.logits[0][j] - one.logits[0][j]) / scale);
        CHECKF(err < 2e-5, "%s tp %d step %zu: logits differ from the whole model's by %.2e (relative)", what, tp, i, err);
        for (int k = 1; k < tp; k++) same &= !memcmp(split.logits[k], split.logits[0], sizeof(float) * n);
        err_max = fmax(err_max, err);
    }
    CHECKF(same, "%s tp %d: the ranks' logits differ", what, tp);
    printf("%-34s tp %d: %zu steps, logits within %.2e of the whole model, every rank the same bits\n", what, tp,
           sizeof steps / sizeof steps[0], err_max);
    worst = fmax(worst, err_max);
    inst_free(&one), inst_free(&split);
}

static void synthetic(const char *what, struct tpm_cfg c, const int *tps, int ntp) {
    char *dir = tpm_write(&c, 1 + (uint64_t)strlen(what));
    CHECKF(dir != NULL, "writing %s", what);
    if (!dir) return;
    for (int i = 0; i < ntp; i++) compare(what, dir, tps[i]);
    tu_rmdir(dir), free(dir);
}

int main(void) {
    test_collectives();
    struct tpm_cfg c;
    synthetic("mamba2 (8 heads, 4 groups)", tpm_default("M"), (int[]){2, 4}, 2);
    synthetic("attention (8 heads, 2 KV heads)", tpm_default("*"), (int[]){2, 4, 8}, 3);
    c = tpm_default("*");
    c.kv_heads = 1;
    synthetic("attention (8 heads, 1 KV head)", c, (int[]){2, 4}, 2);
    synthetic("relu2 MLP (30 wide)", tpm_default("-"), (int[]){2, 3, 4}, 3);
    synthetic("MoE (8 experts, 12 + shared 10 wide)", tpm_default("E"), (int[]){2, 4}, 2);
    c = tpm_default("E");
    c.latent = 16, c.experts_3d = 1;
    synthetic("latent MoE ([E, I, L] tensors)", c, (int[]){2, 4}, 2);
    c = tpm_default("M*-EM");
    c.tie = 1;
    synthetic("mixed M*-EM, tied embeddings", c, (int[]){2, 4}, 2);
    char **fx;
    int nfx = tu_fixture_list("VLLM_TP2_FIXTURES", &fx);
    CHECKF(nfx > 0, "no fixtures in VLLM_TP2_FIXTURES");
    for (int i = 0; i < nfx; i++) {
        char *dir = tu_fixture(fx[i]), name[64];
        snprintf(name, sizeof name, "fixture %s", fx[i]);
        compare(name, dir, 2);
        free(dir);
    }
    tu_list_free(fx, nfx);
    printf("largest relative logit error: %.2e\n", worst);
    return test_summary("tp_layers");
}
