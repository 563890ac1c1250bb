// fast_quant_avx2.c - AVX2 (+ FMA, F16C) kernels of the quantized weights
// (fast_quant.c), for CPUs without AVX-512 (AMD before Zen 4, older Intel):
// codes dequantized in registers, exactly, fp32 FMAs against up to 4
// activation rows at a time, the per-row or per-block scale applied to each
// partial sum; the same arithmetic as fast_quant_avx512.c at half the width.
// Without them the AVX2 kernel set dequantized with wfmt_dequant a weight at
// a time (fast_mm_q_scalar): rand_moe's FP8 decode ran slower than its bf16.
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdbool.h>

#include "backend/cpu/fast.h"
#include "core/common.h"
#include "io/dtype.h"

// 8 e4m3 codes -> fp32 / 256, exactly: sign-extended to 16 bits and shifted
// left by 7 they are halves of the same sign, exponent and mantissa (bias 15
// instead of 7), which vcvtph2ps widens exactly; the 2^8 goes into the scale
// (as fast_quant_avx512.c's fp8_cvt, which says why not fp32 bits).
#define FP8_UNIT 256.0f
static inline __m256 fp8_cvt8(const uint8_t *p) {
    __m128i v = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(v, 7), _mm_set1_epi16((short)0xbf80)));
}

// 16 e2m1 codes from 8 bytes (element 2i in the low nibble of byte i), in
// order, as two vectors of fp32 e2m1 * 2^-14, exactly: each nibble moved to
// bits 12..15 of a 16-bit lane, then its sign kept at bit 15 and exponent and
// mantissa moved to bits 9..11 make a half of that value (e2m1's exponent is
// the half's, its 0.5 the subnormal 2^-15), which vcvtph2ps widens. Bit moves
// only: a vpermps table and vpsrlvd shifts ran at a third of this rate.
#define E2M1_UNIT 16384.0f
static inline __m128i e2m1_h8(__m128i t) {
    return _mm_or_si128(_mm_and_si128(t, _mm_set1_epi16((short)0x8000)),
                        _mm_and_si128(_mm_srli_epi16(t, 3), _mm_set1_epi16(0x0E00)));
}
static inline void e2m1_cvt16(const uint8_t *p, __m256 *w0, __m256 *w1) {
    __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p)); // byte i in lane i
    __m128i even = e2m1_h8(_mm_slli_epi16(v, 12)), odd = e2m1_h8(_mm_slli_epi16(v, 8));
    *w0 = _mm256_cvtph_ps(_mm_unpacklo_epi16(even, odd));
    *w1 = _mm256_cvtph_ps(_mm_unpackhi_epi16(even, odd));
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

#define fp8_lut fast_fp8_lut // e4m3 values: the tails and NVFP4's block scales

// The FMAs of one step of 16 columns: weight rows j < RB (w[j][0] columns
// 0..7, w[j][1] 8..15) against x's rows i < MI at column k. Sums a[j][.]:
// one row of x keeps the two halves apart (4 chains at RB 2); more rows
// take one sum each (2 MI chains). At MI 4: 8 sums, 4 weights and x, 13 of
// the 16 ymm registers (the single-row-of-weights kernel before ran out of
// them and spilled: 4 rows of x took 3.9x one row's time).
static inline __attribute__((always_inline)) void q_fma16(__m256 (*a)[4], __m256 (*w)[2], const float *x, int64_t ldx,
                                                         int64_t k, const int MI, const int RB) {
    #pragma GCC unroll 4
    for (int i = 0; i < MI; i++) {
        __m256 x0 = _mm256_loadu_ps(x + i * ldx + k), x1 = _mm256_loadu_ps(x + i * ldx + k + 8);
        #pragma GCC unroll 4
        for (int j = 0; j < RB; j++) {
            if (MI == 1) {
                a[j][0] = _mm256_fmadd_ps(w[j][0], x0, a[j][0]);
                a[j][1] = _mm256_fmadd_ps(w[j][1], x1, a[j][1]);
            } else {
                a[j][i] = _mm256_fmadd_ps(w[j][0], x0, a[j][i]);
                a[j][i] = _mm256_fmadd_ps(w[j][1], x1, a[j][i]);
            }
        }
    }
}

