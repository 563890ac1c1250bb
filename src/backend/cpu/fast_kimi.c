// fast_kimi.c - Kimi-Linear on the fast path: KDA prefill in chunks as small
// matrix products (below), KDA decode as the reference's recurrence
// (cpu_kimi.c) on the vector kernels, and multi-head latent attention as
// matrix products. Every head reads the same cached latents (one KV "head"),
// so a task gathers a sequence's context rows [n, R+P] once for a group of heads
// and a block of queries, and runs
//   Q_lat = [q_nope W_kb | q_r]   per head          [nq*hg, R+P]
//   S = Q_lat C^T * scale, causal softmax              [nq*hg, n]
//   O_lat = P C[:, :R];  out_h = O_lat_h W_vb_h^T      [nq, V] per head
// as OpenBLAS products (single-threaded inside the pool's tasks). The same
// sums as the reference (cpu_kimi.c), in another order.
#include <cblas.h>
#include <float.h>
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

// One token of one KDA head, as the reference's kda_step, row by row of the
// state: S[i] *= exp(g_i), mem += k_i S[i]; then S[i] += k_i delta, y += q_i S[i].
static void fast_kda_step(struct backend *be, float *st, const float *row, const float *g, float *y, int h, int H, int K,
                          float *scr) {
    const struct fast_kern *k = fast_k(be);
    float *q = scr, *kk = q + K, *mem = kk + K;
    const float *qr = row + h * K, *kr = row + H * K + h * K, *v = row + 2 * H * K + h * K;
    float rq = (1.0f / sqrtf((float)K)) / sqrtf((float)k->sumsq(qr, K) + 1e-6f);
    float rk = 1.0f / sqrtf((float)k->sumsq(kr, K) + 1e-6f);
    for (int i = 0; i < K; i++) q[i] = qr[i] * rq, kk[i] = kr[i] * rk;
    float beta = 1.0f / (1.0f + expf(-row[3 * H * K + h]));
    memset(mem, 0, sizeof(float) * K);
    for (int i = 0; i < K; i++) {
        float *si = st + (int64_t)i * K;
        k->scale(si, expf(g[h * K + i]), K);
        k->axpy(mem, kk[i], si, K);
    }
    for (int j = 0; j < K; j++) mem[j] = beta * (v[j] - mem[j]); // the delta
    memset(y, 0, sizeof(float) * K);
    for (int i = 0; i < K; i++) {
        float *si = st + (int64_t)i * K;
        k->axpy(si, kk[i], mem, K);
        k->axpy(y, q[i], si, K);
    }
}

// The chunked prefill. Chunks of KDA_CS tokens end at absolute multiples of
// KDA_CS (positions counted from the sequence start, as the SSD scan's), and
// a piece also ends at each checkpoint position, so a prefill split over
// scheduler steps computes the same pieces. The recurrence per token (the
// reference's kda_step), S [K, K] (key channel i, value channel j):
//   S' = (I - beta k k^T) diag(a) S + beta k v^T,  y = S'^T q,  a = exp(g)
// unrolls over a piece of n <= KDA_CS tokens entering with S0, with the
// prefix decays P_t = a_0 o ... o a_t [K], into
//   S_t = diag(P_t) S0 + sum_{j<=t} (k_j o a_j+1 o ... o a_t) u_j^T
// where the rows u_t [K] of U [n, K] solve
//   u_t = beta_t (v_t - W_t - sum_{j<t} Mkk[t][j] u_j),  W = Kg S0 [n, K]
//   Qg = q o P, Kg = k o P                                   [n, K]
//   Mkk[t][j] = sum_i k_t,i k_j,i a_j+1,i ... a_t,i (j < t)    [n, n]
//   Mqk[t][j] the same with q_t (j <= t)                     [n, n]
// (a unit lower-triangular system, by forward substitution), and then
//   y = Qg S0 + Mqk U                                        [n, K]
//   S = diag(P_n-1) S0 + Kend^T U,  Kend_j = k_j o a_j+1 ... a_n-1
// The pairwise decays are running products of the a's, each factor <= 1:
// no exp(-G) to overflow however strong the decay, and their rounding is
// the recurrence's. The products with S0 (6 K^2 flops a token, whatever n)
// run on the small-GEMM kernels; the pairwise part costs about 3 n K / 2 a
// token. KDA_CS 16, 32 and 64 measured the same within this machine's noise
// (152, 183, 153 ms at Kimi-Linear-48B's shapes, 2048 tokens, 2 threads):
// 16 keeps the scratch small, and divides the model's chunk_size (64), where
// checkpoints sit. Decode stays the recurrence (fast_kda_step).
#define KDA_CS 16

