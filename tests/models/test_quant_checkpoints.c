// test_quant_checkpoints.c - quantized checkpoints (docs/QUANTIZATION.md).
//
// At test time the qwen3 and nh_moe fixtures are quantized into each layout
// as the producers write it (ModelOpt FP8 / NVFP4 with hf_quant_config.json;
// compressed-tensors FP8 per-tensor, per-channel and 128x128 blocks; the fp8
// block layout with weight_scale_inv), every "*_proj" linear but o_proj (on
// the exclude list: it stays fp32); beside each, an fp32 checkpoint of the
// dequantized weights, dequantized here by this file's own decoders. Then:
// 1. the reference path on the quantized checkpoint against the reference
//    on the dequantized one: teacher-forced logits within 1e-4 (measured: 0);
// 2. the fast path (kernels dequantizing in registers) against the same,
//    within FAST_BOUND (measured and printed);
// 3. the loader alone at shapes of several scale blocks (the fixtures' 64
//    columns are one 128-block): two pieces stacked, a row offset, a column
//    split at 128, every element of the loaded weight against this file's
//    dequantization, for each format;
// 4. two tensor-parallel ranks (reference) on the FP8 per-tensor / channel
//    and NVFP4 checkpoints against the dequantized single-rank reference;
// 5. error cases: a missing scale tensor, a scale of the wrong shape, a
//    missing weight_scale_2, an unknown quant_algo, an excluded module stored
//    quantized, --quantization against the checkpoint, a tensor-parallel
//    split inside an NVFP4 block: each an error naming the tensor / algo /
//    mode.
// VLLM_TEST_DEVICE=cuda (ctest gpu_quant_checkpoints) runs instead the qwen3
// checkpoints of every layout on the GPU in fp32 (--dtype float32: dense
// linears dequantized exactly, src/backend/cuda/cuda_quant.cu) against the
// CPU reference on the dequantized checkpoint, within 1e-4: steps of up to 64
// tokens (prefill: the dequantized weight's fp32 GEMM) and of 8 (the GEMV).
// (nh_moe's routed experts: CUDA runs them in FP8 per row only, with bf16
// activations above 32 tokens: not this test's bound.) Exits 77 without a GPU.
#include <math.h>

#include "backend/cpu/cpu.h"
#include "core/common.h"
#include "core/json.h"
#include "engine/engine.h"
#include "io/dtype.h"
#include "io/safetensors.h"
#include "models/loader.h"
#include "models/model.h"
#include "forced_logits.h"
#include "test.h"
#include "util.h"

#define REF_BOUND 1e-4
#define FAST_BOUND 1e-4

enum layout { L_MO_FP8, L_MO_NVFP4, L_CT_TENSOR, L_CT_CHANNEL, L_CT_BLOCK, L_FP8_BLOCK, L_N };
static const char *layout_names[L_N] = {"modelopt_fp8", "modelopt_nvfp4", "ct_fp8_tensor",
                                        "ct_fp8_channel", "ct_fp8_block", "fp8_block_inv"};

// ---- this file's decoders (independent of src/io/dtype.h's) ----

static float t_fp8(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    double v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    return (float)((b & 0x80) ? -v : v);
}
static float t_e2m1(int c) {
    static const float mag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

// ---- tensors to write ----

struct tset {
    struct tu_tensor *t;
    void **bufs;
    int n, cap;
};

static void *tadd(struct tset *s, const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1, size_t es) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->t = xrealloc(s->t, sizeof *s->t * s->cap);
        s->bufs = xrealloc(s->bufs, sizeof *s->bufs * s->cap * 2);
    }
    size_t nb = (size_t)(ndim == 0 ? 1 : ndim == 1 ? d0 : d0 * d1) * es;
    void *buf = xcalloc(1, nb ? nb : 1);
    char *nm = xstrdup(name);
    s->bufs[2 * s->n] = buf, s->bufs[2 * s->n + 1] = nm;
    s->t[s->n++] = (struct tu_tensor){nm, dtype, ndim, {d0, d1}, buf, nb};
    return buf;
}

static void tset_free(struct tset *s) {
    for (int i = 0; i < 2 * s->n; i++) free(s->bufs[i]);
    free(s->t), free(s->bufs);
    memset(s, 0, sizeof *s);
}

