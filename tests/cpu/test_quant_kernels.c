// test_quant_kernels.c - the fast path's quantized-weight kernels (WF_FP8,
// WF_FP8_B128, WF_NVFP4: codes dequantized in registers, fp32 arithmetic)
// against the reference ops (exact dequantization to fp32, then sgemm), for
// every kernel set this CPU runs: matmul over 1..40 rows (the few-row kernel
// up to the set's mm_q_rows, 8 or on AVX2 12 for FP8 and 11 for FP8 blocks,
// then dequantized chunks through the fp32 GEMM), a column range
// (as the MoE and tensor-parallel paths call it), and routed experts with
// quantized up / down at decode and prefill sizes. Shapes have a column tail
// (301: not a multiple of 16; FP8 only, NVFP4 needs multiples of 16) and
// several 128-column scale blocks. FP8 also runs every finite e4m3 code,
// subnormals included, through the kernels (test_fp8_codes).
//
// Tolerance: max |fast - ref| / max |ref| <= 2e-5 (summation order, and the
// fast kernels apply a row's or block's scale to its partial sum).
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"
#include "op_util.h"
#include "test.h"

#define TOL 2e-5

static struct backend *ref, *fast;
static const char *isa;
static long values;

static void cmp(const char *what, const float *got, const float *want, size_t n) {
    double m = 0, s = 1e-30;
    int bad = n == 0;
    for (size_t i = 0; i < n; i++) {
        s = fmax(s, fabs(want[i]));
        if (!isfinite(got[i])) bad = 1;
        m = fmax(m, fabs((double)got[i] - want[i]));
    }
    double e = bad ? INFINITY : m / s;
    CHECKF(e <= TOL, "%s %s: rel err %.3g > %.0g over %zu values", isa, what, e, TOL, n);
    values += (long)n;
}

static void free_w(struct backend *be, struct weight *w) {
    be->ops->free(be, w->scale), be->ops->free(be, w->bscale);
    free(w->data); // the fast path's weights are aligned_alloc'd, the reference's calloc'd
}

// The same dummy codes and scales on both backends (weight_random_quant).
static int make(enum wfmt f, int64_t N, int64_t K, uint64_t seed, struct weight *wr, struct weight *wf) {
    if (ref->ops->weight_alloc(ref, wr, f, N, K) || fast->ops->weight_alloc(fast, wf, f, N, K)) return -1;
    if (ref->ops->weight_random(ref, wr, seed, 0.5f) || fast->ops->weight_random(fast, wf, seed, 0.5f)) return -1;
    CHECK(!memcmp(wr->data, wf->data, (size_t)N * wfmt_bytes(f, K)));
    return 0;
}

static void test_matmul(enum wfmt f) {
    const int64_t shapes[][2] = {{37, f == WF_NVFP4 ? 304 : 301}, {200, 1024}, {130, 48}};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        struct weight wr, wf;
        CHECK(make(f, N, K, 77 + s, &wr, &wf) == 0);
        for (int n = 1; n <= 40; n++) {
            float *x = test_rnd((size_t)n * K, 1), *y1 = test_rnd((size_t)n * N, 1), *y2 = test_rnd((size_t)n * N, 1);
            char what[96];
            snprintf(what, sizeof what, "%s matmul [%lld, %lld] n=%d", wfmt_name(f), (long long)N, (long long)K, n);
            ref->ops->matmul(ref, y1, x, &wr, n);
            fast->ops->matmul(fast, y2, x, &wf, n);
            cmp(what, y2, y1, (size_t)n * N);
            if (n == 1 || n == 9 || n == 40) { // output columns [5, N - 3), y rows N apart
                float *y3 = test_rnd((size_t)n * N, 1), *y4 = xmalloc(sizeof(float) * (size_t)n * (N - 8));
                fast_matmul_cols(fast, y3, N, x, K, n, &wf, 5, N - 3);
                for (int i = 0; i < n; i++)
                    for (int64_t c = 5; c < N - 3; c++) y4[(int64_t)i * (N - 8) + c - 5] = y3[(int64_t)i * N + c - 5];
                float *want = xmalloc(sizeof(float) * (size_t)n * (N - 8));
                for (int i = 0; i < n; i++)
                    for (int64_t c = 5; c < N - 3; c++) want[(int64_t)i * (N - 8) + c - 5] = y1[(int64_t)i * N + c];
                snprintf(what, sizeof what, "%s matmul columns [5, %lld) n=%d", wfmt_name(f), (long long)N - 3, n);
                cmp(what, y4, want, (size_t)n * (N - 8));
                free(y3), free(y4), free(want);
            }
            free(x), free(y1), free(y2);
        }
        free_w(ref, &wr), free_w(fast, &wf);
    }
}

