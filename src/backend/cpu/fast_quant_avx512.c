// fast_quant_avx512.c - AVX-512 kernels of the quantized weights
// (fast_quant.c): codes dequantized in registers, exactly (the fp32 value of
// each code), fp32 FMAs against up to 4 activation rows at a time; the
// per-row or per-block scale applied to each partial sum.
#if defined(__x86_64__)
#include <immintrin.h>

#include "backend/cpu/fast.h"
#include "core/common.h"
#include "io/dtype.h"

// 16 e4m3 codes -> fp32 / 256, exactly. The code, sign-extended to 16 bits
// and shifted left by 7, is a half of the same sign, exponent and mantissa
// (bias 15 instead of 7: 2^-8 times the value; e4m3's subnormals land on
// half subnormals), and vcvtph2ps widens it exactly. The 2^8 goes into the
// scale. Why not fp32 bits and a multiply by 2^120: e4m3's subnormal codes
// would be fp32 subnormals, and each multiply by one takes a microcode
// assist (three times slower on random weights).
#define FP8_UNIT 256.0f
static inline __m512 fp8_cvt(__m128i b) {
    __m256i v = _mm256_cvtepi8_epi16(b);
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(v, 7), _mm256_set1_epi16((short)0xbf80));
    return _mm512_cvtph_ps(h);
}

// 16 e2m1 codes from 8 bytes (element 2i in the low nibble of byte i), in order.
static inline __m512 e2m1_cvt(const uint8_t *p, __m512 table) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m512i dup = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), v);
    __m512i code = _mm512_and_si512(_mm512_srlv_epi32(dup, _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4)),
                                    _mm512_set1_epi32(15));
    return _mm512_permutexvar_ps(code, table);
}

#define fp8_lut fast_fp8_lut // e4m3 values: NVFP4's block scales, the tails

// FP8 rows [c0, c1), MI activation rows; scale groups of g columns.
static inline __attribute__((always_inline)) void mm_fp8_rows(float *y, int64_t ldy, const float *x, int64_t ldx,
                                                              const struct weight *w, int64_t c0, int64_t c1,
                                                              const int MI) {
    int64_t K = w->cols, g = w->fmt == WF_FP8_B128 ? WF_B128 : K, G = wfmt_scale_cols(w->fmt, K);
    for (int64_t r = c0; r < c1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * K;
        const float *sc = w->scale + r * G;
        __m512 tot[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t b0 = 0, bi = 0; b0 < K; b0 += g, bi++) {
            int64_t e = MIN(K, b0 + g), k = b0;
            // four independent sums per activation row (an FMA's latency is
            // four of its issue slots), added at the group's end
            __m512 part[4], p1[4], p2[4], p3[4];
            for (int i = 0; i < 4; i++) part[i] = p1[i] = p2[i] = p3[i] = _mm512_setzero_ps();
            for (; k + 64 <= e; k += 64) {
                _mm_prefetch((const char *)(row + k + FAST_Q_PF), _MM_HINT_T0);
                __m512 w0 = fp8_cvt(_mm_loadu_si128((const __m128i *)(row + k)));
                __m512 w1 = fp8_cvt(_mm_loadu_si128((const __m128i *)(row + k + 16)));
                __m512 w2 = fp8_cvt(_mm_loadu_si128((const __m128i *)(row + k + 32)));
                __m512 w3 = fp8_cvt(_mm_loadu_si128((const __m128i *)(row + k + 48)));
                for (int i = 0; i < MI; i++) {
                    const float *xi = x + i * ldx + k;
                    part[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xi), part[i]);
                    p1[i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xi + 16), p1[i]);
                    p2[i] = _mm512_fmadd_ps(w2, _mm512_loadu_ps(xi + 32), p2[i]);
                    p3[i] = _mm512_fmadd_ps(w3, _mm512_loadu_ps(xi + 48), p3[i]);
                }
            }
            for (int i = 0; i < MI; i++) part[i] = _mm512_add_ps(_mm512_add_ps(part[i], p1[i]), _mm512_add_ps(p2[i], p3[i]));
            for (; k + 16 <= e; k += 16) {
                __m512 wv = fp8_cvt(_mm_loadu_si128((const __m128i *)(row + k)));
                for (int i = 0; i < MI; i++) part[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i * ldx + k), part[i]);
            }
            if (k < e) {
                __mmask16 mk = (__mmask16)((1u << (e - k)) - 1);
                __m512 wv = fp8_cvt(_mm_maskz_loadu_epi8(mk, row + k));
                for (int i = 0; i < MI; i++) part[i] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mk, x + i * ldx + k), part[i]);
            }
            __m512 s = _mm512_set1_ps(sc[bi] * FP8_UNIT);
            for (int i = 0; i < MI; i++) tot[i] = _mm512_fmadd_ps(part[i], s, tot[i]);
        }
        for (int i = 0; i < MI; i++) y[i * ldy + r - c0] = _mm512_reduce_add_ps(tot[i]);
    }
}

