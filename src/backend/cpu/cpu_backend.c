// cpu_backend.c - the CPU fp32 reference backend: memory, dense ops, sampling;
// and the choice between it and the fast path (fast.h) at creation.
// Device memory is host memory, but every op still goes through this table,
// so the CPU tests cover the engine's device path.
#include <cblas.h>
#include <math.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/fast.h"
#include "core/common.h"
#include "io/dtype.h"
#include "sample/sampler.h"

void *cpu_scratch(struct backend *be, int thread, size_t bytes) {
    struct cpu_impl *c = cpu_of(be);
    if (c->scratch_size[thread] < bytes) {
        free(c->scratch[thread]);
        c->scratch[thread] = xmalloc(bytes);
        c->scratch_size[thread] = bytes;
    }
    return c->scratch[thread];
}

int cpu_reserve(struct backend *be, size_t bytes, const char *what) {
    struct cpu_impl *c = cpu_of(be);
    for (int i = 0; i < be->num_threads; i++) {
        if (c->scratch_size[i] >= bytes) continue;
        void *p = malloc(bytes);
        if (!p)
            return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of CPU scratch per thread for %s", bytes,
                            what);
        free(c->scratch[i]);
        c->scratch[i] = p;
        c->scratch_size[i] = bytes;
    }
    return VLLM_OK;
}

void cpu_parallel(struct backend *be, int n, void (*fn)(void *ctx, int i, int thread), void *ctx) {
    tpool_for(cpu_of(be)->pool, n, fn, ctx);
}

static void cpu_destroy(struct backend *be) {
    struct cpu_impl *c = cpu_of(be);
    for (int i = 0; i < be->num_threads; i++) free(c->scratch[i]), free(c->pack[i]);
    free(c->pack);
    free(c->pack_size);
    for (int i = 0; i < 4; i++) free(c->shared[i]);
    free(c->deq);
    free(c->kern);
    free(c->scratch);
    free(c->scratch_size);
    tpool_free(c->pool);
    cpu_group_release(c->group);
    free(c);
    free(be);
}

static void *cpu_alloc(struct backend *be, size_t bytes) {
    (void)be;
    return calloc(1, bytes ? bytes : 1);
}
static void cpu_free(struct backend *be, void *p) {
    (void)be;
    free(p);
}
static void cpu_copy(struct backend *be, void *dst, const void *src, size_t n) {
    (void)be;
    if (n) memmove(dst, src, n);
}
static void cpu_sync(struct backend *be) { (void)be; }
static void *cpu_host_alloc(struct backend *be, size_t bytes) { return cpu_alloc(be, bytes); }
static int cpu_fence(struct backend *be) {
    (void)be;
    return 0;
}
static void cpu_fence_wait(struct backend *be, int fence) { (void)be, (void)fence; }

// Reference weights hold their format's elements as they are (row-major);
// products dequantize them exactly to fp32 (cpu_weight_f32) and compute in
// fp32.
// Quantized formats keep their codes row-major too, their scales beside
// them (struct weight).
int cpu_quant_alloc(struct backend *be, struct weight *w) {
    int64_t g = wfmt_scale_cols(w->fmt, w->cols);
    if (w->fmt == WF_NVFP4 && w->cols % WF_NVFP4_GROUP)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "an nvfp4 weight needs columns in multiples of 16, not %lld",
                        (long long)w->cols);
    w->scale = cpu_alloc(be, sizeof(float) * (size_t)(w->rows * g));
    if (w->fmt == WF_NVFP4) w->bscale = cpu_alloc(be, (size_t)(w->rows * (w->cols / WF_NVFP4_GROUP)));
    if (!w->scale || (w->fmt == WF_NVFP4 && !w->bscale))
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate the scales of a weight");
    return VLLM_OK;
}

