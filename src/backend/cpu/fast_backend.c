// fast_backend.c - the fast path's CPU detection, weights (fp32 row-major or
// bf16 panels) and matmul: row-parallel tasks over output columns, each
// streaming its slice of the weight once for all rows of the batch.
#include <cblas.h>
#undef I // complex.h's imaginary unit, pulled in by cblas.h
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"
#include "io/dtype.h"

#if defined(__x86_64__)
#include <cpuid.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

enum fast_isa fast_detect(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return FAST_SCALAR;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1;
    if (!osxsave) return FAST_SCALAR;
    uint64_t xcr0 = xgetbv0();
    int ymm_os = (xcr0 & 6) == 6, zmm_os = (xcr0 & 0xe6) == 0xe6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return FAST_SCALAR;
    int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    unsigned a1 = 0, b1, c1, d1;
    __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    int bf16 = (a1 >> 5) & 1;
    if (zmm_os && f && dq && bw && vl && fma) return bf16 ? FAST_AVX512_BF16 : FAST_AVX512;
    if (ymm_os && avx2 && fma) return FAST_AVX2;
#endif
    return FAST_SCALAR;
}

const char *fast_isa_name(enum fast_isa isa) {
    static const char *names[] = {"scalar", "avx2", "avx512", "avx512_bf16"};
    return names[isa];
}

void fast_kern_for(enum fast_isa isa, struct fast_kern *k) {
    *k = fast_kern_scalar;
#if defined(__x86_64__)
    if (isa >= FAST_AVX512) *k = fast_kern_avx512;
    else if (isa == FAST_AVX2) *k = fast_kern_avx2;
    if (isa == FAST_AVX512_BF16) {
        k->name = "avx512_bf16";
        k->mm_pk_dot = fast_mm_pk_dot_avx512bf16;
        k->to_bf16 = fast_to_bf16_avx512bf16;
    }
#endif
    if (!k->to_bf16) k->to_bf16 = fast_kern_scalar.to_bf16;
    k->mm_q = fast_mm_q_scalar, k->deq_q = fast_deq_q_scalar;
    k->mm_q_rows[0] = k->mm_q_rows[1] = k->mm_q_rows[2] = 8;
    fast_fp8_lut_init();
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (isa == FAST_AVX2 && __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1)) { // F16C: vcvtph2ps
        k->mm_q = fast_mm_q_avx2, k->deq_q = fast_deq_q_avx2;
        // Zen 1, 2 threads, [8192, 1024] and [4096, 2688] at 9-16 rows: FP8
        // passes of 4 rows win to 12 (4.48 against 4.91 ms at 12), blocks
        // to 11, NVFP4 not past 8 (5.73 against 5.50 ms at 9)
        k->mm_q_rows[0] = 12, k->mm_q_rows[1] = 11;
    }
    if (isa >= FAST_AVX512) {
        k->mm_q = fast_mm_q_avx512, k->deq_q = fast_deq_q_avx512; // mm_q_rows 8: not measured past 8
    }
    // The FP8 table kernel needs AVX512_VBMI, which some AVX512_BF16 CPUs
    // (Cooper Lake) lack; the plain avx512 set keeps the other kernel, so a
    // VBMI machine tests both (tests/cpu/test_quant_kernels.c).
    if (isa == FAST_AVX512_BF16 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 1) & 1)) {
        fast_quant_vbmi_init();
        k->mm_fp8p = fast_mm_fp8_vbmi, k->perm_x64 = fast_perm_x64;
    }
#endif
}

int fast_reserve_shared(struct backend *be, int slot, size_t bytes, const char *what) {
    struct cpu_impl *c = cpu_of(be);
    if (c->shared_size[slot] >= bytes) return VLLM_OK;
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of CPU scratch for %s", bytes, what);
    free(c->shared[slot]);
    c->shared[slot] = p;
    c->shared_size[slot] = bytes;
    return VLLM_OK;
}

