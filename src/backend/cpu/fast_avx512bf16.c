// fast_avx512bf16.c - the AVX512_BF16 kernels: the prefill GEMM on the
// packed bf16 weights with vdpbf16ps (bf16 x bf16 products, fp32 sums), and
// fp32 -> bf16 rounding of its activations. Built with -mavx512bf16; called
// only when fast_detect() found AVX512_BF16.
#if defined(__x86_64__)
#include <immintrin.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

#define INL static inline __attribute__((always_inline))

INL void store_cols(float *yrow, __m512 v, int64_t pc, int64_t c0, int64_t c1) {
    if (pc >= c0 && pc + 16 <= c1) {
        _mm512_storeu_ps(yrow + (pc - c0), v);
        return;
    }
    int64_t lo = MAX(c0, pc), hi = MIN(c1, pc + 16);
    if (lo >= hi) return;
    __mmask16 keep = (__mmask16)(((1u << (hi - lo)) - 1) << (lo - pc));
    _mm512_mask_storeu_ps(yrow + (lo - c0), (__mmask16)((1u << (hi - lo)) - 1), _mm512_maskz_compress_ps(keep, v));
}

INL __m512bh pair_of(const uint16_t *p) { // two bf16 values broadcast to every lane
    int32_t v;
    memcpy(&v, p, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}

// mb (<= 6) rows of xb against one group (w: its first lane): 24
// accumulators, 4 panel loads and mb broadcasts per column pair. Meanwhile
// pf_lines lines from pf go to L2, pf_rate per column pair: the next group,
// spread over this group's tiles, so the first tile of a group does not wait
// on DRAM.
INL void dot_tile(float *y, int64_t ldy, const uint16_t *xb, int64_t ldxb, const uint32_t *w, int64_t kp2, int64_t gc,
                  int64_t c0, int64_t c1, const char *pf, int64_t pf_lines, int pf_rate, const int mb) {
    const int np = 4;
    __m512 acc[6][4];
#pragma GCC unroll 6
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < np; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t q = 0; q < kp2; q++) {
        if (q * pf_rate < pf_lines) // pf_rate 0: nothing to fetch
            for (int r = 0; r < pf_rate; r++) _mm_prefetch(pf + (q * pf_rate + r) * 64, _MM_HINT_T1);
        __m512bh b[4];
#pragma GCC unroll 4
        for (int j = 0; j < np; j++) b[j] = (__m512bh)_mm512_loadu_si512(w + q * PKG + j * PK);
#pragma GCC unroll 6
        for (int i = 0; i < mb; i++) {
            __m512bh a = pair_of(xb + i * ldxb + 2 * q);
#pragma GCC unroll 4
            for (int j = 0; j < np; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, b[j]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < np; j++) store_cols(y + i * ldy, acc[i][j], gc + PK * j, c0, c1);
}

void fast_mm_pk_dot_avx512bf16(float *y, int64_t ldy, const uint16_t *xb, int64_t ldxb, int m,
                               const struct weight *w, int64_t c0, int64_t c1) {
    int64_t kp2 = pk_kp(w->cols) / 2, g1 = (c1 + PKG - 1) / PKG;
    int tiles = (m + 5) / 6;
    int64_t lines = pk_gstride(w->cols) * 4 / 64, per_tile = (lines + tiles - 1) / tiles;
    int rate = tiles <= 16 ? (int)MIN(4, (per_tile + kp2 - 1) / kp2) : 0; // few tiles: the first would stall
    for (int64_t g = c0 / PKG; g < g1; g++) {
        const uint32_t *wg = pk_group(w, g);
        const char *pf = (const char *)pk_group(w, g + 1);
        int64_t next = g + 1 < g1 ? lines : 0;
        for (int i = 0, t = 0; i < m; i += 6, t++) {
            float *yy = y + (int64_t)i * ldy;
            const uint16_t *xx = xb + (int64_t)i * ldxb;
            const char *p = pf + t * per_tile * 64;
            int64_t pl = MAX(0, MIN(per_tile, next - t * per_tile)); // lines (a few past it at most)
            switch (MIN(6, m - i)) {
            case 1: dot_tile(yy, ldy, xx, ldxb, wg, kp2, g * PKG, c0, c1, p, pl, rate, 1); break;
            case 2: dot_tile(yy, ldy, xx, ldxb, wg, kp2, g * PKG, c0, c1, p, pl, rate, 2); break;
            case 3: dot_tile(yy, ldy, xx, ldxb, wg, kp2, g * PKG, c0, c1, p, pl, rate, 3); break;
            case 4: dot_tile(yy, ldy, xx, ldxb, wg, kp2, g * PKG, c0, c1, p, pl, rate, 4); break;
            case 5: dot_tile(yy, ldy, xx, ldxb, wg, kp2, g * PKG, c0, c1, p, pl, rate, 5); break;
            default: dot_tile(yy, ldy, xx, ldxb, wg, kp2, g * PKG, c0, c1, p, pl, rate, 6); break;
            }
        }
    }
}

void fast_to_bf16_avx512bf16(uint16_t *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(y + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
        _mm256_mask_storeu_epi16(y + i, m, v);
    }
}
#endif
