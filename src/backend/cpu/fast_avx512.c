// fast_avx512.c - AVX-512 (F, BW, VL, DQ) + FMA kernels of the fast path.
// Built with those flags (CMakeLists.txt); called only when fast_detect()
// found them.
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

#define INL static inline __attribute__((always_inline))
// Software prefetch distance of the weight streams (uint32 lanes): 8 KB
// ahead (the packed groups), 2 KB ahead (fp32 rows, four at a time); a
// prefetch measured 25-30% faster than the hardware prefetcher alone on
// decode-sized products (interleaved runs, cold weights).
#define PF_LANES 2048
#define PF_F32 512

// Stores the lanes of v (panel columns pc..pc+15) that fall in [c0, c1) at
// yrow[c - c0].
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

// mb rows of x against one group (four panels, w: its first lane), fp32
// arithmetic: each uint32 lane yields the even-column weight (<< 16) and the
// odd-column one (& 0xffff0000), multiplied by broadcast x values. Up to 2
// rows keep even and odd sums apart (more chains in flight); 3-4 rows share
// one accumulator per panel (16 at most).
INL void pk_tile(float *y, int64_t ldy, const float *x, int64_t ldx, const uint32_t *w, int64_t kp2, int64_t gc,
                 int64_t c0, int64_t c1, const int mb) {
    const int ns = mb <= 2 ? 2 : 1;
    __m512 acc[4][4][2];
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 4
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[i][j][0] = acc[i][j][1] = _mm512_setzero_ps();
    for (int64_t q = 0; q < kp2; q++) {
        __m512 xe[4], xo[4];
#pragma GCC unroll 4
        for (int i = 0; i < mb; i++) {
            xe[i] = _mm512_set1_ps(x[i * ldx + 2 * q]);
            xo[i] = _mm512_set1_ps(x[i * ldx + 2 * q + 1]);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512i v = _mm512_loadu_si512(w + q * PKG + j * PK);
            _mm_prefetch((const char *)(w + q * PKG + j * PK + PF_LANES), _MM_HINT_T0);
            __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
#pragma GCC unroll 4
            for (int i = 0; i < mb; i++) {
                acc[i][j][0] = _mm512_fmadd_ps(we, xe[i], acc[i][j][0]);
                acc[i][j][ns - 1] = _mm512_fmadd_ps(wo, xo[i], acc[i][j][ns - 1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            store_cols(y + i * ldy, ns == 2 ? _mm512_add_ps(acc[i][j][0], acc[i][j][1]) : acc[i][j][0], gc + PK * j, c0,
                       c1);
}

static void mm_pk(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                  int64_t c1) {
    int64_t kp2 = pk_kp(w->cols) / 2, g1 = (c1 + PKG - 1) / PKG;
    for (int64_t g = c0 / PKG; g < g1; g++)
        for (int i = 0; i < m; i += 4) {
            float *yy = y + (int64_t)i * ldy;
            const float *xx = x + (int64_t)i * ldx;
            const uint32_t *wg = pk_group(w, g);
            switch (MIN(4, m - i)) {
            case 1: pk_tile(yy, ldy, xx, ldx, wg, kp2, g * PKG, c0, c1, 1); break;
            case 2: pk_tile(yy, ldy, xx, ldx, wg, kp2, g * PKG, c0, c1, 2); break;
            case 3: pk_tile(yy, ldy, xx, ldx, wg, kp2, g * PKG, c0, c1, 3); break;
            default: pk_tile(yy, ldy, xx, ldx, wg, kp2, g * PKG, c0, c1, 4); break;
            }
        }
}

// mb rows of x against rb rows of a row-major fp32 weight: dot products
// along K, summed across lanes at the end.
INL void f32_tile(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, int64_t K, int64_t yoff,
                  const int mb, const int rb) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < rb; j++) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < rb; j++) {
            wv[j] = _mm512_loadu_ps(w + j * K + k);
            _mm_prefetch((const char *)(w + j * K + k + PF_F32), _MM_HINT_T0);
        }
#pragma GCC unroll 4
        for (int i = 0; i < mb; i++) {
            __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 4
            for (int j = 0; j < rb; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < K) {
        __mmask16 mk = (__mmask16)((1u << (K - k)) - 1);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < rb; j++) wv[j] = _mm512_maskz_loadu_ps(mk, w + j * K + k);
#pragma GCC unroll 4
        for (int i = 0; i < mb; i++) {
            __m512 xv = _mm512_maskz_loadu_ps(mk, x + i * ldx + k);
#pragma GCC unroll 4
            for (int j = 0; j < rb; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < rb; j++) y[i * ldy + yoff + j] = _mm512_reduce_add_ps(acc[i][j]);
}

#define F32_CASE(MB, RB)                                                                                     \
    case (MB) * 8 + (RB): f32_tile(y, ldy, x, ldx, wr, K, yoff, MB, RB); break;

static void mm_f32(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                   int64_t c1) {
    int64_t K = w->cols;
    for (int64_t c = c0; c < c1; c += 4) {
        int rb = (int)MIN(4, c1 - c);
        const float *wr = (const float *)w->data + c * K;
        int64_t yoff = c - c0;
        for (int i = 0; i < m; i += 4) {
            int mb = MIN(4, m - i);
            float *yy = y + (int64_t)i * ldy;
            const float *xx = x + (int64_t)i * ldx;
            {
                float *y = yy;
                const float *x = xx;
                switch (mb * 8 + rb) {
                    F32_CASE(1, 1) F32_CASE(1, 2) F32_CASE(1, 3) F32_CASE(1, 4)
                    F32_CASE(2, 1) F32_CASE(2, 2) F32_CASE(2, 3) F32_CASE(2, 4)
                    F32_CASE(3, 1) F32_CASE(3, 2) F32_CASE(3, 3) F32_CASE(3, 4)
                    F32_CASE(4, 1) F32_CASE(4, 2) F32_CASE(4, 3) F32_CASE(4, 4)
                }
            }
        }
    }
}

// exp(x): x = n ln2 + r, |r| <= ln2/2, a degree-7 Taylor polynomial in r
// (relative error under 1e-7), scaled by 2^n with vscalefps (which gives 0
// below the float range). NaN stays NaN (max/min return their second operand).
INL __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.8f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static void vexp(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, exp16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

INL __m512 silu16(__m512 x) {
    __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static void vsilu(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, silu16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, silu16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

static void axpy(float *y, float a, const float *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static void relu2(float *x, int64_t n) {
    __m512 z = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_max_ps(_mm512_loadu_ps(x + i), z);
        _mm512_storeu_ps(x + i, _mm512_mul_ps(v, v));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_max_ps(_mm512_maskz_loadu_ps(m, x + i), z);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(v, v));
    }
}

static void scale(float *x, float a, int64_t n) {
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(va, _mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(va, _mm512_maskz_loadu_ps(m, x + i)));
    }
}

static void mul(float *x, const float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

// Squares of floats are exact in double: only the order of the sum differs
// from the reference's.
static double sumsq(const float *x, int64_t n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static void rms_apply(float *out, const float *x, const float *w, float r, int64_t n) {
    __m512 vr = _mm512_set1_ps(r);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_mul_ps(_mm512_loadu_ps(x + i), vr)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vr)));
    }
}

static void conv_row(float *out, int nc, const float *const *in, const float (*wt)[FAST_CONV_CH], const float *bias,
                     int K) {
    __m512 acc[FAST_CONV_CH / 16];
    for (int v = 0; v < FAST_CONV_CH / 16; v++) acc[v] = _mm512_loadu_ps(bias + 16 * v);
    for (int k = 0; k < K; k++) // no FMA: the reference rounds the product, then the sum
        for (int v = 0; v < FAST_CONV_CH / 16; v++)
            acc[v] = _mm512_add_ps(acc[v], _mm512_mul_ps(_mm512_loadu_ps(wt[k] + 16 * v), _mm512_loadu_ps(in[k] + 16 * v)));
    for (int v = 0; v < FAST_CONV_CH / 16; v++) {
        int n = nc - 16 * v;
        if (n <= 0) break;
        __mmask16 m = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
        _mm512_mask_storeu_ps(out + 16 * v, m, silu16(acc[v]));
    }
}

static void ssd_decay(float *m, const float *a, float ai, const float *cb, const float *dt, int n) {
    __m512 vai = _mm512_set1_ps(ai);
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = exp16(_mm512_sub_ps(vai, _mm512_loadu_ps(a + j)));
        _mm512_storeu_ps(m + j, _mm512_mul_ps(e, _mm512_mul_ps(_mm512_loadu_ps(cb + j), _mm512_loadu_ps(dt + j))));
    }
    if (j < n) {
        __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
        __m512 e = exp16(_mm512_sub_ps(vai, _mm512_maskz_loadu_ps(k, a + j)));
        _mm512_mask_storeu_ps(m + j, k, _mm512_mul_ps(e, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, cb + j), _mm512_maskz_loadu_ps(k, dt + j))));
    }
}

