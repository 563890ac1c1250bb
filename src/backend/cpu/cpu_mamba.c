// cpu_mamba.c - Mamba2 reference ops: causal conv1d, SSD scan, gated norm.
//
// zxbcdt row layout (ld floats per token): z [I] | xBC [conv_dim] | dt [H],
// I = H*P, xBC = x [H*P] | B [G*N] | C [G*N]. Head h reads group h / (H/G).
#include <math.h>

#include "backend/cpu/cpu.h"
#include "core/common.h"

// Conv over one sequence of L tokens starting at row t0. init: the K-1
// inputs before t0 ([K-1, C], oldest first; NULL: zeros); the last K-1 inputs
// go to out, and for each checkpoint k in [k0, k1) of the batch the K-1
// before position ckpt_pos[k] to its slot of conv_state (p0: the position of
// row t0).
static void conv_seq(float *zxbcdt, int ld, const float *w, const float *bias, const float *init, float *out,
                     int t0, int L, int p0, const struct batch *b, int k0, int k1, float *conv_state,
                     const struct mamba_dims *d, float *buf) {
    int C = d->conv_dim, K = d->conv_kernel, I = d->heads * d->head_dim;
    // buf: [K-1+L, C] = initial state rows, then this sequence's inputs
    if (init) memcpy(buf, init, sizeof(float) * (K - 1) * C);
    else memset(buf, 0, sizeof(float) * (K - 1) * C);
    for (int t = 0; t < L; t++) memcpy(buf + (int64_t)(K - 1 + t) * C, zxbcdt + (int64_t)(t0 + t) * ld + I, sizeof(float) * C);
    for (int t = 0; t < L; t++) {
        float *o = zxbcdt + (int64_t)(t0 + t) * ld + I;
        for (int c = 0; c < C; c++) {
            float acc = bias ? bias[c] : 0.0f;
            for (int k = 0; k < K; k++) acc += w[c * K + k] * buf[(int64_t)(t + k) * C + c];
            o[c] = silu(acc);
        }
    }
    for (int k = k0; k < k1; k++) {
        int rel = b->ckpt_pos[k] - p0; // inputs [rel - K + 1, rel) are buf rows [rel, rel + K - 1)
        memcpy(conv_state + (int64_t)b->ckpt_slot[k] * (K - 1) * C, buf + (int64_t)rel * C,
               sizeof(float) * (K - 1) * C);
    }
    memcpy(out, buf + (int64_t)L * C, sizeof(float) * (K - 1) * C);
}

struct conv_ctx {
    struct backend *be;
    float *zxbcdt;
    int ld;
    const float *w, *bias;
    float *conv_state;
    const struct batch *b;
    int seq0, decode;
    const struct mamba_dims *d;
};

static void conv_one(void *ctx, int i, int thread) {
    struct conv_ctx *c = ctx;
    const struct batch *b = c->b;
    int s = c->seq0 + i, K = c->d->conv_kernel, C = c->d->conv_dim;
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0;
    int64_t per = (int64_t)(K - 1) * C;
    // a decode continues its own slot, and copies the new state to its checkpoint (ckpt_dst) if it has one
    int src = c->decode ? b->state_slots[s] : b->state_src[s];
    int k0 = c->decode ? 0 : b->ckpt_start[s], k1 = c->decode ? 0 : b->ckpt_start[s + 1];
    float *buf = cpu_scratch(c->be, thread, sizeof(float) * (size_t)(K - 1 + L) * C);
    float *own = c->conv_state + b->state_slots[s] * per;
    conv_seq(c->zxbcdt, c->ld, c->w, c->bias, src >= 0 ? c->conv_state + src * per : NULL, own, t0, L,
             b->context_lens[s], b, k0, k1, c->conv_state, c->d, buf);
    int dst = c->decode ? batch_ckpt_dst(b, s) : -1;
    if (dst >= 0) memcpy(c->conv_state + dst * per, own, sizeof(float) * per);
}