static int reserve_pack(struct backend *be, size_t floats, const char *what) {
    struct cpu_impl *c = cpu_of(be);
    size_t bytes = sizeof(float) * floats + 64;
    for (int t = 0; t < be->num_threads; t++) {
        if (c->pack_size[t] >= bytes) continue;
        void *p = malloc(bytes);
        if (!p) return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of CPU scratch for %s", bytes, what);
        free(c->pack[t]);
        c->pack[t] = p;
        c->pack_size[t] = bytes;
    }
    return VLLM_OK;
}

// Set at load (fast_supports); growing here is only a fallback.
void *fast_shared(struct backend *be, int slot, size_t bytes) {
    struct cpu_impl *c = cpu_of(be);
    if (c->shared_size[slot] < bytes) {
        free(c->shared[slot]);
        c->shared[slot] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        if (!c->shared[slot]) {
            fprintf(stderr, "vllm: out of memory (%zu bytes of CPU scratch)\n", bytes);
            abort();
        }
        c->shared_size[slot] = bytes;
    }
    return c->shared[slot];
}

float *fast_pack_scratch(struct backend *be, int thread, size_t floats) {
    struct cpu_impl *c = cpu_of(be);
    size_t bytes = sizeof(float) * floats + 64;
    if (c->pack_size[thread] < bytes) {
        free(c->pack[thread]);
        c->pack[thread] = xmalloc(bytes);
        c->pack_size[thread] = bytes;
    }
    return (float *)(((uintptr_t)c->pack[thread] + 63) & ~(uintptr_t)63);
}

// ---- small fp32 GEMM ----

size_t fast_sgemm_b_floats(int N, int K) { return (size_t)(N + 31) / 32 * 32 * (size_t)K + 16; }
size_t fast_sgemm_a_floats(int M, int K) { return (size_t)(M + 7) / 8 * 8 * (size_t)K + 16; }

void fast_sgemm_prep_b(struct backend *be, struct fast_bmat *m, int N, int K, const float *B, int ldb, int tb,
                       float *space) {
    const struct fast_kern *k = fast_k(be);
    *m = (struct fast_bmat){B, ldb, tb, NULL};
    if (k->sgemm_pack_b && N > 0 && K > 0) {
        float *bp = (float *)(((uintptr_t)space + 63) & ~(uintptr_t)63);
        k->sgemm_pack_b(bp, N, K, B, ldb, tb);
        m->packed = bp;
    }
}

void fast_sgemm_b(struct backend *be, int M, int N, int K, float alpha, const float *A, int lda, int ta,
                  const struct fast_bmat *m, float beta, float *C, int ldc, float *apack) {
    if (M <= 0 || N <= 0) return;
    if (m->packed) {
        fast_k(be)->sgemm_packed(M, N, K, alpha, A, lda, ta, m->packed, beta, C, ldc,
                                 (float *)(((uintptr_t)apack + 63) & ~(uintptr_t)63));
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, m->tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                m->b, m->ldb, beta, C, ldc);
}

// ---- weights ----

size_t fast_pk_bytes(int64_t rows, int64_t cols) { return sizeof(uint32_t) * pk_groups(rows) * pk_gstride(cols); }

int fast_weight_alloc(struct backend *be, struct weight *w, enum wfmt fmt, int64_t rows, int64_t cols) {
    memset(w, 0, sizeof *w);
    (void)be;
    size_t bytes = 0;
    switch (fmt) {
    case WF_F32: bytes = sizeof(float) * (size_t)rows * cols; break;
    case WF_BF16: bytes = fast_pk_bytes(rows, cols); break;
    case WF_F16:
        return vllm_err(VLLM_ERR_UNSUPPORTED, "the CPU fast path has no float16 weights (use bfloat16 or float32)");
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: bytes = (size_t)rows * wfmt_bytes(fmt, cols) + 64; break; // + 64: the kernels' 16-byte loads
    }
    w->data = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!w->data)
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for a [%lld, %lld] %s weight", bytes,
                        (long long)rows, (long long)cols, wfmt_name(fmt));
    memset(w->data, 0, bytes); // pad rows and columns of the packed layout read as zeros
    w->fmt = fmt;
    w->rows = rows;
    w->cols = cols;
    return wfmt_quantized(fmt) ? fast_quant_alloc(w) : VLLM_OK;
}

