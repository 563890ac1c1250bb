// cpu_ops.c - the CPU ops at rand_moe's shapes (KDA at Kimi-Linear-48B's),
// reference against fast path (same process, same threads), and the peak of
// the fast path's GEMM kernel.
//
// Usage: cpu_ops [THREADS] [REPEATS] [ONLY]  (ONLY: run the benchmarks whose
// name contains it)
// Prints, per op and batch rows: the median time of each path, the speed-up,
// and for matmuls the GFLOP/s and weight GB/s of the fast path; then the bf16
// dot kernel in a tight loop on L1-resident data (its peak) on 1 thread and on
// every thread at once.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

static uint64_t rng = 88172645463325252ull;
static float *rnd(size_t n, float s) {
    float *x = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        x[i] = s * (float)((rng >> 11) * 0x1.0p-53 * 2 - 1);
    }
    return x;
}

static int reps = 7;
static const char *only;
static int noref;   // CPU_OPS_NO_REF=1: time the fast path only (for profiles)
static int use_min; // CPU_OPS_MIN=1: the fastest repeat instead of the median (A/B on a busy machine)
static int want(const char *name) { return !only || strstr(name, only); }
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef void (*op_fn)(struct backend *be, void *arg);
static double time_op(struct backend *be, op_fn f, void *arg) {
    double t[64];
    if (noref && cpu_of(be)->reference) return NAN;
    f(be, arg); // warm
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        f(be, arg);
        t[r] = now_s() - t0;
    }
    qsort(t, reps, sizeof(double), cmpd);
    return use_min ? t[0] : t[reps / 2];
}

// Enough copies of each weight to exceed the last-level cache (96 MB), used
// in turn: decode-sized products read their weights from DRAM, as in a step.
#define COLD_BYTES (96 << 20)
struct mm_arg {
    struct weight *w[2]; // [path][copy]
    float *x, *y;
    int n, which, copies, next;
};
static void mm_run(struct backend *be, void *a) {
    struct mm_arg *m = a;
    be->ops->matmul(be, m->y, m->x, &m->w[m->which][m->next], m->n);
    m->next = (m->next + 1) % m->copies;
}

static void bench_matmul(struct backend *ref, struct backend *fast, const char *name, int N, int K, enum wfmt dt,
                         const int *ns, int nn) {
    double bytes = (double)N * K * wfmt_size(dt);
    int copies = (int)MAX(1, MIN(64, COLD_BYTES / bytes + 1));
    struct weight *w[2] = {xcalloc(copies, sizeof(struct weight)), xcalloc(copies, sizeof(struct weight))};
    float *wh = rnd((size_t)N * K, 0.05f);
    for (int c = 0; c < copies; c++) {
        weight_from_f32(ref, &w[0][c], dt, wh, N, K);
        weight_from_f32(fast, &w[1][c], dt, wh, N, K);
    }
    free(wh);
    for (int i = 0; i < nn; i++) {
        int n = ns[i];
        struct mm_arg a = {{w[0], w[1]}, rnd((size_t)n * K, 1), xmalloc(sizeof(float) * (size_t)n * N), n, 0, copies, 0};
        double tr = time_op(ref, mm_run, &a);
        a.which = 1;
        double tf = time_op(fast, mm_run, &a);
        double flop = 2.0 * n * N * K;
        printf("%-22s %-4s n=%-4d ref %8.3f ms  fast %8.3f ms  x%6.2f  %7.1f GFLOP/s  %6.1f GB/s\n", name,
               dt == WF_BF16 ? "bf16" : "fp32", n, tr * 1e3, tf * 1e3, tr / tf, flop / tf / 1e9, bytes / tf / 1e9);
        free(a.x), free(a.y);
    }
    for (int c = 0; c < copies; c++) free(w[0][c].data), free(w[1][c].data);
    free(w[0]), free(w[1]);
}

