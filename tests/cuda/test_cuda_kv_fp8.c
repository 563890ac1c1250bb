// test_cuda_kv_fp8.c - the CUDA fp8 (e4m3) KV cache against the CPU
// reference ops of the same names on the same fp8 cache (the reference is
// the ground truth: tests/cpu/test_kv_fp8.c holds it to an independent
// encoder and to the fp32 cache):
//
// 1. codes: kv_write's codes, byte for byte, equal the reference's and
//    tests/kv_fp8.h's encoder's, over rows holding every corner of the
//    encoding (saturation, infinities, ties, subnormals, -0), at scales
//    (1, 1) and (0.75, 3); qk_norm_rope's equal the encoder's of its own
//    normed and rotated k and of v (its q / k arithmetic against the
//    reference's within 1e-5: a key an ulp apart may round to the
//    neighbouring code, so those are counted, not required equal);
// 2. attention on one fp8 cache uploaded to both backends, batches of
//    decodes and prefills together, scattered blocks: Qwen3-8B's 32/8 heads
//    of 128 (decode G 4, flash prefill), 32/2 (G 16), MHA 16/16 of 64 (flash
//    at 64), 24/8 of 96 (the decode kernel at any head_dim, split-KV
//    prefill), 12/3 of 20 (the generic kernels); a long context (decodes at
//    8,000 and 5,000 tokens, a 64-token prefill after 7,000). Decode rows
//    within 1e-5 (fp32 on both sides: the codes' values e4m3 * scale, in
//    another summation order), split-KV prefill rows within 1e-5, flash
//    prefill rows within 2e-2 (Q and P in bf16, as with a bf16 cache);
// 3. fixed shapes (splits for max_model_len, as recorded graphs run) and a
//    recorded graph of a decode step, replayed, then replayed again after
//    each sequence's next token was written (the graph covers any context);
// 4. MLA with an fp8 cache is refused at load, naming it.
// Exits 77 (skip) without a GPU.
#include <math.h>
#include <stddef.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "core/common.h"
#include "io/dtype.h"
#include "kv_fp8.h"
#include "test.h"

// the decode rows' prologue (attn_decode runs it) without norms or rotation:
// kv_write's k and v
static const struct attn_prep no_prep;

#define DEC_TOL 1e-5
#define FLASH_TOL 2e-2

static struct backend *cpu, *gpu;

// h's arrays on the device (one copy of the whole struct); g points into it,
// its sizes and host mirrors h's.
static char *dev_batch(const struct test_batch *h, struct batch *g, char *d) {
    if (!d) d = gpu->ops->alloc(gpu, sizeof *h);
    gpu->ops->upload(gpu, d, h, sizeof *h);
    *g = h->b;
#define DEV(f, m) g->f = (int32_t *)(d + offsetof(struct test_batch, m))
    DEV(query_start_loc, qsl), DEV(seq_lens, seq_lens), DEV(context_lens, ctx), DEV(positions, pos);
    DEV(slot_mapping, slot_map), DEV(block_tables, btab), DEV(state_slots, slots), DEV(state_src, src);
    DEV(ckpt_start, ck_start), DEV(ckpt_pos, ck_pos), DEV(ckpt_slot, ck_slot), DEV(ckpt_dst, ck_dst);
#undef DEV
    return d;
}

static void *dev_copy(const void *host, size_t bytes) {
    void *d = gpu->ops->alloc(gpu, bytes);
    CHECK(d != NULL);
    gpu->ops->upload(gpu, d, host, bytes);
    return d;
}

static float *download(const void *d, size_t n) {
    float *h = xmalloc(sizeof(float) * (n ? n : 1));
    gpu->ops->download(gpu, h, d, sizeof(float) * n);
    return h;
}

// Rows [t0, t1) of n-float rows: max |got - want| / max |want|, checked
// (none: a failure).
static void cmp_rows(const char *what, const float *got, const float *want, int t0, int t1, int n, double tol) {
    CHECKF(t1 > t0, "%s: no rows", what);
    if (t1 <= t0) return;
    size_t m = (size_t)(t1 - t0) * n;
    int finite = 1;
    for (size_t i = 0; i < m; i++) finite &= isfinite(got[(size_t)t0 * n + i]) != 0;
    double e = finite ? test_max_rel(got + (size_t)t0 * n, want + (size_t)t0 * n, m) : INFINITY;
    printf("  %-44s rel err %.2e (tol %.0e) over %zu values\n", what, e, tol, m);
    CHECKF(e <= tol, "%s: %.3g > %.0e", what, e, tol);
}