static int cpu_weight_alloc(struct backend *be, struct weight *w, enum wfmt fmt, int64_t rows, int64_t cols) {
    memset(w, 0, sizeof *w);
    size_t bytes = (size_t)rows * wfmt_bytes(fmt, cols);
    w->data = cpu_alloc(be, bytes);
    if (!w->data)
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for a [%lld, %lld] %s weight", bytes,
                        (long long)rows, (long long)cols, wfmt_name(fmt));
    w->fmt = fmt;
    w->rows = rows;
    w->cols = cols;
    return wfmt_quantized(fmt) ? cpu_quant_alloc(be, w) : VLLM_OK;
}

// A quantized weight takes rows of its own format only (codes as they are;
// scales through weight_upload_scales). ld: elements.
int cpu_quant_upload(struct weight *w, int64_t row0, int64_t n, const void *src, enum wfmt src_fmt, int64_t ld) {
    if (src_fmt != w->fmt)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "a %s weight cannot be made from %s rows", wfmt_name(w->fmt),
                        wfmt_name(src_fmt));
    size_t rb = wfmt_bytes(w->fmt, w->cols), lb = wfmt_bytes(w->fmt, ld);
    for (int64_t r = 0; r < n; r++) memcpy((char *)w->data + (size_t)(row0 + r) * rb, (const char *)src + r * lb, rb);
    return VLLM_OK;
}

static int cpu_weight_upload_raw(struct backend *be, struct weight *w, int64_t row0, int64_t n, const void *src,
                                 enum wfmt src_fmt, int64_t ld) {
    (void)be;
    if (wfmt_quantized(w->fmt)) return cpu_quant_upload(w, row0, n, src, src_fmt, ld);
    size_t es = wfmt_size(w->fmt), ss = wfmt_size(src_fmt);
    for (int64_t r = 0; r < n; r++)
        wfmt_convert(w->fmt, (char *)w->data + (size_t)(row0 + r) * w->cols * es, src_fmt,
                     (const char *)src + (size_t)r * ld * ss, w->cols);
    return VLLM_OK;
}

// xorshift64, uniform with standard deviation std (the fast path makes the
// same stream), stored in the weight's format
static int cpu_weight_random(struct backend *be, struct weight *w, uint64_t seed, float std) {
    if (wfmt_quantized(w->fmt)) return weight_random_quant(be, w, seed, std);
    float a = std * 1.7320508f * 0x1.0p-31f, buf[256];
    uint64_t x = seed | 1;
    size_t es = wfmt_size(w->fmt), n = (size_t)w->rows * w->cols;
    for (size_t i = 0; i < n; i += 256) {
        size_t m = MIN(256, n - i);
        for (size_t k = 0; k < m; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[k] = a * (float)(int32_t)(x >> 32);
        }
        wfmt_convert(w->fmt, (char *)w->data + i * es, WF_F32, buf, (int64_t)m);
    }
    return VLLM_OK;
}

const float *cpu_weight_f32(struct backend *be, const struct weight *w, int64_t row0, int64_t n) {
    switch (w->fmt) {
    case WF_F32: return (const float *)w->data + row0 * w->cols;
    case WF_BF16:
    case WF_F16:
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: break;
    }
    struct cpu_impl *c = cpu_of(be);
    size_t need = sizeof(float) * (size_t)n * w->cols;
    if (c->deq_size < need) {
        free(c->deq);
        c->deq = xmalloc(need);
        c->deq_size = need;
    }
    if (wfmt_quantized(w->fmt)) { // exactly wfmt_dequant, element by element
        for (int64_t r = 0; r < n; r++)
            for (int64_t k = 0; k < w->cols; k++)
                c->deq[r * w->cols + k] = wfmt_dequant(w->fmt, w->data, w->scale, w->bscale, w->cols, row0 + r, k);
        return c->deq;
    }
    wfmt_convert(WF_F32, c->deq, w->fmt, (const char *)w->data + (size_t)row0 * w->cols * wfmt_size(w->fmt),
                 n * w->cols);
    return c->deq;
}

static void cpu_gather_ids(struct backend *be, int32_t *ids, const int32_t *table, const int32_t *src, int n) {
    (void)be;
    for (int t = 0; t < n; t++) ids[t] = table[src[t]];
}

