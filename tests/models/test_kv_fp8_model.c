// test_kv_fp8_model.c - the fp8 KV cache end to end on the CPU
// (--kv-cache-dtype fp8), and its scales from a checkpoint:
//
// 1. the gate, on an attention-only fixture (qwen3) and a hybrid one
//    (nh_dense): teacher-forced logits with the fp8 cache (reference path)
//    within the fixture's stated bound of the fp32-cache logits (one prefill
//    and chunks of 5); the fast path on the fp8 cache within FAST_BOUND of
//    the reference on it (below: why not 1e-4); greedy
//    decoding with the fp8 cache agrees with the oracle's greedy tokens (the
//    fp32 reference's, token-exact) except where the oracle's top-2 margin
//    is under twice the bound (an error within the bound cannot flip a
//    wider margin);
// 2. scales: copies of qwen3 with a second safetensors file of k_scale /
//    v_scale tensors, in each naming vLLM's loader takes (ModelOpt's
//    self_attn.k_proj.k_scale / v_proj.v_scale, compressed-tensors'
//    self_attn.k_scale / v_scale, the deprecated kv_scale; one alone serves
//    both), read per layer by loader_kv_scales; scales of 1 give the logits
//    of no scales bit for bit, other scales other logits (still within the
//    bound), so they reach the ops;
// 3. malformed scales (a [2] tensor, an I32 one, zero, negative, infinite):
//    the engine fails to load with an error naming the tensor.
// VLLM_TEST_DEVICE=cuda (gpu_kv_fp8_model, tests/cuda.cmake): the gate of 1.
// with the GPU (fp32 weights, the fp8 cache; decode steps replaying recorded
// graphs) in the fast path's place, greedy decoding on the GPU.
#include <math.h>

#include "backend/cpu/cpu.h"
#include "core/common.h"
#include "core/json.h"
#include "engine/engine.h"
#include "models/loader.h"
#include "forced_logits.h"
#include "test.h"
#include "util.h"

// Another path (the CPU fast path; the GPU with fp32 weights) on the fp8
// cache against the reference on it: the same codes' values, but a key or
// value the two compute an ulp apart (their projections sum in other
// orders) can round to neighbouring codes, a step of 1/8 of the value;
// measured (fast path) 8.1e-6 (qwen3, one prefill), 7.7e-4 (qwen3, chunks of
// 5), 8.6e-6 / 6.3e-6 (nh_dense) on earlier machines; on an AMD EPYC (another
// of the fast path's and OpenBLAS's kernel choices) nh_dense 4.05e-3 / 2.18e-3
// (one prefill / chunks of 5). Still a sixtieth of what the fp8 cache itself
// moves (0.616), so a lost scale or a wrong code fails.
#define FAST_BOUND 1e-2
// The GPU's k and v (cuBLAS, its own rope and norm) are a few fp32 ulps from
// the CPU reference's, and a key that rounds to the neighbouring e4m3 code
// moves its scores by up to 1/16 of that element: measured on the H200 0.037
// (qwen3, one prefill) and 0.004 (nh_dense), a tenth of what the fp8 cache
// itself moves (1.21, 0.62), so a lost scale or a wrong code still fails.
#define GPU_BOUND 0.1

struct fixture {
    const char *name;
    double bound; // max |fp8-cache logit - fp32-cache logit|, reference path
};
// Measured (budgets 2048 and 5 alike): qwen3 1.21, nh_dense 0.616 (e4m3
// keeps 4 significant bits; these tiny random models' logits span [-16, 16],
// and bf16 weights alone move nh_dense's by 0.2: tests/cpu/test_bf16_gate.c).
// Bounds: about 1.5x.
static const struct fixture fixtures[] = {{"qwen3", 1.8}, {"nh_dense", 0.9}};