// Row sum of weight row j and x row i from q_fma16's sums.
static inline float q_sum(__m256 (*a)[4], int j, int i, const int MI) {
    return hsum8(MI == 1 ? _mm256_add_ps(a[j][0], a[j][1]) : a[j][i]);
}

// FP8 weight rows r .. r + RB - 1, MI activation rows, the codes / 256
// summed. Per-row scales: the scale * 256 on the row's sum. 128-column
// blocks: at one row of x, each block's sums times its scale * 256 into a
// total (registers to spare); at more, the scale * 256 on the codes as they
// widen (the reference's code * scale, exactly), where a second set of sums
// would spill.
static inline __attribute__((always_inline)) void fp8_tile(float *y, int64_t ldy, const float *x, int64_t ldx,
                                                           const struct weight *w, int64_t r, int64_t yo, const int MI,
                                                           const int RB) {
    int64_t K = w->cols, G = wfmt_scale_cols(w->fmt, K), K16 = K / 16 * 16;
    bool blocks = w->fmt == WF_FP8_B128, fold = blocks && MI == 1;
    int64_t g = blocks ? WF_B128 : K16;
    const uint8_t *row[2];
    __m256 a[2][4], wv[2][2], s[2], tot[2];
#pragma GCC unroll 4
    for (int j = 0; j < RB; j++) {
        row[j] = (const uint8_t *)w->data + (r + j) * K, tot[j] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) a[j][i] = _mm256_setzero_ps();
    }
    for (int64_t b0 = 0; b0 < K16; b0 += g) {
#pragma GCC unroll 4
        for (int j = 0; j < RB; j++) s[j] = _mm256_set1_ps(blocks ? fast_fp8_scale(w, G, r + j, b0) * FP8_UNIT : 1);
        for (int64_t k = b0; k < MIN(K16, b0 + g); k += 16) {
#pragma GCC unroll 4
            for (int j = 0; j < RB; j++) {
                if (k % 64 == 0) _mm_prefetch((const char *)(row[j] + k + FAST_Q_PF), _MM_HINT_T0);
                wv[j][0] = fp8_cvt8(row[j] + k), wv[j][1] = fp8_cvt8(row[j] + k + 8);
                if (blocks && !fold) wv[j][0] = _mm256_mul_ps(wv[j][0], s[j]), wv[j][1] = _mm256_mul_ps(wv[j][1], s[j]);
            }
            q_fma16(a, wv, x, ldx, k, MI, RB);
        }
        if (fold)
#pragma GCC unroll 4
            for (int j = 0; j < RB; j++) {
                tot[j] = _mm256_fmadd_ps(_mm256_add_ps(a[j][0], a[j][1]), s[j], tot[j]);
                a[j][0] = a[j][1] = _mm256_setzero_ps();
            }
    }
#pragma GCC unroll 4
    for (int j = 0; j < RB; j++) {
        const float *sc = w->scale + (r + j) * G;
        for (int i = 0; i < MI; i++) {
            float t = 0; // columns past the last 16: the values themselves (not / 256)
            for (int64_t c = K16; c < K; c++) t += fp8_lut[row[j][c]] * (blocks ? sc[c / WF_B128] : 1) * x[i * ldx + c];
            float sum = fold ? hsum8(tot[j]) : q_sum(a, j, i, MI);
            y[i * ldy + yo + j] = blocks ? sum + t : (sum * FP8_UNIT + t) * sc[0];
        }
    }
}

// Weight rows [c0, c1) against MI activation rows, two weight rows a tile
// (the last alone where the count is odd).
#define Q_ROWS_OF(name, tile)                                                                                          \
    static inline __attribute__((always_inline)) void name(float *y, int64_t ldy, const float *x, int64_t ldx,        \
                                                           const struct weight *w, int64_t c0, int64_t c1,             \
                                                           const int MI) {                                             \
        int64_t r = c0;                                                                                                \
        for (; r + 2 <= c1; r += 2) tile(y, ldy, x, ldx, w, r, r - c0, MI, 2);                                         \
        if (r < c1) tile(y, ldy, x, ldx, w, r, r - c0, MI, 1);                                                         \
    }
Q_ROWS_OF(mm_fp8_rows, fp8_tile)

