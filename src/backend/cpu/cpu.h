// cpu.h - internals shared by the CPU backend's op files.
#ifndef VLLM_BACKEND_CPU_H
#define VLLM_BACKEND_CPU_H

#include <math.h>

#include "backend/backend.h"
#include "core/threadpool.h"

struct fast_kern;
struct cpu_group;

struct cpu_impl {
    struct tpool *pool;
    void **scratch;       // per thread
    size_t *scratch_size; // bytes of each
    void **pack;          // per thread, the fast path's GEMM packing (beside scratch)
    size_t *pack_size;
    int reference;        // 1: the reference ops (VLLM_CPU_REFERENCE=1)
    struct fast_kern *kern; // the fast path's kernels (fast.h)
    int bf16_dot;           // bf16 weights may use the bf16 dot kernel (VLLM_CPU_BF16_DOT, default 1)
    struct backend_ops fast_ops; // the fast path's table (cpu_backend.c)
    void *shared[4];      // scratch shared by the threads of one fast op
    size_t shared_size[4];
    struct cpu_group *group; // tensor-parallel group (cpu_tp.c); NULL alone
    float *deq;           // the reference's fp32 copy of the weight rows a product reads
    size_t deq_size;
};

static inline struct cpu_impl *cpu_of(struct backend *be) { return be->impl; }
// A CPU backend with the reference ops (reference=1) or the fast path on the
// kernels of `isa` (enum fast_isa; -1: the best this CPU has). backend_cpu_create
// picks from VLLM_CPU_REFERENCE and VLLM_CPU_ISA; tests make both.
int cpu_backend_create(int num_threads, int reference, int isa, struct backend **out);
// Per-thread scratch of at least `bytes` (kept between calls).
void *cpu_scratch(struct backend *be, int thread, size_t bytes);
void cpu_parallel(struct backend *be, int n, void (*fn)(void *ctx, int i, int thread), void *ctx);
// Grows every thread's scratch to `bytes` now (load time, from supports()):
// VLLM_ERR_OUT_OF_MEMORY naming `what` instead of a failure mid-step.
int cpu_reserve(struct backend *be, size_t bytes, const char *what);
// The reference's supports(): what the reference ops need (also the fast
// path's fallbacks), with their scratch reserved.
int cpu_supports(struct backend *be, const struct op_query *q);

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float act_f(enum act k, float x) {
    switch (k) {
    case ACT_RELU2: return x > 0 ? x * x : 0.0f;
    case ACT_SILU: return silu(x);
    case ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
    }
    return x;
}
static inline float softplus_th(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
// dt of head h from a zxbcdt row: softplus(dt + dt_bias), clamped to time_step_limit
static inline float dt_of(const float *row, int dt_off, int h, const float *dt_bias, const struct mamba_dims *d) {
    float v = softplus_th(row[dt_off + h] + dt_bias[h]);
    return fminf(fmaxf(v, d->dt_min), d->dt_max);
}

// One row of the reference rope / head_rmsnorm (the fast path runs rows in parallel).
void cpu_rope_row(float *x, int heads, int head_dim, const float *cs);
void cpu_head_rmsnorm_row(float *x, int heads, int head_dim, const float *w, float eps);
// Row t of qk_norm_rope (backend.h): the q/k norms, rope and kv write of one
// qkv row, into caches of dtype kv.
void cpu_qk_norm_rope_row(float *qkv, int ld, int t, const struct attn_prep *p, void *k_cache, void *v_cache,
                          enum dtype kv, const struct batch *b, const struct attn_dims *d);
// The KV cache's elements (the CPU keeps DT_F32 or DT_FP8): x [n] into the
// cache at element offset off (fp8: e4m3(x / scale), enum dtype), and n
// elements at off back as fp32 (fp8: e4m3(code) * scale), for the reference
// and the fast path alike.
void cpu_kv_store(void *cache, enum dtype dt, int64_t off, const float *x, int n, float scale);
void cpu_kv_load(float *dst, const void *cache, enum dtype dt, int64_t off, int n, float scale);
// matmul_act_mul as matmul into gu, then act_mul, through be's own ops (the reference and the fast path alike).
void cpu_matmul_act_mul(struct backend *be, enum act kind, float *out, const float *x, const struct weight *w, int n,
                        float *gu);
// matmul_act as matmul into out, then act in place, through be's own ops (both paths).
void cpu_matmul_act(struct backend *be, enum act kind, float *out, const float *x, const struct weight *w, int n);

// ops in cpu_mamba.c, cpu_attn.c, cpu_moe.c
void cpu_conv1d_fwd(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                    float *conv_state, const struct batch *b, int seq0, int seq1, const struct mamba_dims *d);
void cpu_conv1d_update(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                       float *conv_state, const struct batch *b, const struct mamba_dims *d);
void cpu_ssd_prefill(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias,
                     const float *A, const float *D, float *ssm_state, const struct batch *b, int seq0,
                     int seq1, const struct mamba_dims *d);
void cpu_ssd_decode(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias,
                    const float *A, const float *D, float *ssm_state, const struct batch *b,
                    const struct mamba_dims *d);
void cpu_gated_rmsnorm(struct backend *be, float *out, const float *y, const float *z, int zld,
                       const float *w, int n, int dim, int group_size, float eps);
void cpu_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *qkv, int ld,
                  const struct batch *b, const struct attn_dims *d);