struct kdac_ctx {
    struct backend *be;
    float *y;
    const float *proj;
    int ld;
    const float *g;
    float *state;
    const struct batch *b;
    int seq0;
    const struct kda_dims *d;
};

size_t fast_kda_scratch(const struct kda_dims *d) {
    size_t C = KDA_CS, K = d->head_dim, M = MAX(C, K);
    return sizeof(float) * (9 * C * K + 2 * C * C + C + K + fast_sgemm_b_floats((int)K, (int)K) +
                            fast_sgemm_b_floats((int)K, (int)C) + fast_sgemm_a_floats((int)M, (int)M));
}

// One piece of n tokens (from token t) of head h; st [K, K] in, then out.
static void kda_piece(struct kdac_ctx *c, float *st, int64_t t, int n, int h, float *scr) {
    struct backend *be = c->be;
    const struct fast_kern *k = fast_k(be);
    int H = c->d->heads, K = c->d->head_dim, HK = H * K, C = KDA_CS;
    float *qn = scr, *kn = qn + C * K, *a = kn + C * K, *qg = a + C * K, *kg = qg + C * K, *ke = kg + C * K;
    float *e = ke + C * K, *w = e + C * K, *u = w + C * K, *mkk = u + C * K, *mqk = mkk + C * C, *beta = mqk + C * C;
    float *p = beta + C, *sp1 = p + K, *sp2 = sp1 + fast_sgemm_b_floats(K, K), *apack = sp2 + fast_sgemm_b_floats(K, C);
    float *yt = c->y + t * HK + h * K; // rows HK floats apart
    for (int i = 0; i < n; i++) {
        const float *row = c->proj + (t + i) * c->ld, *qr = row + h * K, *kr = row + HK + h * K;
        float rq = (1.0f / sqrtf((float)K)) / sqrtf((float)k->sumsq(qr, K) + 1e-6f);
        float rk = 1.0f / sqrtf((float)k->sumsq(kr, K) + 1e-6f);
        for (int j = 0; j < K; j++) qn[i * K + j] = qr[j] * rq, kn[i * K + j] = kr[j] * rk;
        beta[i] = 1.0f / (1.0f + expf(-row[3 * HK + h]));
        k->vexp(a + i * K, c->g + (t + i) * HK + h * K, K);
    }
    memcpy(p, a, sizeof(float) * K); // P_i, running
    for (int i = 0; i < n; i++) {
        if (i) k->mul(p, a + i * K, K);
        memcpy(qg + i * K, qn + i * K, sizeof(float) * K);
        memcpy(kg + i * K, kn + i * K, sizeof(float) * K);
        k->mul(qg + i * K, p, K);
        k->mul(kg + i * K, p, K);
    }
    for (int j = n - 1; j >= 0; j--) { // Kend, with the suffix decay running in e
        if (j == n - 1) for (int i = 0; i < K; i++) e[i] = 1.0f;
        else k->mul(e, a + (j + 1) * K, K);
        memcpy(ke + j * K, kn + j * K, sizeof(float) * K);
        k->mul(ke + j * K, e, K);
    }
    for (int i = 0; i < n; i++) { // e row j: k_j o a_j+1 ... a_i
        for (int j = 0; j < i; j++) k->mul(e + j * K, a + i * K, K);
        memcpy(e + i * K, kn + i * K, sizeof(float) * K);
        cblas_sgemv(CblasRowMajor, CblasNoTrans, i + 1, K, 1.0f, e, K, kn + i * K, 1, 0.0f, mkk + i * C, 1);
        cblas_sgemv(CblasRowMajor, CblasNoTrans, i + 1, K, 1.0f, e, K, qn + i * K, 1, 0.0f, mqk + i * C, 1);
        memset(mqk + i * C + i + 1, 0, sizeof(float) * (n - i - 1));
    }
    struct fast_bmat sm, um;
    fast_sgemm_prep_b(be, &sm, K, K, st, K, 0, sp1);
    fast_sgemm_b(be, n, K, K, 1.0f, qg, K, 0, &sm, 0.0f, yt, HK, apack);
    fast_sgemm_b(be, n, K, K, 1.0f, kg, K, 0, &sm, 0.0f, w, K, apack);
    for (int i = 0; i < n; i++) { // forward substitution
        float *ui = u + i * K;
        const float *v = c->proj + (t + i) * c->ld + 2 * HK + h * K;
        for (int j = 0; j < K; j++) ui[j] = v[j] - w[i * K + j];
        for (int j = 0; j < i; j++) k->axpy(ui, -mkk[i * C + j], u + j * K, K);
        k->scale(ui, beta[i], K);
    }
    fast_sgemm_prep_b(be, &um, K, n, u, K, 0, sp2);
    fast_sgemm_b(be, n, K, n, 1.0f, mqk, C, 0, &um, 1.0f, yt, HK, apack);
    for (int i = 0; i < K; i++) k->scale(st + (int64_t)i * K, p[i], K);
    fast_sgemm_b(be, K, K, n, 1.0f, ke, K, 1, &um, 1.0f, st, K, apack);
}