// A batch of S sequences of q tokens each after ctx tokens (decodes when q == 1).
struct hb {
    struct batch b;
    int32_t *qsl, *seq_lens, *ctx, *slots, *src, *ck_start, *pos, *slot_map, *btab;
};
static void make_batch(struct hb *h, int S, int q, int ctx, int bs) {
    int T = S * q, mb = (ctx + q + bs - 1) / bs;
    h->qsl = xcalloc(S + 1, 4), h->seq_lens = xcalloc(S, 4), h->ctx = xcalloc(S, 4), h->slots = xcalloc(S, 4);
    h->src = xcalloc(S, 4), h->ck_start = xcalloc(S + 1, 4), h->pos = xcalloc(T, 4), h->slot_map = xcalloc(T, 4), h->btab = xcalloc((size_t)S * mb, 4);
    for (int s = 0; s < S; s++) {
        h->qsl[s] = s * q;
        h->ctx[s] = ctx;
        h->seq_lens[s] = ctx + q;
        h->slots[s] = s;
        h->src[s] = ctx > 0 ? s : -1; // continue the slot, or zeros
        for (int j = 0; j < mb; j++) h->btab[s * mb + j] = s * mb + j;
        for (int i = 0; i < q; i++) {
            h->pos[s * q + i] = ctx + i;
            h->slot_map[s * q + i] = (s * mb) * bs + ctx + i;
        }
    }
    h->qsl[S] = T;
    struct batch *b = &h->b;
    memset(b, 0, sizeof *b);
    b->num_tokens = T, b->num_seqs = S, b->num_decodes = q == 1 ? S : 0, b->num_prefills = q == 1 ? 0 : S;
    b->max_blocks_per_seq = mb;
    b->query_start_loc = h->qsl, b->seq_lens = h->seq_lens, b->context_lens = h->ctx, b->positions = h->pos;
    b->state_slots = h->slots, b->state_src = h->src, b->ckpt_start = h->ck_start, b->slot_mapping = h->slot_map, b->block_tables = h->btab;
    b->h_query_start_loc = h->qsl, b->h_seq_lens = h->seq_lens, b->h_context_lens = h->ctx;
    b->h_state_slots = h->slots, b->h_state_src = h->src;
}
static void free_batch(struct hb *h) {
    free(h->qsl), free(h->seq_lens), free(h->ctx), free(h->slots), free(h->src), free(h->ck_start), free(h->pos), free(h->slot_map),
        free(h->btab);
}

// rand_moe's Mamba2: 64 heads of 32, 8 groups, state 128, conv 4, chunk 128.
struct mamba_arg {
    struct mamba_dims d;
    struct hb h;
    float *zx, *zx0, *cw, *cb, *cs, *dtb, *A, *D, *st, *y;
    int ld, op;
};
static void mamba_run(struct backend *be, void *p) {
    struct mamba_arg *a = p;
    struct batch *b = &a->h.b;
    int T = b->num_tokens;
    if (a->op == 0) {
        memcpy(a->zx, a->zx0, sizeof(float) * (size_t)T * a->ld);
        if (b->num_decodes) be->ops->conv1d_update(be, a->zx, a->ld, a->cw, a->cb, a->cs, b, &a->d);
        else be->ops->conv1d_fwd(be, a->zx, a->ld, a->cw, a->cb, a->cs, b, 0, b->num_seqs, &a->d);
    } else if (b->num_decodes) {
        be->ops->ssd_decode(be, a->y, a->zx0, a->ld, a->dtb, a->A, a->D, a->st, b, &a->d);
    } else {
        be->ops->ssd_prefill(be, a->y, a->zx0, a->ld, a->dtb, a->A, a->D, a->st, b, 0, b->num_seqs, &a->d);
    }
}

