// fast_quant.c - the fast path's quantized weights (WF_FP8, WF_FP8_B128,
// WF_NVFP4): kept row-major as the reference keeps them, dequantized inside
// the kernels (1 or 0.5 bytes per weight read), fp32 arithmetic. The
// portable kernels here; AVX-512 ones in fast_quant_avx512.c.
#include <cblas.h>
#undef I // complex.h's imaginary unit, pulled in by cblas.h

#include "backend/cpu/fast.h"
#include "core/common.h"
#include "io/dtype.h"

float fast_fp8_lut[256];

void fast_fp8_lut_init(void) {
    for (int i = 0; i < 256; i++) fast_fp8_lut[i] = fp8e4m3_to_f32((uint8_t)i);
}

// Row r of w, columns [0, K), as fp32 into dst: the products the kernels
// form are of these values (the scale applied per row or block after the
// sum in the fast kernels; before it here and in the reference).
static void deq_row(float *dst, const struct weight *w, int64_t r) {
    for (int64_t k = 0; k < w->cols; k++) dst[k] = wfmt_dequant(w->fmt, w->data, w->scale, w->bscale, w->cols, r, k);
}

void fast_deq_q_scalar(float *dst, const struct weight *w, int64_t r0, int64_t nr) {
    for (int64_t r = 0; r < nr; r++) deq_row(dst + r * w->cols, w, r0 + r);
}

void fast_mm_q_scalar(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                      int64_t c1) {
    int64_t K = w->cols;
    float row[4096], *wr = K <= 4096 ? row : xmalloc(sizeof(float) * (size_t)K);
    for (int64_t c = c0; c < c1; c++) {
        deq_row(wr, w, c);
        for (int i = 0; i < m; i++) {
            const float *xr = x + (int64_t)i * ldx;
            float acc[8] = {0};
            int64_t k = 0;
            for (; k + 8 <= K; k += 8)
                for (int l = 0; l < 8; l++) acc[l] += xr[k + l] * wr[k + l];
            float s = 0;
            for (int l = 0; l < 8; l++) s += acc[l];
            for (; k < K; k++) s += xr[k] * wr[k];
            y[(int64_t)i * ldy + c - c0] = s;
        }
    }
    if (wr != row) free(wr);
}

int fast_quant_alloc(struct weight *w) {
    int64_t g = wfmt_scale_cols(w->fmt, w->cols);
    if (w->fmt == WF_NVFP4 && w->cols % WF_NVFP4_GROUP)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "an nvfp4 weight needs columns in multiples of 16, not %lld",
                        (long long)w->cols);
    w->scale = calloc((size_t)MAX(w->rows * g, 1), sizeof(float));
    if (w->fmt == WF_NVFP4) w->bscale = calloc((size_t)MAX(w->rows * (w->cols / WF_NVFP4_GROUP), 1), 1);
    if (!w->scale || (w->fmt == WF_NVFP4 && !w->bscale))
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate the scales of a weight");
    return VLLM_OK;
}

// A many-row product y [n, c1 - c0] = x W^T, with the kernel set's sgemm:
// per pass of QX_ROWS rows of x, x^T packed once as the GEMM's B; per
// chunk of Q_CHUNK weight rows, the rows dequantized to fp32 as its A
// (read in place, unpacked), C = W_chunk x^T [Q_CHUNK, rows] into y
// transposed. (Packing each dequantized chunk as B instead, a transpose
// of Q_CHUNK x K floats a chunk, cost as much as the chunk's GEMM at 64
// rows of x on an AVX2 core.) Q_CHUNK is a multiple of the tiles' rows (6
// on AVX2, 8 on AVX-512), QX_ROWS of their columns (16, 32). 64 rows of x a
// pass ran as fast as 128 (AVX2, 256 x 8192 x 4096) with half the scratch:
// (64 + 48) K floats a thread, besides the chunk's [48, 64] result.
#define Q_CHUNK 48
#define QX_ROWS 64

size_t fast_quant_pack_floats(int64_t K) {
    return fast_sgemm_b_floats(QX_ROWS, (int)K) + (size_t)Q_CHUNK * (K + QX_ROWS) + 32;
}

void fast_mm_q_many(struct backend *be, int thread, float *y, int64_t ldy, const float *x, int64_t ldx, int n,
                    const struct weight *w, int64_t c0, int64_t c1) {
    const struct fast_kern *k = fast_k(be);
    int K = (int)w->cols;
    float *xp = fast_pack_scratch(be, thread, fast_quant_pack_floats(K));
    float *deq = xp + ((fast_sgemm_b_floats(QX_ROWS, K) + 15) & ~(size_t)15), *ct = deq + (size_t)Q_CHUNK * K;
    if (!k->sgemm_pack_b) { // OpenBLAS: each chunk against all of x
        for (int64_t a = c0; a < c1; a += Q_CHUNK) {
            int nc = (int)MIN(Q_CHUNK, c1 - a);
            k->deq_q(deq, w, a, nc);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, nc, K, 1.0f, x, (int)ldx, deq, K, 0.0f, y + (a - c0),
                        (int)ldy);
        }
        return;
    }
    for (int i0 = 0; i0 < n; i0 += QX_ROWS) {
        int ni = MIN(QX_ROWS, n - i0);
        k->sgemm_pack_b(xp, ni, K, x + (int64_t)i0 * ldx, (int)ldx, 1); // op(B) = x^T [K, ni]
        for (int64_t a = c0; a < c1; a += Q_CHUNK) {
            int nc = (int)MIN(Q_CHUNK, c1 - a);
            k->deq_q(deq, w, a, nc);
            k->sgemm_packed(nc, ni, K, 1.0f, deq, K, 0, xp, 0.0f, ct, ni, NULL); // ct [nc, ni]
            for (int i = 0; i < ni; i++) {
                float *yr = y + (int64_t)(i0 + i) * ldy + (a - c0);
                for (int c = 0; c < nc; c++) yr[c] = ct[c * ni + i];
            }
        }
    }
}
