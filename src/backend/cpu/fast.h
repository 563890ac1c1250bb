// fast.h - the CPU fast path: kernels chosen at run time by CPU features
// (AVX-512 with AVX512_BF16, AVX2 + FMA, portable C), bf16 weights packed for
// them, and the ops built on them. The reference ops (cpu.h) stay the ground
// truth; VLLM_CPU_REFERENCE=1 selects them instead.
//
// Weights on the fast path:
// - WF_F32: row-major [rows, cols], as the reference keeps them.
// - WF_BF16: packed in groups of 64 rows (four panels of 16). Group g holds
//   rows 64g..64g+63; for each column pair q (columns 2q, 2q+1) it stores 64
//   uint32 lanes, lane j = W[64g+j][2q] | W[64g+j][2q+1] << 16, so panel
//   (j / 16) of the pair is one 64-byte line and a group is one sequential
//   stream (a single stream per thread reads DRAM about 30% faster here than
//   four streams a panel apart). Columns are padded to an even count (kp),
//   rows to a multiple of 64, with zeros. One layout serves both kernels: the
//   fp32 kernel turns a lane into two fp32 weights with a shift and a mask and
//   multiplies them by broadcast activations (no horizontal sums), and the
//   bf16 dot kernel feeds the lanes to vdpbf16ps as they are.
// - WF_F16: not kept (supports() refuses it: use bfloat16 or float32).
// - WF_FP8, WF_FP8_B128, WF_NVFP4: row-major codes with their scales, as the
//   reference keeps them (backend.h); mm_q dequantizes in registers
//   (fast_quant.c).
#ifndef VLLM_BACKEND_CPU_FAST_H
#define VLLM_BACKEND_CPU_FAST_H

#include "backend/cpu/cpu.h"

#define PK 16  // rows per panel (one 64-byte line per column pair)
#define PKG 64 // rows per group (four panels)
#define FAST_CONV_CH 256 // channels of a conv_row call (1 KB of each row)

static inline int64_t pk_kp(int64_t cols) { return (cols + 1) & ~(int64_t)1; }
static inline int64_t pk_groups(int64_t rows) { return (rows + PKG - 1) / PKG; }
// uint32 lanes per group
static inline int64_t pk_gstride(int64_t cols) { return pk_kp(cols) / 2 * PKG; }
// Group g: its pair q at [q * PKG], row 64g + j at lane j of it.
static inline const uint32_t *pk_group(const struct weight *w, int64_t g) {
    return (const uint32_t *)w->data + g * pk_gstride(w->cols);
}