static void ssd_out(float *y, float *xs, const float *yo, const float *yd, const float *x, float ein, float D, float wgt,
                    int P) {
    __m512 ve = _mm512_set1_ps(ein), vd = _mm512_set1_ps(D), vw = _mm512_set1_ps(wgt);
    for (int p = 0; p < P; p += 16) {
        __mmask16 k = (__mmask16)(P - p >= 16 ? 0xffff : (1u << (P - p)) - 1);
        __m512 xv = _mm512_maskz_loadu_ps(k, x + p);
        __m512 v = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(ve, _mm512_maskz_loadu_ps(k, yo + p)), _mm512_mul_ps(vd, xv)),
                                 _mm512_maskz_loadu_ps(k, yd + p));
        _mm512_mask_storeu_ps(y + p, k, v);
        _mm512_mask_storeu_ps(xs + p, k, _mm512_mul_ps(vw, xv));
    }
}

static void ssd_step(float *S, int P, int N, const float *x, const float *B, const float *C, float dt, float dA,
                     float D, float *y) {
    __m512 va = _mm512_set1_ps(dA);
    for (int p = 0; p < P; p++) {
        float *sp = S + (int64_t)p * N;
        __m512 dx = _mm512_set1_ps(dt * x[p]), acc = _mm512_setzero_ps();
        int n = 0;
        for (; n + 16 <= N; n += 16) {
            __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(sp + n), va, _mm512_mul_ps(dx, _mm512_loadu_ps(B + n)));
            _mm512_storeu_ps(sp + n, v);
            acc = _mm512_fmadd_ps(v, _mm512_loadu_ps(C + n), acc);
        }
        if (n < N) {
            __mmask16 m = (__mmask16)((1u << (N - n)) - 1);
            __m512 v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, sp + n), va, _mm512_mul_ps(dx, _mm512_maskz_loadu_ps(m, B + n)));
            _mm512_mask_storeu_ps(sp + n, m, v);
            acc = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, C + n), acc);
        }
        y[p] = _mm512_reduce_add_ps(acc) + D * x[p];
    }
}