struct pack_ctx {
    const struct weight *w;
    int64_t row0, n, ld;
    const void *src;
    enum wfmt fmt;
};

// bf16 bits of element i of a source row
static uint32_t bf16_bits(const void *row, enum wfmt f, int64_t i) {
    switch (f) {
    case WF_F32: return f32_to_bf16(((const float *)row)[i]);
    case WF_BF16: return ((const uint16_t *)row)[i]; // checkpoint bytes as they are
    case WF_F16: return f32_to_bf16(f16_to_f32(((const uint16_t *)row)[i]));
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: break; // never packed (fast_weight_upload_raw)
    }
    return 0;
}

// Source rows [64 t, 64 t + 64) of the upload into the panel layout (fast.h).
static void pack_task(void *ctx, int t, int thread) {
    (void)thread;
    struct pack_ctx *c = ctx;
    int64_t kp2 = pk_kp(c->w->cols) / 2, cols = c->w->cols, es = (int64_t)wfmt_size(c->fmt);
    for (int64_t i = (int64_t)t * PKG; i < MIN(c->n, (int64_t)(t + 1) * PKG); i++) {
        int64_t r = c->row0 + i;
        const char *s = (const char *)c->src + i * c->ld * es;
        uint32_t *d = (uint32_t *)pk_group(c->w, r / PKG) + r % PKG;
        for (int64_t q = 0; q < kp2; q++) {
            uint32_t lo = bf16_bits(s, c->fmt, 2 * q), hi = 2 * q + 1 < cols ? bf16_bits(s, c->fmt, 2 * q + 1) : 0;
            d[q * PKG] = lo | hi << 16;
        }
    }
}

int fast_weight_upload_raw(struct backend *be, struct weight *w, int64_t row0, int64_t n, const void *src,
                           enum wfmt src_fmt, int64_t ld) {
    switch (w->fmt) {
    case WF_F32: {
        size_t es = wfmt_size(src_fmt);
        for (int64_t r = 0; r < n; r++)
            wfmt_convert(WF_F32, (float *)w->data + (row0 + r) * w->cols, src_fmt, (const char *)src + r * ld * es,
                         w->cols);
        return VLLM_OK;
    }
    case WF_BF16: {
        struct pack_ctx c = {w, row0, n, ld, src, src_fmt};
        cpu_parallel(be, (int)CDIV(n, PKG), pack_task, &c);
        return VLLM_OK;
    }
    case WF_F16: break;
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: return cpu_quant_upload(w, row0, n, src, src_fmt, ld);
    }
    return vllm_err(VLLM_ERR_UNSUPPORTED, "the CPU fast path has no %s weights", wfmt_name(w->fmt));
}

// The reference's values (the same xorshift64 stream), rounded to bf16 and
// packed 64 rows at a time when the weight is bf16.
int fast_weight_random(struct backend *be, struct weight *w, uint64_t seed, float std) {
    if (wfmt_quantized(w->fmt)) return weight_random_quant(be, w, seed, std);
    int64_t rows = w->rows, cols = w->cols;
    float a = std * 1.7320508f * 0x1.0p-31f;
    uint64_t x = seed | 1;
    float *tmp = xmalloc(sizeof(float) * PKG * cols);
    for (int64_t g = 0; g < pk_groups(rows); g++) {
        int64_t r0 = g * PKG, nr = MIN(PKG, rows - r0);
        for (int64_t i = 0; i < nr * cols; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            tmp[i] = a * (float)(int32_t)(x >> 32);
        }
        int rc = fast_weight_upload_raw(be, w, r0, nr, tmp, WF_F32, cols);
        if (rc) {
            free(tmp);
            return rc;
        }
    }
    free(tmp);
    return VLLM_OK;
}

