// fast_scalar.c - portable C kernels of the fast path: the same tiling as
// the vector kernels (weights streamed once per tile of rows), left to the
// compiler to vectorize. Any CPU runs them.
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"
#include "io/dtype.h"

// Up to 4 rows of x against one panel (w: its lane 0, pairs PKG lanes apart).
static void pk_tile(float *y, int64_t ldy, const float *x, int64_t ldx, int mb, const uint32_t *w, int64_t kp2,
                    int64_t pc, int64_t c0, int64_t c1) {
    float acc[4][PK] = {{0}};
    for (int64_t q = 0; q < kp2; q++) {
        const uint32_t *v = w + q * PKG;
        float we[PK], wo[PK];
        for (int j = 0; j < PK; j++) {
            uint32_t e = v[j] << 16, o = v[j] & 0xffff0000u;
            memcpy(&we[j], &e, 4);
            memcpy(&wo[j], &o, 4);
        }
        for (int i = 0; i < mb; i++) {
            float a = x[i * ldx + 2 * q], b = x[i * ldx + 2 * q + 1];
            for (int j = 0; j < PK; j++) acc[i][j] += we[j] * a + wo[j] * b;
        }
    }
    for (int i = 0; i < mb; i++)
        for (int64_t c = MAX(c0, pc); c < MIN(c1, pc + PK); c++) y[i * ldy + c - c0] = acc[i][c - pc];
}

static void mm_pk(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                  int64_t c1) {
    int64_t kp2 = pk_kp(w->cols) / 2, p1 = (c1 + PK - 1) / PK;
    for (int64_t p = c0 / PK; p < p1; p++)
        for (int i = 0; i < m; i += 4)
            pk_tile(y + (int64_t)i * ldy, ldy, x + (int64_t)i * ldx, ldx, MIN(4, m - i),
                    pk_group(w, p / 4) + p % 4 * PK, kp2, p * PK, c0, c1);
}

static void mm_f32(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                   int64_t c1) {
    int64_t K = w->cols;
    for (int64_t c = c0; c < c1; c++) {
        const float *wr = (const float *)w->data + c * K;
        for (int i = 0; i < m; i++) {
            const float *xr = x + (int64_t)i * ldx;
            float acc[8] = {0}; // independent partial sums: vectorizable without reassociation
            int64_t k = 0;
            for (; k + 8 <= K; k += 8)
                for (int l = 0; l < 8; l++) acc[l] += xr[k + l] * wr[k + l];
            float s = 0;
            for (int l = 0; l < 8; l++) s += acc[l];
            for (; k < K; k++) s += xr[k] * wr[k];
            y[(int64_t)i * ldy + c - c0] = s;
        }
    }
}

static void vexp(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = expf(x[i]);
}

static void vsilu(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

static void to_bf16(uint16_t *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = f32_to_bf16(x[i]);
}

static void axpy(float *restrict y, float a, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void relu2(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0 ? x[i] * x[i] : 0.0f;
}

static void scale(float *x, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= a;
}

static void mul(float *restrict x, const float *restrict y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= y[i];
}

static double sumsq(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static void rms_apply(float *out, const float *x, const float *w, float r, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

static void conv_row(float *out, int nc, const float *const *in, const float (*wt)[FAST_CONV_CH], const float *bias,
                     int K) {
    float acc[FAST_CONV_CH];
    for (int i = 0; i < FAST_CONV_CH; i++) acc[i] = bias[i];
    for (int k = 0; k < K; k++) {
        const float *restrict x = in[k], *restrict w = wt[k];
        for (int i = 0; i < FAST_CONV_CH; i++) acc[i] += w[i] * x[i];
    }
    vsilu(out, acc, nc);
}

static void ssd_decay(float *m, const float *a, float ai, const float *cb, const float *dt, int n) {
    for (int j = 0; j < n; j++) m[j] = expf(ai - a[j]) * (cb[j] * dt[j]);
}

static void ssd_out(float *y, float *xs, const float *yo, const float *yd, const float *x, float ein, float D, float wgt,
                    int P) {
    for (int p = 0; p < P; p++) {
        y[p] = ein * yo[p] + D * x[p] + yd[p];
        xs[p] = wgt * x[p];
    }
}

// Partial sums in 16 independent lanes, so the compiler can vectorize.
static void ssd_step(float *S, int P, int N, const float *x, const float *B, const float *C, float dt, float dA,
                     float D, float *y) {
    int n16 = N & ~15;
    for (int p = 0; p < P; p++) {
        float *sp = S + (int64_t)p * N, dx = dt * x[p], part[16] = {0};
        for (int n0 = 0; n0 < n16; n0 += 16)
            for (int l = 0; l < 16; l++) {
                float v = sp[n0 + l] * dA + dx * B[n0 + l];
                sp[n0 + l] = v;
                part[l] += v * C[n0 + l];
            }
        float acc = 0;
        for (int n = n16; n < N; n++) {
            float v = sp[n] * dA + dx * B[n];
            sp[n] = v;
            acc += v * C[n];
        }
        for (int l = 0; l < 16; l++) acc += part[l];
        y[p] = acc + D * x[p];
    }
}

const struct fast_kern fast_kern_scalar = {
    .name = "scalar",
    .mm_pk = mm_pk,
    .mm_pk_dot = NULL,
    .mm_f32 = mm_f32,
    .vexp = vexp,
    .vsilu = vsilu,
    .to_bf16 = to_bf16,
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
};