// path 'r' reference, 'f' fast, 'c' the GPU (fp32 weights)
static struct vllm_engine *load(const char *dir, const char *kv, int budget, char path) {
    if (path == 'r') setenv("VLLM_CPU_REFERENCE", "1", 1);
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    if (path == 'c') ep.device = "cuda", ep.dtype = "float32";
    ep.model = dir;
    ep.num_threads = 2;
    ep.kv_cache_dtype = kv;
    ep.max_num_batched_tokens = budget;
    struct vllm_engine *e = NULL;
    CHECKF(vllm_engine_load(&ep, &e) == 0, "%s (%s KV): %s", dir, kv, vllm_last_error());
    unsetenv("VLLM_CPU_REFERENCE");
    return e;
}

static void forced(const char *dir, const char *kv, int budget, char path, json_t *g, struct fl_rows *out) {
    fl_forced(load(dir, kv, budget, path), g, FL_PROMPTS, out);
}

// 1. the gate of one fixture; other: the path held to the reference on the
// fp8 cache ('f' or 'c'), which also decodes greedily on the GPU
static void gate(const struct fixture *f, char other) {
    json_t *g = tu_fixture_golden(f->name);
    CHECKF(g != NULL, "%s: no golden.json", f->name);
    if (!g) return;
    char *dir = tu_fixture(f->name);
    int np = (int)MIN(FL_PROMPTS, json_array_size(json_object_get(g, "prompts")));
    for (int budget = 2048; budget >= 5; budget = budget == 2048 ? 5 : 0) {
        struct fl_rows r32, r8, o8;
        long c1 = 0, c2 = 0;
        forced(dir, "float32", budget, 'r', g, &r32);
        forced(dir, "fp8", budget, 'r', g, &r8);
        forced(dir, "fp8", budget, other, g, &o8);
        double e = fl_max_diff(&r8, &r32, np, &c1), eo = fl_max_diff(&o8, &r8, np, &c2);
        double eo32 = fl_max_diff(&o8, &r32, np, &c2);
        const char *on = other == 'c' ? "the GPU" : "the fast path";
        printf("%s, budget %d: fp8 KV vs fp32 KV (reference) max |logit diff| %.3g (bound %.2g); %s vs the reference "
               "on fp8 KV %.3g (bound %.0e), vs the reference on fp32 KV %.3g; over %ld values\n",
               f->name, budget, e, f->bound, on, eo, other == 'c' ? GPU_BOUND : FAST_BOUND, eo32, c1);
        CHECKF(c1 > 0 && e > 0 && e <= f->bound, "%s: fp8 KV logits %.3g from fp32 KV (bound %.2g)", f->name, e,
               f->bound);
        double ob = other == 'c' ? GPU_BOUND : FAST_BOUND;
        CHECKF(c2 > 0 && eo <= ob && eo32 <= f->bound, "%s: %s on fp8 KV %.3g from the reference on it (bound %.0e), "
               "%.3g from fp32 KV", f->name, on, eo, ob, eo32);
        fl_free(&r32), fl_free(&r8), fl_free(&o8);
    }
    // greedy with the fp8 cache against the oracle's greedy tokens
    json_t *prompts = json_object_get(g, "prompts"), *want = json_object_get(g, "greedy"),
           *margins = json_object_get(g, "margins");
    struct vllm_engine *e = load(dir, "fp8", 2048, other == 'c' ? 'c' : 'r');
    int agree = 0, total = 0;
    for (int i = 0; e && i < (int)json_array_size(prompts); i++) {
        int n, nq;
        int32_t *p = fl_ids(json_array_get(prompts, i), &n), *q = fl_ids(json_array_get(want, i), &nq);
        struct vllm_sampling_params sp;
        vllm_sampling_params_default(&sp);
        sp.temperature = 0, sp.ignore_eos = 1, sp.max_tokens = nq;
        int32_t *o = NULL;
        int no = 0;
        CHECK(vllm_complete_tokens(e, p, n, &sp, &o, &no, NULL) == 0);
        int k = 0;
        while (k < no && k < nq && o[k] == q[k]) k++;
        double m = 0;
        if (k < nq) json_as_double(json_array_get(json_array_get(margins, i), k), &m);
        printf("%s prompt %d: fp8 KV greedy agrees with the oracle for %d/%d tokens", f->name, i, k, nq);
        if (k < nq) printf("; diverges at step %d, oracle margin %.3g", k, m);
        printf("\n");
        CHECKF(k == nq || m < 2 * f->bound, "%s prompt %d: divergence at margin %.3g >= %.3g", f->name, i, m,
               2 * f->bound);
        agree += k, total += nq;
        vllm_free(o);
        free(p), free(q);
    }
    printf("%s: fp8 KV greedy agreement with the oracle %d/%d\n", f->name, agree, total);
    CHECK(total > 0);
    if (e) vllm_engine_free(e);
    json_decref(g);
    free(dir);
}