// Quantizes w [R, C] (tensor `name`, ending in "weight") in layout L into q;
// its dequantized values into deq [R, C].
static void quantize(struct tset *q, const char *name, const float *w, int64_t R, int64_t C, enum layout L, float *deq) {
    char nm[300], base[256];
    snprintf(base, sizeof base, "%.*s", (int)MIN(strlen(name) - 6, 200), name); // "...mixer.q_proj."
    float amax = 0;
    for (int64_t i = 0; i < R * C; i++) amax = fmaxf(amax, fabsf(w[i]));
    if (L == L_MO_NVFP4) {
        uint8_t *codes = tadd(q, name, "U8", 2, R, C / 2, 1);
        snprintf(nm, sizeof nm, "%sweight_scale", base);
        uint8_t *bs = tadd(q, nm, "F8_E4M3", 2, R, C / 16, 1);
        snprintf(nm, sizeof nm, "%sweight_scale_2", base);
        float *s2 = tadd(q, nm, "F32", 0, 0, 0, 4);
        snprintf(nm, sizeof nm, "%sinput_scale", base);
        *(float *)tadd(q, nm, "F32", 0, 0, 0, 4) = 0.02f;
        *s2 = amax / (6.0f * 448.0f);
        for (int64_t r = 0; r < R; r++)
            for (int64_t b = 0; b < C / 16; b++) {
                float bmax = 0;
                for (int k = 0; k < 16; k++) bmax = fmaxf(bmax, fabsf(w[r * C + b * 16 + k]));
                uint8_t s = f32_to_fp8e4m3(bmax / 6.0f / *s2);
                bs[r * (C / 16) + b] = s;
                float d = t_fp8(s) * *s2;
                for (int k = 0; k < 16; k++) {
                    int64_t c = b * 16 + k;
                    uint8_t code = d > 0 ? f32_to_e2m1(w[r * C + c] / d) : 0;
                    codes[r * (C / 2) + c / 2] |= (uint8_t)((c & 1) ? code << 4 : code);
                    deq[r * C + c] = (t_e2m1(code) * t_fp8(s)) * *s2;
                }
            }
        return;
    }
    uint8_t *codes = tadd(q, name, "F8_E4M3", 2, R, C, 1);
    int64_t bR = CDIV(R, 128), bC = CDIV(C, 128);
    snprintf(nm, sizeof nm, "%s%s", base, L == L_FP8_BLOCK ? "weight_scale_inv" : "weight_scale");
    float *sc;
    if (L == L_MO_FP8 || L == L_CT_TENSOR) sc = tadd(q, nm, "F32", 0, 0, 0, 4);
    else if (L == L_CT_CHANNEL) sc = tadd(q, nm, "F32", 2, R, 1, 4);
    else sc = tadd(q, nm, "F32", 2, bR, bC, 4);
    if (L == L_MO_FP8) {
        snprintf(nm, sizeof nm, "%sinput_scale", base);
        *(float *)tadd(q, nm, "F32", 0, 0, 0, 4) = 0.02f;
    }
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) { // the scale of (r, c), computed once per group
            int64_t si = (L == L_CT_CHANNEL) ? r : (L == L_CT_BLOCK || L == L_FP8_BLOCK) ? r / 128 * bC + c / 128 : 0;
            if (sc[si] == 0) {
                float m = 0;
                for (int64_t i = 0; i < R; i++)
                    for (int64_t k = 0; k < C; k++) {
                        int64_t sj = (L == L_CT_CHANNEL) ? i : (L == L_CT_BLOCK || L == L_FP8_BLOCK) ? i / 128 * bC + k / 128 : 0;
                        if (sj == si) m = fmaxf(m, fabsf(w[i * C + k]));
                    }
                sc[si] = m > 0 ? m / 448.0f : 1.0f;
            }
            uint8_t code = f32_to_fp8e4m3(w[r * C + c] / sc[si]);
            codes[r * C + c] = code;
            deq[r * C + c] = t_fp8(code) * sc[si];
        }
}