static void cpu_embed(struct backend *be, float *out, const struct weight *table, const int32_t *ids, int n) {
    (void)be;
    int64_t d = table->cols;
    size_t es = wfmt_size(table->fmt);
    for (int t = 0; t < n; t++)
        wfmt_convert(WF_F32, out + t * d, table->fmt, (const char *)table->data + (size_t)ids[t] * d * es, d);
}

static void rmsnorm_row(float *out, const float *x, const float *w, int dim, float eps) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = 0; i < dim; i++) out[i] = w[i] * (x[i] * r);
}

static void cpu_rmsnorm(struct backend *be, float *out, const float *x, const float *w, int n, int dim, float eps) {
    (void)be;
    for (int t = 0; t < n; t++) rmsnorm_row(out + (int64_t)t * dim, x + (int64_t)t * dim, w, dim, eps);
}

static void cpu_add_rmsnorm(struct backend *be, float *res, const float *x, float *out, const float *w, int n,
                            int dim, float eps) {
    (void)be;
    for (int64_t i = 0; i < (int64_t)n * dim; i++) res[i] += x[i];
    for (int t = 0; t < n; t++) rmsnorm_row(out + (int64_t)t * dim, res + (int64_t)t * dim, w, dim, eps);
}

void cpu_matmul_rows(struct backend *be, float *y, const float *x, const struct weight *w, int64_t row0, int64_t nr,
                     int n) {
    if (n <= 0 || nr <= 0) return;
    int N = (int)nr, K = (int)w->cols;
    const float *W = cpu_weight_f32(be, w, row0, nr);
    if (n == 1) cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, W, K, x, 1, 0.0f, y, 1);
    else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, N, K, 1.0f, x, K, W, K, 0.0f, y, N);
}

static void cpu_matmul(struct backend *be, float *y, const float *x, const struct weight *w, int n) {
    cpu_matmul_rows(be, y, x, w, 0, w->rows, n);
    for (int t = 0; w->bias && t < n; t++)
        for (int64_t i = 0; i < w->rows; i++) y[t * w->rows + i] += w->bias[i];
}

static void cpu_gather_rows(struct backend *be, float *out, const float *x, const int32_t *rows, int n, int dim) {
    (void)be;
    for (int i = 0; i < n; i++) memcpy(out + (int64_t)i * dim, x + (int64_t)rows[i] * dim, sizeof(float) * dim);
}

static void cpu_add(struct backend *be, float *y, const float *x, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_act(struct backend *be, enum act kind, float *x, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++) x[i] = act_f(kind, x[i]);
}

static void cpu_act_mul(struct backend *be, enum act kind, float *out, const float *x, int n, int inter) {
    (void)be;
    for (int t = 0; t < n; t++) {
        const float *g = x + (int64_t)t * 2 * inter, *u = g + inter;
        float *o = out + (int64_t)t * inter;
        for (int i = 0; i < inter; i++) o[i] = act_f(kind, g[i]) * u[i];
    }
}

void cpu_rope_row(float *x, int heads, int head_dim, const float *cs) {
    int h2 = head_dim / 2;
    const float *c = cs, *s = cs + h2;
    for (int h = 0; h < heads; h++) {
        float *a = x + (int64_t)h * head_dim, *b = a + h2;
        for (int i = 0; i < h2; i++) {
            float u = a[i], v = b[i];
            a[i] = u * c[i] - v * s[i];
            b[i] = v * c[i] + u * s[i];
        }
    }
}

static void cpu_rope(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *table,
                     const int32_t *positions) {
    (void)be;
    for (int t = 0; t < n; t++) cpu_rope_row(x + (int64_t)t * ld, heads, head_dim, table + (int64_t)positions[t] * head_dim);
}

void cpu_head_rmsnorm_row(float *x, int heads, int head_dim, const float *w, float eps) {
    for (int h = 0; h < heads; h++) rmsnorm_row(x + (int64_t)h * head_dim, x + (int64_t)h * head_dim, w, head_dim, eps);
}