// Strong decays make products of many exp(g) subnormal (below 2^-126), and
// each operation on a subnormal takes a microcode assist on x86 (a prefill
// with log-decays in [-20, 0] ran 8x slower): the chunked task flushes them
// to zero (FTZ and DAZ), a change of under 2^-126 in any value, and restores
// the thread's mode after.
static unsigned denormals_off(void) {
#if defined(__x86_64__)
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040); // FTZ (bit 15) | DAZ (bit 6)
    return old;
#else
    return 0;
#endif
}

static void denormals_restore(unsigned old) {
#if defined(__x86_64__)
    _mm_setcsr(old);
#else
    (void)old;
#endif
}

// One (sequence, head): pieces at absolute chunk ends and checkpoints.
static void kda_chunk_task(void *ctx, int task, int thread) {
    struct kdac_ctx *c = ctx;
    const struct kda_dims *d = c->d;
    const struct batch *b = c->b;
    int H = d->heads, K = d->head_dim, s = c->seq0 + task / H, h = task % H;
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0, p0 = b->context_lens[s];
    int64_t hs = (int64_t)K * K;
    float *st = c->state + ((int64_t)b->state_slots[s] * H + h) * hs;
    int src = b->state_src[s], kc = b->ckpt_start[s], k1 = b->ckpt_start[s + 1];
    if (src < 0) memset(st, 0, sizeof(float) * hs); // a fresh slot reads as zeros
    else if (src != b->state_slots[s]) memcpy(st, c->state + ((int64_t)src * H + h) * hs, sizeof(float) * hs);
    float *scr = cpu_scratch(c->be, thread, fast_kda_scratch(d));
    unsigned mode = denormals_off();
    for (; kc < k1 && b->ckpt_pos[kc] <= p0; kc++) {} // the state before the prefill: never written (as the reference)
    for (int i0 = 0; i0 < L;) {
        int n = MIN(L - i0, KDA_CS - (p0 + i0) % KDA_CS);
        if (kc < k1) n = MIN(n, b->ckpt_pos[kc] - (p0 + i0));
        kda_piece(c, st, t0 + i0, n, h, scr);
        i0 += n;
        for (; kc < k1 && b->ckpt_pos[kc] <= p0 + i0; kc++) // the state after position ckpt_pos - 1
            if (b->ckpt_pos[kc] == p0 + i0)
                memcpy(c->state + ((int64_t)b->ckpt_slot[kc] * H + h) * hs, st, sizeof(float) * hs);
    }
    denormals_restore(mode);
}

void fast_kda_prefill(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                      const struct batch *b, int seq0, int seq1, const struct kda_dims *d) {
    struct kdac_ctx c = {be, y, proj, ld, g, state, b, seq0, d};
    cpu_parallel(be, (seq1 - seq0) * d->heads, kda_chunk_task, &c);
}

void fast_kda_decode(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                     const struct batch *b, const struct kda_dims *d) {
    cpu_kda_run(be, fast_kda_step, y, proj, ld, g, state, b, 0, b->num_decodes, 1, d);
}

#define MLA_QBLK 8  // queries per task
#define MLA_HGRP 8  // heads per task (all of them when H is not a multiple)

static int head_group(int H) { return H % MLA_HGRP ? H : MLA_HGRP; }

static size_t task_floats(int n, int nq, int hg, const struct mla_dims *d) {
    size_t W = (size_t)d->rank + d->rope, rows = (size_t)nq * hg;
    return (size_t)n * W + rows * W + rows * n + rows * d->rank;
}

size_t fast_mla_scratch(const struct mla_dims *d, int max_seq_len) {
    return sizeof(float) * task_floats(max_seq_len, MLA_QBLK, head_group(d->heads), d);
}

