// fast_avx2.c - AVX2 + FMA kernels of the fast path (16 ymm registers: at
// most 8 accumulators per tile). Built with -mavx2 -mfma; called only when
// fast_detect() found them.
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

#define INL static inline __attribute__((always_inline))

INL void store_cols(float *yrow, __m256 lo8, __m256 hi8, int64_t pc, int64_t c0, int64_t c1) {
    if (pc >= c0 && pc + 16 <= c1) {
        _mm256_storeu_ps(yrow + (pc - c0), lo8);
        _mm256_storeu_ps(yrow + (pc - c0) + 8, hi8);
        return;
    }
    float t[16];
    _mm256_storeu_ps(t, lo8);
    _mm256_storeu_ps(t + 8, hi8);
    for (int64_t c = MAX(c0, pc); c < MIN(c1, pc + 16); c++) yrow[c - c0] = t[c - pc];
}

// mb (<= 2) rows against np panels of a group (w: the first panel's lane 0,
// pairs PKG lanes apart; mb * np <= 4); each accumulator takes the even and
// the odd column of a pair (two FMAs in a row, 8 chains in flight).
INL void pk_tile(float *y, int64_t ldy, const float *x, int64_t ldx, const uint32_t *w, int64_t kp2, int64_t pc,
                 int64_t c0, int64_t c1, const int mb, const int np) {
    __m256 acc[2][4][2];
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 2
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < np; j++) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    for (int64_t q = 0; q < kp2; q++) {
#pragma GCC unroll 4
        for (int j = 0; j < np; j++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(w + q * PKG + j * PK + h * 8));
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
#pragma GCC unroll 2
                for (int i = 0; i < mb; i++) {
                    acc[i][j][h] = _mm256_fmadd_ps(we, _mm256_set1_ps(x[i * ldx + 2 * q]), acc[i][j][h]);
                    acc[i][j][h] = _mm256_fmadd_ps(wo, _mm256_set1_ps(x[i * ldx + 2 * q + 1]), acc[i][j][h]);
                }
            }
    }
#pragma GCC unroll 2
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < np; j++) store_cols(y + i * ldy, acc[i][j][0], acc[i][j][1], pc + PK * j, c0, c1);
}

// One row: the whole group (4 panels, 8 accumulators); two rows: two panels
// at a time.
static void mm_pk(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                  int64_t c1) {
    int64_t kp2 = pk_kp(w->cols) / 2, g1 = (c1 + PKG - 1) / PKG;
    for (int64_t g = c0 / PKG; g < g1; g++) {
        const uint32_t *wg = pk_group(w, g);
        for (int i = 0; i < m; i += 2) {
            float *yy = y + (int64_t)i * ldy;
            const float *xx = x + (int64_t)i * ldx;
            if (m - i == 1) {
                pk_tile(yy, ldy, xx, ldx, wg, kp2, g * PKG, c0, c1, 1, 4);
            } else {
                pk_tile(yy, ldy, xx, ldx, wg, kp2, g * PKG, c0, c1, 2, 2);
                pk_tile(yy, ldy, xx, ldx, wg + 2 * PK, kp2, g * PKG + 2 * PK, c0, c1, 2, 2);
            }
        }
    }
}

INL float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// mb (<= 2) rows of x against rb (<= 4) weight rows, dot products along K.
INL void f32_tile(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, int64_t K, int64_t yoff,
                  const int mb, const int rb) {
    __m256 acc[2][4];
#pragma GCC unroll 2
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < rb; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
#pragma GCC unroll 2
        for (int i = 0; i < mb; i++) {
            __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 4
            for (int j = 0; j < rb; j++) acc[i][j] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(w + j * K + k), acc[i][j]);
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < mb; i++)
#pragma GCC unroll 4
        for (int j = 0; j < rb; j++) {
            float s = hsum8(acc[i][j]);
            for (int64_t kk = k; kk < K; kk++) s += x[i * ldx + kk] * w[j * K + kk];
            y[i * ldy + yoff + j] = s;
        }
}

static void mm_f32(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                   int64_t c1) {
    int64_t K = w->cols;
    for (int64_t c = c0; c < c1; c += 4) {
        int rb = (int)MIN(4, c1 - c);
        const float *wr = (const float *)w->data + c * K;
        for (int i = 0; i < m; i += 2) {
            float *yy = y + (int64_t)i * ldy;
            const float *xx = x + (int64_t)i * ldx;
            if (m - i >= 2 && rb == 4) f32_tile(yy, ldy, xx, ldx, wr, K, c - c0, 2, 4);
            else if (rb == 4) f32_tile(yy, ldy, xx, ldx, wr, K, c - c0, 1, 4);
            else
                for (int ii = i; ii < MIN(m, i + 2); ii++)
                    for (int j = 0; j < rb; j++) f32_tile(y + (int64_t)ii * ldy, ldy, x + (int64_t)ii * ldx, ldx,
                                                         wr + j * K, K, c - c0 + j, 1, 1);
        }
    }
}

