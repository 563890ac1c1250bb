// test_cuda_moe_quant.c - the CUDA routed experts with quantized weights
// (src/backend/cuda/cuda_moe.cu) against the CPU reference op of the same
// name (moe_experts: exact dequantization, fp32), for each format they run:
// WF_FP8 (e4m3, a scale per row), WF_FP8_B128 (e4m3, 128x128 block scales)
// and WF_NVFP4 (e2m1, an e4m3 scale per 16 columns, a scale per row), at
// nano30b (relu2, 128 experts x 1856, hidden 2688, top 6) and qwen3-30b
// (SwiGLU, 128 x 768, hidden 2048, top 8) shapes, in the fp32 mode and the
// bf16 mode (the tensor-core GEMV up to 32 tokens, the grouped GEMMs above);
// and the refusals at load, each naming what it refuses.
// `test_cuda_moe_quant [fp8|fp8_block|nvfp4]...`: those formats only (the
// device scripts' mutation steps). Exits 77 (skip) without a GPU.
#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "core/common.h"
#include "cuda/cuda_pair.h"
#include "io/dtype.h"
#include "op_util.h"
#include "test.h"

struct moe_shape {
    int E, k, I, L, gated;
    enum act act;
    const char *name;
};

// w (quantized, on the reference backend: host memory) as the fp32 weight
// the reference dequantizes it to, value for value: wfmt_dequant's
// arithmetic, in its order, through tables of the 256 e4m3 and 16 e2m1 codes
// (wfmt_dequant itself takes ~10-40 ns a value: a minute for a set of 128
// experts), held to wfmt_dequant bit for bit on three of its rows. Malloc'd,
// row-major, in a struct weight of the reference.
static struct weight deq_f32(const struct weight *w) {
    int64_t R = w->rows, C = w->cols, g = wfmt_scale_cols(w->fmt, C), nb = C / WF_NVFP4_GROUP;
    float e4[256], e2[16], *d = xmalloc(sizeof(float) * (size_t)(R * C));
    for (int i = 0; i < 256; i++) e4[i] = fp8e4m3_to_f32((uint8_t)i);
    for (int i = 0; i < 16; i++) e2[i] = e2m1_to_f32((uint8_t)i);
    const uint8_t *q = w->data, *bs = w->bscale;
    const float *s = w->scale;
    for (int64_t r = 0; r < R; r++) {
        float *o = d + r * C;
        switch (w->fmt) {
        case WF_FP8:
            for (int64_t c = 0; c < C; c++) o[c] = e4[q[r * C + c]] * s[r];
            break;
        case WF_FP8_B128:
            for (int64_t c = 0; c < C; c++) o[c] = e4[q[r * C + c]] * s[r * g + c / WF_B128];
            break;
        case WF_NVFP4:
            for (int64_t c = 0; c < C; c++) {
                uint8_t b = q[r * (C / 2) + c / 2];
                o[c] = (e2[(c & 1) ? b >> 4 : b & 15] * e4[bs[r * nb + c / WF_NVFP4_GROUP]]) * s[r];
            }
            break;
        case WF_F32:
        case WF_BF16:
        case WF_F16: CHECKF(0, "deq_f32 of a %s weight", wfmt_name(w->fmt)); break;
        }
    }
    int64_t rows[3] = {0, R / 2 + 1, R - 1};
    int same = 1;
    for (int i = 0; i < 3; i++)
        for (int64_t c = 0; c < C; c++) {
            float v = wfmt_dequant(w->fmt, q, s, bs, C, rows[i], c);
            same &= !memcmp(&v, &d[rows[i] * C + c], sizeof v);
        }
    CHECKF(same, "the test's %s dequantization is wfmt_dequant's", wfmt_name(w->fmt));
    return (struct weight){.data = d, .fmt = WF_F32, .rows = R, .cols = C};
}

static void weight_free(struct backend *be, struct weight *w) {
    be->ops->free(be, w->data);
    if (w->scale) be->ops->free(be, w->scale);
    if (w->bscale) be->ops->free(be, w->bscale);
}