// 2. scales in a checkpoint. A copy of qwen3 (4 layers) with kv_scales.safetensors
// holding, per layer i, the tensors named k_fmt / v_fmt (printf of i; NULL:
// none) with values k0 + step i, v0 + step i.
struct scale_file {
    const char *k_fmt, *v_fmt;
    float k0, v0, step;
};

static char *copy_with_scales(const struct scale_file *sf) {
    char *dir = tu_model_copy("qwen3", NULL);
    struct tu_tensor t[8];
    float val[8];
    char names[8][96];
    int n = 0;
    for (int i = 0; i < 4; i++)
        for (int kv = 0; kv < 2; kv++) {
            const char *fmt = kv ? sf->v_fmt : sf->k_fmt;
            if (!fmt) continue;
            snprintf(names[n], sizeof names[n], fmt, i);
            val[n] = (kv ? sf->v0 : sf->k0) + sf->step * (float)i;
            t[n] = (struct tu_tensor){names[n], "F32", 0, {0}, &val[n], sizeof(float)};
            n++;
        }
    char *path = xmalloc(strlen(dir) + 32);
    sprintf(path, "%s/kv_scales.safetensors", dir);
    CHECK(tu_write_safetensors(path, t, n) == 0);
    free(path);
    return dir;
}

static void test_scale_names(void) {
    static const struct {
        struct scale_file f;
        float k0, v0; // what each layer i reads: k0 + i, v0 + i
    } cases[] = {
        {{"model.layers.%d.self_attn.k_proj.k_scale", "model.layers.%d.self_attn.v_proj.v_scale", 0.5f, 2, 1}, 0.5f, 2},
        {{"model.layers.%d.self_attn.k_scale", "model.layers.%d.self_attn.v_scale", 0.25f, 3, 1}, 0.25f, 3},
        {{"model.layers.%d.self_attn.kv_scale", NULL, 1.5f, 0, 1}, 1.5f, 1.5f},
        {{"model.layers.%d.self_attn.k_scale", NULL, 0.75f, 0, 1}, 0.75f, 0.75f},
        {{NULL, NULL, 0, 0, 0}, 1, 1}, // none: 1 at every layer
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *dir = copy_with_scales(&cases[c].f);
        struct backend *be = NULL;
        struct loader l;
        CHECK(cpu_backend_create(1, 1, -1, &be) == 0);
        CHECK(loader_open(&l, dir, 0, 0, WF_F32, be) == 0);
        int good = 0;
        for (int i = 0; i < 4; i++) {
            char p[64];
            float k = 0, v = 0;
            snprintf(p, sizeof p, "model.layers.%d.self_attn.", i);
            CHECK(loader_kv_scales(&l, p, &k, &v) == 0);
            float wk = cases[c].f.k_fmt ? cases[c].k0 + (float)i : 1,
                  wv = cases[c].f.k_fmt ? cases[c].v0 + (float)i : 1;
            good += k == wk && v == wv;
        }
        printf("scales named %s / %s: %d of 4 layers read as expected\n",
               cases[c].f.k_fmt ? cases[c].f.k_fmt : "(none)", cases[c].f.v_fmt ? cases[c].f.v_fmt : "(none)", good);
        CHECK(good == 4);
        loader_close(&l);
        backend_free(be);
        tu_rmdir(dir);
        free(dir);
    }
}