void fast_embed(struct backend *be, float *out, const struct weight *table, const int32_t *ids, int n) {
    (void)be;
    int64_t d = table->cols;
    for (int t = 0; t < n; t++) {
        float *o = out + (int64_t)t * d;
        switch (table->fmt) {
        case WF_F32: memcpy(o, (const float *)table->data + (int64_t)ids[t] * d, sizeof(float) * d); break;
        case WF_BF16: {
            const uint32_t *v = pk_group(table, ids[t] / PKG) + ids[t] % PKG;
            for (int64_t k = 0; k < d; k++) o[k] = bf16_to_f32((uint16_t)(v[k / 2 * PKG] >> (k % 2 * 16)));
            break;
        }
        case WF_F16: break; // refused by fast_supports
        case WF_FP8:
        case WF_FP8_B128:
        case WF_NVFP4: // never made by the loader (embeddings stay fp32); exact anyway
            for (int64_t k = 0; k < d; k++) o[k] = wfmt_dequant(table->fmt, table->data, table->scale, table->bscale, d, ids[t], k);
            break;
        }
    }
}

// ---- matmul ----

// From this many rows on, a bf16 weight runs the bf16 dot kernel (x rounded
// to bf16): below it the fp32 kernel is bandwidth-bound anyway and exact.
#define DOT_MIN_ROWS 16
// Up to this many rows an fp32 weight runs the dot-product kernel, above it
// the kernel set's sgemm (AVX-512; about 3x OpenBLAS 0.3.21's AVX2 kernel on
// this CPU), else OpenBLAS sgemm, single-threaded on each task's columns.
#define F32_KERNEL_MAX_ROWS 8

// A quantized format's place in fast_kern.mm_q_rows.
static int q_fmt_index(enum wfmt f) { return f == WF_FP8 ? 0 : f == WF_FP8_B128 ? 1 : 2; }

// Columns per task of an fp32 sgemm (fast_matmul_cols).
static int64_t sgemm_per(int64_t cols, int nt) { return MAX(32, CDIV(CDIV(cols, 4 * nt), 32) * 32); }

int fast_use_dot(struct backend *be, const struct weight *w, int n) {
    return w->fmt == WF_BF16 && fast_k(be)->mm_pk_dot && cpu_of(be)->bf16_dot && n >= DOT_MIN_ROWS;
}

void fast_mm_serial(struct backend *be, int thread, float *y, int64_t ldy, const float *x, int64_t ldx,
                    const uint16_t *xb, int64_t ldxb, int n, const struct weight *w, int64_t c0, int64_t c1) {
    const struct fast_kern *k = fast_k(be);
    if (c0 >= c1 || n <= 0) return;
    switch (w->fmt) {
    case WF_BF16:
        if (xb) k->mm_pk_dot(y, ldy, xb, ldxb, n, w, c0, c1);
        else k->mm_pk(y, ldy, x, ldx, n, w, c0, c1);
        return;
    case WF_F32: break;
    case WF_F16: return; // refused by fast_supports
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4:
        if (n > k->mm_q_rows[q_fmt_index(w->fmt)]) {
            fast_mm_q_many(be, thread, y, ldy, x, ldx, n, w, c0, c1);
        } else if (k->mm_fp8p && w->fmt != WF_NVFP4 && w->cols >= 64) { // x permuted for the table kernel
            int64_t K64 = w->cols / 64 * 64;
            float *xp = fast_pack_scratch(be, thread, (size_t)n * K64);
            for (int i = 0; i < n; i++) k->perm_x64(xp + i * K64, x + i * ldx, w->cols);
            k->mm_fp8p(y, ldy, x, ldx, xp, K64, n, w, c0, c1);
        } else {
            k->mm_q(y, ldy, x, ldx, n, w, c0, c1);
        }
        return;
    }
    if (n <= F32_KERNEL_MAX_ROWS) {
        k->mm_f32(y, ldy, x, ldx, n, w, c0, c1);
    } else if (k->sgemm_pack_b) { // the kernel set's sgemm on W^T, packed per call
        int K = (int)w->cols, nc = (int)(c1 - c0);
        float *bp = fast_pack_scratch(be, thread, fast_sgemm_b_floats(nc, K));
        k->sgemm_pack_b(bp, nc, K, (const float *)w->data + c0 * K, K, 1);
        k->sgemm_packed(n, nc, K, 1.0f, x, (int)ldx, 0, bp, 0.0f, y, (int)ldy, NULL);
    } else {
        int K = (int)w->cols;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)(c1 - c0), K, 1.0f, x, (int)ldx,
                    (const float *)w->data + c0 * K, K, 0.0f, y, (int)ldy);
    }
}

