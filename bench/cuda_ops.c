// cuda_ops.c - device time of each decode-step op of a NemotronH-MoE layer
// at real shapes (Nemotron-3-Nano 30B-A3B: hidden 2688, 128 experts of 1856
// top-6, shared expert 3712, 64 Mamba heads of 64, state 128, 8 groups), the
// way a decode step runs them: many calls recorded into one CUDA graph, so
// launch gaps count as they do in the engine. Weights are bf16 and cycled
// over copies (and expert sets) larger than the L2, so every call reads
// from HBM. Prints per op the microseconds per call, the bytes it must read
// and that as a fraction of the device's measured copy bandwidth.
//
// Usage: build-cuda/cuda_ops [ROWS (1)] [CALLS per graph (64)] [moe: the routed experts only |
//        fp8 | fp8_block | nvfp4: the routed experts in bf16, then with weights in that format (fp8: e4m3 +
//        a scale per row, half the bytes; fp8_block: e4m3 + a scale per row and 128 columns; nvfp4: e2m1 +
//        an e4m3 scale per 16 columns + a scale per row, 0.28 of the bytes) |
//        quant: the dense linears (Mamba in / out_proj, the shared expert) in bf16, FP8, FP8 blocks and NVFP4
//        (up to 64 rows: the tensor-core GEMV; above: FP8 as W8A8 on cuBLASLt's FP8 GEMM, the others
//        dequantized to bf16, then the GEMM), then up to 64 rows the quantized formats again without it
//        (VLLM_QMMA=0: the fp32 GEMV up to 4 rows, W8A8 or dequantized above), above 64 FP8 again dequantized
//        (VLLM_FP8_W8A8=0); TFLOP/s too. Every mode is bf16 (--dtype bfloat16) |
//        gemv: the 16-bit decode GEMV's kernels (VLLM_GEMV16=0, 1) side by side at NemotronH-Nano's and
//        Qwen3-8B's dense shapes, the gate | up one GATED (matmul_act_mul), and a 151,936-row lm_head]
// e.g. cuda_ops 8192 4 quant (prefill at --max-num-batched-tokens 8192), cuda_ops 1 64 quant (decode)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/common.h"
#include "bench_dev.h"

#ifdef VLLM_HAVE_CUDA
#include <stdarg.h>

enum { D = 2688, E = 128, I = 1856, K = 6, SI = 3712, H = 64, P = 64, G = 8, N = 128, CONV = 4 };
#define L2_BYTES (256LL << 20) // cycle over at least this much (H200 L2: 50 MB)
#define MAXC 64

static struct backend *be;
static double bw_peak;

static void die(const char *fmt, ...) {
    va_list a;
    va_start(a, fmt);
    vfprintf(stderr, fmt, a);
    va_end(a);
    fputc('\n', stderr);
    exit(1);
}

// n floats in [-scale / 2, scale / 2] on the device
static float *dev_random(size_t n, float scale, unsigned seed) {
    return bench_uniform(be, n, -scale / 2, scale / 2, seed);
}

// flops: of a matrix product (printed as TFLOP/s), else 0
static void report(const char *what, double us, double bytes, double flops) {
    double gbs = bytes / (us * 1e-6) / 1e9;
    printf("  %-30s %9.2f us  %8.2f MB  %7.0f GB/s  %5.1f%% of copy", what, us, bytes / 1e6, gbs,
           100 * gbs * 1e9 / bw_peak);
    if (flops > 0) printf("  %6.1f TFLOP/s", flops / (us * 1e-6) / 1e12);
    printf("\n");
}

// ---- matmul over copies of one weight shape ----
struct mm_ctx {
    struct weight w[MAXC];
    int copies, n;
    float *x, *y;
};
static void mm_call(void *p, int i) {
    struct mm_ctx *c = p;
    be->ops->matmul(be, c->y, c->x, &c->w[i % c->copies], c->n);
}
static void bench_matmul(const char *what, enum wfmt f, int64_t rows, int64_t cols, int n, int calls) {
    struct mm_ctx c = {.n = n};
    int64_t bytes = wfmt_weight_bytes(f, rows, cols);
    c.copies = (int)MIN(MAXC, MAX(1, L2_BYTES / bytes + 1));
    for (int k = 0; k < c.copies; k++) {
        if (be->ops->weight_alloc(be, &c.w[k], f, rows, cols) || be->ops->weight_random(be, &c.w[k], 7 + k, 0.02f))
            die("weight: %s", vllm_last_error());
    }
    c.x = dev_random((size_t)n * cols, 1, 1);
    c.y = be->ops->alloc(be, sizeof(float) * n * rows);
    report(what, bench_graph_us(be, mm_call, &c, calls), (double)bytes, n > 16 ? 2.0 * rows * cols * n : 0);
    for (int k = 0; k < c.copies; k++) be->ops->free(be, c.w[k].data);
    be->ops->free(be, c.x), be->ops->free(be, c.y);
}

