// cuda_mla.c - device time of multi-head latent attention alone (mla_attn)
// at Kimi-Linear-48B's shapes: 32 heads, latent 512 + rope 64 per cached
// token (bf16 cache, blocks of 16), q_nope 128, v 128, kv_b fp32.
//   decode: S sequences of one query token over a context of L tokens;
//   prefill: one sequence of L tokens from an empty context, and for L over
//     8,192 the last 8,192-token chunk of an L-token prompt (a chunked
//     prefill's step, as the engine runs it), in 16-bit mode (weight_dtype
//     bf16: the tensor-core path, K_nope / V expanded per head);
//   split: the same prefills on k_mla_split (the fp32 mode's path);
//   step: one decode step of one sequence as a layer runs it, recorded in a
//     graph: mla_kv_write of the token's latent, then mla_attn (absorb,
//     attention, merge, un-absorb), over a context of L tokens, each step
//     on one of MLA_COPIES caches and kv_b weights (more than L2 holds, as
//     the model's other layers leave it), us a step.
// Prints us a call, tokens a second (query tokens / time) and TFLOPS of the
// form that ran: 2 x heads x (query, key) pairs x MACs a pair, the absorbed
// form's R + P + R = 1,088 (decode, split) or the expanded one's N + P + V =
// 320 (16-bit prefill; the expansion GEMM not counted). The op reads
// only the batch's qsl, ctx and block tables, so the program builds against
// any tree with the op: tools/device_mla.sh copies it into the baseline's
// tree to time the old kernel the same way.
//
// Usage: build-cuda/cuda_mla [decode|prefill|split|step|all] [LENS... (1024 8192 32768)]
// (all: decode and prefill)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/common.h"
#include "bench_dev.h"

#ifdef VLLM_HAVE_CUDA
static struct backend *be;

// Random bf16 latents in the cache's first nt slots: through mla_kv_write
// from fp32 rows, a block of tokens at a time.
static void mla_fill(void *cache, int nt, const struct mla_dims *d) {
    int chunk = 65536, W = d->rank + d->rope;
    float *lat = bench_uniform(be, (size_t)chunk * W, -1.0f, 1.0f, 4);
    int32_t *slots = xmalloc(sizeof(int32_t) * chunk);
    for (int t0 = 0; t0 < nt; t0 += chunk) {
        int n = nt - t0 < chunk ? nt - t0 : chunk;
        for (int i = 0; i < n; i++) slots[i] = t0 + i;
        int32_t *ds = bench_upload(be, slots, sizeof(int32_t) * n);
        struct batch w;
        memset(&w, 0, sizeof w);
        w.num_tokens = n, w.slot_mapping = ds;
        be->ops->mla_kv_write(be, cache, lat, W, &w, d);
        be->ops->sync(be);
        be->ops->free(be, ds);
    }
    be->ops->free(be, lat);
    free(slots);
}

// S sequences of qlen query tokens after ctx cached ones, each over its
// own blocks; the median of up to 5 timed calls after a warm one (one call
// when the warm one took over half a second).
static void bench_one(const char *what, int S, int qlen, int ctx, enum wfmt wf) {
    const int H = 32, N = 128, P = 64, V = 128, R = 512, W = R + P, bs = 16;
    struct mla_dims d = {H, N, P, V, R, bs, 0.0721688f}; // 1 / sqrt(192)
    int L = ctx + qlen, mbps = (L + bs - 1) / bs, T = S * qlen;
    size_t na = (size_t)3 * S + 1 + (size_t)S * mbps;
    int32_t *arr = xcalloc(na, sizeof(int32_t)), *qsl = arr, *sl = qsl + S + 1, *cx = sl + S, *bt = cx + S;
    for (int s = 0; s <= S; s++) qsl[s] = s * qlen;
    for (int s = 0; s < S; s++) sl[s] = L, cx[s] = ctx;
    for (int i = 0; i < S * mbps; i++) bt[i] = i;
    int32_t *da = bench_upload(be, arr, na * sizeof(int32_t));
    struct batch b;
    memset(&b, 0, sizeof b);
    b.num_tokens = T, b.num_seqs = S, b.num_decodes = qlen == 1 ? S : 0, b.num_prefills = qlen == 1 ? 0 : S;
    b.max_blocks_per_seq = mbps, b.max_model_len = mbps * bs;
    b.query_start_loc = da, b.seq_lens = da + S + 1, b.context_lens = da + 2 * S + 1, b.block_tables = da + 3 * S + 1;
    b.h_query_start_loc = qsl, b.h_seq_lens = sl, b.h_context_lens = cx;
    size_t cn = (size_t)S * mbps * bs * W;
    float *q = bench_uniform(be, (size_t)T * H * (N + P), -1.0f, 1.0f, 1);
    float *kvb = bench_uniform(be, (size_t)H * (N + V) * R, -0.05f, 0.05f, 2);
    float *out = bench_uniform(be, (size_t)T * H * V, 0.0f, 0.0f, 3);
    void *cache = be->ops->alloc(be, cn * 2);
    mla_fill(cache, S * L, &d);
    be->weight_dtype = wf;
    double t[5], t0 = now_s();
    be->ops->mla_attn(be, out, q, cache, kvb, &b, 0, S, &d);
    be->ops->sync(be);
    int reps = now_s() - t0 > 0.5 ? 1 : 5;
    for (int r = 0; r < reps; r++) {
        t0 = now_s();
        be->ops->mla_attn(be, out, q, cache, kvb, &b, 0, S, &d);
        be->ops->sync(be);
        t[r] = now_s() - t0;
    }
    double m = bench_median(t, reps);
    double pairs = (double)S * ((double)qlen * ctx + (double)qlen * (qlen + 1) / 2);
    int macs = qlen > 1 && wf != WF_F32 ? N + P + V : W + R;
    printf("  mla %-7s %3d seqs x %5d tokens, context %6d  %12.1f us  %10.0f tok/s  %6.1f TFLOPS\n", what, S, qlen, L,
           m * 1e6, T / m, 2.0 * H * pairs * macs / m * 1e-12);
    void *all[] = {da, q, kvb, out, cache};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->free(be, all[i]);
    free(arr);
}