// Scales of 1 change nothing; other scales change the logits, within the bound.
static void test_scales_used(json_t *g) {
    char *dir = tu_fixture("qwen3");
    char *ones = copy_with_scales(&(struct scale_file){"model.layers.%d.self_attn.k_proj.k_scale",
                                                       "model.layers.%d.self_attn.v_proj.v_scale", 1, 1, 0});
    char *other = copy_with_scales(&(struct scale_file){"model.layers.%d.self_attn.k_scale",
                                                        "model.layers.%d.self_attn.v_scale", 2.7f, 0.37f, 0.5f});
    struct fl_rows base, r1, r2, r32;
    long c = 0;
    forced(dir, "fp8", 2048, 'r', g, &base);
    forced(ones, "fp8", 2048, 'r', g, &r1);
    forced(other, "fp8", 2048, 'r', g, &r2);
    forced(dir, "float32", 2048, 'r', g, &r32);
    int np = FL_PROMPTS;
    double d1 = fl_max_diff(&r1, &base, np, &c), d2 = fl_max_diff(&r2, &base, np, &c),
           d32 = fl_max_diff(&r2, &r32, np, &c);
    printf("qwen3 with checkpoint scales: all 1 vs none %.3g (exact), 2.7 / 0.37 (+ 0.5 a layer) vs none %.3g, the "
           "latter vs fp32 KV %.3g (bound %.2g)\n",
           d1, d2, d32, fixtures[0].bound);
    CHECK(c > 0 && d1 == 0 && d2 > 0 && d32 <= fixtures[0].bound);
    fl_free(&base), fl_free(&r1), fl_free(&r2), fl_free(&r32);
    tu_rmdir(ones), tu_rmdir(other);
    free(dir), free(ones), free(other);
}

// 3. a malformed scale: the engine does not load, and says which tensor.
static void test_bad_scales(void) {
    static const struct {
        const char *dtype;
        int ndim;
        int64_t n;
        float v;
        const char *why;
    } cases[] = {{"F32", 1, 2, 1, "shape"},
                 {"I32", 0, 1, 1, "dtype"},
                 {"F32", 0, 1, 0, "positive"},
                 {"F32", 1, 1, -2, "positive"},
                 {"F32", 0, 1, INFINITY, "positive"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *dir = tu_model_copy("qwen3", NULL), path[512];
        float v[2] = {cases[c].v, cases[c].v};
        int32_t iv = 1;
        const char *name = "model.layers.2.self_attn.v_proj.v_scale";
        const void *data = cases[c].dtype[0] == 'I' ? (const void *)&iv : v;
        size_t nb = sizeof(float) * (size_t)cases[c].n;
        struct tu_tensor t = {name, cases[c].dtype, cases[c].ndim, {cases[c].n}, data, nb};
        snprintf(path, sizeof path, "%s/kv_scales.safetensors", dir);
        CHECK(tu_write_safetensors(path, &t, 1) == 0);
        struct vllm_engine_params ep;
        vllm_engine_params_default(&ep);
        ep.model = dir;
        ep.num_threads = 1;
        ep.kv_cache_dtype = "fp8";
        struct vllm_engine *e = NULL;
        int rc = vllm_engine_load(&ep, &e);
        const char *msg = vllm_last_error();
        printf("malformed scale (%s): %s\n", cases[c].why, msg);
        CHECKF(rc != 0 && !e && strstr(msg, name) && strstr(msg, cases[c].why), "case %zu: rc %d, '%s'", c, rc, msg);
        if (e) vllm_engine_free(e);
        tu_rmdir(dir);
        free(dir);
    }
}

int main(void) {
    const char *dev = getenv("VLLM_TEST_DEVICE");
    int gpu = dev && !strcmp(dev, "cuda");
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) gate(&fixtures[i], gpu ? 'c' : 'f');
    if (gpu) return test_summary("kv_fp8_model (cuda)");
    test_scale_names();
    json_t *g = tu_fixture_golden("qwen3");
    CHECK(g != NULL);
    if (g) test_scales_used(g);
    json_decref(g);
    test_bad_scales();
    return test_summary("kv_fp8_model");
}
