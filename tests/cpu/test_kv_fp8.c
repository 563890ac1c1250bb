// test_kv_fp8.c - the fp8 (e4m3) KV cache on the CPU (--kv-cache-dtype fp8),
// the reference ops being its ground truth, and the fast path on it:
//
// 1. codes: kv_write and qk_norm_rope (reference, and the fast path of each
//    kernel set) store exactly tests/kv_fp8.h's code of x / scale (nearest
//    e4m3 by search, ties to even, saturating at +-448) for rows holding
//    every corner of the encoding, at scales (1, 1) and (0.75, 3); a k_scale
//    of 3 instead of 1 changes the codes;
// 2. reads: attention (decodes and prefills in one batch, scattered blocks,
//    contexts to 1,000 tokens) on the fp8 cache equals, bit for bit, the
//    reference on an fp32 cache holding the codes' values (e4m3 * scale),
//    and stays within ATTN_BOUND (below: why) of the reference on the fp32
//    cache of the values before quantization; the fast path on the fp8 cache within 2e-5
//    of the reference on it (test_fast_ops's tolerance);
// 3. the backend: fp8 accepted and bf16 refused at creation; MLA refused
//    with an fp8 cache, naming it.
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"
#include "kv_fp8.h"
#include "test.h"

// the decode rows' prologue (attn_decode runs it) without norms or rotation:
// kv_write's k and v
static const struct attn_prep no_prep;

#define FAST_TOL 2e-5
// max |fp8-cache output - fp32-cache output| / max |fp32-cache output| at
// uniform K, V, q in [-1, 1): e4m3 keeps 4 significant bits, so a value
// moves by up to 1/16 of its binade's top (half an ulp), V's share of the
// error, which dominates where a query attends to itself alone (its output
// is its rounded v); measured 3.1e-2 (scale 1: values near 1 move by up to
// 2^-5), 5.1e-2 (v_scale 3). Bound: about 1.5x.
#define ATTN_BOUND 7.5e-2

static struct backend *ref;

static double max_rel(const float *got, const float *want, size_t n) {
    double m = 0, s = 1e-30;
    for (size_t i = 0; i < n; i++) {
        s = fmax(s, fabs(want[i]));
        m = isfinite(got[i]) ? fmax(m, fabs((double)got[i] - want[i])) : INFINITY;
    }
    return n ? m / s : INFINITY;
}

// Codes of cache rows [0, n) of kvd elements that differ from
// tk_code(want[slot row] / scale): want holds each written slot's values.
static long bad_codes(const uint8_t *c, const float *want, const int32_t *slots, int n, int ld, int kvd, float scale) {
    long bad = 0;
    for (int t = 0; t < n; t++) {
        if (slots[t] < 0) continue;
        for (int i = 0; i < kvd; i++) {
            uint8_t w = tk_code(want[(int64_t)t * ld + i] / scale), g = c[(int64_t)slots[t] * kvd + i];
            if (g != w && bad++ < 3)
                printf("  token %d element %d: code %02x, expected %02x (x = %a)\n", t, i, g, w,
                       want[(int64_t)t * ld + i]);
        }
    }
    return bad;
}

