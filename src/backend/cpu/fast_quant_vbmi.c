// fast_quant_vbmi.c - the FP8 decode kernel for CPUs with AVX512_VBMI
// (fast_quant.c): 64 e4m3 codes at a time become bf16 through two 128-entry
// byte tables (vpermi2b; every e4m3 value is a bf16, subnormals included, so
// this is exact), then fp32 by a shift or a mask, as the bf16 kernels widen
// their panels. Per 16 weights about 3 vector ops besides the FMA, against 5
// for widening through halves (fast_quant_avx512.c): the decode GEMV is no
// longer bound by its instructions. The bytes come out in an order of their
// own (fast_perm_x64), so x is permuted once per call to match.
#if defined(__x86_64__)
#include <immintrin.h>

#include "backend/cpu/fast.h"
#include "core/common.h"
#include "io/dtype.h"

// Where element j of a 64-block lands: vector v (A_lo, A_hi, B_lo, B_hi) of
// 16 lanes d, from unpack{lo,hi}_epi8 within 128-bit lanes.
static inline int64_t perm_src(int v, int d) { return 16 * (d / 4) + (v >= 2 ? 8 : 0) + 2 * (d % 4) + (v & 1); }

static int perm_tab[64]; // xp[b + j] = x[b + perm_tab[j]] (filled by fast_quant_vbmi_init)

// bf16 bits of e4m3 codes 0..127 (the positive half), low and high bytes
static uint8_t lut_lo[128], lut_hi[128];

void fast_quant_vbmi_init(void) {
    for (int j = 0; j < 64; j++) perm_tab[j] = (int)perm_src(j / 16, j % 16);
    for (int i = 0; i < 128; i++) {
        uint16_t b = (i & 0x7f) == 0x7f ? 0x7fc0 : f32_to_bf16(fp8e4m3_to_f32((uint8_t)i)); // 0x7f: NaN
        lut_lo[i] = (uint8_t)b, lut_hi[i] = (uint8_t)(b >> 8);
    }
}

void fast_perm_x64(float *xp, const float *x, int64_t K) {
    for (int64_t b = 0; b + 64 <= K; b += 64)
        for (int j = 0; j < 64; j++) xp[b + j] = x[b + perm_tab[j]];
}

// 16 e4m3 codes -> fp32 / 256 in order (the tail), as fast_quant_avx512.c.
static inline __m512 fp8_cvt16(__m128i b) {
    __m256i v = _mm256_cvtepi8_epi16(b);
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(v, 7), _mm256_set1_epi16((short)0xbf80)));
}

