// test_cuda_quant.c - the CUDA backend's quantized dense weights (WF_FP8,
// WF_FP8_B128, WF_NVFP4; src/backend/cuda/cuda_quant.cu) against the CPU
// reference's ops of the same name on the same weights (the host-made dummy
// codes and scales of weight_random_quant; the reference dequantizes exactly,
// then sgemm in fp32):
// - matmul at Nemotron-3-Nano shapes (hidden 2688 <-> Mamba in_proj 10304,
//   shared expert 3712, out_proj 4096; K 1856, a routed expert's, is not a
//   multiple of 128; K 1000 takes the any-shape kernels; 101 x 16384: odd
//   N, and 4 rows of x too wide to stage), rows 1, 3, 4 (the streaming
//   GEMV, k_gemv_qw), 8, 16, 17, 40, 300, 2048 (dequantized, then the GEMM;
//   in bf16 mode up to 64 rows the tensor-core GEMV), bias off and on; fp32
//   mode (be->weight_dtype WF_F32: what the exactness gates run) within
//   1e-5 relative to the largest |y|, bf16 mode within 2e-2;
// - matmul_act_mul (SwiGLU and relu2) and matmul_act the same way (1-4
//   rows: k_gemv_qw's epilogues);
// - exactness: a weight holding every code (and NVFP4 block scale) times
//   one-hot rows of x gives each value of wfmt_dequant, bit for bit (fp32
//   mode and the bf16 mode's tensor-core GEMV; the bf16 GEMM: that value
//   rounded to bf16), in the GEMV and the GEMM;
// - the tensor-core GEMV of the bf16 mode (src/backend/cuda/cuda_qmma.cuh:
//   5 to 64 rows, K % 64 == 0) at the real shapes and 1, 2, 3 (there the
//   GEMV, held to fp32's 1e-5), 5, 8, 9, 16, 33, 64 rows, odd N, and K %
//   64 != 0 (the other paths) (test_qmma);
// - W8A8 (the default; VLLM_FP8_W8A8=0 off) for WF_FP8 above 64 rows in bf16 mode (test_w8a8);
// - refusals: an NVFP4 weight of 1000 columns (not a multiple of 16), the
//   embedding of a quantized table, each naming it.
// Exits 77 (skip) without a GPU.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "core/common.h"
#include "io/dtype.h"
#include "op_util.h"
#include "test.h"

static struct backend *cpu, *gpu;
static int compared; // results compared: a run that compared none fails

static const enum wfmt fmts[] = {WF_FP8, WF_FP8_B128, WF_NVFP4};
static const char *qname(enum wfmt f) { // as --quantization names them
    return f == WF_FP8 ? "fp8" : f == WF_FP8_B128 ? "fp8_block" : "nvfp4";
}

static void *dev_copy(const void *h, size_t bytes) {
    void *d = gpu->ops->alloc(gpu, bytes);
    gpu->ops->upload(gpu, d, h, bytes);
    return d;
}

static void wfree(struct backend *be, struct weight *w) {
    be->ops->free(be, w->data);
    if (w->scale) be->ops->free(be, w->scale);
    if (w->bscale) be->ops->free(be, w->bscale);
    if (w->bias) be->ops->free(be, w->bias);
    memset(w, 0, sizeof *w);
}

// The same dummy quantized weight on both backends; the GPU's scratch
// reserved for `rows` rows (as a model's load does).
static void make_pair(enum wfmt f, int64_t N, int64_t K, uint64_t seed, int rows, struct weight *wc,
                      struct weight *wg) {
    CHECK(cpu->ops->weight_alloc(cpu, wc, f, N, K) == 0);
    CHECK(gpu->ops->weight_alloc(gpu, wg, f, N, K) == 0);
    CHECK(cpu->ops->weight_random(cpu, wc, seed, 0.02f) == 0);
    CHECK(gpu->ops->weight_random(gpu, wg, seed, 0.02f) == 0);
    struct op_query q = {.op = OP_MATMUL, .max_tokens = rows, .max_seq_len = 1, .w = wg};
    CHECKF(gpu->ops->supports(gpu, &q) == 0, "%s", vllm_last_error());
}