// 1. kv_write and qk_norm_rope store the codes, at scales (ks, vs).
static void test_codes(struct backend *be, const char *path, float ks, float vs) {
    struct attn_dims d = {8, 2, 64, 16, 0.125f, ks, vs};
    int qlen[] = {1, 1, 70, 9, 1}, ctx[] = {13, 2, 0, 17, 30}, init[] = {1, 1, 0, 1, 1}, S = 5, nd = 2;
    struct test_batch h;
    test_batch_paged(&h, S, qlen, ctx, init, nd, d.block_size);
    h.slot_map[1] = -1; // a token without a KV slot writes nothing
    int T = h.b.num_tokens, hd = d.head_dim, qd = d.heads * hd, kvd = d.kv_heads * hd, ld = qd + 2 * kvd + 3,
        maxp = 128;
    size_t cn = (size_t)16 * 64 * d.block_size * kvd;
    float *qkv = xmalloc(sizeof(float) * T * ld), *tab = test_rnd((size_t)maxp * hd, 1), *w = test_rnd(2 * hd, 1);
    tk_fill(qkv, (size_t)T * ld, 4.0f);
    uint8_t *kc = xcalloc(cn, 1), *vc = xcalloc(cn, 1);
    be->kv_dtype = DT_FP8;
    be->ops->kv_write(be, kc, vc, qkv, ld, &h.b, &d);
    long bk = bad_codes(kc, qkv + qd, h.slot_map, T, ld, kvd, ks),
         bv = bad_codes(vc, qkv + qd + kvd, h.slot_map, T, ld, kvd, vs);
    printf("%s kv_write, scales %g / %g: %ld + %ld of %d codes differ from the encoder's\n", path, ks, vs, bk, bv,
           2 * (T - 1) * kvd);
    CHECKF(bk == 0 && bv == 0, "%s kv_write: codes differ", path);
    // qk_norm_rope: the codes of its own normed and rotated k (a k_norm
    // weight of up to 300: past 448 too) and of v
    test_fill(qkv, (size_t)T * ld, 4.0f);
    for (int i = 0; i < hd; i++) w[hd + i] *= 300;
    memset(kc, 0, cn), memset(vc, 0, cn);
    struct attn_prep p = {w, w + hd, tab, 1e-6f};
    be->ops->qk_norm_rope(be, qkv, ld, &p, kc, vc, &h.b, 0, &d);
    bk = bad_codes(kc, qkv + qd, h.slot_map, T, ld, kvd, ks),
    bv = bad_codes(vc, qkv + qd + kvd, h.slot_map, T, ld, kvd, vs);
    printf("%s qk_norm_rope, scales %g / %g: %ld + %ld codes differ\n", path, ks, vs, bk, bv);
    CHECKF(bk == 0 && bv == 0, "%s qk_norm_rope: codes differ", path);
    be->kv_dtype = DT_F32;
    free(qkv), free(tab), free(w), free(kc), free(vc);
}

// The scale takes part: the same k at k_scale 3 and 1 gives other codes.
static void test_scale_changes_codes(void) {
    struct attn_dims d = {2, 1, 16, 16, 0.25f, 1, 1};
    int qlen[] = {4}, ctx[] = {0}, init[] = {0};
    struct test_batch h;
    test_batch_paged(&h, 1, qlen, ctx, init, 0, d.block_size);
    int ld = 4 * 16, n = 4 * 16;
    float *qkv = test_rnd((size_t)4 * ld, 2);
    uint8_t *k1 = xcalloc((size_t)16 * 64 * 16 * 16, 1), *k3 = xcalloc((size_t)16 * 64 * 16 * 16, 1);
    uint8_t *v = xcalloc((size_t)16 * 64 * 16 * 16, 1);
    ref->kv_dtype = DT_FP8;
    ref->ops->kv_write(ref, k1, v, qkv, ld, &h.b, &d);
    d.k_scale = 3;
    ref->ops->kv_write(ref, k3, v, qkv, ld, &h.b, &d);
    ref->kv_dtype = DT_F32;
    int differ = 0;
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 16; i++) differ += k1[(size_t)h.slot_map[t] * 16 + i] != k3[(size_t)h.slot_map[t] * 16 + i];
    printf("k_scale 3 vs 1: %d of %d codes differ\n", differ, n);
    CHECK(differ > n / 2);
    CHECK(bad_codes(k3, qkv + 32, h.slot_map, 4, ld, 16, 3.0f) == 0);
    free(qkv), free(k1), free(k3), free(v);
}

// 2. attention on the fp8 cache: heads / kv heads / head_dim, block size,
// scales; decodes of 1,001, 14 and 256 tokens, prefills from empty and
// continued ones.
struct attn_case {
    int heads, kv_heads, head_dim, bs;
    float ks, vs;
};

// The cache row of position p of sequence s of h (bs tokens a block).
static int64_t slot_of(const struct test_batch *h, int s, int p, int bs) {
    return (int64_t)h->btab[s * h->b.max_blocks_per_seq + p / bs] * bs + p % bs;
}