// exp(x) as in fast_avx512.c, with 2^n built in the exponent bits: inputs
// are clamped to [-87.3, 88.7] and below -87.3 the result is 0.
INL __m256 exp8(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_set1_ps(88.7f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    // 2^n as two factors, so n = 128 (x near 88.7) does not overflow the exponent
    __m256i ni = _mm256_cvtps_epi32(n), h = _mm256_srai_epi32(ni, 1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(_mm256_mul_ps(p, s1), s2));
}

static void vexp(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = expf(x[i]);
}

static void vsilu(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
    for (; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

static void axpy(float *y, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void relu2(float *x, int64_t n) {
    __m256 z = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_max_ps(_mm256_loadu_ps(x + i), z);
        _mm256_storeu_ps(x + i, _mm256_mul_ps(v, v));
    }
    for (; i < n; i++) x[i] = x[i] > 0 ? x[i] * x[i] : 0.0f;
}

static void scale(float *x, float a, int64_t n) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(va, _mm256_loadu_ps(x + i)));
    for (; i < n; i++) x[i] *= a;
}

static void mul(float *x, const float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) x[i] *= y[i];
}

static double sumsq(const float *x, int64_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    __m256d a = _mm256_add_pd(a0, a1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double s = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static void rms_apply(float *out, const float *x, const float *w, float r, int64_t n) {
    __m256 vr = _mm256_set1_ps(r);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), vr)));
    for (; i < n; i++) out[i] = w[i] * (x[i] * r);
}

INL __m256 silu8(__m256 v) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
    return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static void conv_row(float *out, int nc, const float *const *in, const float (*wt)[FAST_CONV_CH], const float *bias,
                     int K) {
    for (int v = 0; v < FAST_CONV_CH / 8 && 8 * v < nc; v++) {
        __m256 acc = _mm256_loadu_ps(bias + 8 * v);
        for (int k = 0; k < K; k++) // no FMA: the reference rounds the product, then the sum
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(wt[k] + 8 * v), _mm256_loadu_ps(in[k] + 8 * v)));
        acc = silu8(acc);
        if (nc - 8 * v >= 8) {
            _mm256_storeu_ps(out + 8 * v, acc);
        } else {
            float t[8];
            _mm256_storeu_ps(t, acc);
            memcpy(out + 8 * v, t, sizeof(float) * (nc - 8 * v));
        }
    }
}

static void ssd_decay(float *m, const float *a, float ai, const float *cb, const float *dt, int n) {
    __m256 vai = _mm256_set1_ps(ai);
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(vai, _mm256_loadu_ps(a + j)));
        _mm256_storeu_ps(m + j, _mm256_mul_ps(e, _mm256_mul_ps(_mm256_loadu_ps(cb + j), _mm256_loadu_ps(dt + j))));
    }
    for (; j < n; j++) m[j] = expf(ai - a[j]) * (cb[j] * dt[j]);
}

static void ssd_out(float *y, float *xs, const float *yo, const float *yd, const float *x, float ein, float D, float wgt,
                    int P) {
    __m256 ve = _mm256_set1_ps(ein), vd = _mm256_set1_ps(D), vw = _mm256_set1_ps(wgt);
    int p = 0;
    for (; p + 8 <= P; p += 8) {
        __m256 xv = _mm256_loadu_ps(x + p);
        _mm256_storeu_ps(y + p, _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(ve, _mm256_loadu_ps(yo + p)), _mm256_mul_ps(vd, xv)),
                                              _mm256_loadu_ps(yd + p)));
        _mm256_storeu_ps(xs + p, _mm256_mul_ps(vw, xv));
    }
    for (; p < P; p++) {
        y[p] = ein * yo[p] + D * x[p] + yd[p];
        xs[p] = wgt * x[p];
    }
}

static void ssd_step(float *S, int P, int N, const float *x, const float *B, const float *C, float dt, float dA,
                     float D, float *y) {
    __m256 va = _mm256_set1_ps(dA);
    for (int p = 0; p < P; p++) {
        float *sp = S + (int64_t)p * N, d = dt * x[p];
        __m256 dx = _mm256_set1_ps(d), acc = _mm256_setzero_ps();
        int n = 0;
        for (; n + 8 <= N; n += 8) {
            __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(sp + n), va, _mm256_mul_ps(dx, _mm256_loadu_ps(B + n)));
            _mm256_storeu_ps(sp + n, v);
            acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(C + n), acc);
        }
        float s = hsum8(acc);
        for (; n < N; n++) {
            float v = sp[n] * dA + d * B[n];
            sp[n] = v;
            s += v * C[n];
        }
        y[p] = s + D * x[p];
    }
}

