// fast_quant_avx2.c - AVX2 (+ FMA, F16C) kernels of the quantized weights
// (fast_quant.c), for CPUs without AVX-512 (AMD before Zen 4, older Intel):
// codes dequantized in registers, exactly, fp32 FMAs against up to 4
// activation rows at a time, the per-row or per-block scale applied to each
// partial sum; the same arithmetic as fast_quant_avx512.c at half the width.
// Without them the AVX2 kernel set dequantized with wfmt_dequant a weight at
// a time (fast_mm_q_scalar): rand_moe's FP8 decode ran slower than its bf16.
#if defined(__x86_64__)
#include <immintrin.h>

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

// FP8 rows [c0, c1), MI activation rows; scale groups of g columns. Two
// independent sums per activation row (16 of the 16 ymm registers at MI 4
// with the weights and x: more spill).
static inline __attribute__((always_inline)) void mm_fp8_rows(float *y, int64_t ldy, const float *x, int64_t ldx,
                                                              const struct weight *w, int64_t c0, int64_t c1,
                                                              const int MI) {
    int64_t K = w->cols, g = w->fmt == WF_FP8_B128 ? WF_B128 : K, G = wfmt_scale_cols(w->fmt, K);
    for (int64_t r = c0; r < c1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * K;
        const float *sc = w->scale + r * G;
        __m256 tot[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        float tail[4] = {0, 0, 0, 0};
        for (int64_t b0 = 0, bi = 0; b0 < K; b0 += g, bi++) {
            int64_t e = MIN(K, b0 + g), k = b0;
            __m256 p0[4], p1[4];
            for (int i = 0; i < 4; i++) p0[i] = p1[i] = _mm256_setzero_ps();
            for (; k + 16 <= e; k += 16) {
                if (k % 64 == 0) _mm_prefetch((const char *)(row + k + FAST_Q_PF), _MM_HINT_T0);
                __m256 w0 = fp8_cvt8(row + k), w1 = fp8_cvt8(row + k + 8);
                for (int i = 0; i < MI; i++) {
                    const float *xi = x + i * ldx + k;
                    p0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xi), p0[i]);
                    p1[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xi + 8), p1[i]);
                }
            }
            for (; k + 8 <= e; k += 8) {
                __m256 wv = fp8_cvt8(row + k);
                for (int i = 0; i < MI; i++) p0[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * ldx + k), p0[i]);
            }
            float t[4] = {0, 0, 0, 0}; // columns past the last 8: the values themselves (not / 256)
            for (; k < e; k++)
                for (int i = 0; i < MI; i++) t[i] += fp8_lut[row[k]] * x[i * ldx + k];
            __m256 s = _mm256_set1_ps(sc[bi] * FP8_UNIT);
            for (int i = 0; i < MI; i++) {
                tot[i] = _mm256_fmadd_ps(_mm256_add_ps(p0[i], p1[i]), s, tot[i]);
                tail[i] += t[i] * sc[bi];
            }
        }
        for (int i = 0; i < MI; i++) y[i * ldy + r - c0] = hsum8(tot[i]) + tail[i];
    }
}

// NVFP4 rows [c0, c1): each block's 16 values (e2m1 * its e4m3 scale, exact:
// at most 6 significant bits; the 2^14 folded into the scale, a power of two)
// into the row's sums, weight_scale_2 on the row's total.
static inline __attribute__((always_inline)) void mm_nvfp4_rows(float *y, int64_t ldy, const float *x, int64_t ldx,
                                                                const struct weight *w, int64_t c0, int64_t c1,
                                                                const int MI) {
    int64_t K = w->cols, nb = K / WF_NVFP4_GROUP;
    for (int64_t r = c0; r < c1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * (K / 2), *bs = w->bscale + r * nb;
        __m256 a0[4], a1[4];
        for (int i = 0; i < 4; i++) a0[i] = a1[i] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) { // a block: two independent sums per row
            if (b % 8 == 0) _mm_prefetch((const char *)(row + b * 8 + FAST_Q_PF), _MM_HINT_T0); // a line: 8 blocks
            if (b % 64 == 0) _mm_prefetch((const char *)(bs + b + FAST_Q_PF / 8), _MM_HINT_T0); // a line: 64 scales
            __m256 s = _mm256_set1_ps(fp8_lut[bs[b]] * E2M1_UNIT), w0, w1;
            e2m1_cvt16(row + b * 8, &w0, &w1);
            w0 = _mm256_mul_ps(w0, s), w1 = _mm256_mul_ps(w1, s);
            for (int i = 0; i < MI; i++) {
                const float *xi = x + i * ldx + b * 16;
                a0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xi), a0[i]);
                a1[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xi + 8), a1[i]);
            }
        }
        for (int i = 0; i < MI; i++) y[i * ldy + r - c0] = hsum8(_mm256_add_ps(a0[i], a1[i])) * w->scale[r];
    }
}

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
                __m256 s = _mm256_set1_ps(FP8_UNIT * (w->fmt == WF_FP8 ? w->scale[r] : w->scale[r * G + k / WF_B128]));
                _mm256_storeu_ps(d + k, _mm256_mul_ps(fp8_cvt8(row + k), s));
            }
            for (; k < K; k++) d[k] = fp8_lut[row[k]] * w->scale[r * G + (w->fmt == WF_FP8 ? 0 : k / WF_B128)];
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