// Every finite e4m3 code through the kernels, against the reference, each
// row starting at a different code: all 254 (NaN, 0x7f / 0xff, left out: it
// would make every sum NaN), then only the 30 smallest, subnormals 0x01-0x07
// and the first two binades and their negatives (beside 448 an error in a
// subnormal is below the tolerance). The random weights above almost never
// hold a subnormal (|v| < scale / 64). K: three 64-code blocks of the table
// kernel, a 16-code step and a masked tail (229), and 300 (a 128-column scale
// block cut short); rows 1, 5, 9 of x (the few-row kernels, then the
// dequantized chunks).
static void test_fp8_codes(enum wfmt f) {
    const int64_t Ks[] = {229, 300};
    for (int small = 0; small < 2; small++)
        for (int s = 0; s < 2; s++) {
            int64_t N = 70, K = Ks[s];
            struct weight wr, wf;
            CHECK(make(f, N, K, 91 + s, &wr, &wf) == 0);
            uint8_t *codes = xmalloc((size_t)(N * K));
            for (int64_t i = 0; i < N * K; i++) {
                int j = (int)((i / K * 37 + i % K) % (small ? 30 : 254));
                if (small) codes[i] = (uint8_t)(j < 15 ? j + 1 : 0x80 + j - 14); // 1..15, 0x81..0x8f
                else codes[i] = (uint8_t)(j < 127 ? j : j + 1);                // 0..0xfe but 0x7f
            }
            CHECK(ref->ops->weight_upload_raw(ref, &wr, 0, N, codes, f, K) == 0);
            CHECK(fast->ops->weight_upload_raw(fast, &wf, 0, N, codes, f, K) == 0);
            for (int n = 1; n <= 9; n += 4) {
                float *x = test_rnd((size_t)n * K, 1), *y1 = test_rnd((size_t)n * N, 1), *y2 = test_rnd((size_t)n * N, 1);
                char what[96];
                snprintf(what, sizeof what, "%s %s codes [%lld, %lld] n=%d", wfmt_name(f), small ? "small" : "every",
                         (long long)N, (long long)K, n);
                ref->ops->matmul(ref, y1, x, &wr, n);
                fast->ops->matmul(fast, y2, x, &wf, n);
                cmp(what, y2, y1, (size_t)n * N);
                free(x), free(y1), free(y2);
            }
            free(codes);
            free_w(ref, &wr), free_w(fast, &wf);
        }
}

static void test_moe(enum wfmt f) {
    int E = 6, I = 32, L = 272, top_k = 2, ns[] = {1, 3, 96};
    for (int gated = 0; gated < 2; gated++) {
        int U = gated ? 2 * I : I;
        struct moe_experts wr = {.num_experts = E, .inter = I, .dim = L, .gated = gated, .act = gated ? ACT_SILU : ACT_RELU2};
        struct moe_experts wf = wr;
        CHECK(make(f, (int64_t)E * U, L, 5, &wr.up, &wf.up) == 0);
        CHECK(make(f, (int64_t)E * L, I, 6, &wr.down, &wf.down) == 0);
        CHECK(fast->ops->supports(fast, &(struct op_query){.op = OP_MOE_EXPERTS, .max_tokens = 96, .moe = &wf,
                                                             .route = &(struct moe_route_cfg){.top_k = top_k}}) == 0);
        for (int k = 0; k < 3; k++) {
            int n = ns[k];
            float *x = test_rnd((size_t)n * L, 1), *wt = test_rnd((size_t)n * top_k, 1);
            int32_t *ids = xmalloc(sizeof(int32_t) * n * top_k);
            for (int t = 0; t < n; t++) ids[t * 2] = t % 3, ids[t * 2 + 1] = 3 + t % 2 * 2;
            float *o1 = test_rnd((size_t)n * L, 1), *o2 = test_rnd((size_t)n * L, 1);
            char what[96];
            snprintf(what, sizeof what, "%s moe_experts%s n=%d", wfmt_name(f), gated ? " gated" : "", n);
            fast->ops->moe_experts(fast, o2, x, &wf, ids, wt, n, top_k, NULL);
            ref->ops->moe_experts(ref, o1, x, &wr, ids, wt, n, top_k, NULL);
            cmp(what, o2, o1, (size_t)n * L);
            free(x), free(wt), free(ids), free(o1), free(o2);
        }
        free_w(ref, &wr.up), free_w(ref, &wr.down), free_w(fast, &wf.up), free_w(fast, &wf.down);
    }
}

int main(void) {
    int best = fast_detect(), runs = 0;
    printf("this CPU: %s\n", fast_isa_name(best));
    for (int i = FAST_SCALAR; i <= best; i++) {
        CHECK(cpu_backend_create(2, 1, -1, &ref) == 0);
        CHECK(cpu_backend_create(2, 0, i, &fast) == 0);
        isa = fast_isa_name(i);
        values = 0;
        enum wfmt fmts[] = {WF_FP8, WF_FP8_B128, WF_NVFP4};
        for (int k = 0; k < 3; k++) {
            test_matmul(fmts[k]);
            if (fmts[k] != WF_NVFP4) test_fp8_codes(fmts[k]);
            test_moe(fmts[k]);
        }
        printf("%-12s %ld values compared against the reference (kernel %s)\n", isa, values, fast_k(fast)->name);
        CHECKF(values > 0, "%s: nothing compared", isa);
        backend_free(fast);
        backend_free(ref);
        runs++;
    }
    CHECK(runs >= 1);
    return test_summary("cpu_quant_kernels");
}