static void write_quant_config(const char *dir, const char *src_cfg, enum layout L, const char *algo) {
    json_t *cfg = json_load_file(src_cfg, 0, NULL);
    json_t *ignore = json_pack("[ss]", "lm_head", L == L_CT_TENSOR || L == L_CT_CHANNEL || L == L_CT_BLOCK ? "re:.*o_proj$" : "*o_proj");
    if (L == L_MO_FP8 || L == L_MO_NVFP4) {
        json_t *h = json_pack("{s:{s:s},s:{s:s,s:i,s:O}}", "producer", "name", "modelopt", "quantization", "quant_algo",
                              algo, "group_size", 16, "exclude_modules", ignore);
        char *txt = json_dumps(h, JSON_INDENT(2));
        tu_write(dir, "hf_quant_config.json", txt, strlen(txt));
        free(txt);
        json_decref(h);
    } else if (L == L_FP8_BLOCK) {
        json_object_set_new(cfg, "quantization_config",
                            json_pack("{s:s,s:s,s:s,s:[ii],s:O}", "quant_method", "fp8", "fmt", "e4m3", "activation_scheme",
                                      "dynamic", "weight_block_size", 128, 128, "modules_to_not_convert", ignore));
    } else {
        const char *strat = L == L_CT_TENSOR ? "tensor" : L == L_CT_CHANNEL ? "channel" : "block";
        json_t *wq = json_pack("{s:i,s:s,s:s,s:b,s:b}", "num_bits", 8, "type", "float", "strategy", strat, "symmetric", 1,
                               "dynamic", 0);
        if (L == L_CT_BLOCK) json_object_set_new(wq, "block_structure", json_pack("[ii]", 128, 128));
        json_object_set_new(cfg, "quantization_config",
                            json_pack("{s:s,s:s,s:{s:{s:[s],s:o,s:{s:i,s:s,s:s,s:b}}},s:O}", "quant_method",
                                      "compressed-tensors", "format", "float-quantized", "config_groups", "group_0",
                                      "targets", "Linear", "weights", wq, "input_activations", "num_bits", 8, "type",
                                      "float", "strategy", "token", "dynamic", 1, "ignore", ignore));
    }
    char *txt = json_dumps(cfg, JSON_INDENT(2));
    tu_write(dir, "config.json", txt, strlen(txt));
    free(txt);
    json_decref(cfg);
    json_decref(ignore);
}

static int quantizable(const struct st_tensor *t) {
    size_t n = strlen(t->name);
    return t->ndim == 2 && n > 12 && !strcmp(t->name + n - 12, "_proj.weight") && !strstr(t->name, "o_proj");
}

// Writes the quantized checkpoint into qdir and the dequantized one into ddir.
static int make_pair(const char *fx, enum layout L, const char *qdir, const char *ddir) {
    char rel[128];
    snprintf(rel, sizeof rel, "%s/model.safetensors", fx);
    char *path = tu_fixture(rel);
    snprintf(rel, sizeof rel, "%s/config.json", fx);
    char *cfg = tu_fixture(rel), *fdir = tu_fixture(fx);
    struct st_set *st = NULL;
    int rc = st_open_file(path, &st);
    struct tset q = {0}, d = {0};
    int nq = 0;
    for (int i = 0; !rc && i < st_count(st); i++) {
        const struct st_tensor *t = st_at(st, i);
        int64_t R = t->ndim == 2 ? t->shape[0] : 0, C = t->ndim == 2 ? t->shape[1] : 0;
        float *dv = tadd(&d, t->name, "F32", t->ndim, t->shape[0], t->ndim > 1 ? t->shape[1] : 0, 4);
        if (t->ndim > 2) { // conv1d [C, 1, K]: written flat with its shape
            d.t[d.n - 1].ndim = t->ndim;
            for (int k = 0; k < t->ndim; k++) d.t[d.n - 1].shape[k] = t->shape[k];
            free(d.bufs[2 * (d.n - 1)]);
            d.bufs[2 * (d.n - 1)] = dv = xmalloc(t->nbytes);
            d.t[d.n - 1].data = dv, d.t[d.n - 1].nbytes = t->nbytes;
        }
        if (quantizable(t)) {
            quantize(&q, t->name, t->data, R, C, L, dv);
            nq++;
        } else {
            memcpy(dv, t->data, t->nbytes);
            struct tu_tensor c = d.t[d.n - 1];
            void *buf = tadd(&q, t->name, "F32", 1, 1, 0, (size_t)t->nbytes);
            memcpy(buf, t->data, t->nbytes);
            q.t[q.n - 1] = (struct tu_tensor){q.t[q.n - 1].name, "F32", c.ndim, {c.shape[0], c.shape[1], c.shape[2], c.shape[3]},
                                              buf, t->nbytes};
        }
    }
    char *qp = path_join(qdir, "model.safetensors"), *dp = path_join(ddir, "model.safetensors");
    if (!rc) rc = tu_write_safetensors(qp, q.t, q.n);
    if (!rc) rc = tu_write_safetensors(dp, d.t, d.n);
    if (!rc) {
        write_quant_config(qdir, cfg, L, L == L_MO_NVFP4 ? "NVFP4" : "FP8");
        tu_copy(fdir, ddir, "config.json");
    }
    CHECKF(nq > 5, "%s: %d tensors quantized", fx, nq);
    tset_free(&q), tset_free(&d);
    st_close(st);
    free(path), free(cfg), free(fdir), free(qp), free(dp);
    return rc;
}