static void cpu_head_rmsnorm(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *w,
                             float eps) {
    (void)be;
    for (int t = 0; t < n; t++) cpu_head_rmsnorm_row(x + (int64_t)t * ld, heads, head_dim, w, eps);
}

void cpu_qk_norm_rope_row(float *qkv, int ld, int t, const struct attn_prep *p, void *k_cache, void *v_cache,
                          enum dtype kv, const struct batch *b, const struct attn_dims *d) {
    int hd = d->head_dim, qd = d->heads * hd, kvd = d->kv_heads * hd;
    float *row = qkv + (int64_t)t * ld;
    if (p->q_norm) {
        cpu_head_rmsnorm_row(row, d->heads, hd, p->q_norm, p->eps);
        cpu_head_rmsnorm_row(row + qd, d->kv_heads, hd, p->k_norm, p->eps);
    }
    if (p->table) cpu_rope_row(row, d->heads + d->kv_heads, hd, p->table + (int64_t)b->positions[t] * hd);
    int slot = b->slot_mapping[t];
    if (slot < 0) return;
    cpu_kv_store(k_cache, kv, (int64_t)slot * kvd, row + qd, kvd, d->k_scale);
    cpu_kv_store(v_cache, kv, (int64_t)slot * kvd, row + qd + kvd, kvd, d->v_scale);
}

static void cpu_qk_norm_rope(struct backend *be, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                             void *v_cache, const struct batch *b, int t0, const struct attn_dims *d) {
    for (int t = t0; t < b->num_tokens; t++) cpu_qk_norm_rope_row(qkv, ld, t, p, k_cache, v_cache, be->kv_dtype, b, d);
}

void cpu_matmul_act_mul(struct backend *be, enum act kind, float *out, const float *x, const struct weight *w, int n,
                        float *gu) {
    be->ops->matmul(be, gu, x, w, n);
    be->ops->act_mul(be, kind, out, gu, n, (int)(w->rows / 2));
}

void cpu_matmul_act(struct backend *be, enum act kind, float *out, const float *x, const struct weight *w, int n) {
    be->ops->matmul(be, out, x, w, n);
    be->ops->act(be, kind, out, (int64_t)n * w->rows);
}

