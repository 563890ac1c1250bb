// test_cuda_attn.c - decode attention (attn_decode) at long contexts against
// the CPU reference op of the same name, with fp32, bf16 and fp8 (e4m3)
// caches: Qwen3-8B's 32/8 heads of 128 (G 4) at 1 + 5 and 16 sequences,
// NemotronH / Nemotron-3-Nano's 32/2 (G 16) at 5 and 64 sequences, G 2, MHA
// at head_dim 64 and 24/8 heads of 96 (a partial group, head_dim not a
// constant of the kernel). Contexts up to 32,767 tokens, of different
// lengths in one batch, around the kernel's 64-key ranges and 16-key tiles
// (1, 63, 8,191, 8,192, 8,193); scattered blocks. Each batch runs twice:
// with splits from its own lengths, and as a recorded graph runs it (fixed
// shapes: splits for max_model_len 40,960).
//
// Both sides hold the same cache values (uniforms rounded to bf16, or the
// same e4m3 codes with k_scale 0.5 and v_scale 2) and the kernels' arithmetic
// is fp32, so every cache type is held to 2e-5 relative: a key missed or
// read twice moves the outputs by far more. (Not 1e-5: the softmax sums of
// 32,768 fp32 terms in another order than the reference's differ by about
// sqrt(n) ulps; measured on the H200 at 32,768 keys 6.1e-6 fp32, 8.6e-6
// bf16, 1.58e-5 fp8.) q is uniform in [-4, 4), so the
// softmax is not flat and the outputs are not averages near zero.
// Exits 77 (skip) without a GPU.
#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "core/common.h"
#include "cuda/cuda_pair.h"
#include "io/dtype.h"
#include "op_util.h"
#include "test.h"

#define TOL 2e-5
#define MAX_MODEL_LEN 40960

struct dec_case {
    const char *name;
    int heads, kv_heads, head_dim, n;
    int ctx[8]; // tokens before each decode token; n > 8: lengths spread over [97, 9096]
};

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

static int case_ctx(const struct dec_case *c, int s) {
    return c->n <= 8 ? c->ctx[s] : 97 + (int)((uint32_t)(s + 1) * 2654435761u % 9000u);
}

enum { QSL, SEQ, CTX, POS, SLOT, BTAB, NARR };

// A batch of n decodes on both backends: sequence s at position ctx[s],
// over blocks of 16 scattered across a pool of exactly nb blocks; h: the
// host arrays (qsl | seq_lens | ctx | pos | slot_mapping | block_tables).
struct dec_batch {
    struct batch c, g;
    struct pair arr;
    int32_t *h, *slot; // slot: h's slot_mapping
    int nb;
};

