// test_cuda_fp8.c - the CUDA weight-only FP8 GEMV (cuda_quant.cu) against the
// CPU reference's matmul of the same name on the same WF_FP8 weight (exact
// dequantization, then fp32 sgemm), at real shapes (Nemotron-3-Nano: hidden
// 2688, Mamba in_proj 10304 x 2688, out_proj 2688 x 4096; a K not a multiple
// of 16 for the any-shape kernel), 1..16 rows (decode) and 40 (passes of 16).
// Tolerance: relative 1e-5 (fp32 accumulation in another order; the scale
// applied to the row's sum). Also: the formats CUDA has no matmul for are
// refused at load (supports), naming the format. Exits 77 (skip) without a GPU.
#include <math.h>

#include "backend/backend.h"
#include "core/common.h"
#include "test.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float *rnd(size_t n) {
    float *x = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        x[i] = (float)((rng >> 11) * 0x1.0p-53 * 2 - 1);
    }
    return x;
}

int main(void) {
    struct backend *cpu = NULL, *gpu = NULL;
    CHECK(backend_create("cpu", 2, DT_F32, &cpu) == 0);
    if (backend_create("cuda", 0, DT_F32, &gpu)) TEST_SKIP("no CUDA device: %s", vllm_last_error());
    const int64_t shapes[][2] = {{10304, 2688}, {2688, 4096}, {1000, 1000}};
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        struct weight wc, wg;
        CHECK(cpu->ops->weight_alloc(cpu, &wc, WF_FP8, N, K) == 0);
        CHECK(gpu->ops->weight_alloc(gpu, &wg, WF_FP8, N, K) == 0);
        CHECK(cpu->ops->weight_random(cpu, &wc, 11 + s, 0.02f) == 0); // the same host-made codes and scales
        CHECK(gpu->ops->weight_random(gpu, &wg, 11 + s, 0.02f) == 0);
        int ns[] = {1, 2, 3, 4, 5, 8, 9, 13, 16, 40};
        for (int k = 0; k < 10; k++) {
            int n = ns[k];
            float *x = rnd((size_t)n * K), *yc = xmalloc(sizeof(float) * n * N), *yg = xmalloc(sizeof(float) * n * N);
            float *xd = gpu->ops->alloc(gpu, sizeof(float) * n * K), *yd = gpu->ops->alloc(gpu, sizeof(float) * n * N);
            gpu->ops->upload(gpu, xd, x, sizeof(float) * n * K);
            cpu->ops->matmul(cpu, yc, x, &wc, n);
            gpu->ops->matmul(gpu, yd, xd, &wg, n);
            gpu->ops->download(gpu, yg, yd, sizeof(float) * n * N);
            double m = 0, sc = 1e-30;
            int bad = 0;
            for (int64_t i = 0; i < (int64_t)n * N; i++) {
                sc = fmax(sc, fabs(yc[i]));
                m = fmax(m, fabs((double)yg[i] - yc[i]));
                bad |= !isfinite(yg[i]);
            }
            double e = bad ? INFINITY : m / sc;
            printf("  fp8 matmul [%lld, %lld] n=%-2d rel err %.2e\n", (long long)N, (long long)K, n, e);
            CHECKF(e <= 1e-5, "fp8 matmul [%lld, %lld] n=%d: %.3g", (long long)N, (long long)K, n, e);
            gpu->ops->free(gpu, xd), gpu->ops->free(gpu, yd);
            free(x), free(yc), free(yg);
        }
        cpu->ops->free(cpu, wc.data), cpu->ops->free(cpu, wc.scale);
        gpu->ops->free(gpu, wg.data), gpu->ops->free(gpu, wg.scale);
    }
    enum wfmt refused[] = {WF_FP8_B128, WF_NVFP4};
    for (int i = 0; i < 2; i++) {
        struct weight w = {.fmt = refused[i], .rows = 256, .cols = 256};
        int rc = gpu->ops->supports(gpu, &(struct op_query){.op = OP_MATMUL, .max_tokens = 4, .w = &w});
        const char *msg = vllm_last_error();
        CHECKF(rc != 0 && msg && strstr(msg, wfmt_name(refused[i])), "%s: refused naming it (got %s)",
               wfmt_name(refused[i]), rc ? msg : "success");
    }
    backend_free(gpu);
    backend_free(cpu);
    return test_summary("gpu_fp8");
}