static double cpu_sum_sq(struct backend *be, const float *x, int64_t n) {
    (void)be;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

// The reference of every backend's mask_logits, a row per task; a word at a
// time (all set: nothing to do, the common case inside JSON strings).
struct mask_ctx {
    float *logits;
    int vocab;
    const uint32_t *mask;
};

static void mask_row(void *ctx, int r, int thread) {
    (void)thread;
    const struct mask_ctx *c = ctx;
    int V = c->vocab, W = CDIV(V, 32);
    float *l = c->logits + (size_t)r * V;
    const uint32_t *m = c->mask + (size_t)r * W;
    for (int w = 0; w < W; w++) {
        uint32_t bits = m[w];
        if (bits == 0xffffffffu) continue;
        for (int i = w * 32, e = MIN(i + 32, V); i < e; i++)
            if (!((bits >> (i & 31)) & 1u)) l[i] = -INFINITY;
    }
}

static void cpu_mask_logits(struct backend *be, float *logits, int rows, int vocab, const uint32_t *mask) {
    struct mask_ctx c = {logits, vocab, mask};
    cpu_parallel(be, rows, mask_row, &c);
}

static void cpu_mem_info(struct backend *be, int64_t *free_bytes, int64_t *total_bytes) {
    (void)be;
    int64_t page = sysconf(_SC_PAGESIZE);
    *free_bytes = (int64_t)sysconf(_SC_AVPHYS_PAGES) * page;
    *total_bytes = (int64_t)sysconf(_SC_PHYS_PAGES) * page;
}

// The reference of every backend's bias_logits.
static void cpu_bias_logits(struct backend *be, float *logits, int n, const int64_t *idx, const float *val) {
    (void)be;
    for (int i = 0; i < n; i++) logits[idx[i]] += val[i];
}

struct sample_ctx {
    struct backend *be;
    const float *logits;
    int vocab;
    int32_t *table;
    const struct batch *b;
    struct sample_out *out;
};

static void sample_one(void *ctx, int i, int thread) {
    struct sample_ctx *c = ctx;
    const struct sample_params *p = &c->b->sample_params[i];
    void *scratch = cpu_scratch(c->be, thread, sample_scratch_bytes(c->vocab));
    int mt = c->out->max_top;
    int32_t id = sample_row(c->logits + (int64_t)i * c->vocab, c->vocab, c->table + p->row_base, p, scratch,
                            &c->out->logprobs[i], c->out->top_ids + (int64_t)i * mt,
                            c->out->top_logprobs + (int64_t)i * mt, mt);
    c->out->ids[i] = id;
    c->table[p->row_base + p->num_tokens] = id; // the next step's input
}

static void cpu_sample(struct backend *be, const float *logits, int vocab, int32_t *token_table, const struct batch *b,
                       struct sample_out *out) {
    struct sample_ctx c = {be, logits, vocab, token_table, b, out};
    cpu_parallel(be, b->num_sample, sample_one, &c);
}

struct logprob_ctx {
    const float *logits;
    int vocab, k;
    const int32_t *rows, *targets;
    float *lp, *top_lp;
    int32_t *rank, *top_ids;
};

static void logprob_one(void *ctx, int i, int thread) {
    (void)thread;
    const struct logprob_ctx *c = ctx;
    logprob_row(c->logits + (int64_t)c->rows[i] * c->vocab, c->vocab, c->targets[i], c->k, &c->lp[i], &c->rank[i],
                c->top_ids + (int64_t)i * c->k, c->top_lp + (int64_t)i * c->k);
}

static void cpu_token_logprobs(struct backend *be, const float *logits, int vocab, const int32_t *rows,
                               const int32_t *targets, int n, int k, float *lp, int32_t *rank, int32_t *top_ids,
                               float *top_lp) {
    struct logprob_ctx c = {logits, vocab, k, rows, targets, lp, top_lp, rank, top_ids};
    cpu_parallel(be, n, logprob_one, &c);
}

// Router and expert shapes every backend's MoE assumes.
static int check_route(const struct moe_route_cfg *r) {
    switch (r->kind) {
    case ROUTE_SIGMOID_GROUPED:
        if (r->n_group < 1 || r->num_experts % r->n_group || r->topk_group < 1 || r->topk_group > r->n_group ||
            r->top_k > r->topk_group * (r->num_experts / r->n_group))
            return vllm_err(VLLM_ERR_UNSUPPORTED, "moe_route: %d experts in %d groups, top %d groups, top-%d",
                            r->num_experts, r->n_group, r->topk_group, r->top_k);
        break;
    case ROUTE_SOFTMAX_TOPK: break;
    }
    if (r->top_k < 1 || r->top_k > r->num_experts)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "moe_route: top-%d of %d experts", r->top_k, r->num_experts);
    return VLLM_OK;
}