static void make_batch(struct dec_batch *t, const struct dec_case *c) {
    int n = c->n, bs = 16, mbps = 0, nb = 0;
    for (int s = 0; s < n; s++) {
        int nbl = (case_ctx(c, s) + bs) / bs;
        mbps = nbl > mbps ? nbl : mbps, nb += nbl;
    }
    size_t off[NARR + 1] = {0};
    size_t sz[NARR] = {(size_t)n + 1, (size_t)n, (size_t)n, (size_t)n, (size_t)n, (size_t)n * mbps};
    for (int i = 0; i < NARR; i++) off[i + 1] = off[i] + sz[i];
    int32_t *h = t->h = xcalloc(off[NARR], sizeof(int32_t));
    int mul = 7; // block k of the batch is pool block k * mul % nb (mul coprime with nb): no two sequences share one
    while (gcd(mul, nb) != 1) mul += 2;
    for (int s = 0, k = 0; s < n; s++) {
        int p = case_ctx(c, s), nbl = (p + bs) / bs;
        h[off[QSL] + s] = s, h[off[SEQ] + s] = p + 1, h[off[CTX] + s] = p, h[off[POS] + s] = p;
        for (int j = 0; j < nbl; j++, k++) h[off[BTAB] + (size_t)s * mbps + j] = (int32_t)((int64_t)k * mul % nb);
        h[off[SLOT] + s] = h[off[BTAB] + (size_t)s * mbps + p / bs] * bs + p % bs;
    }
    h[off[QSL] + n] = n;
    t->arr = up(h, off[NARR] * sizeof(int32_t));
    t->nb = nb, t->slot = h + off[SLOT];
    struct batch *b2[2] = {&t->c, &t->g};
    for (int k = 0; k < 2; k++) {
        int32_t *d = k ? t->arr.g : t->arr.c;
        struct batch *b = b2[k];
        memset(b, 0, sizeof *b);
        b->num_tokens = n, b->num_seqs = n, b->num_decodes = n, b->max_blocks_per_seq = mbps;
        b->max_query_len = 1, b->max_seq_len = mbps * bs;
        b->query_start_loc = d + off[QSL], b->seq_lens = d + off[SEQ], b->context_lens = d + off[CTX];
        b->positions = d + off[POS], b->slot_mapping = d + off[SLOT], b->block_tables = d + off[BTAB];
        b->h_query_start_loc = h + off[QSL], b->h_seq_lens = h + off[SEQ], b->h_context_lens = h + off[CTX];
    }
}

// A cache of cn values on both sides: the reference's (fp32 values, or e4m3
// codes), the device's in kv: the same values.
static struct pair make_cache(size_t cn, enum dtype kv, float scale) {
    struct pair p = {NULL, NULL, 0};
    if (kv == DT_FP8) {
        uint8_t *b = xmalloc(cn);
        for (size_t i = 0; i < cn; i++) b[i] = f32_to_fp8e4m3(2 * test_frand() / scale);
        p = up(b, cn);
        free(b);
        return p;
    }
    float *f = xmalloc(sizeof(float) * cn);
    uint16_t *b = kv == DT_BF16 ? xmalloc(2 * cn) : NULL;
    for (size_t i = 0; i < cn; i++) {
        f[i] = test_frand();
        if (b) b[i] = f32_to_bf16(f[i]), f[i] = bf16_to_f32(b[i]);
    }
    p.c = cpu->ops->alloc(cpu, sizeof(float) * cn);
    cpu->ops->upload(cpu, p.c, f, sizeof(float) * cn);
    p.g = gpu->ops->alloc(gpu, b ? 2 * cn : sizeof(float) * cn);
    gpu->ops->upload(gpu, p.g, b ? (void *)b : (void *)f, b ? 2 * cn : sizeof(float) * cn);
    free(f), free(b);
    return p;
}

// qkv's k and v of each decode token: its cache row's values (the CPU
// side's: fp32, or e4m3 codes times the scale), so that attn_decode's write
// of them (it runs the decode rows' prologue) leaves both caches as they are.
static void kv_from_cache(float *qkv, int ld, int qd, int kvd, const int32_t *slots, int n, const void *kc,
                          const void *vc, int fp8, const struct attn_dims *d) {
    for (int s = 0; s < n; s++)
        for (int i = 0; i < kvd; i++) {
            size_t e = (size_t)slots[s] * kvd + i;
            float *r = qkv + (size_t)s * ld + qd;
            r[i] = fp8 ? fp8e4m3_to_f32(((const uint8_t *)kc)[e]) * d->k_scale : ((const float *)kc)[e];
            r[kvd + i] = fp8 ? fp8e4m3_to_f32(((const uint8_t *)vc)[e]) * d->v_scale : ((const float *)vc)[e];
        }
}