void cpu_conv1d_fwd(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                    float *conv_state, const struct batch *b, int seq0, int seq1, const struct mamba_dims *d) {
    struct conv_ctx c = {be, zxbcdt, ld, w, bias, conv_state, b, seq0, 0, d};
    cpu_parallel(be, seq1 - seq0, conv_one, &c);
}

void cpu_conv1d_update(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                       float *conv_state, const struct batch *b, const struct mamba_dims *d) {
    struct conv_ctx c = {be, zxbcdt, ld, w, bias, conv_state, b, 0, 1, d};
    cpu_parallel(be, b->num_decodes, conv_one, &c);
}

struct ssd_ctx {
    struct backend *be;
    float *y;
    const float *zxbcdt;
    int ld;
    const float *dt_bias, *A, *D;
    float *ssm_state;
    const struct batch *b;
    int seq0;
    const struct mamba_dims *d;
};

// One (sequence, head) of the chunked scan. Chunks end at absolute positions
// that are multiples of chunk_size, so a prefill split over several steps
// uses the same chunk boundaries as one that is not.
static void ssd_prefill_one(void *ctx, int task, int thread) {
    struct ssd_ctx *c = ctx;
    const struct mamba_dims *d = c->d;
    const struct batch *b = c->b;
    int H = d->heads, P = d->head_dim, N = d->state, G = d->groups, I = H * P;
    int s = c->seq0 + task / H, h = task % H, g = h / (H / G);
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0, p0 = b->context_lens[s];
    int xoff = I + h * P, boff = I + I + g * N, coff = I + I + G * N + g * N, dtoff = I + d->conv_dim;
    int64_t hs = (int64_t)P * N;                           // one head's state
    float *st = c->ssm_state + ((int64_t)b->state_slots[s] * H + h) * hs; // [P, N]
    int src = b->state_src[s], k = b->ckpt_start[s];
    if (src < 0) memset(st, 0, sizeof(float) * hs); // a fresh slot reads as zeros
    else if (src != b->state_slots[s]) memcpy(st, c->ssm_state + ((int64_t)src * H + h) * hs, sizeof(float) * hs);
    int cs = d->chunk_size;
    float *dt = cpu_scratch(c->be, thread, sizeof(float) * 2 * cs), *acum = dt + cs;
    float A = c->A[h], Dh = c->D[h];
    for (int i0 = 0; i0 < L;) {
        int i1 = MIN(L, i0 + cs - (p0 + i0) % cs); // chunk [i0, i1)
        float run = 0;
        for (int i = i0; i < i1; i++) {
            const float *row = c->zxbcdt + (int64_t)(t0 + i) * c->ld;
            dt[i - i0] = dt_of(row, dtoff, h, c->dt_bias, d);
            run += dt[i - i0] * A;
            acum[i - i0] = run;
        }
        for (int i = i0; i < i1; i++) {
            const float *ri = c->zxbcdt + (int64_t)(t0 + i) * c->ld;
            float *yi = c->y + (int64_t)(t0 + i) * I + h * P;
            float decay_in = expf(acum[i - i0]);
            for (int p = 0; p < P; p++) { // contribution of the state entering the chunk
                float acc = 0;
                for (int n = 0; n < N; n++) acc += st[p * N + n] * ri[coff + n];
                yi[p] = decay_in * acc + Dh * ri[xoff + p];
            }
            for (int j = i0; j <= i; j++) { // intra-chunk (the "attention-like" diagonal block)
                const float *rj = c->zxbcdt + (int64_t)(t0 + j) * c->ld;
                float cb = 0;
                for (int n = 0; n < N; n++) cb += ri[coff + n] * rj[boff + n];
                float wgt = cb * expf(acum[i - i0] - acum[j - i0]) * dt[j - i0];
                for (int p = 0; p < P; p++) yi[p] += wgt * rj[xoff + p];
            }
        }
        float last = acum[i1 - 1 - i0], decay_all = expf(last);
        for (int k = 0; k < P * N; k++) st[k] *= decay_all;
        for (int j = i0; j < i1; j++) {
            const float *rj = c->zxbcdt + (int64_t)(t0 + j) * c->ld;
            float wgt = expf(last - acum[j - i0]) * dt[j - i0];
            for (int p = 0; p < P; p++) {
                float xp = wgt * rj[xoff + p];
                for (int n = 0; n < N; n++) st[p * N + n] += xp * rj[boff + n];
            }
        }
        for (; k < b->ckpt_start[s + 1] && b->ckpt_pos[k] <= p0 + i1; k++) // a checkpoint at this chunk's end
            if (b->ckpt_pos[k] == p0 + i1)
                memcpy(c->ssm_state + ((int64_t)b->ckpt_slot[k] * H + h) * hs, st, sizeof(float) * hs);
        i0 = i1;
    }
}

