// wquant.c - the quantized weight formats' sizes, their exact dequantization
// (the definition every backend's ops are held to), and dummy quantized
// weights made on the host for any backend.
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/common.h"
#include "io/dtype.h"

int wfmt_quantized(enum wfmt f) {
    switch (f) {
    case WF_F32:
    case WF_BF16:
    case WF_F16: return 0;
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: return 1;
    }
    return 0;
}

size_t wfmt_bytes(enum wfmt f, int64_t n) {
    switch (f) {
    case WF_NVFP4: return (size_t)(n + 1) / 2;
    case WF_F32:
    case WF_BF16:
    case WF_F16:
    case WF_FP8:
    case WF_FP8_B128: break;
    }
    return (size_t)n * wfmt_size(f);
}

int64_t wfmt_scale_cols(enum wfmt f, int64_t cols) {
    switch (f) {
    case WF_F32:
    case WF_BF16:
    case WF_F16: return 0;
    case WF_FP8:
    case WF_NVFP4: return 1;
    case WF_FP8_B128: return (cols + WF_B128 - 1) / WF_B128;
    }
    return 0;
}

int64_t wfmt_weight_bytes(enum wfmt f, int64_t rows, int64_t cols) {
    int64_t b = rows * (int64_t)wfmt_bytes(f, cols) + rows * wfmt_scale_cols(f, cols) * 4;
    if (f == WF_NVFP4) b += rows * (cols / WF_NVFP4_GROUP);
    return b;
}

float wfmt_dequant(enum wfmt f, const uint8_t *codes, const float *scale, const uint8_t *bscale, int64_t cols,
                   int64_t r, int64_t c) {
    switch (f) {
    case WF_FP8: return fp8e4m3_to_f32(codes[r * cols + c]) * scale[r];
    case WF_FP8_B128: return fp8e4m3_to_f32(codes[r * cols + c]) * scale[r * wfmt_scale_cols(f, cols) + c / WF_B128];
    case WF_NVFP4: {
        uint8_t b = codes[r * (cols / 2) + c / 2], code = (c & 1) ? b >> 4 : b & 15;
        float block = fp8e4m3_to_f32(bscale[r * (cols / WF_NVFP4_GROUP) + c / WF_NVFP4_GROUP]);
        return (e2m1_to_f32(code) * block) * scale[r];
    }
    case WF_F32:
    case WF_BF16:
    case WF_F16: break;
    }
    return NAN;
}

void weight_upload_scales(struct backend *be, struct weight *w, int64_t row0, int64_t n, const float *scale,
                          const uint8_t *bscale) {
    int64_t g = wfmt_scale_cols(w->fmt, w->cols);
    if (g) be->ops->upload(be, w->scale + row0 * g, scale, sizeof(float) * (size_t)(n * g));
    if (w->fmt == WF_NVFP4) {
        int64_t nb = w->cols / WF_NVFP4_GROUP;
        be->ops->upload(be, w->bscale + row0 * nb, bscale, (size_t)(n * nb));
    }
}

// One row of values v [cols] into codes and scales of format f.
static void quantize_row(enum wfmt f, const float *v, int64_t cols, uint8_t *codes, float *scale, uint8_t *bscale) {
    int64_t g = f == WF_FP8_B128 ? WF_B128 : cols;
    switch (f) {
    case WF_FP8:
    case WF_FP8_B128:
        for (int64_t c0 = 0, k = 0; c0 < cols; c0 += g, k++) {
            float amax = 0;
            for (int64_t c = c0; c < MIN(cols, c0 + g); c++) amax = fmaxf(amax, fabsf(v[c]));
            float s = amax > 0 ? amax / 448.0f : 1.0f;
            scale[k] = s;
            for (int64_t c = c0; c < MIN(cols, c0 + g); c++) codes[c] = f32_to_fp8e4m3(v[c] / s);
        }
        return;
    case WF_NVFP4: { // ModelOpt's two levels: s2 = amax / (6 * 448), block scale = e4m3(block amax / 6 / s2)
        float amax = 0;
        for (int64_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(v[c]));
        float s2 = amax > 0 ? amax / (6.0f * 448.0f) : 1.0f;
        scale[0] = s2;
        memset(codes, 0, (size_t)cols / 2);
        for (int64_t b = 0; b < cols / WF_NVFP4_GROUP; b++) {
            float bmax = 0;
            for (int k = 0; k < WF_NVFP4_GROUP; k++) bmax = fmaxf(bmax, fabsf(v[b * WF_NVFP4_GROUP + k]));
            uint8_t bs = f32_to_fp8e4m3(bmax / 6.0f / s2);
            float d = fp8e4m3_to_f32(bs) * s2;
            bscale[b] = bs;
            for (int k = 0; k < WF_NVFP4_GROUP; k++) {
                int64_t c = b * WF_NVFP4_GROUP + k;
                uint8_t q = d > 0 ? f32_to_e2m1(v[c] / d) : 0;
                codes[c / 2] |= (uint8_t)((c & 1) ? q << 4 : q);
            }
        }
        return;
    }
    case WF_F32:
    case WF_BF16:
    case WF_F16: return;
    }
}