static void bench_mamba(struct backend *ref, struct backend *fast, int S, int q, int ctx) {
    struct mamba_arg a;
    memset(&a, 0, sizeof a);
    a.d = (struct mamba_dims){64, 32, 8, 128, 4, 128, 0, 0.0f, INFINITY};
    a.d.conv_dim = 64 * 32 + 2 * 8 * 128;
    int I = 64 * 32, H = 64, T = S * q;
    a.ld = 2 * I + 2 * 8 * 128 + H;
    make_batch(&a.h, S, q, ctx, 16);
    a.zx0 = rnd((size_t)T * a.ld, 1), a.zx = xmalloc(sizeof(float) * (size_t)T * a.ld);
    a.cw = rnd((size_t)a.d.conv_dim * 4, 0.5f), a.cb = rnd(a.d.conv_dim, 0.1f), a.cs = rnd((size_t)S * 3 * a.d.conv_dim, 1);
    a.dtb = rnd(H, 0.5f), a.A = rnd(H, 1), a.D = rnd(H, 1), a.y = xmalloc(sizeof(float) * (size_t)T * I);
    for (int h = 0; h < H; h++) a.A[h] = -expf(a.A[h] + 1);
    a.st = rnd((size_t)S * H * 32 * 128, 0.1f);
    const char *names[2] = {q == 1 ? "conv1d_update" : "conv1d_fwd", q == 1 ? "ssd_decode" : "ssd_prefill"};
    for (a.op = 0; a.op < 2; a.op++) {
        double tr = time_op(ref, mamba_run, &a), tf = time_op(fast, mamba_run, &a);
        printf("%-22s      n=%-4d ref %8.3f ms  fast %8.3f ms  x%6.2f\n", names[a.op], T, tr * 1e3, tf * 1e3, tr / tf);
    }
    free(a.zx0), free(a.zx), free(a.cw), free(a.cb), free(a.cs), free(a.dtb), free(a.A), free(a.D), free(a.y), free(a.st);
    free_batch(&a.h);
}

// rand_moe's attention: 16 query heads, 2 KV heads of 64.
struct attn_arg {
    struct attn_dims d;
    struct hb h;
    float *qkv, *kc, *vc, *out;
    int ld;
};
static void attn_run(struct backend *be, void *p) {
    struct attn_arg *a = p;
    struct batch *b = &a->h.b;
    struct attn_prep none = {0}; // the decode rows' k and v written as kv_write would
    if (b->num_decodes) be->ops->attn_decode(be, a->out, a->qkv, a->ld, &none, a->kc, a->vc, b, &a->d);
    else be->ops->attn_prefill(be, a->out, a->qkv, a->ld, a->kc, a->vc, b, 0, b->num_seqs, &a->d);
}
static void bench_attn(struct backend *ref, struct backend *fast, int S, int q, int ctx) {
    struct attn_arg a;
    memset(&a, 0, sizeof a);
    a.d = (struct attn_dims){16, 2, 64, 16, 0.125f, 1, 1};
    a.ld = 16 * 64 + 2 * 2 * 64;
    make_batch(&a.h, S, q, ctx, 16);
    int T = S * q, blocks = S * a.h.b.max_blocks_per_seq;
    a.qkv = rnd((size_t)T * a.ld, 1), a.out = xmalloc(sizeof(float) * (size_t)T * 1024);
    a.kc = rnd((size_t)blocks * 16 * 128, 1), a.vc = rnd((size_t)blocks * 16 * 128, 1);
    double tr = time_op(ref, attn_run, &a), tf = time_op(fast, attn_run, &a);
    printf("%-22s      n=%-4d ref %8.3f ms  fast %8.3f ms  x%6.2f  (context %d)\n",
           q == 1 ? "attn_decode" : "attn_prefill", T, tr * 1e3, tf * 1e3, tr / tf, ctx + q);
    free(a.qkv), free(a.out), free(a.kc), free(a.vc);
    free_batch(&a.h);
}