#define MLA_COPIES 8
struct step_ctx {
    struct mla_dims d;
    struct batch b, w; // the decode, the write of its token's latent
    float *q, *lat, *out, *kvb[MLA_COPIES];
    void *cache[MLA_COPIES];
};
static void step_one(void *p, int i) {
    struct step_ctx *c = p;
    int k = i % MLA_COPIES;
    be->ops->mla_kv_write(be, c->cache[k], c->lat, c->d.rank + c->d.rope, &c->w, &c->d);
    be->ops->mla_attn(be, c->out, c->q, c->cache[k], c->kvb[k], &c->b, 0, 1, &c->d);
}

// One decode step of one sequence at a context of L keys (this token's
// included), as a recorded graph replays it (fixed shapes: splits for a
// max_model_len of the context rounded up to a block).
static void bench_step(int L) {
    const int H = 32, N = 128, P = 64, V = 128, R = 512, W = R + P, bs = 16;
    struct step_ctx c;
    memset(&c, 0, sizeof c);
    c.d = (struct mla_dims){H, N, P, V, R, bs, 0.0721688f};
    int mbps = (L + bs - 1) / bs;
    size_t na = 5 + (size_t)mbps;
    int32_t *arr = xcalloc(na, sizeof(int32_t)); // qsl [2], seq_lens, context_lens, slot, block table
    arr[1] = 1, arr[2] = L, arr[3] = L - 1, arr[4] = L - 1;
    for (int i = 0; i < mbps; i++) arr[5 + i] = i;
    int32_t *da = bench_upload(be, arr, na * sizeof(int32_t));
    struct batch *b = &c.b;
    b->num_tokens = 1, b->num_seqs = 1, b->num_decodes = 1, b->max_blocks_per_seq = mbps;
    b->fixed_shapes = 1, b->max_model_len = mbps * bs;
    b->query_start_loc = da, b->seq_lens = da + 2, b->context_lens = da + 3, b->block_tables = da + 5;
    b->h_query_start_loc = arr, b->h_seq_lens = arr + 2, b->h_context_lens = arr + 3;
    c.w.num_tokens = 1, c.w.slot_mapping = da + 4;
    c.q = bench_uniform(be, (size_t)H * (N + P), -1.0f, 1.0f, 1);
    c.lat = bench_uniform(be, W, -1.0f, 1.0f, 5);
    c.out = bench_uniform(be, (size_t)H * V, 0.0f, 0.0f, 3);
    for (int k = 0; k < MLA_COPIES; k++) {
        c.kvb[k] = bench_uniform(be, (size_t)H * (N + V) * R, -0.05f, 0.05f, 2 + k);
        c.cache[k] = be->ops->alloc(be, (size_t)mbps * bs * W * 2);
        mla_fill(c.cache[k], L, &c.d);
    }
    be->weight_dtype = WF_BF16;
    double us = bench_graph_us(be, step_one, &c, 64);
    printf("  mla step    1 seq,  context %6d  %8.2f us a step (kv write, absorb, attention, merge, un-absorb)\n", L,
           us);
    for (int k = 0; k < MLA_COPIES; k++) be->ops->free(be, c.kvb[k]), be->ops->free(be, c.cache[k]);
    void *all[] = {da, c.q, c.lat, c.out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->free(be, all[i]);
    free(arr);
}

int main(int argc, char **argv) {
    if (backend_cuda_create(DT_BF16, &be)) {
        printf("cuda_mla: no GPU (%s)\n", vllm_last_error());
        return 0;
    }
    static const int def[] = {1024, 8192, 32768};
    const char *mode = argc > 1 ? argv[1] : "all";
    int n = argc > 2 ? argc - 2 : 3, dec = !strcmp(mode, "decode") || !strcmp(mode, "all");
    int pre = !strcmp(mode, "prefill") || !strcmp(mode, "all"), split = !strcmp(mode, "split");
    int step = !strcmp(mode, "step");
    if (!dec && !pre && !split && !step) {
        fprintf(stderr, "cuda_mla: mode %s is none of decode, prefill, split, step, all\n", mode);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        int L = argc > 2 ? atoi(argv[i + 2]) : def[i];
        if (L < 1 || L > (1 << 20)) {
            fprintf(stderr, "cuda_mla: length %s outside [1, 2^20]\n", argv[i + 2]);
            return 1;
        }
        if (step) bench_step(L);
        if (dec) bench_one("decode", 1, 1, L - 1, WF_BF16), bench_one("decode", 64, 1, L - 1, WF_BF16);
        if (pre || split) {
            const char *what = pre ? "prefill" : "split";
            enum wfmt wf = pre ? WF_BF16 : WF_F32;
            bench_one(what, 1, L, 0, wf);
            if (L > 8192) bench_one(what, 1, 8192, L - 8192, wf);
        }
    }
    backend_free(be);
    return 0;
}
#else
int main(void) {
    printf("cuda_mla: built without CUDA\n");
    return 0;
}
#endif