// The experts of shape m in format f (the same host-made codes and scales on
// both backends: weight_random quantizes on the host) against the reference
// op, which dequantizes exactly and runs fp32: at n = 1 the op itself on the
// quantized weights, elsewhere the op on their fp32 dequantization made once
// (deq_f32: the same values; the op would dequantize each expert's rows
// again per call, seconds a call at 100+ experts). The GEMV (n <= 32) reads x
// in fp32 and widens codes in registers (FP8, NVFP4: exactly, the row scale
// on each sum; FP8 blocks: wfmt_dequant's product), so it differs only in
// summation order (expected ~1e-6, tol 1e-4). Random routing at 1, 7, 32
// (the GEMV), 33, 64 and T (600), shared routing at 32 (the GEMV's passes
// of 8 rows) and 64, and + a shared expert (fp32) at 7, 64 and T.
// The fp32 mode runs the GEMV in passes of 32 tokens at every n; above 32
// the 16-bit mode runs the grouped GEMMs on the same inputs (thin tiles at
// 33 and 64: 4 an expert when shared; the 128-row tiles at T), which round
// x and h to bf16, FP8 blocks their weights too (expected a few 1e-3, tol
// 2e-2 as bf16).
static void test_experts_quant(enum wfmt f, const char *fname, const struct moe_shape *m, struct pair pids,
                               struct pair pw, int T) {
    int E = m->E, k = m->k, I = m->I, L = m->L, U = m->gated ? 2 * I : I;
    struct moe_experts mc = {{0}, {0}, E, I, L, m->gated, m->act}, mg = mc;
    CHECK(cpu->ops->weight_alloc(cpu, &mc.up, f, (int64_t)E * U, L) == 0);
    CHECK(cpu->ops->weight_alloc(cpu, &mc.down, f, (int64_t)E * L, I) == 0);
    CHECKF(gpu->ops->weight_alloc(gpu, &mg.up, f, (int64_t)E * U, L) == 0, "%s", vllm_last_error());
    CHECKF(gpu->ops->weight_alloc(gpu, &mg.down, f, (int64_t)E * L, I) == 0, "%s", vllm_last_error());
    CHECK(cpu->ops->weight_random(cpu, &mc.up, 31, 0.02f) == 0 && gpu->ops->weight_random(gpu, &mg.up, 31, 0.02f) == 0);
    CHECK(cpu->ops->weight_random(cpu, &mc.down, 32, 0.02f) == 0 &&
          gpu->ops->weight_random(gpu, &mg.down, 32, 0.02f) == 0);
    struct op_query q = {.op = OP_MOE_EXPERTS, .max_tokens = T, .route = &(struct moe_route_cfg){.top_k = k},
                         .moe = &mg};
    CHECKF(gpu->ops->supports(gpu, &q) == 0, "%s experts %s refused: %s", fname, m->name, vllm_last_error());
    struct moe_experts mf = mc; // the fp32 dequantization
    mf.up = deq_f32(&mc.up), mf.down = deq_f32(&mc.down);
    float *x = test_rnd((size_t)T * L, 1);
    struct pair px = up(x, sizeof(float) * T * L), po = up(x, sizeof(float) * T * L);
    int32_t *same = xmalloc(sizeof(int32_t) * T * k);
    cpu->ops->download(cpu, same, pids.c, sizeof(int32_t) * k);
    for (int t = k; t < T * k; t++) same[t] = same[t % k];
    struct pair psame = up(same, sizeof(int32_t) * T * k);
    // the shared expert (fp32 weights, the routed width: computed beside the
    // quantized experts, its y added in their combine)
    float *s_up = test_rnd((size_t)U * L, 0.02f), *s_down = test_rnd((size_t)L * I, 0.02f);
    struct moe_experts sc = {{0}, {0}, 1, I, L, m->gated, m->act}, sg = sc;
    CHECK(weight_from_f32(cpu, &sc.up, WF_F32, s_up, U, L) == 0 && weight_from_f32(cpu, &sc.down, WF_F32, s_down, L, I) == 0);
    CHECK(weight_from_f32(gpu, &sg.up, WF_F32, s_up, U, L) == 0 && weight_from_f32(gpu, &sg.down, WF_F32, s_down, L, I) == 0);
    float *zero = xcalloc((size_t)T * U, sizeof(float));
    struct pair ph = up(zero, sizeof(float) * T * I), pt = up(zero, sizeof(float) * T * U),
                py = up(zero, sizeof(float) * T * L);
    struct moe_shared shc = {&sc, ph.c, pt.c, py.c}, shg = {&sg, ph.g, pt.g, py.g};
    enum { NR = 6, NC = 11 };
    int ns[NC] = {1, 7, 32, 33, 64, T, 32, 64, 7, 64, T};
    for (int i = 0; i < NC; i++) {
        char name[96];
        struct pair pi = i >= NR && i < NR + 2 ? psame : pids;
        const struct moe_shared *ac = i >= NR + 2 ? &shc : NULL, *ag = i >= NR + 2 ? &shg : NULL;
        cpu->ops->moe_experts(cpu, po.c, px.c, ns[i] == 1 ? &mc : &mf, pi.c, pw.c, ns[i], k, ac);
        gpu->ops->moe_experts(gpu, po.g, px.g, &mg, pi.g, pw.g, ns[i], k, ag);
        snprintf(name, sizeof name, "moe_experts %s %s n=%d%s", m->name, fname, ns[i],
                 i >= NR + 2 ? " + shared" : i >= NR ? " shared" : "");
        cmp(name, po, (size_t)ns[i] * L, ns[i] <= 32 ? 1e-4 : 2e-2);
        if (ns[i] <= 32) continue;
        // the grouped GEMMs (thin tiles at 33 and 64, the 128-row tiles at
        // T) run in the 16-bit mode only: the same reference, tol 2e-2
        gpu->weight_dtype = WF_BF16;
        gpu->ops->moe_experts(gpu, po.g, px.g, &mg, pi.g, pw.g, ns[i], k, ag);
        gpu->weight_dtype = WF_F32;
        snprintf(name, sizeof name, "moe_experts %s %s n=%d%s bf16 mode", m->name, fname, ns[i],
                 i >= NR + 2 ? " + shared" : i >= NR ? " shared" : "");
        cmp(name, po, (size_t)ns[i] * L, 2e-2);
    }
    // the 16-bit mode (--dtype bfloat16): up to 32 tokens the GEMV on tensor
    // cores (cuda_qmma.cuh: x and h rounded to fp16 after a power-of-two
    // scaling per row, products exact, fp32 sums: |err| <= (2^-11 + K 2^-24)
    // sum |w x| per product, ~1e-4 of the largest output expected with
    // random data; held to 2e-3 against the bf16 mode's 2e-2), 1 to 32 tokens,
    // shared routing (passes of one expert's 32 assignments), + a shared expert
    gpu->weight_dtype = WF_BF16;
    const int qn[] = {1, 2, 3, 5, 8, 9, 16, 32, 32, 7};
    for (int i = 0; i < 10; i++) {
        char name[96];
        struct pair pi = i == 8 ? psame : pids;
        const struct moe_shared *ac = i == 9 ? &shc : NULL, *ag = i == 9 ? &shg : NULL;
        cpu->ops->moe_experts(cpu, po.c, px.c, qn[i] == 1 ? &mc : &mf, pi.c, pw.c, qn[i], k, ac);
        gpu->ops->moe_experts(gpu, po.g, px.g, &mg, pi.g, pw.g, qn[i], k, ag);
        snprintf(name, sizeof name, "moe_experts %s %s n=%d%s bf16 mode", m->name, fname, qn[i],
                 i == 9 ? " + shared" : i == 8 ? " shared" : "");
        cmp(name, po, (size_t)qn[i] * L, 2e-3);
    }
    gpu->weight_dtype = WF_F32;
    pfree(psame), pfree(px), pfree(po), pfree(ph), pfree(pt), pfree(py);
    free(same), free(x), free(mf.up.data), free(mf.down.data), free(zero), free(s_up), free(s_down);
    weight_free(cpu, &sc.up), weight_free(cpu, &sc.down), weight_free(gpu, &sg.up), weight_free(gpu, &sg.down);
    weight_free(cpu, &mc.up), weight_free(cpu, &mc.down);
    weight_free(gpu, &mg.up), weight_free(gpu, &mg.down);
}