// ---- the GATED GEMV: matmul_act_mul over copies of a [2I, cols] weight ----
struct mam_ctx {
    struct mm_ctx m;
    float *gu;
};
static void mam_call(void *p, int i) {
    struct mam_ctx *c = p;
    be->ops->matmul_act_mul(be, ACT_SILU, c->m.y, c->m.x, &c->m.w[i % c->m.copies], c->m.n, c->gu);
}
static void bench_matmul_act_mul(const char *what, int64_t rows, int64_t cols, int n, int calls) {
    struct mam_ctx c = {.m = {.n = n}};
    int64_t bytes = wfmt_weight_bytes(WF_BF16, rows, cols);
    c.m.copies = (int)MIN(MAXC, MAX(1, L2_BYTES / bytes + 1));
    for (int k = 0; k < c.m.copies; k++) {
        if (be->ops->weight_alloc(be, &c.m.w[k], WF_BF16, rows, cols) ||
            be->ops->weight_random(be, &c.m.w[k], 7 + k, 0.02f))
            die("weight: %s", vllm_last_error());
    }
    c.m.x = dev_random((size_t)n * cols, 1, 1);
    c.m.y = be->ops->alloc(be, sizeof(float) * n * rows / 2);
    c.gu = be->ops->alloc(be, sizeof(float) * n * rows);
    report(what, bench_graph_us(be, mam_call, &c, calls), (double)bytes, 0);
    for (int k = 0; k < c.m.copies; k++) be->ops->free(be, c.m.w[k].data);
    be->ops->free(be, c.m.x), be->ops->free(be, c.m.y), be->ops->free(be, c.gu);
}

// Each shape under each VLLM_GEMV16 kernel (a backend made again per kernel:
// the switch is read at creation), one line per kernel, the shapes in turn.
static void bench_gemv16(int n, int calls) {
    static const struct {
        const char *name;
        int64_t rows, cols;
        int gated;
    } sh[] = {{"nano in_proj", 2 * H * P + 2 * G * N + H, D, 0}, {"nano out_proj", D, H * P, 0},
              {"nano shared up", SI, D, 0},                        {"nano shared down", D, SI, 0},
              {"qwen3_8b qkv", 6144, 4096, 0},                     {"qwen3_8b o_proj", 4096, 4096, 0},
              {"qwen3_8b gate|up GATED", 2 * 12288, 4096, 1},      {"qwen3_8b down", 4096, 12288, 0},
              {"lm_head 151936", 151936, 4096, 0}};
    enum { VARIANTS = 2 };
    char what[64];
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        for (int v = 0; v < VARIANTS; v++) {
            char val[8];
            snprintf(val, sizeof val, "%d", v);
            setenv("VLLM_GEMV16", val, 1);
            backend_free(be);
            if (backend_cuda_create(DT_BF16, &be)) die("cuda: %s", vllm_last_error());
            be->weight_dtype = WF_BF16;
            snprintf(what, sizeof what, "%s v%d", sh[s].name, v);
            if (sh[s].gated) bench_matmul_act_mul(what, sh[s].rows, sh[s].cols, n, calls);
            else bench_matmul(what, WF_BF16, sh[s].rows, sh[s].cols, n, sh[s].rows > 100000 ? 8 : calls);
        }
}