// Context position (s, p): random values in the fp32 caches, their codes in
// the fp8 ones (this file's encoder).
static void fill_context(const struct test_batch *h, int S, const int *ctx, const struct attn_dims *d, float *k32,
                         float *v32, uint8_t *k8, uint8_t *v8) {
    int kvd = d->kv_heads * d->head_dim;
    for (int s = 0; s < S; s++)
        for (int p = 0; p < ctx[s]; p++) {
            int64_t o = slot_of(h, s, p, d->block_size) * kvd;
            for (int i = 0; i < kvd; i++) {
                k32[o + i] = test_frand(), v32[o + i] = test_frand();
                k8[o + i] = tk_code(k32[o + i] / d->k_scale), v8[o + i] = tk_code(v32[o + i] / d->v_scale);
            }
        }
}

static void test_attention(const struct attn_case *ac, int best) {
    struct attn_dims d = {ac->heads, ac->kv_heads, ac->head_dim, ac->bs, 1.0f / sqrtf((float)ac->head_dim), ac->ks,
                          ac->vs};
    int qlen[] = {1, 1, 1, 120, 9, 1, 33}, ctx[] = {1000, 13, 255, 0, 300, 0, 64}, init[] = {1, 1, 1, 0, 1, 0, 1};
    int S = 7, nd = 3;
    struct test_batch h;
    test_batch_paged(&h, S, qlen, ctx, init, nd, d.block_size);
    int T = h.b.num_tokens, qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim, ld = qd + 2 * kvd;
    size_t cn = (size_t)16 * 64 * d.block_size * kvd, no = (size_t)T * qd;
    float *qkv = test_rnd((size_t)T * ld, 1);
    for (int t = 0; t < T; t++) // k and v at e4m3 values: attn_decode rewrites the decode rows' into each cache
        for (int i = 0; i < 2 * kvd; i++) {
            float *x = qkv + (size_t)t * ld + qd + i, s = i < kvd ? d.k_scale : d.v_scale;
            *x = tk_val(tk_code(*x / s)) * s;
        }
    float *k32 = xcalloc(cn, sizeof(float)), *v32 = xcalloc(cn, sizeof(float));
    float *kd = xcalloc(cn, sizeof(float)), *vd = xcalloc(cn, sizeof(float));
    uint8_t *k8 = xcalloc(cn, 1), *v8 = xcalloc(cn, 1);
    fill_context(&h, S, ctx, &d, k32, v32, k8, v8);
    ref->ops->kv_write(ref, k32, v32, qkv, ld, &h.b, &d); // the queries' own keys and values
    ref->kv_dtype = DT_FP8;
    ref->ops->kv_write(ref, k8, v8, qkv, ld, &h.b, &d);
    for (int s = 0; s < S; s++) // the fp32 cache of the codes' values
        for (int p = 0; p < ctx[s] + qlen[s]; p++)
            for (int64_t o = slot_of(&h, s, p, d.block_size) * kvd, i = 0; i < kvd; i++)
                kd[o + i] = tk_val(k8[o + i]) * d.k_scale, vd[o + i] = tk_val(v8[o + i]) * d.v_scale;
    float *o8 = xcalloc(no, sizeof(float)), *od = xcalloc(no, sizeof(float)), *o32 = xcalloc(no, sizeof(float));
    float *of = xcalloc(no, sizeof(float));
    ref->ops->attn_decode(ref, o8, qkv, ld, &no_prep, k8, v8, &h.b, &d);
    ref->ops->attn_prefill(ref, o8, qkv, ld, k8, v8, &h.b, nd, S, &d);
    ref->kv_dtype = DT_F32;
    ref->ops->attn_decode(ref, od, qkv, ld, &no_prep, kd, vd, &h.b, &d);
    ref->ops->attn_prefill(ref, od, qkv, ld, kd, vd, &h.b, nd, S, &d);
    ref->ops->attn_decode(ref, o32, qkv, ld, &no_prep, k32, v32, &h.b, &d);
    ref->ops->attn_prefill(ref, o32, qkv, ld, k32, v32, &h.b, nd, S, &d);
    double e_deq = max_rel(o8, od, no), e32 = max_rel(o8, o32, no);
    printf("attention %d/%d heads of %d, block %d, scales %g / %g, %d tokens: the fp8 cache vs its values in fp32 "
           "%.2e (exact), vs the fp32 cache %.2e (bound %.1e)\n",
           d.heads, d.kv_heads, d.head_dim, d.block_size, d.k_scale, d.v_scale, T, e_deq, e32, ATTN_BOUND);
    CHECKF(e_deq == 0, "fp8 cache reads differ from e4m3 * scale (%.3g)", e_deq);
    CHECKF(e32 > 0 && e32 <= ATTN_BOUND, "fp8 cache vs fp32 cache: %.3g (bound %.1e)", e32, ATTN_BOUND);
    for (int i = FAST_SCALAR; i <= best; i++) { // the fast path of each kernel set on the same fp8 cache
        struct backend *fast = NULL;
        CHECK(cpu_backend_create(2, 0, i, &fast) == 0);
        if (!fast) break;
        fast->kv_dtype = DT_FP8;
        memset(of, 0, sizeof(float) * no);
        fast->ops->attn_decode(fast, of, qkv, ld, &no_prep, k8, v8, &h.b, &d);
        fast->ops->attn_prefill(fast, of, qkv, ld, k8, v8, &h.b, nd, S, &d);
        double ef = max_rel(of, o8, no);
        printf("  fast path (%s) vs the reference on the fp8 cache: %.2e (tol %.0e)\n", fast_isa_name(i), ef, FAST_TOL);
        CHECKF(ef <= FAST_TOL, "%s fast path on the fp8 cache: %.3g", fast_isa_name(i), ef);
        backend_free(fast);
    }
    free(qkv), free(k32), free(v32), free(kd), free(vd), free(k8), free(v8), free(o8), free(od), free(o32), free(of);
}