struct mm_ctx {
    struct backend *be;
    float *y;
    int64_t ldy;
    const float *x;
    int64_t ldx;
    const uint16_t *xb;
    int64_t ldxb;
    int n;
    const struct weight *w;
    int64_t c0, c1, per;
};

static void mm_task(void *ctx, int i, int thread) {
    struct mm_ctx *c = ctx;
    int64_t a = c->c0 + i * c->per, b = MIN(c->c1, a + c->per);
    float *y = c->y + (a - c->c0);
    fast_mm_serial(c->be, thread, y, c->ldy, c->x, c->ldx, c->xb, c->ldxb, c->n, c->w, a, b);
    for (int r = 0; c->w->bias && r < c->n; r++) {
        float *yr = y + (int64_t)r * c->ldy;
        for (int64_t j = a; j < b; j++) yr[j - a] += c->w->bias[j];
    }
}

struct cvt_ctx {
    const struct fast_kern *k;
    uint16_t *dst;
    int64_t ldd;
    const float *src;
    int64_t lds, cols;
    int rows_per;
    int n;
};

static void cvt_task(void *ctx, int i, int thread) {
    (void)thread;
    struct cvt_ctx *c = ctx;
    for (int r = i * c->rows_per; r < MIN(c->n, (i + 1) * c->rows_per); r++) {
        c->k->to_bf16(c->dst + r * c->ldd, c->src + r * c->lds, c->cols);
        if (c->ldd > c->cols) c->dst[r * c->ldd + c->cols] = 0; // the odd column's pad
    }
}

// x [n, ldx] fp32 -> bf16 [n, pk_kp(cols)] in shared scratch slot.
static uint16_t *to_bf16_rows(struct backend *be, int slot, const float *x, int64_t ldx, int n, int64_t cols) {
    int64_t kp = pk_kp(cols);
    uint16_t *xb = fast_shared(be, slot, sizeof(uint16_t) * (size_t)n * kp);
    struct cvt_ctx c = {fast_k(be), xb, kp, x, ldx, cols, 16, n};
    cpu_parallel(be, (n + 15) / 16, cvt_task, &c);
    return xb;
}

void fast_matmul_cols(struct backend *be, float *y, int64_t ldy, const float *x, int64_t ldx, int n,
                      const struct weight *w, int64_t c0, int64_t c1) {
    if (n <= 0 || c0 >= c1) return;
    int nt = be->num_threads;
    struct mm_ctx c = {be, y, ldy, x, ldx, NULL, 0, n, w, c0, c1, 0};
    int64_t cols = c1 - c0, K = w->cols;
    if (w->fmt == WF_BF16) {
        if (fast_use_dot(be, w, n)) {
            c.xb = to_bf16_rows(be, 0, x, ldx, n, K);
            c.ldxb = pk_kp(K);
        } else if (K % 2) { // the fp32 kernel reads whole column pairs: pad x with a zero column
            float *xp = fast_shared(be, 0, sizeof(float) * (size_t)n * (K + 1));
            for (int i = 0; i < n; i++) {
                memcpy(xp + (int64_t)i * (K + 1), x + (int64_t)i * ldx, sizeof(float) * K);
                xp[(int64_t)i * (K + 1) + K] = 0;
            }
            c.x = xp;
            c.ldx = K + 1;
        }
        // Groups per task. GEMV: about 4 tasks per thread (each task streams its
        // slice once). Dot kernel: one group (every task reads all of x
        // whatever its size, so small tasks cost nothing and balance the
        // threads), more only when there would be over 16 tasks per thread.
        int64_t groups = CDIV(cols, PKG), per;
        if (c.xb) per = MAX(1, groups / (16 * nt));
        else per = MAX(1, groups / (4 * nt));
        c.per = per * PKG;
    } else if (n <= F32_KERNEL_MAX_ROWS) {
        c.per = MAX(16, CDIV(CDIV(cols, 4 * nt), 16) * 16);
    } else { // sgemm: whole 32-column panels, about 4 tasks per thread
        c.per = sgemm_per(cols, nt);
    }
    cpu_parallel(be, (int)CDIV(cols, c.per), mm_task, &c);
}