static inline __attribute__((always_inline)) void rows_fp8(float *y, int64_t ldy, const float *x, int64_t ldx,
                                                           const float *xp, int64_t ldxp, const struct weight *w,
                                                           int64_t c0, int64_t c1, const int MI) {
    const __m512i lo_a = _mm512_loadu_si512(lut_lo), lo_b = _mm512_loadu_si512(lut_lo + 64);
    const __m512i hi_a = _mm512_loadu_si512(lut_hi), hi_b = _mm512_loadu_si512(lut_hi + 64);
    const __m512i sign = _mm512_set1_epi32((int)0x80808080u), high = _mm512_set1_epi32((int)0xffff0000u);
    int64_t K = w->cols, g = w->fmt == WF_FP8_B128 ? WF_B128 : K, G = wfmt_scale_cols(w->fmt, K);
    for (int64_t r = c0; r < c1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + r * K;
        const float *sc = w->scale + r * G;
        __m512 tot[4];
        for (int i = 0; i < 4; i++) tot[i] = _mm512_setzero_ps();
        for (int64_t b0 = 0, bi = 0; b0 < K; b0 += g, bi++) {
            int64_t e = MIN(K, b0 + g), k = b0;
            __m512 p0[4], p1[4], tl[4];
            for (int i = 0; i < 4; i++) p0[i] = p1[i] = tl[i] = _mm512_setzero_ps();
            for (; k + 64 <= e; k += 64) { // bf16 values exact: their fp32 is the code's value
                __m512i c = _mm512_loadu_si512(row + k);
                _mm_prefetch((const char *)(row + k + FAST_Q_PF), _MM_HINT_T0);
                __m512i h = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(hi_a, c, hi_b), c, sign, 0xF8);
                __m512i l = _mm512_permutex2var_epi8(lo_a, c, lo_b);
                __m512i A = _mm512_unpacklo_epi8(l, h), B = _mm512_unpackhi_epi8(l, h);
                __m512 alo = _mm512_castsi512_ps(_mm512_slli_epi32(A, 16)), ahi = _mm512_castsi512_ps(_mm512_and_si512(A, high));
                __m512 blo = _mm512_castsi512_ps(_mm512_slli_epi32(B, 16)), bhi = _mm512_castsi512_ps(_mm512_and_si512(B, high));
                if (MI == 1) { // four chains: an FMA's latency is four of its issue slots
                    p0[0] = _mm512_fmadd_ps(alo, _mm512_loadu_ps(xp + k), p0[0]);
                    p1[0] = _mm512_fmadd_ps(ahi, _mm512_loadu_ps(xp + k + 16), p1[0]);
                    p0[1] = _mm512_fmadd_ps(blo, _mm512_loadu_ps(xp + k + 32), p0[1]);
                    p1[1] = _mm512_fmadd_ps(bhi, _mm512_loadu_ps(xp + k + 48), p1[1]);
                    continue;
                }
                for (int i = 0; i < MI; i++) { // rows interleave their chains
                    const float *xi = xp + i * ldxp + k;
                    p0[i] = _mm512_fmadd_ps(alo, _mm512_loadu_ps(xi), p0[i]);
                    p1[i] = _mm512_fmadd_ps(ahi, _mm512_loadu_ps(xi + 16), p1[i]);
                    p0[i] = _mm512_fmadd_ps(blo, _mm512_loadu_ps(xi + 32), p0[i]);
                    p1[i] = _mm512_fmadd_ps(bhi, _mm512_loadu_ps(xi + 48), p1[i]);
                }
            }
            if (MI == 1) p0[0] = _mm512_add_ps(p0[0], p0[1]), p1[0] = _mm512_add_ps(p1[0], p1[1]);
            for (; k + 16 <= e; k += 16) { // the tail: codes / 256 in order against x itself
                __m512 wv = fp8_cvt16(_mm_loadu_si128((const __m128i *)(row + k)));
                for (int i = 0; i < MI; i++) tl[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + i * ldx + k), tl[i]);
            }
            if (k < e) {
                __mmask16 mk = (__mmask16)((1u << (e - k)) - 1);
                __m512 wv = fp8_cvt16(_mm_maskz_loadu_epi8(mk, row + k));
                for (int i = 0; i < MI; i++) tl[i] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mk, x + i * ldx + k), tl[i]);
            }
            __m512 s = _mm512_set1_ps(sc[bi]), s256 = _mm512_set1_ps(sc[bi] * 256.0f);
            for (int i = 0; i < MI; i++)
                tot[i] = _mm512_fmadd_ps(tl[i], s256, _mm512_fmadd_ps(_mm512_add_ps(p0[i], p1[i]), s, tot[i]));
        }
        for (int i = 0; i < MI; i++) y[i * ldy + r - c0] = _mm512_reduce_add_ps(tot[i]);
    }
}

// x [m, ldx] and xp, x's rows permuted by fast_perm_x64 ([m, ldxp]).
void fast_mm_fp8_vbmi(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xp, int64_t ldxp, int m,
                      const struct weight *w, int64_t c0, int64_t c1) {
    for (int i0 = 0; i0 < m; i0 += 4) {
        int mi = MIN(4, m - i0);
        float *yy = y + (int64_t)i0 * ldy;
        const float *xx = x + (int64_t)i0 * ldx, *pp = xp + (int64_t)i0 * ldxp;
        switch (mi) {
        case 1: rows_fp8(yy, ldy, xx, ldx, pp, ldxp, w, c0, c1, 1); break;
        case 2: rows_fp8(yy, ldy, xx, ldx, pp, ldxp, w, c0, c1, 2); break;
        case 3: rows_fp8(yy, ldy, xx, ldx, pp, ldxp, w, c0, c1, 3); break;
        default: rows_fp8(yy, ldy, xx, ldx, pp, ldxp, w, c0, c1, 4); break;
        }
    }
}
#endif