// Small fp32 GEMM. B is packed in panels of 32 columns ([K][32], zero
// padded); A is read in place, 8 rows at a time (element (i, k) at
// a[i * sa + k * sk]: a row-major A directly, a transposed one after a copy
// into [K][8] panels). An 8 x 32 tile of C lives in 16 accumulators while the
// B panel stays hot in L1/L2.
#define SG_MR 8
#define SG_NR 32
INL void sg_tile(int K, const float *a, int64_t sa, int64_t sk, const float *bp, float *C, int ldc, float alpha,
                 float beta, int mr, int nr) {
    __m512 acc[SG_MR][2];
    const float *ar[SG_MR];
#pragma GCC unroll 8
    for (int i = 0; i < SG_MR; i++) {
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        ar[i] = a + (i < mr ? i : 0) * sa; // rows past M repeat row 0 (not stored)
    }
    for (int k = 0; k < K; k++) {
        __m512 b0 = _mm512_loadu_ps(bp + k * SG_NR), b1 = _mm512_loadu_ps(bp + k * SG_NR + 16);
#pragma GCC unroll 8
        for (int i = 0; i < SG_MR; i++) {
            __m512 av = _mm512_set1_ps(ar[i][k * sk]);
            acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
        }
    }
    __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
    __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xffff : nr > 16 ? (1u << (nr - 16)) - 1 : 0);
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int i = 0; i < mr; i++) {
        float *c = C + (int64_t)i * ldc;
        __m512 r0 = _mm512_mul_ps(va, acc[i][0]), r1 = _mm512_mul_ps(va, acc[i][1]);
        if (beta != 0.0f) {
            r0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), r0);
            r1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), r1);
        }
        _mm512_mask_storeu_ps(c, m0, r0);
        _mm512_mask_storeu_ps(c + 16, m1, r1);
    }
}