static int matmul_reserve(struct backend *be, const struct weight *w, int n) {
    int64_t K = w->cols;
    size_t xb = sizeof(uint16_t) * (size_t)n * pk_kp(K), xp = sizeof(float) * (size_t)n * (K + 1);
    TRY(fast_reserve_shared(be, 0, MAX(xb, xp), "matmul"));
    if (w->fmt == WF_F32 && n > F32_KERNEL_MAX_ROWS && fast_k(be)->sgemm_pack_b)
        TRY(reserve_pack(be, fast_sgemm_b_floats((int)MIN(w->rows, sgemm_per(w->rows, be->num_threads)), (int)K),
                         "matmul"));
    return fast_quant_reserve(be, w, n);
}

int fast_quant_reserve(struct backend *be, const struct weight *w, int n) {
    if (!wfmt_quantized(w->fmt)) return VLLM_OK;
    int rows = fast_k(be)->mm_q_rows[q_fmt_index(w->fmt)];
    size_t few = (size_t)rows * w->cols; // the permuted x of the FP8 table kernel
    return reserve_pack(be, n > rows ? MAX(few, fast_quant_pack_floats(w->cols)) : few, "a quantized matmul");
}

// What the reference needs (its ops are the fast path's fallbacks), then
// the fast ops' own limits and scratch.
int fast_supports(struct backend *be, const struct op_query *q) {
    TRY(cpu_supports(be, q));
    int n = MAX(q->max_tokens, 1);
    switch (q->op) {
    case OP_MATMUL:
    case OP_EMBED:
        if (q->w->fmt == WF_F16)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "the CPU fast path has no float16 weights (use bfloat16 or float32)");
        return q->op == OP_MATMUL ? matmul_reserve(be, q->w, n) : VLLM_OK;
    case OP_ATTN:
        TRY(fast_reserve_shared(be, 0, sizeof(int) * 2 * (size_t)n, "attention")); // tasks <= tokens
        return cpu_reserve(be, fast_attn_scratch(q->attn, MAX(q->max_seq_len, 1)), "attention");
    case OP_MAMBA:
        if (q->mamba->conv_kernel > 8)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "the CPU fast path's conv1d takes conv_kernel <= 8, not %d",
                            q->mamba->conv_kernel);
        return cpu_reserve(be, fast_ssd_scratch(q->mamba), "the SSD scan");
    case OP_MOE_ROUTE: return VLLM_OK;
    case OP_MOE_EXPERTS: {
        const struct moe_experts *w = q->moe;
        if (w->up.fmt == WF_F16 || w->down.fmt == WF_F16)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "the CPU fast path has no float16 weights (use bfloat16 or float32)");
        return fast_moe_reserve(be, w, n, q->route->top_k);
    }
    case OP_KDA:
        // the chunked prefill and the decode recurrence (fast_kimi.c), the fast conv1d
        if (q->kda->conv_kernel > 8)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "the CPU fast path's conv1d takes conv_kernel <= 8, not %d",
                            q->kda->conv_kernel);
        return cpu_reserve(be, fast_kda_scratch(q->kda), "the KDA chunks");
    case OP_MLA: // mla_attn as products (fast_kimi.c); mla_kv_write the reference's
        TRY(fast_reserve_shared(be, 0, sizeof(int) * 2 * (size_t)n, "MLA")); // tasks <= tokens
        return cpu_reserve(be, fast_mla_scratch(q->mla, MAX(q->max_seq_len, 1)), "multi-head latent attention");
    case OP_SAMPLE: return VLLM_OK; // the reference's sampler
    }
    return VLLM_OK;
}

void fast_matmul(struct backend *be, float *y, const float *x, const struct weight *w, int n) {
    fast_matmul_cols(be, y, w->rows, x, w->cols, n, w, 0, w->rows);
}

struct act_ctx {
    const struct fast_kern *k;
    enum act kind;
    float *out;
    const float *x;
    int64_t n;
    int inter; // act_mul: the gated width; 0: act in place
};