void cpu_attn_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                      const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d);
void cpu_attn_decode(struct backend *be, float *out, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                     void *v_cache, const struct batch *b, const struct attn_dims *d);
void cpu_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits, const float *bias,
                   int n, const struct moe_route_cfg *c);
// The router of tokens [0, n) with caller scratch of route_scratch_bytes(E).
size_t route_scratch_bytes(int num_experts);
void cpu_route_tokens(int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                      const struct moe_route_cfg *c, void *scratch);
void cpu_moe_experts(struct backend *be, float *out, const float *x, const struct moe_experts *w,
                     const int32_t *ids, const float *weights, int n, int top_k,
                     const struct moe_shared *shared);
// ops in cpu_kimi.c (Kimi-Linear: KDA, MLA)
// The KDA recurrence over sequences [seq0, seq1) (decode: continuing their
// slots; else from state_src, with checkpoints), a task per (sequence, head).
// step runs one token of one head (st [K, K] updated in place, y [K]
// written, scr 3K floats): the reference's loops or the fast path's kernels.
void cpu_kda_run(struct backend *be,
                 void (*step)(struct backend *be, float *st, const float *row, const float *g, float *y, int h, int H,
                              int K, float *scr),
                 float *y, const float *proj, int ld, const float *g, float *state, const struct batch *b, int seq0,
                 int seq1, int decode, const struct kda_dims *d);
void cpu_kda_prefill(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                     const struct batch *b, int seq0, int seq1, const struct kda_dims *d);
void cpu_kda_decode(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                    const struct batch *b, const struct kda_dims *d);
void cpu_kda_gate(struct backend *be, float *g, const float *A_log, const float *dt_bias, int n,
                  const struct kda_dims *d);
void cpu_head_norm_gate(struct backend *be, float *y, const float *gate, const float *w, int n, int heads,
                        int head_dim, float eps);
void cpu_mla_kv_write(struct backend *be, void *cache, const float *lat, int ld, const struct batch *b,
                      const struct mla_dims *d);
void cpu_mla_attn(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                  const struct batch *b, int seq0, int seq1, const struct mla_dims *d);
// y: [n, nr] = x @ W[row0 .. row0 + nr)^T, W dequantized to fp32 first.
void cpu_matmul_rows(struct backend *be, float *y, const float *x, const struct weight *w, int64_t row0, int64_t nr,
                     int n);
// Rows [row0, row0 + n) of w as fp32 (the weight itself for WF_F32, else a
// dequantized copy valid until the next call).
const float *cpu_weight_f32(struct backend *be, const struct weight *w, int64_t row0, int64_t n);
// Quantized weights (row-major codes, scales beside, backend.h), shared with
// the fast path: the scales of w (fmt, rows, cols set), and rows of codes
// uploaded as they are (src_fmt must be w->fmt; ld in elements).
int cpu_quant_alloc(struct backend *be, struct weight *w);
int cpu_quant_upload(struct weight *w, int64_t row0, int64_t n, const void *src, enum wfmt src_fmt, int64_t ld);
// collectives in cpu_tp.c
void cpu_all_reduce(struct backend *be, float *x, int64_t n);
void cpu_all_gather(struct backend *be, float *out, int out_cols, const float *in, int in_cols, int rows);
void cpu_group_release(struct cpu_group *g);

#endif