int cpu_supports(struct backend *be, const struct op_query *q) {
    size_t T = (size_t)MAX(q->max_tokens, 1), S = (size_t)MAX(q->max_seq_len, 1);
    switch (q->op) {
    case OP_MATMUL:
    case OP_EMBED: return VLLM_OK; // every format dequantizes
    case OP_ATTN: // the scores of a context, and a key / value row read from an fp8 cache
        return cpu_reserve(be, sizeof(float) * (S + (size_t)q->attn->head_dim), "attention");
    case OP_MAMBA: {
        const struct mamba_dims *d = q->mamba;
        size_t conv = sizeof(float) * (size_t)(d->conv_kernel - 1 + T) * d->conv_dim;
        return cpu_reserve(be, MAX(conv, sizeof(float) * 2 * (size_t)d->chunk_size), "the Mamba2 conv / scan");
    }
    case OP_MOE_ROUTE:
        TRY(check_route(q->route));
        return cpu_reserve(be, route_scratch_bytes(q->route->num_experts), "the MoE router");
    case OP_MOE_EXPERTS: {
        const struct moe_experts *w = q->moe;
        size_t A = T * (size_t)q->route->top_k, U = (size_t)(w->gated ? 2 : 1) * w->inter;
        return cpu_reserve(be, sizeof(float) * A * ((size_t)w->dim + U + w->dim) + sizeof(int32_t) * 2 * A,
                           "the MoE experts");
    }
    case OP_KDA: { // the q | k | v conv (conv1d_fwd) and one head's step
        const struct kda_dims *d = q->kda;
        size_t conv = sizeof(float) * (size_t)(d->conv_kernel - 1 + T) * 3 * d->heads * d->head_dim;
        return cpu_reserve(be, MAX(conv, sizeof(float) * 3 * (size_t)d->head_dim), "Kimi Delta Attention");
    }
    case OP_MLA: {
        const struct mla_dims *d = q->mla;
        if (be->kv_dtype != DT_F32) // CUDA refuses an fp8 latent cache too (its bf16 one the CPU does not keep)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "multi-head latent attention (MLA) has no %s KV cache on the CPU "
                            "backend (use kv_cache_dtype auto or float32)", dtype_name(be->kv_dtype));
        return cpu_reserve(be, sizeof(float) * ((size_t)2 * d->rank + d->rope + S), "multi-head latent attention");
    }
    case OP_SAMPLE: return cpu_reserve(be, sample_scratch_bytes(q->vocab), "the sampler"); // a row per thread
    }
    return VLLM_OK;
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .download_async = cpu_copy,
    .fence = cpu_fence,
    .fence_wait = cpu_fence_wait,
    .supports = cpu_supports,
    .weight_alloc = cpu_weight_alloc,
    .weight_upload_raw = cpu_weight_upload_raw,
    .weight_random = cpu_weight_random,
    .gather_ids = cpu_gather_ids,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .matmul = cpu_matmul,
    .gather_rows = cpu_gather_rows,
    .add = cpu_add,
    .act = cpu_act,
    .act_mul = cpu_act_mul,
    .rope = cpu_rope,
    .head_rmsnorm = cpu_head_rmsnorm,
    .qk_norm_rope = cpu_qk_norm_rope,
    .matmul_act_mul = cpu_matmul_act_mul,
    .matmul_act = cpu_matmul_act,
    .sum_sq = cpu_sum_sq,
    .conv1d_fwd = cpu_conv1d_fwd,
    .conv1d_update = cpu_conv1d_update,
    .ssd_prefill = cpu_ssd_prefill,
    .ssd_decode = cpu_ssd_decode,
    .gated_rmsnorm = cpu_gated_rmsnorm,
    .mamba_decode = backend_mamba_decode,
    .kv_write = cpu_kv_write,
    .attn_prefill = cpu_attn_prefill,
    .attn_decode = cpu_attn_decode,
    .kda_prefill = cpu_kda_prefill,
    .kda_decode = cpu_kda_decode,
    .kda_gate = cpu_kda_gate,
    .head_norm_gate = cpu_head_norm_gate,
    .mla_kv_write = cpu_mla_kv_write,
    .mla_attn = cpu_mla_attn,
    .moe_route = cpu_moe_route,
    .moe_experts = cpu_moe_experts,
    .mask_logits = cpu_mask_logits,
    .bias_logits = cpu_bias_logits,
    .mem_info = cpu_mem_info,
    .sample = cpu_sample,
    .token_logprobs = cpu_token_logprobs,
    .all_reduce = cpu_all_reduce,
    .all_gather = cpu_all_gather,
};