// A GPU result ydev [n, M] of backend be against the reference's yc: its
// largest error over the largest |yc| within tol (mode: what ran, printed).
// Returns the result, downloaded (the caller frees it).
static float *compare(struct backend *be, const char *what, enum wfmt f, int64_t N, int64_t K, int n,
                      const char *mode, double tol, const float *yc, const float *ydev, int64_t M) {
    float *yg = xmalloc(sizeof(float) * (size_t)(n * M));
    be->ops->download(be, yg, ydev, sizeof(float) * (size_t)(n * M));
    int bad = 0;
    for (int64_t i = 0; i < n * M; i++) bad |= !isfinite(yg[i]);
    double e = bad ? INFINITY : test_max_rel(yg, yc, (size_t)(n * M));
    printf("  %-14s %-9s [%5lld, %5lld] n=%-4d %s rel err %.2e\n", what, qname(f), (long long)N, (long long)K, n,
           mode, e);
    CHECKF(e <= tol, "%s %s [%lld, %lld] n=%d (%s): %.3g", what, qname(f), (long long)N, (long long)K, n, mode, e);
    compared++;
    return yg;
}
// fp32 mode (the exactness gates) within 1e-5, bf16 mode within 2e-2
static void compare_mode(const char *what, enum wfmt f, int64_t N, int64_t K, int n, const float *yc,
                         const float *ydev, int64_t M) {
    int f32 = gpu->weight_dtype == WF_F32;
    free(compare(gpu, what, f, N, K, n, f32 ? "fp32" : "bf16", f32 ? 1e-5 : 2e-2, yc, ydev, M));
}

static const int row_counts[] = {1, 3, 4, 8, 16, 17, 40, 300, 2048};
#define NROWS ((int)(sizeof row_counts / sizeof row_counts[0]))

// matmul of one format and shape over every row count, in both modes; bias
// on at every other row count.
static void test_matmul(enum wfmt f, int64_t N, int64_t K, uint64_t seed) {
    struct weight wc, wg;
    make_pair(f, N, K, seed, 2048, &wc, &wg);
    float *bias = test_rnd((size_t)N, 0.5f), *bias_d = dev_copy(bias, sizeof(float) * N);
    for (int i = 0; i < NROWS; i++) {
        int n = row_counts[i], with_bias = i % 2;
        float *x = test_rnd((size_t)(n * K), 1), *yc = xmalloc(sizeof(float) * (size_t)(n * N));
        float *xd = dev_copy(x, sizeof(float) * (size_t)(n * K)), *yd = gpu->ops->alloc(gpu, sizeof(float) * n * N);
        cpu->ops->matmul(cpu, yc, x, &wc, n);
        for (int t = 0; with_bias && t < n; t++)
            for (int64_t r = 0; r < N; r++) yc[t * N + r] += bias[r]; // the reference op's bias, once
        wg.bias = with_bias ? bias_d : NULL;
        for (int mode = 0; mode < 2; mode++) {
            gpu->weight_dtype = mode ? WF_BF16 : WF_F32;
            gpu->ops->matmul(gpu, yd, xd, &wg, n);
            compare_mode(with_bias ? "matmul+bias" : "matmul", f, N, K, n, yc, yd, N);
        }
        gpu->ops->free(gpu, xd), gpu->ops->free(gpu, yd);
        free(x), free(yc);
    }
    // x not 16-byte aligned: the any-shape GEMV (1 and 5 rows)
    for (int n = 1; n <= 5; n += 4) {
        float *x = test_rnd((size_t)(n * K), 1), *yc = xmalloc(sizeof(float) * (size_t)(n * N));
        float *xd = gpu->ops->alloc(gpu, sizeof(float) * (n * K + 1)), *yd = gpu->ops->alloc(gpu, sizeof(float) * n * N);
        gpu->ops->upload(gpu, xd + 1, x, sizeof(float) * (size_t)(n * K));
        cpu->ops->matmul(cpu, yc, x, &wc, n);
        wg.bias = NULL;
        gpu->weight_dtype = WF_F32;
        gpu->ops->matmul(gpu, yd, xd + 1, &wg, n);
        compare_mode("matmul x+4B", f, N, K, n, yc, yd, N);
        gpu->ops->free(gpu, xd), gpu->ops->free(gpu, yd);
        free(x), free(yc);
    }
    wg.bias = bias_d; // freed with the weight
    wfree(cpu, &wc), wfree(gpu, &wg);
    free(bias);
}