static void act_task(void *ctx, int i, int thread) {
    (void)thread;
    struct act_ctx *c = ctx;
    if (!c->inter) {
        int64_t a = (int64_t)i * 16384;
        fast_act_span(c->k, c->kind, c->out + a, MIN(16384, c->n - a));
        return;
    }
    for (int64_t t = (int64_t)i * 16; t < MIN(c->n, (int64_t)i * 16 + 16); t++) { // rows: out = act(gate) * up
        float *o = c->out + t * c->inter;
        const float *g = c->x + t * 2 * c->inter;
        memcpy(o, g, sizeof(float) * c->inter);
        fast_act_span(c->k, c->kind, o, c->inter);
        c->k->mul(o, g + c->inter, c->inter);
    }
}

void fast_act(struct backend *be, enum act kind, float *x, int64_t n) {
    struct act_ctx c = {fast_k(be), kind, x, x, n, 0};
    cpu_parallel(be, (int)CDIV(n, 16384), act_task, &c);
}

void fast_act_mul(struct backend *be, enum act kind, float *out, const float *x, int n, int inter) {
    struct act_ctx c = {fast_k(be), kind, out, x, n, inter};
    cpu_parallel(be, CDIV(n, 16), act_task, &c);
}

// rope and head_rmsnorm: the reference's row functions, 16 rows a task
struct head_ctx {
    float *x;
    int ld, n, heads, head_dim;
    const float *table, *w;
    const int32_t *pos;
    float eps;
};

static void rope_task(void *ctx, int i, int thread) {
    (void)thread;
    struct head_ctx *c = ctx;
    for (int t = i * 16; t < MIN(c->n, i * 16 + 16); t++)
        cpu_rope_row(c->x + (int64_t)t * c->ld, c->heads, c->head_dim, c->table + (int64_t)c->pos[t] * c->head_dim);
}

static void head_norm_task(void *ctx, int i, int thread) {
    (void)thread;
    struct head_ctx *c = ctx;
    for (int t = i * 16; t < MIN(c->n, i * 16 + 16); t++)
        cpu_head_rmsnorm_row(c->x + (int64_t)t * c->ld, c->heads, c->head_dim, c->w, c->eps);
}

void fast_rope(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *table,
               const int32_t *positions) {
    struct head_ctx c = {x, ld, n, heads, head_dim, table, NULL, positions, 0};
    cpu_parallel(be, CDIV(n, 16), rope_task, &c);
}

void fast_head_rmsnorm(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *w, float eps) {
    struct head_ctx c = {x, ld, n, heads, head_dim, NULL, w, NULL, eps};
    cpu_parallel(be, CDIV(n, 16), head_norm_task, &c);
}

// qk_norm_rope: the reference's row function, 16 rows a task
struct qk_ctx {
    float *qkv;
    void *kc, *vc;
    enum dtype kv;
    int ld, t0, t1;
    const struct attn_prep *p;
    const struct batch *b;
    const struct attn_dims *d;
};

static void qk_task(void *ctx, int i, int thread) {
    (void)thread;
    struct qk_ctx *c = ctx;
    for (int t = c->t0 + i * 16; t < MIN(c->t1, c->t0 + i * 16 + 16); t++)
        cpu_qk_norm_rope_row(c->qkv, c->ld, t, c->p, c->kc, c->vc, c->kv, c->b, c->d);
}

void fast_qk_rows(struct backend *be, float *qkv, int ld, const struct attn_prep *p, void *k_cache, void *v_cache,
                  const struct batch *b, int t0, int t1, const struct attn_dims *d) {
    struct qk_ctx c = {qkv, k_cache, v_cache, be->kv_dtype, ld, t0, t1, p, b, d};
    if (t1 > t0) cpu_parallel(be, CDIV(t1 - t0, 16), qk_task, &c);
}

void fast_qk_norm_rope(struct backend *be, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                       void *v_cache, const struct batch *b, int t0, const struct attn_dims *d) {
    fast_qk_rows(be, qkv, ld, p, k_cache, v_cache, b, t0, b->num_tokens, d);
}

// rmsnorm rows (res += x first when res is given), 16 rows a task.
struct norm_ctx {
    const struct fast_kern *k;
    float *res, *out;
    const float *x, *w;
    int n, dim;
    float eps;
};