// What the quantized experts cannot do is refused at load, naming it:
// widths not multiples of 16 (FP8, FP8 blocks: 16 codes a load) or 32
// (NVFP4: 32 codes and 2 block scales a load), up and down in two formats.
static void test_refused(void) {
    static const struct {
        enum wfmt up, down;
        int inter, dim;
        const char *says;
    } cases[] = {
        {WF_FP8, WF_FP8, 12, 44, "multiples of 16"},
        {WF_FP8_B128, WF_FP8_B128, 64, 136, "multiples of 16"},
        {WF_NVFP4, WF_NVFP4, 64, 48, "multiples of 32"},
        {WF_NVFP4, WF_NVFP4, 80, 64, "multiples of 32"},
        {WF_FP8, WF_BF16, 64, 128, "in one format"},
        {WF_BF16, WF_NVFP4, 64, 128, "in one format"},
        {WF_NVFP4, WF_FP8_B128, 64, 128, "in one format"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct moe_experts w = {{0}, {0}, 8, cases[i].inter, cases[i].dim, 1, ACT_SILU};
        w.up.fmt = cases[i].up, w.down.fmt = cases[i].down;
        struct op_query q = {.op = OP_MOE_EXPERTS, .max_tokens = 4, .route = &(struct moe_route_cfg){.top_k = 2},
                             .moe = &w};
        int rc = gpu->ops->supports(gpu, &q);
        const char *msg = rc ? vllm_last_error() : "accepted";
        enum wfmt named = wfmt_quantized(cases[i].up) ? cases[i].up : cases[i].down;
        CHECKF(rc != 0 && strstr(msg, cases[i].says) && strstr(msg, wfmt_name(named)), "%s up, %s down, %d x %d: %s",
               wfmt_name(cases[i].up), wfmt_name(cases[i].down), cases[i].inter, cases[i].dim, msg);
    }
}

// Host-made routing of T tokens: k distinct experts of E a token, weights in
// (0.1, 1].
static void make_routing(int T, int E, int k, struct pair *ids, struct pair *wts) {
    int32_t *h = xmalloc(sizeof(int32_t) * T * k);
    float *w = xmalloc(sizeof(float) * T * k);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = (int)((test_frand() + 1) * 0.5f * E) % E, dup = 0;
                for (int i = 0; i < j; i++) dup |= h[t * k + i] == e;
            } while (dup);
            h[t * k + j] = e, w[t * k + j] = 0.55f + 0.45f * test_frand();
        }
    *ids = up(h, sizeof(int32_t) * T * k), *wts = up(w, sizeof(float) * T * k);
    free(h), free(w);
}