// r[0..15] (rows) -> their transpose, in registers.
INL void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = 0; j < 2; j++) {
            __m512d a = _mm512_castps_pd(t[i + j]), b = _mm512_castps_pd(t[i + j + 2]);
            r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
}

static void sgemm_pack_b(float *bp, int N, int K, const float *B, int ldb, int tb) {
    for (int jp = 0; jp < (N + SG_NR - 1) / SG_NR; jp++) {
        float *d = bp + (size_t)jp * SG_NR * K;
        int n0 = jp * SG_NR, nc = MIN(SG_NR, N - n0);
        if (tb) { // B [N, K]: a transpose, in 16 x 16 blocks
            for (int h = 0; h < SG_NR; h += 16) {
                for (int k0 = 0; k0 < K; k0 += 16) {
                    int kc = MIN(16, K - k0);
                    __mmask16 mk = (__mmask16)(kc >= 16 ? 0xffff : (1u << kc) - 1);
                    __m512 r[16];
                    for (int j = 0; j < 16; j++)
                        r[j] = h + j < nc ? _mm512_maskz_loadu_ps(mk, B + (int64_t)(n0 + h + j) * ldb + k0) : _mm512_setzero_ps();
                    transpose16(r);
                    for (int k = 0; k < kc; k++) _mm512_storeu_ps(d + (k0 + k) * SG_NR + h, r[k]);
                }
            }
        } else {
            __mmask16 m0 = (__mmask16)(nc >= 16 ? 0xffff : (1u << nc) - 1);
            __mmask16 m1 = (__mmask16)(nc >= 32 ? 0xffff : nc > 16 ? (1u << (nc - 16)) - 1 : 0);
            for (int k = 0; k < K; k++) {
                const float *b = B + (int64_t)k * ldb + n0;
                _mm512_storeu_ps(d + k * SG_NR, _mm512_maskz_loadu_ps(m0, b));
                _mm512_storeu_ps(d + k * SG_NR + 16, _mm512_maskz_loadu_ps(m1, b + 16));
            }
        }
    }
}

static void sgemm_packed(int M, int N, int K, float alpha, const float *A, int lda, int ta, const float *bp, float beta,
                         float *C, int ldc, float *ap) {
    int mp = (M + SG_MR - 1) / SG_MR, np = (N + SG_NR - 1) / SG_NR;
    int64_t sa = lda, sk = 1;
    if (ta) { // A [K, M]: copy 8 columns at a time into [K][8] panels
        for (int ip = 0; ip < mp; ip++) {
            float *d = ap + (size_t)ip * SG_MR * K;
            int i0 = ip * SG_MR, mc = MIN(SG_MR, M - i0);
            __mmask16 m = (__mmask16)((1u << mc) - 1);
            for (int k = 0; k < K; k++)
                _mm256_storeu_ps(d + k * SG_MR, _mm512_castps512_ps256(_mm512_maskz_loadu_ps(m, A + (int64_t)k * lda + i0)));
        }
        sa = 1, sk = SG_MR;
    }
    for (int jp = 0; jp < np; jp++)
        for (int ip = 0; ip < mp; ip++) {
            const float *a = ta ? ap + (size_t)ip * SG_MR * K : A + (int64_t)ip * SG_MR * lda;
            sg_tile(K, a, sa, sk, bp + (size_t)jp * SG_NR * K, C + (int64_t)ip * SG_MR * ldc + jp * SG_NR, ldc, alpha,
                    beta, MIN(SG_MR, M - ip * SG_MR), MIN(SG_NR, N - jp * SG_NR));
        }
}

const struct fast_kern fast_kern_avx512 = {
    .name = "avx512",
    .mm_pk = mm_pk,
    .mm_pk_dot = NULL,
    .mm_f32 = mm_f32,
    .vexp = vexp,
    .vsilu = vsilu,
    .to_bf16 = NULL,
    .axpy = axpy,
    .relu2 = relu2,
    .scale = scale,
    .mul = mul,
    .sumsq = sumsq,
    .rms_apply = rms_apply,
    .conv_row = conv_row,
    .ssd_decay = ssd_decay,
    .ssd_out = ssd_out,
    .ssd_step = ssd_step,
    .sgemm_pack_b = sgemm_pack_b,
    .sgemm_packed = sgemm_packed,
};
#endif