// rand_moe's routed experts: 64 of inter 512, dim 1024, top-4.
struct moe_arg {
    struct moe_experts w[2];
    float *x, *out, *wt;
    int32_t *ids;
    int n, which;
};
// New experts every call (4 distinct per token, spread): their weights come
// from DRAM, as in a step.
static void moe_run(struct backend *be, void *p) {
    struct moe_arg *a = p;
    for (int t = 0; t < a->n * 4; t++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        a->ids[t] = (int32_t)((t % 4) * 16 + (rng >> 40) % 16);
    }
    be->ops->moe_experts(be, a->out, a->x, &a->w[a->which], a->ids, a->wt, a->n, 4, NULL);
}
static void bench_moe(struct backend *ref, struct backend *fast, enum wfmt dt, const int *ns, int nn) {
    struct moe_arg a;
    memset(&a, 0, sizeof a);
    int E = 64, I = 512, L = 1024;
    float *h = rnd((size_t)E * I * L, 0.03f);
    for (int k = 0; k < 2; k++) {
        struct backend *be = k ? fast : ref;
        a.w[k] = (struct moe_experts){.num_experts = E, .inter = I, .dim = L};
        weight_from_f32(be, &a.w[k].up, dt, h, (int64_t)E * I, L);
        weight_from_f32(be, &a.w[k].down, dt, h, (int64_t)E * L, I);
    }
    free(h);
    for (int i = 0; i < nn; i++) {
        a.n = ns[i];
        a.x = rnd((size_t)a.n * L, 1), a.out = xmalloc(sizeof(float) * (size_t)a.n * L), a.wt = rnd((size_t)a.n * 4, 1);
        a.ids = xmalloc(sizeof(int32_t) * a.n * 4);
        a.which = 0;
        double tr = time_op(ref, moe_run, &a);
        a.which = 1;
        double tf = time_op(fast, moe_run, &a);
        printf("%-22s %-4s n=%-4d ref %8.3f ms  fast %8.3f ms  x%6.2f\n", "moe_experts", dt == WF_BF16 ? "bf16" : "fp32",
               a.n, tr * 1e3, tf * 1e3, tr / tf);
        free(a.x), free(a.out), free(a.wt), free(a.ids);
    }
    for (int k = 0; k < 2; k++) free(a.w[k].up.data), free(a.w[k].down.data);
}

// The dot kernel's peak: 6 rows x 4 panels x 256 columns (24 KB of weight,
// 3 KB of activations: L1-resident), called back to back.
struct peak_arg {
    struct backend *be;
    double gflops;
};
// Kimi-Linear-48B's KDA: 32 heads of 128, a [128, 128] state per head;
// log-decays in [-2 depth, 0] (the op alone: no conv, no gate). Depth 10:
// decays strong enough for subnormal state entries and decay products.
struct kda_arg {
    struct kda_dims d;
    struct hb h;
    float *proj, *g, *st, *y;
    int ld;
};
static void kda_run(struct backend *be, void *p) {
    struct kda_arg *a = p;
    struct batch *b = &a->h.b;
    if (b->num_decodes) be->ops->kda_decode(be, a->y, a->proj, a->ld, a->g, a->st, b, &a->d);
    else be->ops->kda_prefill(be, a->y, a->proj, a->ld, a->g, a->st, b, 0, b->num_seqs, &a->d);
}

static void bench_kda(struct backend *ref, struct backend *fast, int S, int q, int ctx, float depth) {
    struct kda_arg a;
    memset(&a, 0, sizeof a);
    a.d = (struct kda_dims){32, 128, 4, 64};
    int HK = 32 * 128, T = S * q;
    a.ld = 3 * HK + 32;
    make_batch(&a.h, S, q, ctx, 16);
    a.proj = rnd((size_t)T * a.ld, 1), a.g = rnd((size_t)T * HK, depth), a.y = xmalloc(sizeof(float) * (size_t)T * HK);
    for (size_t i = 0; i < (size_t)T * HK; i++) a.g[i] -= depth;
    a.st = rnd((size_t)S * HK * 128, 0.1f);
    double tr = time_op(ref, kda_run, &a), tf = time_op(fast, kda_run, &a);
    char name[64];
    snprintf(name, sizeof name, "%s g>=%g", q == 1 ? "kda_decode" : "kda_prefill", -2 * depth);
    printf("%-22s      n=%-4d ref %8.3f ms  fast %8.3f ms  x%6.2f\n", name, T, tr * 1e3, tf * 1e3, tr / tf);
    free(a.proj), free(a.g), free(a.y), free(a.st);
    free_batch(&a.h);
}