// ---- small fp32 GEMM (fast.h's sgemm_pack_b / sgemm_packed) ----
// op(B) packed into panels of 16 columns ([K][16] each); a 6 x 16 tile of C
// in 12 accumulators (with the two B vectors and a broadcast of A: 15 of the
// 16 ymm registers; 12 FMA chains cover the FMA latency of two pipes). Rows
// of A are read through a pointer each, so a tile may straddle the [K][8]
// panels a transposed A is copied into.
#define SG2_MR 6
#define SG2_NR 16
INL void sg_tile(int K, const float *const *ar, int64_t sk, const float *bp, float *C, int ldc, float alpha,
                 float beta, int mr, int nr) {
    __m256 acc[SG2_MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < SG2_MR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(bp + k * SG2_NR), b1 = _mm256_loadu_ps(bp + k * SG2_NR + 8);
#pragma GCC unroll 6
        for (int i = 0; i < SG2_MR; i++) {
            __m256 av = _mm256_broadcast_ss(ar[i] + k * sk);
            acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < SG2_MR; i++) { // a constant count: the sums stay registers (a loop to mr spilled them)
        if (i >= mr) break;
        float *c = C + (int64_t)i * ldc, t[SG2_NR];
        _mm256_storeu_ps(t, _mm256_mul_ps(_mm256_set1_ps(alpha), acc[i][0]));
        _mm256_storeu_ps(t + 8, _mm256_mul_ps(_mm256_set1_ps(alpha), acc[i][1]));
        for (int j = 0; j < nr; j++) c[j] = beta != 0.0f ? t[j] + beta * c[j] : t[j];
    }
}

// r[0..7] (rows) -> their transpose, in registers.
INL void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 8; i += 4)
        for (int j = 0; j < 2; j++) {
            u[i + j] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0x44);
            u[i + j + 2] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0xee);
        }
    for (int i = 0; i < 4; i++) {
        int a = (i & 1) * 2 + (i >> 1); // u's order: rows 0 2 1 3 of each half
        r[i] = _mm256_permute2f128_ps(u[a], u[a + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[a], u[a + 4], 0x31);
    }
}

static void sgemm_pack_b(float *bp, int N, int K, const float *B, int ldb, int tb) {
    for (int jp = 0; jp < (N + SG2_NR - 1) / SG2_NR; jp++) {
        float *d = bp + (size_t)jp * SG2_NR * K;
        int n0 = jp * SG2_NR, nc = MIN(SG2_NR, N - n0), k = 0;
        if (tb && nc == SG2_NR) // B [N, K]: 8 x 8 blocks transposed in registers
            for (; k + 8 <= K; k += 8)
                for (int h = 0; h < SG2_NR; h += 8) {
                    __m256 r[8];
                    for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(B + (int64_t)(n0 + h + j) * ldb + k);
                    transpose8(r);
                    for (int j = 0; j < 8; j++) _mm256_storeu_ps(d + (k + j) * SG2_NR + h, r[j]);
                }
        for (; k < K; k++)
            for (int j = 0; j < SG2_NR; j++) // tb: a column of B a row of the panel
                d[k * SG2_NR + j] = j >= nc ? 0.0f : tb ? B[(int64_t)(n0 + j) * ldb + k] : B[(int64_t)k * ldb + n0 + j];
    }
}

static void sgemm_packed(int M, int N, int K, float alpha, const float *A, int lda, int ta, const float *bp, float beta,
                         float *C, int ldc, float *ap) {
    int np = (N + SG2_NR - 1) / SG2_NR;
    if (ta) // A [K, M]: copied into [K][8] panels (fast_sgemm_a_floats), row i at panel i / 8, lane i % 8
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++) ap[(size_t)(i / 8) * 8 * K + (size_t)k * 8 + i % 8] = A[(int64_t)k * lda + i];
    int64_t sk = ta ? 8 : 1;
    for (int jp = 0; jp < np; jp++)
        for (int i0 = 0; i0 < M; i0 += SG2_MR) {
            const float *ar[SG2_MR];
            for (int i = 0; i < SG2_MR; i++) { // rows past M repeat row i0 (not stored)
                int r = i0 + i < M ? i0 + i : i0;
                ar[i] = ta ? ap + (size_t)(r / 8) * 8 * K + r % 8 : A + (int64_t)r * lda;
            }
            sg_tile(K, ar, sk, bp + (size_t)jp * SG2_NR * K, C + (int64_t)i0 * ldc + jp * SG2_NR, ldc, alpha, beta,
                    MIN(SG2_MR, M - i0), MIN(SG2_NR, N - jp * SG2_NR));
        }
}

const struct fast_kern fast_kern_avx2 = {
    .name = "avx2",
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