// One ISA's kernels. Every kernel computes y[i][c - c0] for rows i < m and
// output columns c in [c0, c1) (weight rows), y rows ldy floats apart.
struct fast_kern {
    const char *name;
    // packed bf16 weight, fp32 activations, fp32 arithmetic: x [m, ldx],
    // 2*kp readable floats per row (the caller pads odd cols)
    void (*mm_pk)(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                  int64_t c1);
    // packed bf16 weight, bf16 activations xb [m, ldxb] (kp used), fp32
    // accumulation; NULL where the CPU has no bf16 dot product
    void (*mm_pk_dot)(float *y, int64_t ldy, const uint16_t *xb, int64_t ldxb, int m, const struct weight *w,
                      int64_t c0, int64_t c1);
    // row-major fp32 weight
    void (*mm_f32)(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                   int64_t c1);
    // quantized weight (WF_FP8, WF_FP8_B128, WF_NVFP4), fp32 activations and
    // arithmetic, codes dequantized in the kernel; for few rows (decode)
    void (*mm_q)(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                 int64_t c1);
    // the most rows of x mm_q takes, per format (FP8, FP8 blocks, NVFP4),
    // before the many-row product (fast_mm_q_many) is faster: measured per
    // set (`quant_gemv THREADS ROUNDS N K M`)
    int mm_q_rows[3];
    // WF_FP8 / WF_FP8_B128, few rows, with x also permuted by perm_x64 into
    // xp [m, ldxp] (NULL where the kernel set has none: mm_q instead)
    void (*mm_fp8p)(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xp, int64_t ldxp, int m,
                    const struct weight *w, int64_t c0, int64_t c1);
    void (*perm_x64)(float *xp, const float *x, int64_t K); // whole 64-blocks of x
    // rows [r0, r0 + nr) of a quantized weight as fp32: dst [nr, cols]
    void (*deq_q)(float *dst, const struct weight *w, int64_t r0, int64_t nr);
    void (*vexp)(float *y, const float *x, int64_t n);  // y = exp(x), in place allowed
    void (*vsilu)(float *y, const float *x, int64_t n); // y = x * sigmoid(x), in place allowed
    void (*to_bf16)(uint16_t *y, const float *x, int64_t n); // round to nearest even
    void (*axpy)(float *y, float a, const float *x, int64_t n); // y += a x
    void (*relu2)(float *x, int64_t n);                          // x = relu(x)^2
    void (*scale)(float *x, float a, int64_t n);                 // x *= a
    void (*mul)(float *x, const float *y, int64_t n);            // x *= y
    double (*sumsq)(const float *x, int64_t n);                  // sum of x^2, in double
    void (*rms_apply)(float *out, const float *x, const float *w, float r, int64_t n); // out = w (x r)
    // One token of the causal conv over FAST_CONV_CH channels: out[i] =
    // silu(bias[i] + sum_k wt[k][i] in[k][i]) for i < nc (the sum in the
    // reference's order: bias, then the taps oldest first).
    void (*conv_row)(float *out, int nc, const float *const *in, const float (*wt)[FAST_CONV_CH], const float *bias,
                     int K);
    // A row of an SSD chunk's decay-weighted CB: m[j] = exp(ai - a[j]) cb[j] dt[j], j < n.
    void (*ssd_decay)(float *m, const float *a, float ai, const float *cb, const float *dt, int n);
    // A token's SSD output and scaled input: y = ein yo + D x + yd, xs = wgt x (P values).
    void (*ssd_out)(float *y, float *xs, const float *yo, const float *yd, const float *x, float ein, float D,
                    float wgt, int P);
    // One head of the SSD decode step: S[p] = S[p] dA + (dt x[p]) B, y[p] =
    // S[p] . C + D x[p], for p < P; S [P, N].
    void (*ssd_step)(float *S, int P, int N, const float *x, const float *B, const float *C, float dt, float dA,
                     float D, float *y);
    // Small fp32 GEMM, one thread, in two steps: sgemm_pack_b packs op(B)
    // [K, N] (tb: B is [N, K]) into bp (fast_sgemm_b_floats(N, K)), then
    // sgemm_packed computes C [M, N] = alpha op(A) op(B) + beta C, op(A)
    // [M, K] (ta: A is [K, M]; apack holds fast_sgemm_a_floats(M, K)).
    // NULL: OpenBLAS sgemm instead.
    void (*sgemm_pack_b)(float *bp, int N, int K, const float *B, int ldb, int tb);
    void (*sgemm_packed)(int M, int N, int K, float alpha, const float *A, int lda, int ta, const float *bp,
                         float beta, float *C, int ldc, float *apack);
};

// op(B) of a small GEMM, packed once for several products (fast_sgemm_b).
struct fast_bmat {
    const float *b; // as given (OpenBLAS)
    int ldb, tb;
    const float *packed; // the kernel's panels, or NULL
};
size_t fast_sgemm_b_floats(int N, int K);
size_t fast_sgemm_a_floats(int M, int K);
// space: fast_sgemm_b_floats(N, K) floats, used when the kernel set packs.
void fast_sgemm_prep_b(struct backend *be, struct fast_bmat *m, int N, int K, const float *B, int ldb, int tb,
                       float *space);