void cpu_ssd_prefill(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias,
                     const float *A, const float *D, float *ssm_state, const struct batch *b, int seq0,
                     int seq1, const struct mamba_dims *d) {
    struct ssd_ctx c = {be, y, zxbcdt, ld, dt_bias, A, D, ssm_state, b, seq0, d};
    cpu_parallel(be, (seq1 - seq0) * d->heads, ssd_prefill_one, &c);
}

static void ssd_decode_one(void *ctx, int task, int thread) {
    (void)thread;
    struct ssd_ctx *c = ctx;
    const struct mamba_dims *d = c->d;
    const struct batch *b = c->b;
    int H = d->heads, P = d->head_dim, N = d->state, G = d->groups, I = H * P;
    int s = task / H, h = task % H, g = h / (H / G);
    int t = b->query_start_loc[s];
    const float *r = c->zxbcdt + (int64_t)t * c->ld;
    const float *x = r + I + h * P, *B = r + I + I + g * N, *C = r + I + I + G * N + g * N;
    float *st = c->ssm_state + ((int64_t)b->state_slots[s] * H + h) * P * N;
    float dt = dt_of(r, I + d->conv_dim, h, c->dt_bias, d), dA = expf(dt * c->A[h]);
    float *y = c->y + (int64_t)t * I + h * P;
    for (int p = 0; p < P; p++) {
        float acc = 0, dx = dt * x[p];
        for (int n = 0; n < N; n++) {
            float v = st[p * N + n] * dA + dx * B[n];
            st[p * N + n] = v;
            acc += v * C[n];
        }
        y[p] = acc + c->D[h] * x[p];
    }
    int dst = batch_ckpt_dst(b, s); // the state after this token, also to its checkpoint
    if (dst >= 0) memcpy(c->ssm_state + ((int64_t)dst * H + h) * P * N, st, sizeof(float) * P * N);
}

void cpu_ssd_decode(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias,
                    const float *A, const float *D, float *ssm_state, const struct batch *b,
                    const struct mamba_dims *d) {
    struct ssd_ctx c = {be, y, zxbcdt, ld, dt_bias, A, D, ssm_state, b, 0, d};
    cpu_parallel(be, b->num_decodes * d->heads, ssd_decode_one, &c);
}

void cpu_gated_rmsnorm(struct backend *be, float *out, const float *y, const float *z, int zld, const float *w,
                       int n, int dim, int group_size, float eps) {
    (void)be;
    for (int t = 0; t < n; t++) {
        const float *yt = y + (int64_t)t * dim, *zt = z + (int64_t)t * zld;
        float *ot = out + (int64_t)t * dim;
        for (int i = 0; i < dim; i++) ot[i] = yt[i] * silu(zt[i]);
        for (int g0 = 0; g0 < dim; g0 += group_size) {
            double ss = 0;
            for (int i = g0; i < g0 + group_size; i++) ss += (double)ot[i] * ot[i];
            float r = 1.0f / sqrtf((float)(ss / group_size) + eps);
            for (int i = g0; i < g0 + group_size; i++) ot[i] = w[i] * (ot[i] * r);
        }
    }
}