// ---- routed experts: ids cycled over sets that together cover the experts ----
struct moe_ctx {
    struct moe_experts w;
    int n, sets;
    float *x, *out, *wts;
    int32_t *ids; // [sets, n * K]
};
static void moe_call(void *p, int i) {
    struct moe_ctx *c = p;
    be->ops->moe_experts(be, c->out, c->x, &c->w, c->ids + (size_t)(i % c->sets) * c->n * K, c->wts, c->n, K, NULL);
}
static void bench_moe(int n, int calls, enum wfmt f, const char *fname) {
    struct moe_ctx c = {.n = n, .sets = 16};
    c.w = (struct moe_experts){.num_experts = E, .inter = I, .dim = D, .gated = 0, .act = ACT_RELU2};
    if (be->ops->weight_alloc(be, &c.w.up, f, (int64_t)E * I, D) || be->ops->weight_random(be, &c.w.up, 3, 0.02f) ||
        be->ops->weight_alloc(be, &c.w.down, f, (int64_t)E * D, I) ||
        be->ops->weight_random(be, &c.w.down, 4, 0.02f))
        die("experts: %s", vllm_last_error());
    struct op_query q = {.op = OP_MOE_EXPERTS, .max_tokens = n,
                         .route = &(struct moe_route_cfg){.kind = ROUTE_SIGMOID_GROUPED, .num_experts = E, .top_k = K},
                         .moe = &c.w};
    if (be->ops->supports(be, &q)) die("moe_experts refused: %s", vllm_last_error());
    int32_t *h = xmalloc(sizeof(int32_t) * c.sets * n * K);
    double distinct = 0;
    srand(5);
    for (int s = 0; s < c.sets; s++) {
        char used[E] = {0};
        for (int t = 0; t < n; t++) {
            int32_t *r = h + ((size_t)s * n + t) * K;
            char pick[E] = {0};
            for (int j = 0; j < K; j++) { // K distinct experts per token
                int e = rand() % E;
                while (pick[e]) e = (e + 1) % E;
                pick[e] = used[e] = 1;
                r[j] = e;
            }
        }
        for (int e = 0; e < E; e++) distinct += used[e];
    }
    c.ids = be->ops->alloc(be, sizeof(int32_t) * c.sets * n * K);
    be->ops->upload(be, c.ids, h, sizeof(int32_t) * c.sets * n * K);
    free(h);
    c.x = dev_random((size_t)n * D, 1, 2);
    c.wts = dev_random((size_t)n * K, 1, 3);
    c.out = be->ops->alloc(be, sizeof(float) * n * D);
    // the experts' up and down weights read, codes and scales
    double bytes = distinct / c.sets * (double)(wfmt_weight_bytes(f, I, D) + wfmt_weight_bytes(f, D, I));
    char what[64];
    snprintf(what, sizeof what, "moe_experts%s%s (%.1f experts)", fname ? " " : "", fname ? fname : "",
             distinct / c.sets);
    // the products' FLOPs (relu2: up [I, D], down [D, I] per assignment): prefill sizes are compute-bound
    report(what, bench_graph_us(be, moe_call, &c, calls), bytes, 2.0 * n * K * 2 * (double)I * D);
    struct weight *ws[2] = {&c.w.up, &c.w.down};
    for (int i = 0; i < 2; i++) {
        be->ops->free(be, ws[i]->data);
        if (ws[i]->scale) be->ops->free(be, ws[i]->scale);
        if (ws[i]->bscale) be->ops->free(be, ws[i]->bscale);
    }
    be->ops->free(be, c.ids), be->ops->free(be, c.x), be->ops->free(be, c.wts), be->ops->free(be, c.out);
}

// ---- small ops: norms, adds, routing, the Mamba decode chain ----
struct small_ctx {
    int n;
    float *x, *y, *z, *res, *w, *logits, *rw;
    int32_t *rids;
    struct moe_route_cfg route;
    // Mamba decode
    float *proj, *conv_w, *conv_b, *conv_state, *ssm, *dt_bias, *A, *Dp, *ys, *yn, *norm_w;
    struct batch b;
    struct mamba_dims md;
    int ld;
};
static void add_rmsnorm_call(void *p, int i) {
    struct small_ctx *c = p;
    (void)i;
    be->ops->add_rmsnorm(be, c->res, c->y, c->x, c->w, c->n, D, 1e-5f);
}
static void add_call(void *p, int i) {
    struct small_ctx *c = p;
    (void)i;
    be->ops->add(be, c->y, c->x, (int64_t)c->n * D);
}
static void route_call(void *p, int i) {
    struct small_ctx *c = p;
    (void)i;
    be->ops->moe_route(be, c->rids, c->rw, c->logits, c->z, c->n, &c->route);
}
static void conv_call(void *p, int i) {
    struct small_ctx *c = p;
    (void)i;
    be->ops->conv1d_update(be, c->proj, c->ld, c->conv_w, c->conv_b, c->conv_state, &c->b, &c->md);
}
static void ssd_call(void *p, int i) {
    struct small_ctx *c = p;
    (void)i;
    be->ops->ssd_decode(be, c->ys, c->proj, c->ld, c->dt_bias, c->A, c->Dp, c->ssm, &c->b, &c->md);
}
static void gnorm_call(void *p, int i) {
    struct small_ctx *c = p;
    (void)i;
    be->ops->gated_rmsnorm(be, c->yn, c->ys, c->proj, c->ld, c->norm_w, c->n, H * P, H * P / G, 1e-5f);
}