// Bytes of cache rows slots[t] (t < n, kvd each) that differ between a and b.
static long diff_rows(const uint8_t *a, const uint8_t *b, const int32_t *slots, int n, int kvd) {
    long d = 0;
    for (int t = 0; t < n; t++)
        for (int i = 0; slots[t] >= 0 && i < kvd; i++)
            d += a[(int64_t)slots[t] * kvd + i] != b[(int64_t)slots[t] * kvd + i];
    return d;
}

// Codes of rows slots[t] against tests/kv_fp8.h's of x[t * ld + i] / scale.
static long bad_codes(const uint8_t *c, const float *x, const int32_t *slots, int n, int ld, int kvd, float scale) {
    long bad = 0;
    for (int t = 0; t < n; t++)
        for (int i = 0; slots[t] >= 0 && i < kvd; i++)
            bad += c[(int64_t)slots[t] * kvd + i] != tk_code(x[(int64_t)t * ld + i] / scale);
    return bad;
}

// 1. codes of kv_write and qk_norm_rope.
static void test_codes(int heads, int kv_heads, int hd, float ks, float vs) {
    struct attn_dims d = {heads, kv_heads, hd, 16, 1.0f / sqrtf((float)hd), ks, vs};
    int qlen[] = {1, 1, 1, 200, 5, 1}, ctx[] = {1000, 30, 255, 0, 700, 0}, init[] = {1, 1, 1, 0, 1, 0};
    struct test_batch h;
    test_batch_paged(&h, 6, qlen, ctx, init, 3, d.block_size);
    h.slot_map[1] = -1; // no KV slot: nothing written
    struct batch g;
    char *db = dev_batch(&h, &g, NULL);
    int T = h.b.num_tokens, qd = heads * hd, kvd = kv_heads * hd, ld = qd + 2 * kvd + 8, maxp = 2048;
    size_t cn = (size_t)16 * 64 * d.block_size * kvd, nq = (size_t)T * ld;
    float *qkv = xmalloc(sizeof(float) * nq), *tab = test_rnd((size_t)maxp * hd, 1), *w = test_rnd(2 * hd, 1);
    tk_fill(qkv, nq, 4.0f);
    uint8_t *kc = xcalloc(cn, 1), *vc = xcalloc(cn, 1), *kg = xmalloc(cn), *vg = xmalloc(cn);
    void *dk = gpu->ops->alloc(gpu, cn), *dv = gpu->ops->alloc(gpu, cn), *dq = dev_copy(qkv, sizeof(float) * nq);
    cpu->ops->kv_write(cpu, kc, vc, qkv, ld, &h.b, &d);
    gpu->ops->kv_write(gpu, dk, dv, dq, ld, &g, &d);
    gpu->ops->download(gpu, kg, dk, cn), gpu->ops->download(gpu, vg, dv, cn);
    long dif = diff_rows(kg, kc, h.slot_map, T, kvd) + diff_rows(vg, vc, h.slot_map, T, kvd);
    long bad =
        bad_codes(kg, qkv + qd, h.slot_map, T, ld, kvd, ks) + bad_codes(vg, qkv + qd + kvd, h.slot_map, T, ld, kvd, vs);
    printf("kv_write %d/%d heads of %d, scales %g / %g: %ld codes differ from the reference's, %ld from the encoder's, "
           "of %d\n",
           heads, kv_heads, hd, ks, vs, dif, bad, 2 * (T - 1) * kvd);
    CHECK(dif == 0 && bad == 0 && T > 1);
    // qk_norm_rope (k_norm weights up to 300: k past 448 * k_scale too)
    test_fill(qkv, nq, 4.0f);
    for (int i = 0; i < hd; i++) w[hd + i] *= 300;
    float *dw = dev_copy(w, sizeof(float) * 2 * hd), *dt = dev_copy(tab, sizeof(float) * maxp * hd);
    gpu->ops->upload(gpu, dq, qkv, sizeof(float) * nq);
    struct attn_prep pc = {w, w + hd, tab, 1e-6f}, pg = {dw, dw + hd, dt, 1e-6f};
    cpu->ops->qk_norm_rope(cpu, qkv, ld, &pc, kc, vc, &h.b, 0, &d);
    gpu->ops->qk_norm_rope(gpu, dq, ld, &pg, dk, dv, &g, 0, &d);
    float *qg = download(dq, nq);
    gpu->ops->download(gpu, kg, dk, cn), gpu->ops->download(gpu, vg, dv, cn);
    cmp_rows("qk_norm_rope q | k | v (fp32)", qg, qkv, 0, T, ld, DEC_TOL);
    bad = bad_codes(kg, qg + qd, h.slot_map, T, ld, kvd, ks) + bad_codes(vg, qg + qd + kvd, h.slot_map, T, ld, kvd, vs);
    dif = diff_rows(kg, kc, h.slot_map, T, kvd) + diff_rows(vg, vc, h.slot_map, T, kvd);
    printf("qk_norm_rope: %ld codes differ from the encoder's of its own k and v; %ld from the reference's (keys "
           "an ulp apart)\n", bad, dif);
    CHECK(bad == 0 && dif <= (long)T * kvd / 100);
    gpu->ops->free(gpu, dk), gpu->ops->free(gpu, dv), gpu->ops->free(gpu, dq), gpu->ops->free(gpu, dw);
    gpu->ops->free(gpu, dt), gpu->ops->free(gpu, db);
    free(qkv), free(tab), free(w), free(kc), free(vc), free(kg), free(vg);
}

