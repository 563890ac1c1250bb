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

void cpu_parallel(struct backend *be, int n, void (*fn)(void *ctx, int i, int thread), void *ctx) {
    tpool_for(cpu_of(be)->pool, n, fn, ctx);
}

static void cpu_destroy(struct backend *be) {
    struct cpu_impl *c = cpu_of(be);
    for (int i = 0; i < be->num_threads; i++) free(c->scratch[i]), free(c->pack[i]);
    free(c->pack);
    free(c->pack_size);
    for (int i = 0; i < 4; i++) free(c->shared[i]);
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
static void cpu_memset0(struct backend *be, void *dst, size_t n) {
    (void)be;
    memset(dst, 0, n);
}
static void cpu_sync(struct backend *be) { (void)be; }
static void *cpu_host_alloc(struct backend *be, size_t bytes) { return cpu_alloc(be, bytes); }
static int cpu_fence(struct backend *be) {
    (void)be;
    return 0;
}
static void cpu_fence_wait(struct backend *be, int fence) { (void)be, (void)fence; }

// The reference keeps fp32 weights whatever dtype is asked for; a bf16
// weight holds bf16 values (rounded to nearest even), as the fast path's.
static void round_bf16(float *d, size_t n, enum dtype dt) {
    if (dt == DT_BF16)
        for (size_t i = 0; i < n; i++) d[i] = bf16_to_f32(f32_to_bf16(d[i]));
}

static int cpu_weight_upload(struct backend *be, struct weight *w, const float *src, int64_t rows, int64_t cols,
                             enum dtype dt) {
    size_t bytes = sizeof(float) * rows * cols;
    w->data = cpu_alloc(be, bytes);
    if (!w->data) return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for a weight", bytes);
    memcpy(w->data, src, bytes);
    round_bf16(w->data, (size_t)rows * cols, dt);
    w->dtype = DT_F32;
    w->rows = rows;
    w->cols = cols;
    return VLLM_OK;
}

static int cpu_weight_random(struct backend *be, struct weight *w, int64_t rows, int64_t cols, enum dtype dt,
                             uint64_t seed, float std) {
    size_t n = (size_t)rows * cols;
    w->data = cpu_alloc(be, sizeof(float) * n);
    if (!w->data) return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for a weight", sizeof(float) * n);
    w->dtype = DT_F32;
    w->rows = rows;
    w->cols = cols;
    float a = std * 1.7320508f * 0x1.0p-31f, *d = w->data;
    uint64_t x = seed | 1;
    for (size_t i = 0; i < n; i++) { // xorshift64: uniform, std `std`
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        d[i] = a * (float)(int32_t)(x >> 32);
    }
    round_bf16(d, n, dt);
    return VLLM_OK;
}

static void cpu_gather_ids(struct backend *be, int32_t *ids, const int32_t *table, const int32_t *src, int n) {
    (void)be;
    for (int t = 0; t < n; t++) ids[t] = table[src[t]];
}

static void cpu_embed(struct backend *be, float *out, const struct weight *table, const int32_t *ids, int n) {
    (void)be;
    int64_t d = table->cols;
    for (int t = 0; t < n; t++) memcpy(out + t * d, (const float *)table->data + (int64_t)ids[t] * d, sizeof(float) * d);
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

void cpu_matmul(struct backend *be, float *y, const float *x, const struct weight *w, int n) {
    (void)be;
    if (n <= 0) return;
    int N = (int)w->rows, K = (int)w->cols;
    if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, w->data, K, x, 1, 0.0f, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, N, K, 1.0f, x, K, w->data, K, 0.0f, y, N);
}

static void cpu_gather_rows(struct backend *be, float *out, const float *x, const int32_t *rows, int n, int dim) {
    (void)be;
    for (int i = 0; i < n; i++) memcpy(out + (int64_t)i * dim, x + (int64_t)rows[i] * dim, sizeof(float) * dim);
}

static void cpu_add(struct backend *be, float *y, const float *x, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_relu2(struct backend *be, float *x, int64_t n) {
    (void)be;
    for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0 ? x[i] * x[i] : 0.0f;
}

static double cpu_sum_sq(struct backend *be, const float *x, int64_t n) {
    (void)be;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
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

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .memset0 = cpu_memset0,
    .sync = cpu_sync,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_free,
    .download_async = cpu_copy,
    .fence = cpu_fence,
    .fence_wait = cpu_fence_wait,
    .weight_upload = cpu_weight_upload,
    .weight_random = cpu_weight_random,
    .gather_ids = cpu_gather_ids,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .matmul = cpu_matmul,
    .gather_rows = cpu_gather_rows,
    .add = cpu_add,
    .relu2 = cpu_relu2,
    .sum_sq = cpu_sum_sq,
    .conv1d_fwd = cpu_conv1d_fwd,
    .conv1d_update = cpu_conv1d_update,
    .ssd_prefill = cpu_ssd_prefill,
    .ssd_decode = cpu_ssd_decode,
    .gated_rmsnorm = cpu_gated_rmsnorm,
    .kv_write = cpu_kv_write,
    .attn_prefill = cpu_attn_prefill,
    .attn_decode = cpu_attn_decode,
    .moe_route = cpu_moe_route,
    .moe_experts = cpu_moe_experts,
    .sample = cpu_sample,
    .all_reduce = cpu_all_reduce,
    .all_gather = cpu_all_gather,
};

// The fast path: the reference table with the fast path's weights, matmul,
// norms, Mamba2, attention, router and experts (copied per backend, so an op
// added to the reference table is on both paths).
static void fast_ops_init(struct backend_ops *o) {
    *o = cpu_ops;
    o->weight_upload = fast_weight_upload;
    o->weight_random = fast_weight_random;
    o->embed = fast_embed;
    o->rmsnorm = fast_rmsnorm;
    o->add_rmsnorm = fast_add_rmsnorm;
    o->matmul = fast_matmul;
    o->relu2 = fast_relu2;
    o->conv1d_fwd = fast_conv1d_fwd;
    o->conv1d_update = fast_conv1d_update;
    o->ssd_prefill = fast_ssd_prefill;
    o->ssd_decode = fast_ssd_decode;
    o->gated_rmsnorm = fast_gated_rmsnorm;
    o->attn_prefill = fast_attn_prefill;
    o->attn_decode = fast_attn_decode;
    o->moe_route = fast_moe_route;
    o->moe_experts = fast_moe_experts;
}

int cpu_backend_create(int num_threads, int reference, int isa, struct backend **out) {
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
int backend_cpu_create(int num_threads, struct backend **out) {
    const char *r = getenv("VLLM_CPU_REFERENCE"), *s = getenv("VLLM_CPU_ISA");
    int reference = r && *r && strcmp(r, "0") != 0, isa = -1;
    if (s && *s) {
        for (int i = FAST_SCALAR; i <= FAST_AVX512_BF16; i++)
            if (!strcmp(s, fast_isa_name(i))) isa = i;
        if (isa < 0)
            return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "VLLM_CPU_ISA=%s: expected scalar, avx2, avx512 or avx512_bf16", s);
    }
    return cpu_backend_create(num_threads, reference, isa, out);
}