// ---- logits ----

static int tp_size = 1; // tensor-parallel ranks of the next loads
static const char *device; // of the next loads: NULL the CPU, else in fp32 (VLLM_TEST_DEVICE)
static int max_batched = 64; // tokens a step

static struct vllm_engine *load(const char *dir, int reference, const char *quant) {
    if (reference) setenv("VLLM_CPU_REFERENCE", "1", 1);
    else unsetenv("VLLM_CPU_REFERENCE");
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir;
    ep.num_threads = 2;
    ep.quantization = quant;
    ep.max_num_batched_tokens = max_batched;
    ep.tensor_parallel_size = tp_size;
    if (device) ep.device = device, ep.dtype = "float32";
    struct vllm_engine *e = NULL;
    int rc = vllm_engine_load(&ep, &e);
    unsetenv("VLLM_CPU_REFERENCE");
    return rc ? NULL : e;
}

// Teacher forcing of the fixture's first prompts + their greedy tokens.
static void forced(const char *dir, int reference, json_t *g, struct fl_rows *out) {
    struct vllm_engine *e = load(dir, reference, NULL);
    CHECKF(e != NULL, "%s: %s", dir, vllm_last_error());
    fl_forced(e, g, 3, out);
}

static void expect_error(const char *dir, const char *quant, const char *want, const char *what);
static double worst_fast;

// The reference and the fast path on the quantized checkpoint qdir, and two
// tensor-parallel ranks, against the reference on the dequantized one (rd).
static void check_cpu(const char *fx, enum layout L, const char *qdir, json_t *g, const struct fl_rows *rd) {
    struct fl_rows rq, fq;
    forced(qdir, 1, g, &rq);
    forced(qdir, 0, g, &fq);
    long n1 = 0, n2 = 0;
    double d1 = fl_max_diff(&rq, rd, 3, &n1), d2 = fl_max_diff(&fq, rd, 3, &n2);
    CHECKF(n1 > 1000 && d1 <= REF_BOUND, "%s %s: reference on the quantized checkpoint vs the dequantized: %g over %ld", fx,
           layout_names[L], d1, n1);
    CHECKF(n2 > 1000 && d2 <= FAST_BOUND, "%s %s: fast path vs the dequantized reference: %g over %ld (bound %g)", fx,
           layout_names[L], d2, n2, FAST_BOUND);
    worst_fast = fmax(worst_fast, d2);
    printf("%-7s %-15s reference max |dlogit| %.3g, fast path %.3g (%ld logits)\n", fx, layout_names[L], d1, d2, n1);
    if (L == L_MO_NVFP4 && !strcmp(fx, "nh_moe")) { // the shared expert's 48 columns split at 24: inside a block
        tp_size = 2;
        expect_error(qdir, NULL, "a split at column 24 is not on a 16-column scale block", "nvfp4 split inside a block");
        tp_size = 1;
    } else if (L == L_MO_FP8 || L == L_MO_NVFP4 || L == L_CT_CHANNEL) { // two ranks: rows and columns split
        struct fl_rows tq;
        tp_size = 2;
        forced(qdir, 1, g, &tq);
        tp_size = 1;
        long n3 = 0;
        double d3 = fl_max_diff(&tq, rd, 3, &n3);
        CHECKF(n3 > 1000 && d3 <= REF_BOUND, "%s %s: 2 ranks vs the dequantized reference: %g over %ld", fx,
               layout_names[L], d3, n3);
        printf("%-7s %-15s 2 ranks (reference) max |dlogit| %.3g\n", fx, layout_names[L], d3);
        fl_free(&tq);
    }
    fl_free(&rq), fl_free(&fq);
}