// C [M, N] = alpha op(A) op(B) + beta C; apack: fast_sgemm_a_floats(M, K).
void fast_sgemm_b(struct backend *be, int M, int N, int K, float alpha, const float *A, int lda, int ta,
                  const struct fast_bmat *m, float beta, float *C, int ldc, float *apack);

// Software prefetch distance of the quantized decode kernels' code streams
// (bytes ahead; a weight's rows are one stream). Pages are 4 KB here (no
// transparent huge pages unless madvised) and the hardware prefetcher stops
// at each page's end, so without it the FP8 GEMV ran at half the read
// bandwidth, no faster than bf16 (bench/quant_gemv, docs/BENCHMARKS_CPU.md).
#define FAST_Q_PF 8192
extern const struct fast_kern fast_kern_scalar;
#if defined(__x86_64__)
extern const struct fast_kern fast_kern_avx2, fast_kern_avx512;
// AVX512_BF16 kernels (fast_avx512bf16.c)
void fast_mm_pk_dot_avx512bf16(float *y, int64_t ldy, const uint16_t *xb, int64_t ldxb, int m,
                               const struct weight *w, int64_t c0, int64_t c1);
void fast_to_bf16_avx512bf16(uint16_t *y, const float *x, int64_t n);
// A kernel set's few-row quantized product (fast_mm_q_<set>) from its row
// kernels, static inline fp8_rows / nvfp4_rows (y, ldy, x, ldx, w, c0, c1,
// MI): 4 activation rows at a time, MI a constant in each call so the
// kernels unroll over it (fast_quant_avx2.c, fast_quant_avx512.c).
#define FAST_Q_ROWS(fn, mi, ...)                                                                                       \
    switch (mi) {                                                                                                      \
    case 1: fn(__VA_ARGS__, 1); break;                                                                                 \
    case 2: fn(__VA_ARGS__, 2); break;                                                                                 \
    case 3: fn(__VA_ARGS__, 3); break;                                                                                 \
    default: fn(__VA_ARGS__, 4); break;                                                                                \
    }
#define FAST_MM_Q_DEFINE(name, fp8_rows, nvfp4_rows)                                                                   \
    void name(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,          \
              int64_t c1) {                                                                                            \
        for (int i0 = 0; i0 < m; i0 += 4) {                                                                            \
            int mi = MIN(4, m - i0);                                                                                   \
            float *yy = y + (int64_t)i0 * ldy;                                                                         \
            const float *xx = x + (int64_t)i0 * ldx;                                                                   \
            switch (w->fmt) {                                                                                          \
            case WF_FP8:                                                                                               \
            case WF_FP8_B128: FAST_Q_ROWS(fp8_rows, mi, yy, ldy, xx, ldx, w, c0, c1); break;                           \
            case WF_NVFP4: FAST_Q_ROWS(nvfp4_rows, mi, yy, ldy, xx, ldx, w, c0, c1); break;                            \
            case WF_F32:                                                                                               \
            case WF_BF16:                                                                                              \
            case WF_F16: return; /* not quantized: fast_mm_serial's other kernels */                                   \
            }                                                                                                          \
        }                                                                                                              \
    }
// quantized weights (fast_quant_avx2.c: the AVX2 set, where the CPU has F16C)
void fast_mm_q_avx2(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                    int64_t c1);
void fast_deq_q_avx2(float *dst, const struct weight *w, int64_t r0, int64_t nr);
// ... (fast_quant_avx512.c)
void fast_mm_q_avx512(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                      int64_t c1);
void fast_deq_q_avx512(float *dst, const struct weight *w, int64_t r0, int64_t nr);
// FP8 with AVX512_VBMI (fast_quant_vbmi.c)
void fast_mm_fp8_vbmi(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xp, int64_t ldxp, int m,
                      const struct weight *w, int64_t c0, int64_t c1);