// The fast path: the reference table with the fast path's weights, matmul,
// norms, Mamba2, attention, router and experts (copied per backend, so an op
// added to the reference table is on both paths).
static void fast_ops_init(struct backend_ops *o) {
    *o = cpu_ops;
    o->supports = fast_supports;
    o->peaks = fast_peaks;
    o->weight_alloc = fast_weight_alloc;
    o->weight_upload_raw = fast_weight_upload_raw;
    o->weight_random = fast_weight_random;
    o->embed = fast_embed;
    o->rmsnorm = fast_rmsnorm;
    o->add_rmsnorm = fast_add_rmsnorm;
    o->matmul = fast_matmul;
    o->act = fast_act;
    o->act_mul = fast_act_mul;
    o->rope = fast_rope;
    o->head_rmsnorm = fast_head_rmsnorm;
    o->qk_norm_rope = fast_qk_norm_rope;
    o->conv1d_fwd = fast_conv1d_fwd;
    o->conv1d_update = fast_conv1d_update;
    o->ssd_prefill = fast_ssd_prefill;
    o->ssd_decode = fast_ssd_decode;
    o->gated_rmsnorm = fast_gated_rmsnorm;
    o->attn_prefill = fast_attn_prefill;
    o->attn_decode = fast_attn_decode;
    o->moe_route = fast_moe_route;
    o->moe_experts = fast_moe_experts;
    o->mla_attn = fast_mla_attn;
    o->kda_prefill = fast_kda_prefill;
    o->kda_decode = fast_kda_decode;
}

int cpu_backend_create(int num_threads, int reference, int isa, struct backend **out) {
    TRY(backend_check_ops(&cpu_ops));
    if (num_threads <= 0) num_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (num_threads <= 0) num_threads = 1;
    enum fast_isa best = fast_detect();
    if (isa < 0) isa = best;
    if (!reference && isa > (int)best)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "this CPU lacks %s (it has %s)", fast_isa_name(isa), fast_isa_name(best));
    struct backend *be = xcalloc(1, sizeof *be);
    struct cpu_impl *c = xcalloc(1, sizeof *c);
    c->pool = tpool_create(num_threads);
    c->scratch = xcalloc(num_threads, sizeof(void *));
    c->scratch_size = xcalloc(num_threads, sizeof(size_t));
    c->pack = xcalloc(num_threads, sizeof(void *));
    c->pack_size = xcalloc(num_threads, sizeof(size_t));
    c->reference = reference;
    const char *dot = getenv("VLLM_CPU_BF16_DOT");
    c->bf16_dot = !(dot && !strcmp(dot, "0"));
    c->kern = xcalloc(1, sizeof *c->kern);
    fast_kern_for(reference ? FAST_SCALAR : (enum fast_isa)isa, c->kern);
    fast_ops_init(&c->fast_ops);
    be->ops = reference ? &cpu_ops : &c->fast_ops;
    be->num_threads = num_threads;
    be->kv_dtype = DT_F32;
    be->tp_size = 1;
    be->impl = c;
    // The reference lets OpenBLAS thread each call; the fast path calls it
    // single-threaded from its own pool's tasks (its threads never run, so
    // they never spin in sched_yield after a call).
    openblas_set_num_threads(reference ? num_threads : 1);
    *out = be;
    return VLLM_OK;
}

// VLLM_CPU_REFERENCE=1: the reference ops; VLLM_CPU_ISA=scalar|avx2|avx512|
// avx512_bf16 caps the fast path's kernels (default: the best this CPU has).
int backend_cpu_create(int num_threads, enum dtype kv_dtype, struct backend **out) {
    if (kv_dtype != DT_F32 && kv_dtype != DT_FP8)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "the CPU backend keeps the KV cache in float32 or fp8 (kv_cache_dtype "
                        "%s is for CUDA)", dtype_name(kv_dtype));
    const char *r = getenv("VLLM_CPU_REFERENCE"), *s = getenv("VLLM_CPU_ISA");
    int reference = r && *r && strcmp(r, "0") != 0, isa = -1;
    if (s && *s) {
        for (int i = FAST_SCALAR; i <= FAST_AVX512_BF16; i++)
            if (!strcmp(s, fast_isa_name(i))) isa = i;
        if (isa < 0)
            return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "VLLM_CPU_ISA=%s: expected scalar, avx2, avx512 or avx512_bf16", s);
    }
    TRY(cpu_backend_create(num_threads, reference, isa, out));
    (*out)->kv_dtype = kv_dtype;
    return VLLM_OK;
}