struct mla_ctx {
    struct backend *be;
    float *out;
    const float *q, *cache, *kv_b;
    const struct batch *b;
    const struct mla_dims *d;
    int *task_seq, *task_q0, groups;
};

static void mla_task(void *ctx, int task, int thread) {
    struct mla_ctx *c = ctx;
    const struct mla_dims *d = c->d;
    const struct batch *b = c->b;
    const struct fast_kern *k = fast_k(c->be);
    int H = d->heads, N = d->nope, P = d->rope, V = d->v_dim, R = d->rank, W = R + P, bs = d->block_size;
    int hg = head_group(H), h0 = task % c->groups * hg, s = c->task_seq[task / c->groups], q0 = c->task_q0[task / c->groups];
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0, ctx0 = b->context_lens[s];
    int nq = MIN(MLA_QBLK, L - q0), n = ctx0 + q0 + nq, rows = nq * hg; // keys [0, n) cover the last query
    const int32_t *bt = b->block_tables + (int64_t)s * b->max_blocks_per_seq;
    float *cc = cpu_scratch(c->be, thread, sizeof(float) * task_floats(n, nq, hg, d));
    float *ql = cc + (size_t)n * W, *sc = ql + (size_t)rows * W, *ol = sc + (size_t)rows * n;
    for (int j = 0; j < n; j++)
        memcpy(cc + (int64_t)j * W, c->cache + ((int64_t)bt[j / bs] * bs + j % bs) * W, sizeof(float) * W);
    // rows of ql, sc, ol: (query i, head hh) at i*hg + hh
    for (int hh = 0; hh < hg; hh++) {
        int h = h0 + hh;
        const float *qh = c->q + (int64_t)(t0 + q0) * H * (N + P) + (int64_t)h * (N + P);
        const float *wk = c->kv_b + (int64_t)h * (N + V) * R;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, R, N, 1.0f, qh, H * (N + P), wk, R, 0.0f,
                    ql + (int64_t)hh * W, hg * W);
        for (int i = 0; i < nq; i++) memcpy(ql + ((int64_t)i * hg + hh) * W + R, qh + (int64_t)i * H * (N + P) + N,
                                            sizeof(float) * P);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, W, d->scale, ql, W, cc, W, 0.0f, sc, n);
    for (int r = 0; r < rows; r++) { // query r / hg sees keys [0, ctx0 + q0 + r / hg]
        float *x = sc + (int64_t)r * n, mx = -FLT_MAX, sum = 0;
        int m = ctx0 + q0 + r / hg + 1;
        for (int j = 0; j < m; j++) mx = x[j] > mx ? x[j] : mx;
        for (int j = 0; j < m; j++) x[j] -= mx;
        k->vexp(x, x, m);
        for (int j = 0; j < m; j++) sum += x[j];
        float inv = 1.0f / sum;
        for (int j = 0; j < m; j++) x[j] *= inv;
        for (int j = m; j < n; j++) x[j] = 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, R, n, 1.0f, sc, n, cc, W, 0.0f, ol, R);
    for (int hh = 0; hh < hg; hh++) {
        int h = h0 + hh;
        const float *wv = c->kv_b + (int64_t)h * (N + V) * R + (int64_t)N * R; // [V, R]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, V, R, 1.0f, ol + (int64_t)hh * R, hg * R, wv, R, 0.0f,
                    c->out + (int64_t)(t0 + q0) * H * V + (int64_t)h * V, H * V);
    }
}

void fast_mla_attn(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                   const struct batch *b, int seq0, int seq1, const struct mla_dims *d) {
    int nt = 0;
    for (int s = seq0; s < seq1; s++) nt += CDIV(b->h_query_start_loc[s + 1] - b->h_query_start_loc[s], MLA_QBLK);
    if (!nt) return;
    int *ts = fast_shared(be, 0, sizeof(int) * 2 * (size_t)nt), *tq = ts + nt; // slot 0, as attention
    nt = 0;
    for (int s = seq0; s < seq1; s++)
        for (int q0 = 0; q0 < b->h_query_start_loc[s + 1] - b->h_query_start_loc[s]; q0 += MLA_QBLK) {
            ts[nt] = s;
            tq[nt++] = q0;
        }
    struct mla_ctx c = {be, out, q, cache, kv_b, b, d, ts, tq, d->heads / head_group(d->heads)};
    cpu_parallel(be, nt * c.groups, mla_task, &c);
}