void fast_perm_x64(float *xp, const float *x, int64_t K);
void fast_quant_vbmi_init(void);
#endif
// quantized weights, portable (fast_quant.c)
// Every e4m3 code's fp32 value, for the kernel sets' tails and NVFP4 block
// scales (filled by fast_kern_for, before any kernel runs)
extern float fast_fp8_lut[256];
void fast_fp8_lut_init(void);
// The scale of column k of FP8 row r: the row's, or its 128-column block's
// (G: wfmt_scale_cols of the weight).
static inline float fast_fp8_scale(const struct weight *w, int64_t G, int64_t r, int64_t k) {
    return w->scale[r * G + (w->fmt == WF_FP8_B128 ? k / WF_B128 : 0)];
}
void fast_mm_q_scalar(float *y, int64_t ldy, const float *x, int64_t ldx, int m, const struct weight *w, int64_t c0,
                      int64_t c1);
void fast_deq_q_scalar(float *dst, const struct weight *w, int64_t r0, int64_t nr);
// The scales of a quantized weight whose codes are allocated (w->fmt, rows, cols set).
int fast_quant_alloc(struct weight *w);
// Pack scratch floats of a many-row product with a quantized weight of K columns.
size_t fast_quant_pack_floats(int64_t K);
// A many-row product: chunks of weight rows dequantized (deq_q), then the fp32 GEMM.
void fast_mm_q_many(struct backend *be, int thread, float *y, int64_t ldy, const float *x, int64_t ldx, int n,
                    const struct weight *w, int64_t c0, int64_t c1);

enum fast_isa { FAST_SCALAR, FAST_AVX2, FAST_AVX512, FAST_AVX512_BF16 };
// The best ISA this CPU (and OS) supports.
enum fast_isa fast_detect(void);
const char *fast_isa_name(enum fast_isa isa);
// Fills k with the kernels of isa (which the CPU must support).
void fast_kern_for(enum fast_isa isa, struct fast_kern *k);

static inline const struct fast_kern *fast_k(struct backend *be) { return cpu_of(be)->kern; }
// x = act(x) on the kernel set's vector kernels (GELU: the reference's scalar form)
static inline void fast_act_span(const struct fast_kern *k, enum act kind, float *x, int64_t n) {
    switch (kind) {
    case ACT_RELU2: k->relu2(x, n); return;
    case ACT_SILU: k->vsilu(x, x, n); return;
    case ACT_GELU_TANH:
        for (int64_t i = 0; i < n; i++) x[i] = act_f(ACT_GELU_TANH, x[i]);
        return;
    }
}
// Scratch shared by all threads of one op (slot 0..3), kept between calls.
void *fast_shared(struct backend *be, int slot, size_t bytes);
// Grows shared slot `slot` to bytes now (load time): VLLM_ERR_OUT_OF_MEMORY naming `what`.
int fast_reserve_shared(struct backend *be, int slot, size_t bytes, const char *what);
// A thread's packing space for fast_mm_serial (apart from cpu_scratch, which
// its callers use), 64-byte aligned.
float *fast_pack_scratch(struct backend *be, int thread, size_t floats);

// Bytes of a [rows, cols] weight in the bf16 panel layout.
size_t fast_pk_bytes(int64_t rows, int64_t cols);
// Scratch the fast ops need at a query's sizes (fast_*.c), for fast_supports.
size_t fast_attn_scratch(const struct attn_dims *d, int max_seq_len);
size_t fast_ssd_scratch(const struct mamba_dims *d);
size_t fast_kda_scratch(const struct kda_dims *d);
int fast_moe_reserve(struct backend *be, const struct moe_experts *w, int max_tokens, int top_k);
// The pack scratch of n-row products with w when it is quantized.
int fast_quant_reserve(struct backend *be, const struct weight *w, int n);

// y [n, ldy] (columns [c0, c1) of x @ W^T, written at y[i*ldy + c - c0]),
// x [n, ldx]: the fast matmul on a column range, threaded.
void fast_matmul_cols(struct backend *be, float *y, int64_t ldy, const float *x, int64_t ldx, int n,
                      const struct weight *w, int64_t c0, int64_t c1);