static void *peak_thread(void *p) {
    struct peak_arg *a = p;
    const struct fast_kern *k = fast_k(a->be);
    int N = 64, K = 256, m = 6;
    struct weight w;
    float *wh = rnd((size_t)N * K, 0.1f), *y = xmalloc(sizeof(float) * m * N), *x = rnd((size_t)m * K, 1);
    weight_from_f32(a->be, &w, WF_BF16, wh, N, K);
    uint16_t *xb = xmalloc(sizeof(uint16_t) * m * K);
    k->to_bf16(xb, x, (int64_t)m * K);
    long iters = 0;
    double t0 = now_s(), t;
    do {
        for (int i = 0; i < 1000; i++) k->mm_pk_dot(y, N, xb, K, m, &w, 0, N);
        iters += 1000;
    } while ((t = now_s() - t0) < 1.0);
    a->gflops = 2.0 * m * N * K * iters / t / 1e9;
    free(wh), free(y), free(x), free(xb), free(w.data);
    return NULL;
}
static void bench_peak(struct backend *fast) {
    if (!fast_k(fast)->mm_pk_dot) {
        printf("peak: no bf16 dot kernel on this CPU\n");
        return;
    }
    int nt = fast->num_threads;
    struct peak_arg a[64];
    pthread_t th[64];
    a[0].be = fast;
    peak_thread(&a[0]);
    double one = a[0].gflops, all = 0;
    for (int i = 0; i < nt; i++) a[i].be = fast, pthread_create(&th[i], NULL, peak_thread, &a[i]);
    for (int i = 0; i < nt; i++) pthread_join(th[i], NULL), all += a[i].gflops;
    printf("peak of the bf16 dot kernel (6x64 tile, L1-resident): %.1f GFLOP/s on 1 thread, %.1f on %d\n", one, all, nt);
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 2;
    reps = argc > 2 ? atoi(argv[2]) : 7;
    only = argc > 3 ? argv[3] : NULL;
    noref = getenv("CPU_OPS_NO_REF") && atoi(getenv("CPU_OPS_NO_REF"));
    use_min = getenv("CPU_OPS_MIN") && atoi(getenv("CPU_OPS_MIN"));
    if (nt < 1 || nt > 64 || reps < 1 || reps > 64) {
        fprintf(stderr, "usage: cpu_ops [THREADS] [REPEATS <= 64]\n");
        return 2;
    }
    struct backend *ref, *fast;
    if (cpu_backend_create(nt, 1, -1, &ref) || cpu_backend_create(nt, 0, -1, &fast)) {
        fprintf(stderr, "cpu_ops: %s\n", vllm_last_error());
        return 1;
    }
    printf("fast path kernels: %s, %d threads, %s of %d\n", fast_k(fast)->name, nt, use_min ? "fastest" : "median", reps);
    int dec[] = {1, 4}, all[] = {1, 4, 512};
    if (want("peak")) bench_peak(fast);
    if (want("mamba in_proj")) bench_matmul(ref, fast, "mamba in_proj", 6208, 1024, WF_BF16, all, 3);
    if (want("mamba out_proj")) bench_matmul(ref, fast, "mamba out_proj", 1024, 2048, WF_BF16, all, 3);
    if (want("attn qkv")) bench_matmul(ref, fast, "attn qkv", 1280, 1024, WF_BF16, dec, 2);
    if (want("shared up")) bench_matmul(ref, fast, "shared up", 1024, 1024, WF_BF16, all, 3);
    if (want("lm_head")) bench_matmul(ref, fast, "lm_head", 32000, 1024, WF_BF16, dec, 2);
    if (want("router (fp32)")) bench_matmul(ref, fast, "router (fp32)", 64, 1024, WF_F32, all, 3);
    if (want("mamba in_proj")) bench_matmul(ref, fast, "mamba in_proj", 6208, 1024, WF_F32, all, 3);
    int moe_n[] = {1, 4, 512};
    if (want("moe")) bench_moe(ref, fast, WF_BF16, moe_n, 3);
    if (want("ssd conv")) bench_mamba(ref, fast, 1, 1, 100);
    if (want("ssd conv")) bench_mamba(ref, fast, 4, 1, 100);
    if (want("ssd conv")) bench_mamba(ref, fast, 1, 512, 0);
    if (want("attention")) bench_attn(ref, fast, 1, 1, 575);
    if (want("attention")) bench_attn(ref, fast, 4, 1, 575);
    if (want("attention")) bench_attn(ref, fast, 1, 512, 0);
    if (want("kda")) bench_kda(ref, fast, 1, 1, 100, 0.1f);
    if (want("kda")) bench_kda(ref, fast, 1, 2048, 0, 0.1f);
    if (want("kda")) bench_kda(ref, fast, 1, 2048, 0, 10.0f);
    backend_free(ref);
    backend_free(fast);
    return 0;
}