// matmul_act_mul: W [2I, K] gate | up; the reference op's out [n, I]. 1-4
// rows: k_gemv_qw's gated epilogue (4 x 16384 columns: x read in place, not
// staged).
static void test_act_mul(enum wfmt f, int64_t I, int64_t K, enum act kind) {
    struct weight wc, wg;
    make_pair(f, 2 * I, K, 77 + kind, 300, &wc, &wg);
    const int ns[] = {1, 3, 4, 8, 17, 300};
    for (int i = 0; i < 6; i++) {
        int n = ns[i];
        float *x = test_rnd((size_t)(n * K), 1), *oc = xmalloc(sizeof(float) * (size_t)(n * I));
        float *guc = xmalloc(sizeof(float) * (size_t)(n * 2 * I));
        float *xd = dev_copy(x, sizeof(float) * (size_t)(n * K)), *od = gpu->ops->alloc(gpu, sizeof(float) * n * I);
        float *gud = gpu->ops->alloc(gpu, sizeof(float) * n * 2 * I);
        cpu->ops->matmul_act_mul(cpu, kind, oc, x, &wc, n, guc);
        for (int mode = 0; mode < 2; mode++) {
            gpu->weight_dtype = mode ? WF_BF16 : WF_F32;
            gpu->ops->matmul_act_mul(gpu, kind, od, xd, &wg, n, gud);
            compare_mode(kind == ACT_SILU ? "act_mul silu" : "act_mul relu2", f, 2 * I, K, n, oc, od, I);
        }
        gpu->ops->free(gpu, xd), gpu->ops->free(gpu, od), gpu->ops->free(gpu, gud);
        free(x), free(oc), free(guc);
    }
    wfree(cpu, &wc), wfree(gpu, &wg);
}

// matmul_act: W [N, K], the reference op's out [n, N] = act(x W^T); 1-4
// rows: k_gemv_qw's epilogue, else matmul then act.
static void test_act(enum wfmt f, int64_t N, int64_t K, enum act kind) {
    struct weight wc, wg;
    make_pair(f, N, K, 91 + kind, 17, &wc, &wg);
    const int ns[] = {1, 2, 4, 17};
    for (int i = 0; i < 4; i++) {
        int n = ns[i];
        float *x = test_rnd((size_t)(n * K), 1), *oc = xmalloc(sizeof(float) * (size_t)(n * N));
        float *xd = dev_copy(x, sizeof(float) * (size_t)(n * K)), *od = gpu->ops->alloc(gpu, sizeof(float) * n * N);
        cpu->ops->matmul_act(cpu, kind, oc, x, &wc, n);
        for (int mode = 0; mode < 2; mode++) {
            gpu->weight_dtype = mode ? WF_BF16 : WF_F32;
            gpu->ops->matmul_act(gpu, kind, od, xd, &wg, n);
            compare_mode(kind == ACT_SILU ? "act silu" : "act relu2", f, N, K, n, oc, od, N);
        }
        gpu->ops->free(gpu, xd), gpu->ops->free(gpu, od);
        free(x), free(oc);
    }
    wfree(cpu, &wc), wfree(gpu, &wg);
}