// The same for one calling thread (inside a parallel task, thread its
// index). xb: x already converted to bf16 ([n, ldxb]), or NULL.
void fast_mm_serial(struct backend *be, int thread, float *y, int64_t ldy, const float *x, int64_t ldx,
                    const uint16_t *xb, int64_t ldxb, int n, const struct weight *w, int64_t c0, int64_t c1);
// Whether an n-row product with w runs the bf16 dot kernel (x converted to bf16).
int fast_use_dot(struct backend *be, const struct weight *w, int n);

// Fast ops (fast_*.c)
void fast_matmul(struct backend *be, float *y, const float *x, const struct weight *w, int n);
void fast_act(struct backend *be, enum act kind, float *x, int64_t n);
void fast_act_mul(struct backend *be, enum act kind, float *out, const float *x, int n, int inter);
int fast_supports(struct backend *be, const struct op_query *q);
int fast_peaks(struct backend *be, double *bytes_per_s, double *flops_per_s);
void fast_rope(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *table,
               const int32_t *positions);
void fast_head_rmsnorm(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *w, float eps);
void fast_qk_norm_rope(struct backend *be, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                       void *v_cache, const struct batch *b, int t0, const struct attn_dims *d);
// qk_norm_rope of rows [t0, t1)
void fast_qk_rows(struct backend *be, float *qkv, int ld, const struct attn_prep *p, void *k_cache, void *v_cache,
                  const struct batch *b, int t0, int t1, const struct attn_dims *d);
void fast_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
void fast_add_rmsnorm(struct backend *be, float *res, const float *x, float *out, const float *w, int n, int dim,
                      float eps);
void fast_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                    const struct moe_route_cfg *c);
int fast_weight_alloc(struct backend *be, struct weight *w, enum wfmt fmt, int64_t rows, int64_t cols);
int fast_weight_upload_raw(struct backend *be, struct weight *w, int64_t row0, int64_t n, const void *src,
                           enum wfmt src_fmt, int64_t ld);
int fast_weight_random(struct backend *be, struct weight *w, uint64_t seed, float std);
void fast_embed(struct backend *be, float *out, const struct weight *table, const int32_t *ids, int n);
void fast_conv1d_fwd(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                     float *conv_state, const struct batch *b, int seq0, int seq1, const struct mamba_dims *d);
void fast_conv1d_update(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                        float *conv_state, const struct batch *b, const struct mamba_dims *d);
void fast_ssd_prefill(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias,
                      const float *A, const float *D, float *ssm_state, const struct batch *b, int seq0, int seq1,
                      const struct mamba_dims *d);
void fast_ssd_decode(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias,
                     const float *A, const float *D, float *ssm_state, const struct batch *b,
                     const struct mamba_dims *d);
void fast_gated_rmsnorm(struct backend *be, float *out, const float *y, const float *z, int zld, const float *w,
                        int n, int dim, int group_size, float eps);
void fast_attn_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                       const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d);
void fast_attn_decode(struct backend *be, float *out, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                      void *v_cache, const struct batch *b, const struct attn_dims *d);
void fast_moe_experts(struct backend *be, float *out, const float *x, const struct moe_experts *w,
                      const int32_t *ids, const float *weights, int n, int top_k,
                     const struct moe_shared *shared);
void fast_kda_prefill(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                      const struct batch *b, int seq0, int seq1, const struct kda_dims *d);
void fast_kda_decode(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                     const struct batch *b, const struct kda_dims *d);
void fast_mla_attn(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                   const struct batch *b, int seq0, int seq1, const struct mla_dims *d);
// Per-thread scratch bytes of fast_mla_attn over sequences of max_seq_len tokens.
size_t fast_mla_scratch(const struct mla_dims *d, int max_seq_len);

#endif