int main(int argc, char **argv) {
#ifndef VLLM_HAVE_CUDA
    (void)argc, (void)argv;
    TEST_SKIP("built without CUDA");
#else
    if (backend_cuda_create(DT_F32, &gpu)) TEST_SKIP("no GPU: %s", vllm_last_error());
    if (cpu_backend_create(0, 1, -1, &cpu)) return 1; // the reference ops (cuda_pair.h: cpu)
    static const struct {
        enum wfmt f;
        const char *name;
    } fmts[] = {{WF_FP8, "fp8"}, {WF_FP8_B128, "fp8_block"}, {WF_NVFP4, "nvfp4"}};
    const struct moe_shape shapes[2] = {{128, 6, 1856, 2688, 0, ACT_RELU2, "relu2 nano"},
                                        {128, 8, 768, 2048, 1, ACT_SILU, "swiglu qwen3-30b"}};
    int T = 600; // > 512: the 128-row grouped GEMM
    test_refused();
    for (int s = 0; s < 2; s++) {
        struct pair ids, wts;
        make_routing(T, shapes[s].E, shapes[s].k, &ids, &wts);
        for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
            int run = argc < 2;
            for (int a = 1; a < argc; a++) run |= !strcmp(argv[a], fmts[i].name);
            if (run) test_experts_quant(fmts[i].f, fmts[i].name, &shapes[s], ids, wts, T);
        }
        pfree(ids), pfree(wts);
    }
    backend_free(gpu);
    backend_free(cpu);
    return test_summary("gpu_moe_quant");
#endif
}