static inline __attribute__((always_inline)) void mm_nvfp4_rows(float *y, int64_t ldy, const float *x, int64_t ldx,
                                                                const struct weight *w, int64_t c0, int64_t c1,
                                                                const int MI) {
    int64_t K = w->cols, nb = K / WF_NVFP4_GROUP;
    const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f,
                                        -3.0f, -4.0f, -6.0f);
    for (int64_t r = c0; r < c1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * (K / 2), *bs = w->bscale + r * nb;
        __m512 acc[4], a1[4];
        for (int i = 0; i < 4; i++) acc[i] = a1[i] = _mm512_setzero_ps();
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) { // two independent sums per row
            if (b % 8 == 0) _mm_prefetch((const char *)(row + b * 8 + FAST_Q_PF), _MM_HINT_T0); // a line: 8 blocks
            if (b % 64 == 0) _mm_prefetch((const char *)(bs + b + FAST_Q_PF / 8), _MM_HINT_T0); // a line: 64 scales
            __m512 w0 = _mm512_mul_ps(e2m1_cvt(row + b * 8, table), _mm512_set1_ps(fp8_lut[bs[b]]));
            __m512 w1 = _mm512_mul_ps(e2m1_cvt(row + b * 8 + 8, table), _mm512_set1_ps(fp8_lut[bs[b + 1]]));
            for (int i = 0; i < MI; i++) {
                acc[i] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i * ldx + b * 16), acc[i]);
                a1[i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i * ldx + b * 16 + 16), a1[i]);
            }
        }
        for (; b < nb; b++) {
            __m512 wv = _mm512_mul_ps(e2m1_cvt(row + b * 8, table), _mm512_set1_ps(fp8_lut[bs[b]]));
            for (int i = 0; i < MI; i++) acc[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i * ldx + b * 16), acc[i]);
        }
        for (int i = 0; i < MI; i++) acc[i] = _mm512_add_ps(acc[i], a1[i]);
        for (int i = 0; i < MI; i++) y[i * ldy + r - c0] = _mm512_reduce_add_ps(acc[i]) * w->scale[r];
    }
}

FAST_MM_Q_DEFINE(fast_mm_q_avx512, mm_fp8_rows, mm_nvfp4_rows)

// Rows [r0, r0 + nr) dequantized to fp32 (the many-row products), the
// reference's values: code * scale (NVFP4: (code * block scale) * scale).
void fast_deq_q_avx512(float *dst, const struct weight *w, int64_t r0, int64_t nr) {
    int64_t K = w->cols, G = wfmt_scale_cols(w->fmt, K);
    const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f,
                                        -3.0f, -4.0f, -6.0f);
    for (int64_t r = r0; r < r0 + nr; r++) {
        float *d = dst + (r - r0) * K;
        switch (w->fmt) {
        case WF_FP8:
        case WF_FP8_B128: {
            const uint8_t *row = (const uint8_t *)w->data + r * K;
            int64_t k = 0;
            for (; k + 16 <= K; k += 16) {
                // (code / 256) * (256 * scale): the reference's code * scale exactly
                __m512 s = _mm512_set1_ps(FP8_UNIT * fast_fp8_scale(w, G, r, k));
                _mm512_storeu_ps(d + k, _mm512_mul_ps(fp8_cvt(_mm_loadu_si128((const __m128i *)(row + k))), s));
            }
            for (; k < K; k++) d[k] = fp8_lut[row[k]] * fast_fp8_scale(w, G, r, k);
            break;
        }
        case WF_NVFP4: {
            const uint8_t *row = (const uint8_t *)w->data + r * (K / 2), *bs = w->bscale + r * (K / WF_NVFP4_GROUP);
            __m512 s2 = _mm512_set1_ps(w->scale[r]);
            for (int64_t b = 0; b < K / WF_NVFP4_GROUP; b++)
                _mm512_storeu_ps(d + b * 16,
                                 _mm512_mul_ps(_mm512_mul_ps(e2m1_cvt(row + b * 8, table), _mm512_set1_ps(fp8_lut[bs[b]])), s2));
            break;
        }
        case WF_F32:
        case WF_BF16:
        case WF_F16: return;
        }
    }
}
#endif