// A decode batch of n sequences in slots 0..n-1, each continuing its state.
static void make_batch(struct small_ctx *c) {
    int n = c->n;
    int32_t *h = xcalloc(8 * (n + 1), sizeof(int32_t));
    int32_t *qsl = h, *sl = h + (n + 1), *cl = h + 2 * (n + 1), *pos = h + 3 * (n + 1), *st = h + 4 * (n + 1),
            *src = h + 5 * (n + 1);
    for (int s = 0; s <= n; s++) qsl[s] = s;
    for (int s = 0; s < n; s++) sl[s] = 100, cl[s] = 99, pos[s] = 99, st[s] = s, src[s] = s;
    int32_t *d = be->ops->alloc(be, sizeof(int32_t) * 8 * (n + 1));
    be->ops->upload(be, d, h, sizeof(int32_t) * 8 * (n + 1));
    c->b = (struct batch){.num_tokens = n, .num_seqs = n, .num_decodes = n, .max_query_len = 1, .max_seq_len = 100,
                          .fixed_shapes = 1, .max_model_len = 4096};
    c->b.query_start_loc = d, c->b.seq_lens = d + (n + 1), c->b.context_lens = d + 2 * (n + 1);
    c->b.positions = d + 3 * (n + 1), c->b.state_slots = d + 4 * (n + 1), c->b.state_src = d + 5 * (n + 1);
    c->b.h_query_start_loc = qsl, c->b.h_seq_lens = sl, c->b.h_context_lens = cl, c->b.h_state_slots = st;
    c->b.h_state_src = src;
}

static void bench_small(int n, int calls) {
    struct small_ctx c = {.n = n};
    c.x = dev_random((size_t)n * D, 1, 11), c.y = dev_random((size_t)n * D, 1, 12);
    c.res = dev_random((size_t)n * D, 1, 13), c.w = dev_random(D, 1, 14);
    c.logits = dev_random((size_t)n * E, 4, 15), c.z = dev_random(E, 0.1f, 16);
    c.rids = be->ops->alloc(be, sizeof(int32_t) * n * K), c.rw = be->ops->alloc(be, sizeof(float) * n * K);
    c.route = (struct moe_route_cfg){.kind = ROUTE_SIGMOID_GROUPED, .num_experts = E, .top_k = K, .n_group = 1,
                                     .topk_group = 1, .norm_topk_prob = 1, .routed_scaling_factor = 2.5f};
    double act = (double)n * D * 4;
    report("add_rmsnorm", bench_graph_us(be, add_rmsnorm_call, &c, calls), 4 * act, 0);
    report("add", bench_graph_us(be, add_call, &c, calls), 3 * act, 0);
    report("moe_route", bench_graph_us(be, route_call, &c, calls), (double)n * E * 4, 0);
    c.md = (struct mamba_dims){.heads = H, .head_dim = P, .groups = G, .state = N, .conv_kernel = CONV,
                               .chunk_size = 128, .conv_dim = H * P + 2 * G * N, .dt_min = 0, .dt_max = 1e30f};
    c.ld = 2 * H * P + 2 * G * N + H;
    c.proj = dev_random((size_t)n * c.ld, 1, 17);
    c.conv_w = dev_random((size_t)c.md.conv_dim * CONV, 0.5f, 18), c.conv_b = dev_random(c.md.conv_dim, 0.1f, 19);
    c.conv_state = dev_random((size_t)n * (CONV - 1) * c.md.conv_dim, 1, 20);
    c.ssm = dev_random((size_t)n * H * P * N, 1, 21);
    c.dt_bias = dev_random(H, 1, 22), c.A = dev_random(H, 1, 23), c.Dp = dev_random(H, 1, 24);
    c.ys = be->ops->alloc(be, sizeof(float) * n * H * P), c.yn = be->ops->alloc(be, sizeof(float) * n * H * P);
    c.norm_w = dev_random(H * P, 1, 25);
    make_batch(&c);
    double state = (double)n * H * P * N * 4;
    report("conv1d_update", bench_graph_us(be, conv_call, &c, calls), (double)n * c.md.conv_dim * 4 * 4, 0);
    report("ssd_decode (state r+w)", bench_graph_us(be, ssd_call, &c, calls), 2 * state, 0);
    report("gated_rmsnorm", bench_graph_us(be, gnorm_call, &c, calls), (double)n * H * P * 4 * 3, 0);
}