// The quantized checkpoint on device dev (fp32) against the same, in steps of
// 64 and of 8 tokens.
static void check_device(const char *fx, enum layout L, const char *dev, const char *qdir, json_t *g,
                         const struct fl_rows *rd) {
    for (int k = 0; k < 2; k++) {
        struct fl_rows rq;
        device = dev, max_batched = k ? 8 : 64;
        forced(qdir, 0, g, &rq);
        device = NULL, max_batched = 64;
        long n = 0;
        double d = fl_max_diff(&rq, rd, 3, &n);
        CHECKF(n > 1000 && d <= REF_BOUND, "%s %s on %s, steps of %d: vs the dequantized reference: %g over %ld", fx,
               layout_names[L], dev, k ? 8 : 64, d, n);
        printf("%-7s %-15s %s fp32, steps of %2d tokens: max |dlogit| %.3g (%ld logits)\n", fx, layout_names[L], dev,
               k ? 8 : 64, d, n);
        fl_free(&rq);
    }
}

// Fixture fx quantized in layout L beside its dequantized fp32 checkpoint:
// check_cpu, or check_device on dev.
static void run_model(const char *fx, enum layout L, const char *dev) {
    char *qdir = tu_tmpdir(), *ddir = tu_tmpdir(), rel[128];
    snprintf(rel, sizeof rel, "%s/golden.json", fx);
    char *gp = tu_fixture(rel);
    json_t *g = NULL;
    CHECK(json_load_path(gp, &g) == 0);
    CHECK(make_pair(fx, L, qdir, ddir) == 0);
    struct fl_rows rd;
    forced(ddir, 1, g, &rd);
    if (dev) check_device(fx, L, dev, qdir, g, &rd);
    else check_cpu(fx, L, qdir, g, &rd);
    fl_free(&rd);
    json_decref(g);
    tu_rmdir(qdir), tu_rmdir(ddir);
    free(qdir), free(ddir), free(gp);
}

// ---- the loader at several scale blocks ----