// 3. what the CPU backend keeps and refuses.
static void test_backend(void) {
    struct backend *be = NULL;
    CHECK(backend_cpu_create(1, DT_FP8, &be) == VLLM_OK && be && be->kv_dtype == DT_FP8);
    struct mla_dims md = {4, 8, 8, 8, 32, 16, 0.1f};
    struct attn_dims ad = {4, 2, 16, 16, 0.25f, 1, 1};
    if (be) {
        struct op_query qa = {.op = OP_ATTN, .max_tokens = 8, .max_seq_len = 64, .attn = &ad};
        struct op_query qm = {.op = OP_MLA, .max_tokens = 8, .max_seq_len = 64, .mla = &md};
        CHECK(be->ops->supports(be, &qa) == VLLM_OK);
        int rc = be->ops->supports(be, &qm);
        printf("MLA with an fp8 cache: %s\n", vllm_last_error());
        CHECK(rc == VLLM_ERR_UNSUPPORTED && strstr(vllm_last_error(), "latent attention") &&
              strstr(vllm_last_error(), "fp8_e4m3"));
        backend_free(be);
    }
    be = NULL;
    CHECK(backend_cpu_create(1, DT_BF16, &be) == VLLM_ERR_UNSUPPORTED && !be);
    printf("a bf16 cache: %s\n", vllm_last_error());
}

int main(void) {
    test_rng = 0x5DEECE66Dull;
    int best = fast_detect();
    test_backend();
    CHECK(cpu_backend_create(2, 1, -1, &ref) == 0);
    if (!ref) return test_summary("kv_fp8");
    test_codes(ref, "reference", 1, 1);
    test_codes(ref, "reference", 0.75f, 3);
    test_scale_changes_codes();
    for (int i = FAST_SCALAR; i <= best; i++) { // the fast path's qk_norm_rope (its kv_write is the reference's)
        struct backend *fast = NULL;
        CHECK(cpu_backend_create(2, 0, i, &fast) == 0);
        if (!fast) break;
        char path[64];
        snprintf(path, sizeof path, "fast (%s)", fast_isa_name(i));
        test_codes(fast, path, 0.75f, 3);
        backend_free(fast);
    }
    static const struct attn_case cases[] = {{8, 2, 64, 16, 1, 1}, {4, 1, 16, 16, 0.75f, 3}, {32, 8, 128, 16, 0.5f, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) test_attention(&cases[c], best);
    backend_free(ref);
    return test_summary("kv_fp8");
}
