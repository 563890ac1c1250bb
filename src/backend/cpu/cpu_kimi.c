// cpu_kimi.c - Kimi-Linear reference ops: the KDA gated delta rule (prefill
// and decode, one recurrence), its channel-wise forget gate and gated output
// norm, and multi-head latent attention over a cache of latents.
//
// KDA proj row (ld floats per token): q [H*K] | k [H*K] | v [H*K] (after the
// causal conv + SiLU) | b [H]. Head h reads columns [h*K, (h+1)*K) of each.
#include <float.h>
#include <math.h>

#include "backend/cpu/cpu.h"
#include "core/common.h"

// x / sqrt(sum x^2 + 1e-6), times scale (fla's l2norm, as KDA applies it in the kernel)
static void l2norm_scaled(float *out, const float *x, int n, float scale) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = scale / sqrtf((float)ss + 1e-6f);
    for (int i = 0; i < n; i++) out[i] = x[i] * r;
}

// One token of one head: decay, delta-rule write, read. st: [K, K] (key
// channel i, value channel j); scratch: 3K floats.
static void kda_step(struct backend *be, float *st, const float *row, const float *g, float *y, int h, int H, int K,
                     float *scr) {
    (void)be;
    float *q = scr, *k = q + K, *mem = k + K;
    const float *v = row + 2 * H * K + h * K;
    l2norm_scaled(q, row + h * K, K, 1.0f / sqrtf((float)K));
    l2norm_scaled(k, row + H * K + h * K, K, 1.0f);
    float beta = 1.0f / (1.0f + expf(-row[3 * H * K + h]));
    for (int j = 0; j < K; j++) mem[j] = 0;
    for (int i = 0; i < K; i++) {
        float a = expf(g[h * K + i]), *si = st + (int64_t)i * K;
        for (int j = 0; j < K; j++) {
            si[j] *= a;
            mem[j] += si[j] * k[i];
        }
    }
    for (int j = 0; j < K; j++) mem[j] = beta * (v[j] - mem[j]); // the delta
    for (int j = 0; j < K; j++) y[j] = 0;
    for (int i = 0; i < K; i++) {
        float *si = st + (int64_t)i * K;
        for (int j = 0; j < K; j++) {
            si[j] += k[i] * mem[j];
            y[j] += si[j] * q[i];
        }
    }
}

struct kda_ctx {
    struct backend *be;
    float *y;
    const float *proj;
    int ld;
    const float *g;
    float *state;
    const struct batch *b;
    int seq0, decode;
    const struct kda_dims *d;
    void (*step)(struct backend *be, float *st, const float *row, const float *g, float *y, int h, int H, int K,
                 float *scr);
};

// One (sequence, head), token by token: a prefill split over scheduler steps
// runs the same recurrence as one that is not.
static void kda_one(void *ctx, int task, int thread) {
    struct kda_ctx *c = ctx;
    const struct kda_dims *d = c->d;
    const struct batch *b = c->b;
    int H = d->heads, K = d->head_dim, s = c->seq0 + task / H, h = task % H;
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0, p0 = b->context_lens[s];
    int64_t hs = (int64_t)K * K;
    float *st = c->state + ((int64_t)b->state_slots[s] * H + h) * hs;
    int k = 0;
    if (!c->decode) {
        int src = b->state_src[s];
        if (src < 0) memset(st, 0, sizeof(float) * hs); // a fresh slot reads as zeros
        else if (src != b->state_slots[s]) memcpy(st, c->state + ((int64_t)src * H + h) * hs, sizeof(float) * hs);
        k = b->ckpt_start[s];
    }
    float *scr = cpu_scratch(c->be, thread, sizeof(float) * 3 * (size_t)K);
    for (int i = 0; i < L; i++) {
        int64_t t = t0 + i;
        c->step(c->be, st, c->proj + t * c->ld, c->g + t * H * K, c->y + t * H * K + h * K, h, H, K, scr);
        for (; !c->decode && k < b->ckpt_start[s + 1] && b->ckpt_pos[k] <= p0 + i + 1; k++)
            if (b->ckpt_pos[k] == p0 + i + 1) // the state after position ckpt_pos - 1
                memcpy(c->state + ((int64_t)b->ckpt_slot[k] * H + h) * hs, st, sizeof(float) * hs);
    }
    int dst = c->decode ? batch_ckpt_dst(b, s) : -1; // a decode's checkpoint: the state after its token
    if (dst >= 0) memcpy(c->state + ((int64_t)dst * H + h) * hs, st, sizeof(float) * hs);
}

void cpu_kda_run(struct backend *be,
                 void (*step)(struct backend *be, float *st, const float *row, const float *g, float *y, int h, int H,
                              int K, float *scr),
                 float *y, const float *proj, int ld, const float *g, float *state, const struct batch *b, int seq0,
                 int seq1, int decode, const struct kda_dims *d) {
    struct kda_ctx c = {be, y, proj, ld, g, state, b, seq0, decode, d, step};
    cpu_parallel(be, (seq1 - seq0) * d->heads, kda_one, &c);
}

void cpu_kda_prefill(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                     const struct batch *b, int seq0, int seq1, const struct kda_dims *d) {
    cpu_kda_run(be, kda_step, y, proj, ld, g, state, b, seq0, seq1, 0, d);
}