static void run_loader(enum layout L) {
    const int64_t R1 = 130, R2 = 70, C = 304;
    char *dir = tu_tmpdir();
    float *w1 = xmalloc(sizeof(float) * R1 * C), *w2 = xmalloc(sizeof(float) * R2 * C);
    float *d1 = xmalloc(sizeof(float) * R1 * C), *d2 = xmalloc(sizeof(float) * R2 * C);
    uint64_t s = 12345 + L;
    for (int64_t i = 0; i < R1 * C; i++) s = s * 6364136223846793005ull + 1, w1[i] = (float)((int64_t)(s >> 40) - (1 << 23)) * 1e-8f * (1 + i % 7);
    for (int64_t i = 0; i < R2 * C; i++) s = s * 6364136223846793005ull + 1, w2[i] = (float)((int64_t)(s >> 40) - (1 << 23)) * 3e-8f;
    struct tset q = {0};
    quantize(&q, "a.weight", w1, R1, C, L, d1);
    quantize(&q, "b.weight", w2, R2, C, L, d2);
    char *p = path_join(dir, "model.safetensors");
    CHECK(tu_write_safetensors(p, q.t, q.n) == 0);
    tu_write(dir, "config.json", "{}", 2);
    char *cp = path_join(dir, "config.json");
    write_quant_config(dir, cp, L, L == L_MO_NVFP4 ? "NVFP4" : "FP8");
    free(cp);
    struct backend *be = NULL;
    CHECK(cpu_backend_create(1, 1, -1, &be) == 0);
    struct loader l;
    struct model_load_opts o = {WF_F32, 0, 0, 8, 1, 0, 0};
    int rc = loader_open_opts(&l, dir, &o, be);
    CHECKF(rc == 0, "%s", vllm_last_error());
    // rows [0, 130) of a, then rows [10, 70) of b; columns [128, 304)
    struct wpiece pc[2] = {{"a.weight", 2, {R1, C}, {0, R1}}, {"b.weight", 2, {R2, C}, {10, R2 - 10}}};
    struct weight w;
    rc = rc ? rc : loader_weight(&l, pc, 2, 128, C, 0, 0, &w);
    CHECKF(rc == 0, "%s: %s", layout_names[L], vllm_last_error());
    if (!rc) {
        int64_t rows = R1 + R2 - 10, cols = C - 128, bad = 0, n = 0;
        const float *f = cpu_weight_f32(be, &w, 0, rows);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++, n++) {
                float want = r < R1 ? d1[r * C + 128 + c] : d2[(r - R1 + 10) * C + 128 + c];
                if (f[r * cols + c] != want && bad++ < 3)
                    fprintf(stderr, "%s: element [%lld][%lld] %g, dequantized here %g\n", layout_names[L], (long long)r,
                            (long long)c, f[r * cols + c], want);
            }
        CHECKF(bad == 0 && n == rows * cols && n > 0, "%s: %lld of %lld elements differ", layout_names[L], (long long)bad,
               (long long)n);
        be->ops->free(be, w.data), be->ops->free(be, w.scale), be->ops->free(be, w.bscale);
    }
    if (!rc || l.st) loader_close(&l);
    backend_free(be);
    tset_free(&q);
    tu_rmdir(dir);
    free(dir), free(p), free(w1), free(w2), free(d1), free(d2);
}

// ---- errors ----

// Loads dir (reference path) expecting an error containing want.
static void expect_error(const char *dir, const char *quant, const char *want, const char *what) {
    struct vllm_engine *e = load(dir, 1, quant);
    const char *msg = vllm_last_error();
    CHECKF(!e && msg && strstr(msg, want), "%s: expected an error naming %s, got %s", what, want, e ? "success" : msg);
    if (e) vllm_engine_free(e);
}

// Rewrites qdir/model.safetensors without tensor `drop`, or with `reshape`'s
// shape cut by one row, or with `retype` stored as F8_E4M3 codes.
static void edit_ckpt3(const char *qdir, const char *drop, const char *reshape, const char *retype) {
    char *p = path_join(qdir, "model.safetensors");
    struct st_set *st = NULL;
    CHECK(st_open_file(p, &st) == 0);
    int n = st_count(st), k = 0;
    struct tu_tensor *t = xcalloc(n, sizeof *t);
    void **keep = xcalloc(n, sizeof *keep);
    for (int i = 0; i < n; i++) {
        const struct st_tensor *s = st_at(st, i);
        if (drop && !strcmp(s->name, drop)) continue;
        t[k] = (struct tu_tensor){s->name, st_dtype_name(s->dtype), s->ndim, {0}, NULL, s->nbytes};
        for (int d = 0; d < s->ndim; d++) t[k].shape[d] = s->shape[d];
        keep[k] = xmalloc(s->nbytes ? s->nbytes : 1);
        memcpy(keep[k], s->data, s->nbytes);
        t[k].data = keep[k];
        if (reshape && !strcmp(s->name, reshape)) {
            t[k].shape[0]--;
            t[k].nbytes = s->nbytes / s->shape[0] * t[k].shape[0];
        }
        if (retype && !strcmp(s->name, retype)) t[k].dtype = "F8_E4M3", t[k].nbytes = (size_t)s->numel;
        t[k].name = xstrdup(s->name);
        k++;
    }
    st_close(st);
    CHECK(tu_write_safetensors(p, t, k) == 0);
    for (int i = 0; i < k; i++) free(keep[i]), free((char *)t[i].name);
    free(keep), free(t), free(p);
}

// A fresh quantized / dequantized pair of fx in layout L.
static void fresh(char **q, char **d, const char *fx, enum layout L) {
    if (*q) tu_rmdir(*q), tu_rmdir(*d), free(*q), free(*d);
    *q = tu_tmpdir(), *d = tu_tmpdir();
    CHECK(make_pair(fx, L, *q, *d) == 0);
}