static void norm_task(void *ctx, int i, int thread) {
    (void)thread;
    struct norm_ctx *c = ctx;
    for (int t = i * 16; t < MIN(c->n, i * 16 + 16); t++) {
        int64_t o = (int64_t)t * c->dim;
        const float *src = c->x + o;
        if (c->res) {
            c->k->axpy(c->res + o, 1.0f, c->x + o, c->dim);
            src = c->res + o;
        }
        float r = 1.0f / sqrtf((float)(c->k->sumsq(src, c->dim) / c->dim) + c->eps);
        c->k->rms_apply(c->out + o, src, c->w, r, c->dim);
    }
}

void fast_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n, int dim, float eps) {
    struct norm_ctx c = {fast_k(be), NULL, out, x, w, n, dim, eps};
    cpu_parallel(be, CDIV(n, 16), norm_task, &c);
}

void fast_add_rmsnorm(struct backend *be, float *res, const float *x, float *out, const float *w, int n, int dim,
                      float eps) {
    struct norm_ctx c = {fast_k(be), res, out, x, w, n, dim, eps};
    cpu_parallel(be, CDIV(n, 16), norm_task, &c);
}

// The reference router, 32 tokens a task (tokens are independent).
struct route_ctx {
    struct backend *be;
    int32_t *ids;
    float *weights;
    const float *logits, *bias;
    int n;
    const struct moe_route_cfg *c;
};

static void route_task(void *ctx, int i, int thread) {
    struct route_ctx *r = ctx;
    int t0 = i * 32, nt = MIN(32, r->n - t0), k = r->c->top_k, E = r->c->num_experts;
    cpu_route_tokens(r->ids + (int64_t)t0 * k, r->weights + (int64_t)t0 * k, r->logits + (int64_t)t0 * E, r->bias, nt,
                     r->c, cpu_scratch(r->be, thread, route_scratch_bytes(E)));
}

void fast_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                    const struct moe_route_cfg *c) {
    struct route_ctx r = {be, ids, weights, logits, bias, n, c};
    cpu_parallel(be, CDIV(n, 32), route_task, &r);
}

// ---- the CPU's limits, for vllm bench ----

struct copy_ctx {
    char *dst;
    const char *src;
    size_t chunk, n;
};

static void copy_task(void *ctx, int i, int thread) {
    (void)thread;
    struct copy_ctx *c = ctx;
    size_t a = (size_t)i * c->chunk;
    memcpy(c->dst + a, c->src + a, MIN(c->chunk, c->n - a));
}

// A 256 MiB parallel copy (512 MiB moved) and a bf16 product of 256 rows by
// a 4096 x 4096 weight on the fast kernels, best of a few.
int fast_peaks(struct backend *be, double *bw, double *fl) {
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a), free(b);
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "no room to measure the CPU's limits");
    }
    memset(a, 1, n), memset(b, 2, n);
    struct copy_ctx c = {b, a, (size_t)4 << 20, n};
    double best = 1e30;
    for (int i = 0; i < 4; i++) {
        double t = now_s();
        cpu_parallel(be, (int)CDIV(n, c.chunk), copy_task, &c);
        t = now_s() - t;
        if (i) best = fmin(best, t);
    }
    *bw = 2.0 * n / best;
    int N = 4096, K = 4096, m = 256;
    float *x = (float *)a, *y = (float *)b; // 4 MiB of x, 4 MiB of y: inside the buffers
    for (int i = 0; i < m * K; i++) x[i] = (float)((i * 2654435761u) >> 20) * 1e-4f - 0.2f;
    struct weight w;
    int rc = fast_weight_alloc(be, &w, WF_BF16, N, K);
    if (!rc) rc = fast_weight_random(be, &w, 7, 0.02f);
    best = 1e30;
    for (int i = 0; !rc && i < 3; i++) {
        double t = now_s();
        fast_matmul(be, y, x, &w, m);
        t = now_s() - t;
        if (i) best = fmin(best, t);
    }
    *fl = 2.0 * m * N * K / best;
    if (!rc) free(w.data);
    free(a), free(b);
    return rc;
}