// The dense linears in each weight format (the model's --dtype bf16: what
// quantized prefill dequantizes to); then, on a backend made again, up to 64
// rows the quantized formats without the tensor-core GEMV (VLLM_QMMA=0), above
// FP8 (W8A8 by default) dequantized (VLLM_FP8_W8A8=0).
static void bench_quant(int n, int calls) {
    static const struct {
        const char *name;
        int64_t rows, cols;
    } sh[] = {{"mamba in_proj", 2 * H * P + 2 * G * N + H, D}, {"mamba out_proj", D, H * P}, {"shared up", SI, D},
              {"shared down", D, SI}};
    static const enum wfmt fmts[] = {WF_BF16, WF_FP8, WF_FP8_B128, WF_NVFP4};
    char what[64];
    be->weight_dtype = WF_BF16;
    for (int s = 0; s < 4; s++)
        for (int f = 0; f < 4; f++) {
            snprintf(what, sizeof what, "%s %s", sh[s].name, wfmt_name(fmts[f]));
            bench_matmul(what, fmts[f], sh[s].rows, sh[s].cols, n, calls);
        }
    backend_free(be); // again without the tensor-core GEMV (up to 64 rows), or FP8 dequantized, not W8A8 (above)
    setenv(n <= 64 ? "VLLM_QMMA" : "VLLM_FP8_W8A8", "0", 1);
    if (backend_cuda_create(DT_BF16, &be)) die("cuda: %s", vllm_last_error());
    be->weight_dtype = WF_BF16;
    for (int s = 0; s < 4; s++)
        for (int f = 1; f < 4; f++) {
            if (n > 64 && fmts[f] != WF_FP8) break;
            snprintf(what, sizeof what, "%s %s %s", sh[s].name, wfmt_name(fmts[f]), n <= 64 ? "no mma" : "dequantized");
            bench_matmul(what, fmts[f], sh[s].rows, sh[s].cols, n, calls);
        }
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1, calls = argc > 2 ? atoi(argv[2]) : 64;
    if (n < 1 || n > 16384 || calls < 1) die("usage: cuda_ops [ROWS 1..16384] [CALLS] [moe|fp8|fp8_block|nvfp4|quant|gemv]");
    if (backend_cuda_create(DT_BF16, &be)) {
        printf("cuda_ops: no GPU (%s)\n", vllm_last_error());
        return 0;
    }
    double fl;
    be->weight_dtype = WF_BF16; // the model's --dtype bfloat16
    be->ops->peaks(be, &bw_peak, &fl);
    printf("cuda_ops: %d rows, %d calls per graph; copy %.0f GB/s\n", n, calls, bw_peak / 1e9);
    if (argc > 3 && !strcmp(argv[3], "gemv")) {
        if (n > 4) die("cuda_ops: gemv: 1-4 rows (the GEMV's)");
        bench_gemv16(n, calls);
        backend_free(be);
        return 0;
    }
    if (argc > 3 && !strcmp(argv[3], "quant")) {
        bench_quant(n, calls);
        backend_free(be);
        return 0;
    }
    if (argc > 3) { // the routed experts only (sweeps), in bf16 then a quantized format
        static const struct {
            const char *name;
            enum wfmt f;
        } q[] = {{"fp8", WF_FP8}, {"fp8_block", WF_FP8_B128}, {"nvfp4", WF_NVFP4}};
        int qi = -1;
        for (int i = 0; i < 3; i++)
            if (!strcmp(argv[3], q[i].name)) qi = i;
        if (qi < 0 && strcmp(argv[3], "moe")) die("cuda_ops: %s: not moe, fp8, fp8_block, nvfp4 or quant", argv[3]);
        bench_moe(n, calls, WF_BF16, NULL);
        if (qi >= 0) bench_moe(n, calls, q[qi].f, q[qi].name);
        backend_free(be);
        return 0;
    }
    bench_matmul("matmul mamba in_proj", WF_BF16, 2 * H * P + 2 * G * N + H, D, n, calls);
    bench_matmul("matmul mamba out_proj", WF_BF16, D, H * P, n, calls);
    bench_matmul("matmul shared up", WF_BF16, SI, D, n, calls);
    bench_matmul("matmul shared down", WF_BF16, D, SI, n, calls);
    bench_matmul("matmul router (fp32)", WF_F32, E, D, n, calls);
    bench_matmul("matmul lm_head", WF_BF16, 131072, D, n, 8);
    bench_moe(n, calls, WF_BF16, NULL);
    bench_small(n, calls);
    backend_free(be);
    return 0;
}
#else
int main(void) {
    printf("cuda_ops: built without CUDA\n");
    return 0;
}
#endif