// Every code (and NVFP4 block scale) of format f at every row of one column:
// code (r + 7c) mod 256 (NVFP4: nibble (r + c) mod 16, block scale
// (r + 5 * block) mod 256), the two e4m3 NaNs made 0x7e / 0xfe; row scales in
// [0.5, 2). One-hot rows of x pick columns: y [b][r] must be W[r][c_b] as
// wfmt_dequant makes it (fp32 mode), or that value rounded to bf16.
static void test_exact(enum wfmt f, int64_t K) {
    const int64_t N = 256;
    size_t rb = wfmt_bytes(f, K);
    int64_t g = wfmt_scale_cols(f, K), nb = f == WF_NVFP4 ? K / WF_NVFP4_GROUP : 0;
    uint8_t *codes = xcalloc((size_t)N, rb), *bs = xcalloc((size_t)(N * nb + 1), 1);
    float *sc = xmalloc(sizeof(float) * (size_t)(N * g));
    for (int64_t r = 0; r < N; r++) {
        for (int64_t c = 0; c < K; c++) {
            if (f == WF_NVFP4) codes[r * rb + c / 2] |= (uint8_t)(((r + c) % 16) << (4 * (c & 1)));
            else codes[r * rb + c] = (uint8_t)((r + 7 * c) % 256);
            if (f != WF_NVFP4 && (codes[r * rb + c] & 0x7f) == 0x7f) codes[r * rb + c] ^= 1;
        }
        for (int64_t b = 0; b < nb; b++) {
            bs[r * nb + b] = (uint8_t)((r + 5 * b) % 256);
            if ((bs[r * nb + b] & 0x7f) == 0x7f) bs[r * nb + b] ^= 1;
        }
        for (int64_t k = 0; k < g; k++) sc[r * g + k] = 0.5f + 1.5f * (float)((r * 37 + k * 11) % 101) / 101;
    }
    struct weight wg;
    CHECK(gpu->ops->weight_alloc(gpu, &wg, f, N, K) == 0);
    CHECK(gpu->ops->weight_upload_raw(gpu, &wg, 0, N, codes, f, K) == 0);
    weight_upload_scales(gpu, &wg, 0, N, sc, bs);
    struct op_query q = {.op = OP_MATMUL, .max_tokens = 80, .max_seq_len = 1, .w = &wg};
    CHECK(gpu->ops->supports(gpu, &q) == 0);
    const int ns[] = {1, 16, 40, 80}; // bf16 mode up to 64: the tensor-core GEMV (FP8 at 1: the GEMV); else the GEMM
    for (int i = 0; i < 4; i++) {
        int n = ns[i];
        float *x = xcalloc((size_t)(n * K), sizeof(float)), *y = xmalloc(sizeof(float) * (size_t)(n * N));
        int64_t col[80];
        for (int b = 0; b < n; b++) col[b] = (b * 131 + 3) % K, x[b * K + col[b]] = 1;
        float *xd = dev_copy(x, sizeof(float) * (size_t)(n * K)), *yd = gpu->ops->alloc(gpu, sizeof(float) * n * N);
        for (int mode = 0; mode < 2; mode++) {
            gpu->weight_dtype = mode ? WF_BF16 : WF_F32;
            int qmma = mode && K % 64 == 0 && n > 4 && n <= 64; // exact too: x 2^sh in fp16, the sums scaled back
            gpu->ops->matmul(gpu, yd, xd, &wg, n);
            gpu->ops->download(gpu, y, yd, sizeof(float) * (size_t)(n * N));
            int64_t wrong = 0, first = -1;
            for (int b = 0; b < n; b++)
                for (int64_t r = 0; r < N; r++) {
                    float v = wfmt_dequant(f, codes, sc, bs, K, r, col[b]);
                    if (mode && !qmma && n > 4) v = bf16_to_f32(f32_to_bf16(v)); // the GEMM's (the GEMV's is fp32)
                    if (y[b * N + r] != v && first < 0) first = b * N + r;
                    wrong += y[b * N + r] != v;
                }
            printf("  exact          %-9s [%5lld, %5lld] n=%-4d %s: %lld of %lld values differ\n", qname(f),
                   (long long)N, (long long)K, n, mode ? "bf16" : "fp32", (long long)wrong, (long long)(n * N));
            CHECKF(wrong == 0, "exact %s K=%lld n=%d (%s mode): %lld values differ, first y[%lld][%lld] = %a",
                   qname(f), (long long)K, n, mode ? "bf16" : "fp32", (long long)wrong,
                   (long long)(first / N), (long long)(first % N), first < 0 ? 0.0 : y[first]);
            compared++;
        }
        gpu->ops->free(gpu, xd), gpu->ops->free(gpu, yd);
        free(x), free(y);
    }
    wfree(gpu, &wg);
    free(codes), free(bs), free(sc);
}