static void edit_ckpt(const char *qdir, const char *drop, const char *reshape) { edit_ckpt3(qdir, drop, reshape, NULL); }

static void run_errors(void) {
    char *q = NULL, *d = NULL;
    const char *sc = "model.layers.1.self_attn.k_proj.weight_scale";
    fresh(&q, &d, "qwen3", L_MO_FP8);
    expect_error(q, "nvfp4", "--quantization nvfp4", "a mode the checkpoint is not in");
    expect_error(d, "fp8", "not quantized", "fp8 asked of an unquantized checkpoint");
    edit_ckpt(q, sc, NULL);
    expect_error(q, NULL, sc, "a missing weight_scale");
    fresh(&q, &d, "qwen3", L_CT_CHANNEL);
    edit_ckpt(q, NULL, "model.layers.2.mlp.up_proj.weight_scale");
    expect_error(q, NULL, "model.layers.2.mlp.up_proj.weight_scale", "a per-channel scale one row short");
    fresh(&q, &d, "nh_moe", L_MO_NVFP4);
    edit_ckpt(q, "backbone.layers.1.mixer.experts.3.down_proj.weight_scale_2", NULL);
    expect_error(q, NULL, "backbone.layers.1.mixer.experts.3.down_proj.weight_scale_2", "a missing weight_scale_2");
    fresh(&q, &d, "nh_moe", L_MO_NVFP4);
    edit_ckpt(q, NULL, "backbone.layers.0.mixer.in_proj.weight_scale");
    expect_error(q, NULL, "backbone.layers.0.mixer.in_proj.weight_scale", "an nvfp4 block scale one row short");
    const char *hq = "{\"quantization\": {\"quant_algo\": \"FP6_E3M2\", \"exclude_modules\": []}}";
    tu_write(q, "hf_quant_config.json", hq, strlen(hq));
    expect_error(q, NULL, "FP6_E3M2", "an unknown quant_algo");
    fresh(&q, &d, "qwen3", L_MO_FP8);
    const char *ex = "{\"quantization\": {\"quant_algo\": \"FP8\", \"exclude_modules\": [\"lm_head\", "
                     "\"model.layers.0.mlp\"]}}";
    tu_write(q, "hf_quant_config.json", ex, strlen(ex));
    expect_error(q, NULL, "model.layers.0.mlp.", "an excluded module stored quantized");
    fresh(&q, &d, "qwen3", L_MO_FP8);
    edit_ckpt3(q, NULL, NULL, "model.layers.1.post_attention_layernorm.weight");
    expect_error(q, NULL, "model.layers.1.post_attention_layernorm.weight is stored quantized",
                 "a quantized tensor the model reads as a plain one (a norm)");
    fresh(&q, &d, "qwen3", L_CT_BLOCK);
    tu_write(q, "config.json", "{", 1);
    tu_copy(d, q, "config.json");
    expect_error(q, NULL, "has no quantization config", "F8_E4M3 tensors without a config");
    tu_rmdir(q), tu_rmdir(d);
    free(q), free(d);
}

int main(void) {
    const char *dev = getenv("VLLM_TEST_DEVICE");
    if (dev) { // tests/cuda.cmake: gpu_quant_checkpoints
        struct backend *be = NULL;
        if (backend_create(dev, 1, DT_F32, &be)) TEST_SKIP("no %s device: %s", dev, vllm_last_error());
        backend_free(be);
        for (int L = 0; L < L_N; L++) run_model("qwen3", (enum layout)L, dev);
        return test_summary("gpu_quant_checkpoints");
    }
    for (int L = 0; L < L_N; L++) run_loader((enum layout)L);
    const char *fx[] = {"qwen3", "nh_moe"};
    for (int f = 0; f < 2; f++)
        for (int L = 0; L < L_N; L++) run_model(fx[f], (enum layout)L, NULL);
    printf("fast path: worst max |dlogit| %.3g (bound %g)\n", worst_fast, FAST_BOUND);
    run_errors();
    return test_summary("test_quant_checkpoints");
}