// Dummy quantized weights: uniform values of standard deviation std,
// quantized on the host by every core (an 8B model's weights are billions of
// values), a block of rows a thread, then uploaded. Each row has its own
// random stream, so the values do not depend on the thread count.
struct wq_job {
    enum wfmt fmt;
    int64_t row0, n, cols, g, nb;
    size_t rb;
    uint64_t seed;
    float a;
    uint8_t *codes, *bs;
    float *sc, *v;
};

static void *wq_run(void *arg) {
    const struct wq_job *j = arg;
    for (int64_t i = 0; i < j->n; i++) {
        uint64_t x = (j->seed ^ ((uint64_t)(j->row0 + i) + 1) * 0x9E3779B97F4A7C15ull) | 1;
        for (int64_t c = 0; c < j->cols; c++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            j->v[c] = j->a * (float)(int32_t)(x >> 32);
        }
        quantize_row(j->fmt, j->v, j->cols, j->codes + i * j->rb, j->sc + i * j->g, j->bs + i * j->nb);
    }
    return NULL;
}

int weight_random_quant(struct backend *be, struct weight *w, uint64_t seed, float std) {
    enum { MAX_THREADS = 32 };
    int64_t rows = w->rows, cols = w->cols, per = MAX(1, (1 << 20) / MAX(cols, 1));
    int64_t g = wfmt_scale_cols(w->fmt, cols), nb = w->fmt == WF_NVFP4 ? cols / WF_NVFP4_GROUP : 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = (int)MIN(MAX_THREADS, MAX(1, MIN(cores, CDIV(rows, per))));
    size_t rb = wfmt_bytes(w->fmt, cols);
    struct wq_job jobs[MAX_THREADS];
    float *sc = xmalloc(sizeof(float) * (size_t)(nt * per * g)), *v = xmalloc(sizeof(float) * (size_t)(nt * cols));
    uint8_t *codes = xmalloc(rb * (size_t)(nt * per)), *bs = xmalloc((size_t)(nt * per * nb) + 1);
    int rc = VLLM_OK;
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += nt * per) {
        pthread_t th[MAX_THREADS];
        unsigned started = 0;
        for (int t = 0; t < nt; t++) {
            int64_t a = r0 + t * per;
            jobs[t] = (struct wq_job){w->fmt, a, MAX(0, MIN(per, rows - a)), cols, g, nb, rb, seed,
                                      std * 1.7320508f * 0x1.0p-31f, codes + (size_t)(t * per) * rb,
                                      bs + t * per * nb, sc + t * per * g, v + t * cols};
            if (jobs[t].n == 0) continue;
            if (t > 0 && !pthread_create(&th[t], NULL, wq_run, &jobs[t])) started |= 1u << t;
            else if (t > 0) wq_run(&jobs[t]); // no thread: do it here
        }
        if (jobs[0].n) wq_run(&jobs[0]);
        for (int t = 1; t < nt; t++)
            if (started & (1u << t)) pthread_join(th[t], NULL);
        int64_t n = MIN(nt * per, rows - r0);
        rc = be->ops->weight_upload_raw(be, w, r0, n, codes, w->fmt, cols);
        if (!rc) weight_upload_scales(be, w, r0, n, sc, bs);
    }
    free(v), free(sc), free(codes), free(bs);
    return rc;
}