static void test_decode(const struct dec_case *c, enum dtype kv) {
    int fp8 = kv == DT_FP8;
    struct attn_dims d = {c->heads, c->kv_heads, c->head_dim, 16, 1.0f / sqrtf((float)c->head_dim),
                          fp8 ? 0.5f : 1.0f, fp8 ? 2.0f : 1.0f};
    struct dec_batch t;
    make_batch(&t, c);
    int n = c->n, qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim, ld = qd + 2 * kvd;
    gpu->kv_dtype = kv, cpu->kv_dtype = fp8 ? DT_FP8 : DT_F32;
    struct op_query q = {.op = OP_ATTN, .max_tokens = n, .max_seq_len = MAX_MODEL_LEN, .attn = &d};
    CHECK(gpu->ops->supports(gpu, &q) == VLLM_OK);
    size_t cn = (size_t)t.nb * 16 * kvd, no = (size_t)n * qd;
    struct pair pk = make_cache(cn, kv, d.k_scale), pv = make_cache(cn, kv, d.v_scale);
    float *qkv = test_rnd((size_t)n * ld, 4), *nan = xmalloc(sizeof(float) * no);
    kv_from_cache(qkv, ld, qd, kvd, t.slot, n, pk.c, pv.c, fp8, &d);
    memset(nan, 0xff, sizeof(float) * no); // the device output before each call: a call that misses a value fails
    struct pair pq = up(qkv, sizeof(float) * n * ld), po = up(nan, sizeof(float) * no);
    struct attn_prep none = {0};
    cpu->ops->attn_decode(cpu, po.c, pq.c, ld, &none, pk.c, pv.c, &t.c, &d);
    long keys = 0;
    for (int s = 0; s < n; s++) keys += case_ctx(c, s) + 1;
    for (int fixed = 0; fixed < 2; fixed++) {
        gpu->ops->upload(gpu, po.g, nan, sizeof(float) * no);
        t.g.fixed_shapes = fixed, t.g.max_model_len = fixed ? MAX_MODEL_LEN : 0;
        gpu->ops->attn_decode(gpu, po.g, pq.g, ld, &none, pk.g, pv.g, &t.g, &d);
        char name[128];
        snprintf(name, sizeof name, "%s %s, %d seqs, %ld keys%s", c->name, kv == DT_FP8 ? "fp8" : kv == DT_BF16 ? "bf16" : "fp32",
                 n, keys, fixed ? ", graph splits" : "");
        cmp(name, po, no, TOL);
    }
    pfree(pk), pfree(pv), pfree(pq), pfree(po), pfree(t.arr);
    free(t.h), free(qkv), free(nan);
    gpu->kv_dtype = DT_F32, cpu->kv_dtype = DT_F32;
}

int main(void) {
#ifndef VLLM_HAVE_CUDA
    TEST_SKIP("built without CUDA");
#else
    if (backend_cuda_create(DT_F32, &gpu)) TEST_SKIP("no GPU: %s", vllm_last_error());
    if (cpu_backend_create(0, 1, -1, &cpu)) return 1; // the reference ops, on every core
    static const struct dec_case cases[] = {
        {"qwen3-8b 32/8 x128", 32, 8, 128, 6, {32767, 8192, 8191, 4160, 63, 1}},
        {"qwen3-8b 32/8 x128", 32, 8, 128, 1, {32767}},
        {"qwen3-8b 32/8 x128", 32, 8, 128, 16, {0}},
        {"nano30b 32/2 x128", 32, 2, 128, 5, {32767, 12000, 8193, 100, 2}},
        {"nano30b 32/2 x128", 32, 2, 128, 64, {0}},
        {"gqa-2 16/8 x128", 16, 8, 128, 2, {20000, 777}},
        {"mha 16/16 x64", 16, 16, 64, 3, {9000, 8191, 300}},
        {"gqa-3 24/8 x96", 24, 8, 96, 3, {10000, 4999, 64}},
    };
    static const enum dtype kvs[] = {DT_F32, DT_BF16, DT_FP8};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t k = 0; k < sizeof kvs / sizeof kvs[0]; k++) test_decode(&cases[i], kvs[k]);
    backend_free(gpu);
    backend_free(cpu);
    return test_summary("cuda decode attention");
#endif
}