void cpu_kda_decode(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                    const struct batch *b, const struct kda_dims *d) {
    cpu_kda_run(be, kda_step, y, proj, ld, g, state, b, 0, b->num_decodes, 1, d);
}

void cpu_kda_gate(struct backend *be, float *g, const float *A_log, const float *dt_bias, int n,
                  const struct kda_dims *d) {
    (void)be;
    int H = d->heads, K = d->head_dim;
    for (int64_t t = 0; t < n; t++)
        for (int h = 0; h < H; h++) {
            float a = expf(A_log[h]), *gt = g + (t * H + h) * K;
            for (int i = 0; i < K; i++) gt[i] = -a * softplus_th(gt[i] + dt_bias[h * K + i]);
        }
}

void cpu_head_norm_gate(struct backend *be, float *y, const float *gate, const float *w, int n, int heads,
                        int head_dim, float eps) {
    (void)be;
    for (int64_t r = 0; r < (int64_t)n * heads; r++) {
        float *x = y + r * head_dim;
        const float *z = gate + r * head_dim;
        double ss = 0;
        for (int i = 0; i < head_dim; i++) ss += (double)x[i] * x[i];
        float inv = 1.0f / sqrtf((float)(ss / head_dim) + eps);
        for (int i = 0; i < head_dim; i++) x[i] = w[i] * (x[i] * inv) / (1.0f + expf(-z[i]));
    }
}

void cpu_mla_kv_write(struct backend *be, void *cache, const float *lat, int ld, const struct batch *b,
                      const struct mla_dims *d) {
    (void)be;
    int w = d->rank + d->rope;
    for (int t = 0; t < b->num_tokens; t++) {
        int slot = b->slot_mapping[t];
        if (slot >= 0) memcpy((float *)cache + (int64_t)slot * w, lat + (int64_t)t * ld, sizeof(float) * w);
    }
}

struct mla_ctx {
    struct backend *be;
    float *out;
    const float *q, *cache, *kv_b;
    const struct batch *b;
    int seq0;
    const struct mla_dims *d;
};

// One (sequence, head). The key part W_kb c is absorbed into the query
// (q_nope . W_kb c = (W_kb^T q_nope) . c) and W_vb applied once to the
// attention-weighted latent: exact up to the order of the sums, and the
// cache never holds per-head keys or values.
static void mla_one(void *ctx, int task, int thread) {
    struct mla_ctx *c = ctx;
    const struct mla_dims *d = c->d;
    const struct batch *b = c->b;
    int H = d->heads, N = d->nope, P = d->rope, V = d->v_dim, R = d->rank, W = R + P, bs = d->block_size;
    int s = c->seq0 + task / H, h = task % H;
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0, ctx0 = b->context_lens[s];
    const int32_t *bt = b->block_tables + (int64_t)s * b->max_blocks_per_seq;
    const float *wk = c->kv_b + (int64_t)h * (N + V) * R, *wv = wk + (int64_t)N * R; // [N, R], [V, R]
    float *ql = cpu_scratch(c->be, thread, sizeof(float) * ((size_t)W + R + ctx0 + L)), *ol = ql + W, *sc = ol + R;
    for (int i = 0; i < L; i++) {
        const float *qh = c->q + (int64_t)(t0 + i) * H * (N + P) + (int64_t)h * (N + P);
        for (int r = 0; r < R; r++) ql[r] = 0;
        for (int e = 0; e < N; e++)
            for (int r = 0; r < R; r++) ql[r] += qh[e] * wk[(int64_t)e * R + r];
        for (int e = 0; e < P; e++) ql[R + e] = qh[N + e];
        int n = ctx0 + i + 1;
        float mx = -FLT_MAX;
        for (int j = 0; j < n; j++) {
            const float *kv = c->cache + ((int64_t)bt[j / bs] * bs + j % bs) * W;
            float dot = 0;
            for (int e = 0; e < W; e++) dot += ql[e] * kv[e];
            sc[j] = dot * d->scale;
            mx = fmaxf(mx, sc[j]);
        }
        float sum = 0;
        for (int j = 0; j < n; j++) sum += sc[j] = expf(sc[j] - mx);
        for (int r = 0; r < R; r++) ol[r] = 0;
        for (int j = 0; j < n; j++) {
            const float *kv = c->cache + ((int64_t)bt[j / bs] * bs + j % bs) * W;
            float p = sc[j] / sum;
            for (int r = 0; r < R; r++) ol[r] += p * kv[r];
        }
        float *o = c->out + (int64_t)(t0 + i) * H * V + (int64_t)h * V;
        for (int e = 0; e < V; e++) {
            float acc = 0;
            for (int r = 0; r < R; r++) acc += wv[(int64_t)e * R + r] * ol[r];
            o[e] = acc;
        }
    }
}

void cpu_mla_attn(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                  const struct batch *b, int seq0, int seq1, const struct mla_dims *d) {
    struct mla_ctx c = {be, out, q, cache, kv_b, b, seq0, d};
    cpu_parallel(be, (seq1 - seq0) * d->heads, mla_one, &c);
}