// The bf16 mode's tensor-core GEMV (cuda_qmma.cuh) against the reference:
// x is rounded to fp16 after a power-of-two scaling per row (exact), so each
// x value is off by at most 2^-11 of itself, products are exact and the sums
// fp32: |y - y_ref| <= (2^-11 + K 2^-24) sum_k |w_k x_k|. With these random
// weights and x (signs random) the error is ~2^-11 / sqrt(3) of the root of
// sum_k w_k^2 x_k^2, about 1e-4 of the largest |y| at K 2688; the bound
// checked is QMMA_TOL, 10x the bf16 GEMM's 2e-3 measured error below the 2e-2
// allowed the bf16 mode. Rows 5..64 (a pass of up to 8 tiles of 8), bias on
// at every other row count; 1-3 rows and K % 64 != 0 run the other paths
// (the streaming fp32 GEMV up to 4 rows: 1e-5; else dequantized to bf16:
// 2e-2).
#define QMMA_TOL 2e-3
static void test_qmma(enum wfmt f, int64_t N, int64_t K, uint64_t seed) {
    static const int ns[] = {1, 2, 3, 5, 8, 9, 16, 33, 64};
    struct weight wc, wg;
    gpu->weight_dtype = WF_BF16;
    make_pair(f, N, K, seed, 64, &wc, &wg);
    float *bias = test_rnd((size_t)N, 0.5f), *bias_d = dev_copy(bias, sizeof(float) * N);
    for (int i = 0; i < (int)(sizeof ns / sizeof ns[0]); i++) {
        int n = ns[i], with_bias = i % 2, qmma = K % 64 == 0 && n > 4;
        float *x = test_rnd((size_t)(n * K), 1), *yc = xmalloc(sizeof(float) * (size_t)(n * N));
        float *xd = dev_copy(x, sizeof(float) * (size_t)(n * K)), *yd = gpu->ops->alloc(gpu, sizeof(float) * n * N);
        cpu->ops->matmul(cpu, yc, x, &wc, n);
        for (int t = 0; with_bias && t < n; t++)
            for (int64_t r = 0; r < N; r++) yc[t * N + r] += bias[r];
        wg.bias = with_bias ? bias_d : NULL;
        gpu->ops->matmul(gpu, yd, xd, &wg, n);
        free(compare(gpu, with_bias ? "qmma+bias" : "qmma", f, N, K, n, qmma ? "bf16 mma" : n <= 4 ? "bf16 gemv" : "bf16 old",
                     qmma ? QMMA_TOL : n <= 4 ? 1e-5 : 2e-2, yc, yd, N));
        gpu->ops->free(gpu, xd), gpu->ops->free(gpu, yd);
        free(x), free(yc);
    }
    wg.bias = bias_d;
    wfree(cpu, &wc), wfree(gpu, &wg);
    free(bias);
    gpu->weight_dtype = WF_F32;
}

// W8A8 (the default in bf16 mode): WF_FP8 above 64 rows on FP8 tensor cores, x
// quantized per token. Bound 5e-2 of the largest |y| (emulated on the host
// with these weights and x: 2.5e-2 at K 1856..4096; the dequantized bf16
// GEMM: 2.5e-3). Its result must differ from the dequantized path's: equal,
// cuBLASLt refused the FP8 GEMM and it fell back (stderr says so).
static void test_w8a8(void) {
    struct backend *g8 = NULL;
    CHECK(backend_create("cuda", 0, DT_F32, &g8) == 0); // W8A8: the default
    g8->weight_dtype = gpu->weight_dtype = WF_BF16;
    const int64_t shapes[][2] = {{10304, 2688}, {2688, 4096}, {2688, 1856}};
    const int ns[] = {65, 128, 300, 2048}; // up to 64: the tensor-core GEMV (test_qmma)
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        struct weight wc, wg, w8;
        make_pair(WF_FP8, N, K, 300 + s, 2048, &wc, &wg);
        CHECK(g8->ops->weight_alloc(g8, &w8, WF_FP8, N, K) == 0);
        CHECK(g8->ops->weight_random(g8, &w8, 300 + s, 0.02f) == 0);
        struct op_query q = {.op = OP_MATMUL, .max_tokens = 2048, .max_seq_len = 1, .w = &w8};
        CHECK(g8->ops->supports(g8, &q) == 0);
        for (int i = 0; i < 4; i++) {
            int n = ns[i];
            float *x = test_rnd((size_t)(n * K), 1), *yc = xmalloc(sizeof(float) * (size_t)(n * N));
            float *xd = dev_copy(x, sizeof(float) * (size_t)(n * K)), *yd = gpu->ops->alloc(gpu, sizeof(float) * n * N);
            float *x8 = g8->ops->alloc(g8, sizeof(float) * n * K), *y8 = g8->ops->alloc(g8, sizeof(float) * n * N);
            g8->ops->upload(g8, x8, x, sizeof(float) * (size_t)(n * K));
            cpu->ops->matmul(cpu, yc, x, &wc, n);
            gpu->ops->matmul(gpu, yd, xd, &wg, n);
            g8->ops->matmul(g8, y8, x8, &w8, n);
            float *a = compare(gpu, "matmul", WF_FP8, N, K, n, "bf16", 2e-2, yc, yd, N);
            float *b = compare(g8, "matmul", WF_FP8, N, K, n, "w8a8", 5e-2, yc, y8, N);
            CHECKF(memcmp(a, b, sizeof(float) * (size_t)(n * N)), "W8A8 [%lld, %lld] n=%d: the dequantized path's "
                   "result (cuBLASLt refused the FP8 GEMM?)", (long long)N, (long long)K, n);
            gpu->ops->free(gpu, xd), gpu->ops->free(gpu, yd), g8->ops->free(g8, x8), g8->ops->free(g8, y8);
            free(x), free(yc), free(a), free(b);
        }
        wfree(cpu, &wc), wfree(gpu, &wg), wfree(g8, &w8);
    }
    backend_free(g8);
}

