// fast_attn.c - paged attention of the fast path as matrix products: per
// (sequence, KV head, block of queries), the block's context is gathered
// from the paged caches once for the H/Hkv query heads that share it; then
// per head S = Q K^T, causal softmax, O = P V. Decode is the same with one
// query per sequence. Caches and rows as in cpu_attn.c (the reference); an
// fp8 cache's codes (1 byte an element) are read to fp32 by the gather.
#include <float.h>
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

#define QBLK 64 // queries per task

struct attn_ctx {
    struct backend *be;
    float *out;
    const float *qkv;
    int ld;
    const void *kc, *vc;
    const struct batch *b;
    int seq0;
    const struct attn_dims *d;
    int *task_seq, *task_q0; // per task: sequence, first query
};

// Floats of a task's scratch for n keys and nq queries.
static size_t task_floats(int n, int nq, int Dh) {
    return (size_t)2 * n * Dh + (size_t)nq * n + fast_sgemm_b_floats(n, Dh) + fast_sgemm_b_floats(Dh, n) +
           fast_sgemm_a_floats(nq, n);
}

size_t fast_attn_scratch(const struct attn_dims *d, int max_seq_len) {
    return sizeof(float) * task_floats(max_seq_len, QBLK, d->head_dim);
}

static void attn_task(void *ctx, int task, int thread) {
    struct attn_ctx *c = ctx;
    const struct attn_dims *d = c->d;
    const struct batch *b = c->b;
    const struct fast_kern *k = fast_k(c->be);
    int H = d->heads, Hkv = d->kv_heads, Dh = d->head_dim, hg = H / Hkv, bs = d->block_size, kvd = Hkv * Dh;
    int kvh = task % Hkv, s = c->task_seq[task / Hkv], q0 = c->task_q0[task / Hkv];
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0, ctx0 = b->context_lens[s];
    int nq = MIN(QBLK, L - q0), n = ctx0 + q0 + nq; // keys [0, n) cover the block's last query
    const int32_t *bt = b->block_tables + (int64_t)s * b->max_blocks_per_seq;
    size_t kb = fast_sgemm_b_floats(n, Dh), vb = fast_sgemm_b_floats(Dh, n);
    float *kk = cpu_scratch(c->be, thread, sizeof(float) * task_floats(n, nq, Dh));
    float *vv = kk + (size_t)n * Dh, *sc = vv + (size_t)n * Dh, *kpack = sc + (size_t)nq * n, *vpack = kpack + kb;
    float *apack = vpack + vb;
    enum dtype dt = c->be->kv_dtype;
    for (int j = 0; j < n; j++) {
        int64_t off = ((int64_t)bt[j / bs] * bs + j % bs) * kvd + kvh * Dh;
        cpu_kv_load(kk + (int64_t)j * Dh, c->kc, dt, off, Dh, d->k_scale);
        cpu_kv_load(vv + (int64_t)j * Dh, c->vc, dt, off, Dh, d->v_scale);
    }
    if (nq == 1) { // one query (decode): dot products and axpys, nothing to pack
        const float *q = c->qkv + (int64_t)(t0 + q0) * c->ld + kvh * hg * Dh; // the group's hg heads, adjacent
        struct weight kw = {.data = kk, .fmt = WF_F32, .rows = n, .cols = Dh};
        k->mm_f32(sc, n, q, Dh, hg, &kw, 0, n); // sc [hg, n]
        for (int hh = 0; hh < hg; hh++) {
            float *r = sc + (int64_t)hh * n, mx = -FLT_MAX, sum = 0;
            for (int j = 0; j < n; j++) {
                r[j] *= d->scale;
                mx = r[j] > mx ? r[j] : mx;
            }
            for (int j = 0; j < n; j++) r[j] -= mx;
            k->vexp(r, r, n);
            for (int j = 0; j < n; j++) sum += r[j];
            float inv = 1.0f / sum, *o = c->out + (int64_t)(t0 + q0) * H * Dh + (kvh * hg + hh) * Dh;
            memset(o, 0, sizeof(float) * Dh);
            for (int j = 0; j < n; j++) k->axpy(o, r[j] * inv, vv + (int64_t)j * Dh, Dh);
        }
        return;
    }
    struct fast_bmat kt, vm; // K^T and V, packed once for the hg heads
    fast_sgemm_prep_b(c->be, &kt, n, Dh, kk, Dh, 1, kpack);
    fast_sgemm_prep_b(c->be, &vm, Dh, n, vv, Dh, 0, vpack);
    for (int hh = 0; hh < hg; hh++) {
        int h = kvh * hg + hh;
        const float *q = c->qkv + (int64_t)(t0 + q0) * c->ld + h * Dh;
        fast_sgemm_b(c->be, nq, n, Dh, d->scale, q, c->ld, 0, &kt, 0.0f, sc, n, apack);
        for (int i = 0; i < nq; i++) { // query i sees keys [0, ctx0 + q0 + i]
            float *r = sc + (int64_t)i * n, mx = -FLT_MAX, sum = 0;
            int m = ctx0 + q0 + i + 1;
            for (int j = 0; j < m; j++) mx = r[j] > mx ? r[j] : mx;
            for (int j = 0; j < m; j++) r[j] -= mx;
            k->vexp(r, r, m);
            for (int j = 0; j < m; j++) sum += r[j];
            float inv = 1.0f / sum;
            for (int j = 0; j < m; j++) r[j] *= inv;
            for (int j = m; j < n; j++) r[j] = 0.0f;
        }
        fast_sgemm_b(c->be, nq, Dh, n, 1.0f, sc, n, 0, &vm, 0.0f, c->out + (int64_t)(t0 + q0) * H * Dh + h * Dh, H * Dh,
                     apack);
    }
}

static void attn_run(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                     const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d) {
    int nt = 0;
    for (int s = seq0; s < seq1; s++) nt += CDIV(b->h_query_start_loc[s + 1] - b->h_query_start_loc[s], QBLK);
    int *ts = fast_shared(be, 0, sizeof(int) * 2 * (size_t)MAX(nt, 1)), *tq = ts + nt;
    nt = 0;
    for (int s = seq0; s < seq1; s++)
        for (int q0 = 0; q0 < b->h_query_start_loc[s + 1] - b->h_query_start_loc[s]; q0 += QBLK) {
            ts[nt] = s;
            tq[nt++] = q0;
        }
    struct attn_ctx c = {be, out, qkv, ld, k_cache, v_cache, b, seq0, d, ts, tq};
    cpu_parallel(be, nt * d->kv_heads, attn_task, &c);
}

void fast_attn_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                       const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d) {
    attn_run(be, out, qkv, ld, k_cache, v_cache, b, seq0, seq1, d);
}

void fast_attn_decode(struct backend *be, float *out, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                      void *v_cache, const struct batch *b, const struct attn_dims *d) {
    fast_qk_rows(be, qkv, ld, p, k_cache, v_cache, b, 0, b->num_decodes, d);
    attn_run(be, out, qkv, ld, k_cache, v_cache, b, 0, b->num_decodes, d);
}