// 2. / 3. attention: nd decodes first, then prefills.
struct attn_case {
    const char *name;
    int heads, kv_heads, head_dim, bs, mb, n, nd;
    int qlen[8], ctx[8];
    float ks, vs;
};

static struct attn_dims dims_of(const struct attn_case *ac) {
    return (struct attn_dims){ac->heads, ac->kv_heads, ac->head_dim, ac->bs, 1.0f / sqrtf((float)ac->head_dim), ac->ks,
                              ac->vs};
}

// Context positions [0, ctx[s]) of h: codes of uniforms in [-2, 2) / scale,
// into the host cache (the CPU's) only where the rows are used.
static void fill_context(const struct test_batch *h, const int *ctx, int n, int bs, int kvd, uint8_t *c, float scale) {
    for (int s = 0; s < n; s++)
        for (int p = 0; p < ctx[s]; p++) {
            int64_t o = ((int64_t)h->btab[s * h->b.max_blocks_per_seq + p / bs] * bs + p % bs) * kvd;
            for (int i = 0; i < kvd; i++) c[o + i] = f32_to_fp8e4m3(2 * test_frand() / scale);
        }
}

static void test_attention(const struct attn_case *ac) {
    struct attn_dims d = dims_of(ac);
    struct test_batch h;
    int init[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    test_batch_blocks(&h, ac->n, ac->qlen, ac->ctx, init, ac->nd, d.block_size, ac->mb);
    struct batch g;
    char *db = dev_batch(&h, &g, NULL);
    int T = h.b.num_tokens, qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim, ld = qd + 2 * kvd;
    int td = h.qsl[ac->nd], flash = (d.head_dim == 64 || d.head_dim == 128);
    size_t cn = (size_t)16 * ac->mb * d.block_size * kvd, no = (size_t)T * qd;
    uint8_t *kc = xcalloc(cn, 1), *vc = xcalloc(cn, 1), *kg = xmalloc(cn);
    fill_context(&h, ac->ctx, ac->n, d.block_size, kvd, kc, d.k_scale);
    fill_context(&h, ac->ctx, ac->n, d.block_size, kvd, vc, d.v_scale);
    float *qkv = test_rnd((size_t)T * ld, 1), *oc = xcalloc(no, sizeof(float));
    void *dk = dev_copy(kc, cn), *dv = dev_copy(vc, cn), *dq = dev_copy(qkv, sizeof(float) * T * ld);
    float *dout = gpu->ops->alloc(gpu, sizeof(float) * no);
    struct op_query q = {.op = OP_ATTN, .max_tokens = T, .max_seq_len = ac->mb * d.block_size, .attn = &d};
    CHECK(gpu->ops->supports(gpu, &q) == VLLM_OK);
    cpu->ops->kv_write(cpu, kc, vc, qkv, ld, &h.b, &d);
    gpu->ops->kv_write(gpu, dk, dv, dq, ld, &g, &d);
    gpu->ops->download(gpu, kg, dk, cn);
    printf("%s: %d/%d heads of %d, blocks of %d, scales %g / %g, %d decodes, %d prefill tokens\n", ac->name, d.heads,
           d.kv_heads, d.head_dim, d.block_size, d.k_scale, d.v_scale, ac->nd, T - td);
    CHECKF(diff_rows(kg, kc, h.slot_map, T, kvd) == 0, "%s: kv_write codes differ", ac->name);
    cpu->ops->attn_decode(cpu, oc, qkv, ld, &no_prep, kc, vc, &h.b, &d);
    cpu->ops->attn_prefill(cpu, oc, qkv, ld, kc, vc, &h.b, ac->nd, ac->n, &d);
    gpu->ops->attn_decode(gpu, dout, dq, ld, &no_prep, dk, dv, &g, &d);
    gpu->ops->attn_prefill(gpu, dout, dq, ld, dk, dv, &g, ac->nd, ac->n, &d);
    float *og = download(dout, no);
    cmp_rows("decode rows", og, oc, 0, td, qd, DEC_TOL);
    cmp_rows(flash ? "prefill rows (flash, bf16 tiles)" : "prefill rows (split-KV)", og, oc, td, T, qd,
             flash ? FLASH_TOL : DEC_TOL);
    free(og);
    g.fixed_shapes = 1, g.max_model_len = ac->mb * d.block_size; // splits for max_model_len, as a graph runs them
    gpu->ops->attn_decode(gpu, dout, dq, ld, &no_prep, dk, dv, &g, &d);
    gpu->ops->attn_prefill(gpu, dout, dq, ld, dk, dv, &g, ac->nd, ac->n, &d);
    og = download(dout, no);
    cmp_rows("decode rows, fixed shapes", og, oc, 0, td, qd, DEC_TOL);
    cmp_rows("prefill rows, fixed shapes (split-KV)", og, oc, td, T, qd, DEC_TOL);
    free(og);
    gpu->ops->free(gpu, dk), gpu->ops->free(gpu, dv), gpu->ops->free(gpu, dq), gpu->ops->free(gpu, dout);
    gpu->ops->free(gpu, db);
    free(kc), free(vc), free(kg), free(qkv), free(oc);
}

// 3. A recorded graph of a decode step (nd sequences), replayed; then each
// sequence's next token written, its batch re-uploaded in place, and the
// same graph replayed over the longer contexts.
static void test_graph(const struct attn_case *ac) {
    struct attn_dims d = dims_of(ac);
    int n = ac->nd, qlen[8], ctx[8], init[8];
    for (int s = 0; s < n; s++) qlen[s] = 1, ctx[s] = ac->ctx[s], init[s] = 1;
    struct test_batch h;
    test_batch_blocks(&h, n, qlen, ctx, init, n, d.block_size, ac->mb);
    struct batch g;
    char *db = dev_batch(&h, &g, NULL);
    g.fixed_shapes = 1, g.max_model_len = ac->mb * d.block_size;
    int qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim, ld = qd + 2 * kvd;
    size_t cn = (size_t)16 * ac->mb * d.block_size * kvd, no = (size_t)n * qd;
    uint8_t *kc = xcalloc(cn, 1), *vc = xcalloc(cn, 1);
    fill_context(&h, ctx, n, d.block_size, kvd, kc, d.k_scale);
    fill_context(&h, ctx, n, d.block_size, kvd, vc, d.v_scale);
    float *qkv = test_rnd((size_t)n * ld, 1), *oc = xcalloc(no, sizeof(float));
    void *dk = dev_copy(kc, cn), *dv = dev_copy(vc, cn), *dq = dev_copy(qkv, sizeof(float) * n * ld);
    float *dout = gpu->ops->alloc(gpu, sizeof(float) * no);
    CHECK(gpu->ops->graph_begin != NULL);
    if (!gpu->ops->graph_begin) return;
    // the step once before recording (the scratch of its splits grown now: a
    // recording cannot grow it); the recorded one writes the same KV again
    gpu->ops->kv_write(gpu, dk, dv, dq, ld, &g, &d);
    gpu->ops->attn_decode(gpu, dout, dq, ld, &no_prep, dk, dv, &g, &d);
    gpu->ops->graph_begin(gpu);
    gpu->ops->kv_write(gpu, dk, dv, dq, ld, &g, &d);
    gpu->ops->attn_decode(gpu, dout, dq, ld, &no_prep, dk, dv, &g, &d);
    void *graph = gpu->ops->graph_end(gpu);
    for (int step = 0; step < 2; step++) {
        gpu->ops->graph_launch(gpu, graph);
        cpu->ops->kv_write(cpu, kc, vc, qkv, ld, &h.b, &d);
        cpu->ops->attn_decode(cpu, oc, qkv, ld, &no_prep, kc, vc, &h.b, &d);
        float *og = download(dout, no);
        char what[64];
        snprintf(what, sizeof what, "%s: recorded decode graph, step %d", ac->name, step);
        cmp_rows(what, og, oc, 0, n, qd, DEC_TOL);
        free(og);
        for (int s = 0; s < n; s++) ctx[s]++; // the next token: contexts one longer, the batch rewritten in place
        test_batch_blocks(&h, n, qlen, ctx, init, n, d.block_size, ac->mb);
        dev_batch(&h, &g, db);
        g.fixed_shapes = 1, g.max_model_len = ac->mb * d.block_size;
        test_fill(qkv, (size_t)n * ld, 1);
        gpu->ops->upload(gpu, dq, qkv, sizeof(float) * n * ld);
    }
    gpu->ops->graph_free(gpu, graph);
    gpu->ops->free(gpu, dk), gpu->ops->free(gpu, dv), gpu->ops->free(gpu, dq), gpu->ops->free(gpu, dout);
    gpu->ops->free(gpu, db);
    free(kc), free(vc), free(qkv), free(oc);
}

// 4. MLA refuses an fp8 cache at load.
static void test_mla_refused(void) {
    struct mla_dims md = {32, 128, 64, 128, 512, 16, 0.1f};
    int rc = gpu->ops->supports(gpu, &(struct op_query){.op = OP_MLA, .max_tokens = 8, .max_seq_len = 64, .mla = &md});
    printf("MLA with an fp8 cache: %s\n", vllm_last_error());
    CHECK(rc == VLLM_ERR_UNSUPPORTED && strstr(vllm_last_error(), "latent attention") &&
          strstr(vllm_last_error(), "fp8"));
}

int main(void) {
#ifndef VLLM_HAVE_CUDA
    TEST_SKIP("built without CUDA");
#else
    if (backend_cuda_create(DT_FP8, &gpu)) TEST_SKIP("no GPU: %s", vllm_last_error());
    gpu->weight_dtype = WF_BF16; // the 16-bit mode: prefill at head_dim 64 and 128 takes the flash kernel
    if (cpu_backend_create(0, 1, -1, &cpu)) return 1;
    cpu->kv_dtype = DT_FP8;
    test_rng = 0x853c49e6748fea9bull;
    test_mla_refused();
    test_codes(32, 8, 128, 1, 1);
    test_codes(32, 8, 128, 0.75f, 3);
    test_codes(12, 3, 24, 0.75f, 3);
    static const struct attn_case cases[] = {
        {"qwen3-8b", 32, 8, 128, 16, 64, 7, 4, {1, 1, 1, 1, 200, 5, 1}, {1000, 30, 255, 1000, 0, 700, 0}, 0.5f, 2},
        {"nemotron-h", 32, 2, 128, 16, 64, 5, 3, {1, 1, 1, 64, 17}, {900, 31, 1, 0, 300}, 1, 1},
        {"mha-64", 16, 16, 64, 16, 64, 4, 2, {1, 1, 100, 3}, {500, 64, 0, 129}, 0.25f, 0.5f},
        {"gqa-96", 24, 8, 96, 16, 64, 4, 2, {1, 1, 40, 2}, {333, 17, 0, 90}, 1.5f, 0.75f},
        {"generic-20", 12, 3, 20, 16, 64, 4, 2, {1, 1, 9, 1}, {250, 7, 0, 40}, 1, 3},
        {"long-context", 32, 8, 128, 32, 256, 3, 2, {1, 1, 64}, {8000, 5000, 7000}, 0.5f, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention(&cases[i]);
    test_graph(&cases[0]);
    test_graph(&cases[5]);
    backend_free(gpu);
    backend_free(cpu);
    return test_summary("cuda fp8 KV");
#endif
}