static void test_refusals(void) {
    struct weight w;
    int rc = gpu->ops->weight_alloc(gpu, &w, WF_NVFP4, 256, 1000);
    const char *msg = vllm_last_error();
    CHECKF(rc != 0 && msg && strstr(msg, "nvfp4"), "an nvfp4 weight of 1000 columns: refused naming it (got %s)",
           rc ? msg : "success");
    for (int i = 0; i < 3; i++) {
        CHECK(gpu->ops->weight_alloc(gpu, &w, fmts[i], 64, 256) == 0);
        struct op_query q = {.op = OP_EMBED, .max_tokens = 16, .max_seq_len = 1, .w = &w};
        rc = gpu->ops->supports(gpu, &q);
        msg = vllm_last_error();
        CHECKF(rc != 0 && msg && strstr(msg, wfmt_name(fmts[i])), "a %s embedding table: refused naming it (got %s)",
               wfmt_name(fmts[i]), rc ? msg : "success");
        wfree(gpu, &w);
    }
}

int main(void) {
    CHECK(cpu_backend_create(0, 1, -1, &cpu) == 0); // the reference ops, every core
    setenv("VLLM_FP8_W8A8", "0", 1); // this backend: FP8 dequantized above the GEMV's rows (test_w8a8: W8A8)
    int rc = backend_create("cuda", 0, DT_F32, &gpu);
    unsetenv("VLLM_FP8_W8A8");
    if (rc) TEST_SKIP("no CUDA device: %s", vllm_last_error());
    // nano30b's linears; odd N with K 16384 (4 rows of x: read in place by the streaming GEMV, not staged)
    const int64_t shapes[][2] = {{10304, 2688}, {2688, 4096}, {3712, 2688}, {2688, 3712},
                                 {2688, 1856},  {101, 16384}, {1000, 1000}};
    for (int i = 0; i < 3; i++)
        for (int s = 0; s < 7; s++) {
            if (fmts[i] == WF_NVFP4 && shapes[s][1] % WF_NVFP4_GROUP) continue; // refused (test_refusals)
            test_matmul(fmts[i], shapes[s][0], shapes[s][1], 11 + 10 * i + s);
        }
    // the tensor-core GEMV: nano30b's in_proj, out_proj, shared up, experts' up and down, h8b-like 4096-wide
    // rows, odd N; K % 64 != 0 (old paths)
    const int64_t qshapes[][2] = {{10304, 2688}, {2688, 4096}, {3712, 2688}, {4096, 4096}, {1856, 2688},
                                  {2688, 1856}, {1001, 2688}, {515, 1000}, {515, 1008}};
    for (int i = 0; i < 3; i++)
        for (int s = 0; s < 9; s++) {
            if (qshapes[s][1] % (fmts[i] == WF_NVFP4 ? WF_NVFP4_GROUP : 1)) continue; // refused
            test_qmma(fmts[i], qshapes[s][0], qshapes[s][1], 500 + 10 * i + s);
        }
    for (int i = 0; i < 3; i++) {
        test_act_mul(fmts[i], 1856, 2688, ACT_RELU2);
        test_act_mul(fmts[i], 768, 2048, ACT_SILU); // Qwen3-30B-A3B's experts' shape, SwiGLU
        test_act_mul(fmts[i], 64, 16384, ACT_SILU);
        test_act(fmts[i], 3712, 2688, ACT_RELU2); // nano30b's shared expert up
        test_act(fmts[i], 515, 16384, ACT_SILU);
        test_exact(fmts[i], 4096);
        test_exact(fmts[i], 1856);
        if (fmts[i] != WF_NVFP4) test_exact(fmts[i], 1000);
    }
    test_w8a8();
    test_refusals();
    CHECKF(compared > 0, "nothing compared");
    backend_free(gpu);
    backend_free(cpu);
    return test_summary("gpu_quant");
}