// NVFP4 weight rows r .. r + RB - 1: each block's 16 values (e2m1 * its e4m3
// scale, exact: at most 6 significant bits; the 2^14 folded into the scale,
// a power of two) into the row's sums, weight_scale_2 on the row's total.
static inline __attribute__((always_inline)) void nvfp4_tile(float *y, int64_t ldy, const float *x, int64_t ldx,
                                                             const struct weight *w, int64_t r, int64_t yo,
                                                             const int MI, const int RB) {
    int64_t K = w->cols, nb = K / WF_NVFP4_GROUP;
    const uint8_t *row[2], *bs[2];
    __m256 a[2][4], wv[2][2];
    #pragma GCC unroll 4
    for (int j = 0; j < RB; j++) {
        row[j] = (const uint8_t *)w->data + (r + j) * (K / 2), bs[j] = w->bscale + (r + j) * nb;
        #pragma GCC unroll 4
        for (int i = 0; i < 4; i++) a[j][i] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        #pragma GCC unroll 4
        for (int j = 0; j < RB; j++) {
            if (b % 8 == 0) _mm_prefetch((const char *)(row[j] + b * 8 + FAST_Q_PF), _MM_HINT_T0); // a line: 8 blocks
            if (b % 64 == 0) _mm_prefetch((const char *)(bs[j] + b + FAST_Q_PF / 8), _MM_HINT_T0); // 64 scales
            __m256 s = _mm256_set1_ps(fp8_lut[bs[j][b]] * E2M1_UNIT);
            e2m1_cvt16(row[j] + b * 8, &wv[j][0], &wv[j][1]);
            wv[j][0] = _mm256_mul_ps(wv[j][0], s), wv[j][1] = _mm256_mul_ps(wv[j][1], s);
        }
        q_fma16(a, wv, x, ldx, b * 16, MI, RB);
    }
    #pragma GCC unroll 4
    for (int j = 0; j < RB; j++)
        #pragma GCC unroll 4
        for (int i = 0; i < MI; i++) y[i * ldy + yo + j] = q_sum(a, j, i, MI) * w->scale[r + j];
}

Q_ROWS_OF(mm_nvfp4_rows, nvfp4_tile)

FAST_MM_Q_DEFINE(fast_mm_q_avx2, mm_fp8_rows, mm_nvfp4_rows)

// Rows [r0, r0 + nr) dequantized to fp32 (the many-row products), the
// reference's values: code * scale (NVFP4: (code * block scale) * scale).
void fast_deq_q_avx2(float *dst, const struct weight *w, int64_t r0, int64_t nr) {
    int64_t K = w->cols, G = wfmt_scale_cols(w->fmt, K);
    for (int64_t r = r0; r < r0 + nr; r++) {
        float *d = dst + (r - r0) * K;
        switch (w->fmt) {
        case WF_FP8:
        case WF_FP8_B128: {
            const uint8_t *row = (const uint8_t *)w->data + r * K;
            int64_t k = 0;
            for (; k + 8 <= K; k += 8) { // (code / 256) * (256 * scale): the reference's code * scale exactly
                __m256 s = _mm256_set1_ps(FP8_UNIT * fast_fp8_scale(w, G, r, k));
                _mm256_storeu_ps(d + k, _mm256_mul_ps(fp8_cvt8(row + k), s));
            }
            for (; k < K; k++) d[k] = fp8_lut[row[k]] * fast_fp8_scale(w, G, r, k);
            break;
        }
        case WF_NVFP4: {
            const uint8_t *row = (const uint8_t *)w->data + r * (K / 2), *bs = w->bscale + r * (K / WF_NVFP4_GROUP);
            __m256 s2 = _mm256_set1_ps(w->scale[r]);
            for (int64_t b = 0; b < K / WF_NVFP4_GROUP; b++) { // (e2m1 * bscale) * scale, as the reference
                __m256 s = _mm256_set1_ps(fp8_lut[bs[b]] * E2M1_UNIT), w0, w1;
                e2m1_cvt16(row + b * 8, &w0, &w1);
                _mm256_storeu_ps(d + b * 16, _mm256_mul_ps(_mm256_mul_ps(w0, s), s2));
                _mm256_storeu_ps(d + b * 16 + 8, _mm256_mul_ps(_mm256_mul_ps(w1, s), s2));
            }
            break;
        }
        case WF_F32:
        case WF_BF16:
        case WF_F16: return;
        }
    }
}
#endif
