// fast_mamba.c - Mamba2 ops of the fast path: the causal conv in channel
// blocks, the chunked SSD scan as matrix products, the decode recurrence, the
// gated norm. Same math and layouts as cpu_mamba.c (the reference).
//
// zxbcdt row layout (ld floats per token): z [I] | xBC [conv_dim] | dt [H],
// I = H*P, xBC = x [H*P] | B [G*N] | C [G*N]. Head h reads group h / (H/G).
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

#define CB_CH FAST_CONV_CH // conv channels per block

struct conv_ctx {
    struct backend *be;
    float *zxbcdt;
    int ld;
    const float *w, *bias;
    float *conv_state;
    const struct batch *b;
    int seq0, decode, nblk, per; // tasks per sequence, blocks per task
    const struct mamba_dims *d;
};

// One (sequence, block of CB_CH channels), in place: tokens run last to
// first, so the inputs a token reads (itself and the K-1 before it) are not
// yet overwritten; the K-1 inputs before the sequence come from the state.
// The new state (the last K-1 inputs) is taken first and written last.
static void conv_block(struct conv_ctx *c, int s, int c0, int nc) {
    const struct batch *b = c->b;
    int C = c->d->conv_dim, K = c->d->conv_kernel, I = c->d->heads * c->d->head_dim;
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0;
    int64_t per = (int64_t)(K - 1) * C;
    float *state = c->conv_state + b->state_slots[s] * per + c0;
    // a decode continues its own slot (its checkpoint, if any, is written
    // at the end); a prefill reads slot state_src (-1: zeros)
    int src = c->decode ? b->state_slots[s] : b->state_src[s], init = src >= 0;
    int k0 = c->decode ? 0 : b->ckpt_start[s], k1 = c->decode ? 0 : b->ckpt_start[s + 1];
    // K <= 8 (checked by the caller); whole CB_CH-wide vectors, zero padded
    float old[7][CB_CH], keep[7][CB_CH], wt[8][CB_CH], bias[CB_CH], pad[8][CB_CH];
    memset(old, 0, sizeof old);
    memset(wt, 0, sizeof wt);
    memset(bias, 0, sizeof bias);
    for (int k = 0; k < K; k++)
        for (int i = 0; i < nc; i++) wt[k][i] = c->w[(int64_t)(c0 + i) * K + k];
    for (int i = 0; i < nc && c->bias; i++) bias[i] = c->bias[c0 + i];
    for (int k = 0; k < K - 1 && init; k++)
        memcpy(old[k], c->conv_state + src * per + c0 + (int64_t)k * C, sizeof(float) * nc);
    float *row0 = c->zxbcdt + (int64_t)t0 * c->ld + I + c0;
    for (int k = k0; k < k1; k++) { // checkpoints: the K-1 inputs before their positions, before any is overwritten
        int rel = b->ckpt_pos[k] - b->context_lens[s];
        float *dst = c->conv_state + b->ckpt_slot[k] * per + c0;
        for (int j = 0; j < K - 1; j++) {
            int src_t = rel - (K - 1) + j;
            const float *in = src_t >= 0 ? row0 + (int64_t)src_t * c->ld : old[K - 1 + src_t];
            memcpy(dst + (int64_t)j * C, in, sizeof(float) * nc);
        }
    }
    for (int j = 0; j < K - 1; j++) { // input L-(K-1)+j: a row, or an old state entry
        int src = L - (K - 1) + j;
        memcpy(keep[j], src >= 0 ? row0 + (int64_t)src * c->ld : old[K - 1 + src], sizeof(float) * nc);
    }
    for (int t = L - 1; t >= 0; t--) {
        const float *in[8];
        for (int k = 0; k < K; k++) {
            int src = t - (K - 1) + k;
            const float *p = src >= 0 ? row0 + (int64_t)src * c->ld : old[K - 1 + src];
            if (nc < CB_CH && src >= 0) { // a partial block: read only nc floats of the row
                memset(pad[k], 0, sizeof pad[k]);
                memcpy(pad[k], p, sizeof(float) * nc);
                p = pad[k];
            }
            in[k] = p;
        }
        fast_k(c->be)->conv_row(row0 + (int64_t)t * c->ld, nc, in, (const float(*)[CB_CH])wt, bias, K);
    }
    for (int k = 0; k < K - 1; k++) memcpy(state + (int64_t)k * C, keep[k], sizeof(float) * nc);
    int dst = c->decode ? batch_ckpt_dst(b, s) : -1; // a decode's checkpoint: the new state too
    for (int k = 0; k < K - 1 && dst >= 0; k++)
        memcpy(c->conv_state + dst * per + c0 + (int64_t)k * C, keep[k], sizeof(float) * nc);
}

// Task: one sequence, c->per blocks of CB_CH channels (a decode token is
// little work per block: fewer, wider tasks).
static void conv_task(void *ctx, int task, int thread) {
    (void)thread;
    struct conv_ctx *c = ctx;
    int C = c->d->conv_dim;
    int s = c->seq0 + task / c->nblk, blk = task % c->nblk;
    for (int c0 = blk * c->per * CB_CH; c0 < MIN(C, (blk + 1) * c->per * CB_CH); c0 += CB_CH)
        conv_block(c, s, c0, MIN(CB_CH, C - c0));
}

static void conv_run(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias, float *conv_state,
                     const struct batch *b, int seq0, int seq1, int decode, const struct mamba_dims *d) {
    if (d->conv_kernel > 8) { // wider than any Mamba2 checkpoint: the reference handles it
        if (decode) cpu_conv1d_update(be, zxbcdt, ld, w, bias, conv_state, b, d);
        else cpu_conv1d_fwd(be, zxbcdt, ld, w, bias, conv_state, b, seq0, seq1, d);
        return;
    }
    int blocks = CDIV(d->conv_dim, CB_CH), ns = seq1 - seq0;
    int per = decode ? MAX(1, blocks * ns / (2 * be->num_threads)) : 1; // decode: ~2 tasks per thread
    per = MIN(per, blocks);
    struct conv_ctx c = {be, zxbcdt, ld, w, bias, conv_state, b, seq0, decode, CDIV(blocks, per), per, d};
    cpu_parallel(be, ns * c.nblk, conv_task, &c);
}

void fast_conv1d_fwd(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                     float *conv_state, const struct batch *b, int seq0, int seq1, const struct mamba_dims *d) {
    conv_run(be, zxbcdt, ld, w, bias, conv_state, b, seq0, seq1, 0, d);
}

void fast_conv1d_update(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                        float *conv_state, const struct batch *b, const struct mamba_dims *d) {
    conv_run(be, zxbcdt, ld, w, bias, conv_state, b, 0, b->num_decodes, 1, d);
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

// Bytes of one (sequence, group) task's scratch (ssd_prefill_task).
size_t fast_ssd_scratch(const struct mamba_dims *d) {
    size_t cs = d->chunk_size, N = d->state, P = d->head_dim, hg = d->heads / d->groups, W = hg * P, lx = W + 2 * N;
    size_t need = 2 * cs * cs + 3 * cs * W + (2 * hg + 2) * cs + fast_sgemm_b_floats((int)cs, (int)N) +
                  fast_sgemm_b_floats((int)W, (int)N) + fast_sgemm_b_floats((int)P, (int)cs) +
                  fast_sgemm_b_floats((int)N, (int)cs) + fast_sgemm_a_floats((int)MAX(cs, W), (int)MAX(N, cs)) + cs * lx;
    return sizeof(float) * need;
}

// One (sequence, group) of the chunked scan; its hg = H/G heads share B and
// C. Per chunk of Lc tokens (chunks end at absolute multiples of chunk_size,
// as in the reference), with a = cumsum(dt * A) inside the chunk:
//   CB   = C B^T                                   [Lc, Lc]  (once per group)
//   Yoff = C S^T, S the state entering the chunk   [Lc, hg*P] (all heads at once)
//   y_h  = exp(a_i) Yoff_h + (CB o decay_h) X_h + D_h x,
//          decay_h[i][j] = exp(a_i - a_j) dt_j for j <= i, else 0
//   S_h  = exp(a_last) S_h + Xs_h^T B, Xs_h[j] = exp(a_last - a_j) dt_j x_j
//                                                  (all heads in one product)
static void ssd_prefill_task(void *ctx, int task, int thread) {
    struct ssd_ctx *c = ctx;
    const struct mamba_dims *d = c->d;
    const struct batch *b = c->b;
    const struct fast_kern *k = fast_k(c->be);
    int H = d->heads, P = d->head_dim, N = d->state, G = d->groups, I = H * P, hg = H / G, cs = d->chunk_size;
    int s = c->seq0 + task / G, g = task % G, h0 = g * hg, W = hg * P, ld = c->ld;
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0, p0 = b->context_lens[s];
    float *st = c->ssm_state + ((int64_t)b->state_slots[s] * H + h0) * P * N; // [W, N]
    int src = b->state_src[s], kc = b->ckpt_start[s];
    if (src < 0) memset(st, 0, sizeof(float) * W * N); // a fresh slot reads as zeros
    else if (src != b->state_slots[s]) // a checkpoint restored
        memcpy(st, c->ssm_state + ((int64_t)src * H + h0) * P * N, sizeof(float) * W * N);
    size_t pb1 = fast_sgemm_b_floats(cs, N), pb2 = fast_sgemm_b_floats(W, N), pb3 = fast_sgemm_b_floats(P, cs);
    size_t pb4 = fast_sgemm_b_floats(N, cs), pa = fast_sgemm_a_floats(MAX(cs, W), MAX(N, cs));
    int lx = W + 2 * N; // a local row: the group's x | B | C
    float *cb = cpu_scratch(c->be, thread, fast_ssd_scratch(d)), *mh = cb + cs * cs, *yoff = mh + cs * cs;
    float *yd = yoff + cs * W, *xs = yd + cs * W, *dt = xs + cs * W, *acum = dt + hg * cs, *tmp = acum + hg * cs;
    float *ein = tmp + cs, *sp1 = ein + cs, *sp2 = sp1 + pb1, *sp3 = sp2 + pb2, *sp4 = sp3 + pb3, *apack = sp4 + pb4;
    float *loc = apack + pa;
    struct fast_bmat bt, stt, xh, bn; // B^T, S^T, X_h, B packed for the products below
    struct backend *be = c->be;
    for (int i0 = 0; i0 < L;) {
        int lc = MIN(L - i0, cs - (p0 + i0) % cs); // chunk [i0, i0 + lc)
        const float *row0 = c->zxbcdt + (int64_t)(t0 + i0) * ld;
        // the chunk's rows of this group, gathered once: every product below
        // reads them from L2 instead of rows ld floats apart
        float run[64] = {0}; // hg <= 64 (checked by the caller)
        for (int i = 0; i < lc; i++) {
            const float *r = row0 + (int64_t)i * ld;
            float *l = loc + (int64_t)i * lx;
            if (i + 4 < lc) { // rows ld floats apart defeat the hardware prefetcher
                const char *f = (const char *)(r + 4 * (int64_t)ld);
                for (int o = 0; o < W * 4; o += 64) __builtin_prefetch(f + (I + h0 * P) * 4 + o);
                for (int o = 0; o < N * 4; o += 64) {
                    __builtin_prefetch(f + (2 * I + g * N) * 4 + o);
                    __builtin_prefetch(f + (2 * I + G * N + g * N) * 4 + o);
                }
            }
            memcpy(l, r + I + h0 * P, sizeof(float) * W);
            memcpy(l + W, r + 2 * I + g * N, sizeof(float) * N);
            memcpy(l + W + N, r + 2 * I + G * N + g * N, sizeof(float) * N);
            for (int hh = 0; hh < hg; hh++) {
                float v = dt_of(r, I + d->conv_dim, h0 + hh, c->dt_bias, d);
                dt[hh * cs + i] = v;
                run[hh] += v * c->A[h0 + hh];
                acum[hh * cs + i] = run[hh];
            }
        }
        const float *X = loc, *B = loc + W, *C = loc + W + N;
        fast_sgemm_prep_b(be, &bt, lc, N, B, lx, 1, sp1);
        fast_sgemm_prep_b(be, &stt, W, N, st, N, 1, sp2);
        fast_sgemm_b(be, lc, lc, N, 1.0f, C, lx, 0, &bt, 0.0f, cb, cs, apack);
        fast_sgemm_b(be, lc, W, N, 1.0f, C, lx, 0, &stt, 0.0f, yoff, W, apack);
        for (int hh = 0; hh < hg; hh++) {
            const float *a = acum + hh * cs, *dth = dt + hh * cs;
            for (int i = 0; i < lc; i++) {
                float *m = mh + i * cs;
                k->ssd_decay(m, a, a[i], cb + i * cs, dth, i + 1);
                memset(m + i + 1, 0, sizeof(float) * (lc - i - 1));
            }
            fast_sgemm_prep_b(be, &xh, P, lc, X + hh * P, lx, 0, sp3);
            fast_sgemm_b(be, lc, P, lc, 1.0f, mh, cs, 0, &xh, 0.0f, yd + hh * P, W, apack);
        }
        // y, then the state: decays exp(a_i) (into the chunk) and exp(a_last - a_j)
        for (int hh = 0; hh < hg; hh++) {
            const float *a = acum + hh * cs;
            float Dh = c->D[h0 + hh], last = a[lc - 1];
            k->vexp(ein, a, lc);
            for (int i = 0; i < lc; i++) tmp[i] = last - a[i];
            k->vexp(tmp, tmp, lc);
            for (int i = 0; i < lc; i++) {
                const float *x = X + (int64_t)i * lx + hh * P;
                float *yi = c->y + (int64_t)(t0 + i0 + i) * I + (h0 + hh) * P;
                const float *yo = yoff + i * W + hh * P, *ydi = yd + i * W + hh * P;
                k->ssd_out(yi, xs + i * W + hh * P, yo, ydi, x, ein[i], Dh, tmp[i] * dt[hh * cs + i], P);
            }
            k->scale(st + (int64_t)hh * P * N, expf(last), (int64_t)P * N);
        }
        fast_sgemm_prep_b(be, &bn, N, lc, B, lx, 0, sp4);
        fast_sgemm_b(be, W, N, lc, 1.0f, xs, W, 1, &bn, 1.0f, st, N, apack);
        i0 += lc;
        for (; kc < b->ckpt_start[s + 1] && b->ckpt_pos[kc] <= p0 + i0; kc++) // a checkpoint at this chunk's end
            if (b->ckpt_pos[kc] == p0 + i0)
                memcpy(c->ssm_state + ((int64_t)b->ckpt_slot[kc] * H + h0) * P * N, st, sizeof(float) * W * N);
    }
}

void fast_ssd_prefill(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                      const float *D, float *ssm_state, const struct batch *b, int seq0, int seq1,
                      const struct mamba_dims *d) {
    if (d->heads / d->groups > 64) { // more heads per group than any Mamba2 checkpoint: the reference
        cpu_ssd_prefill(be, y, zxbcdt, ld, dt_bias, A, D, ssm_state, b, seq0, seq1, d);
        return;
    }
    struct ssd_ctx c = {be, y, zxbcdt, ld, dt_bias, A, D, ssm_state, b, seq0, d};
    cpu_parallel(be, (seq1 - seq0) * d->groups, ssd_prefill_task, &c);
}

// One (sequence, head): S = S dA + dt x B^T, y = S C + D x (a kernel: the
// state is read and written once, at memory speed).
static void ssd_decode_task(void *ctx, int task, int thread) {
    (void)thread;
    struct ssd_ctx *c = ctx;
    const struct mamba_dims *d = c->d;
    const struct batch *b = c->b;
    int H = d->heads, P = d->head_dim, N = d->state, G = d->groups, I = H * P;
    int s = task / H, h = task % H, g = h / (H / G);
    int t = b->query_start_loc[s];
    const float *r = c->zxbcdt + (int64_t)t * c->ld;
    float *st = c->ssm_state + ((int64_t)b->state_slots[s] * H + h) * P * N;
    float dt = dt_of(r, I + d->conv_dim, h, c->dt_bias, d), dA = expf(dt * c->A[h]);
    fast_k(c->be)->ssd_step(st, P, N, r + I + h * P, r + I + I + g * N, r + I + I + G * N + g * N, dt, dA, c->D[h],
                            c->y + (int64_t)t * I + h * P);
    int dst = batch_ckpt_dst(b, s); // the state after this token, also to its checkpoint
    if (dst >= 0) memcpy(c->ssm_state + ((int64_t)dst * H + h) * P * N, st, sizeof(float) * P * N);
}

void fast_ssd_decode(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias, const float *A,
                     const float *D, float *ssm_state, const struct batch *b, const struct mamba_dims *d) {
    struct ssd_ctx c = {be, y, zxbcdt, ld, dt_bias, A, D, ssm_state, b, 0, d};
    cpu_parallel(be, b->num_decodes * d->heads, ssd_decode_task, &c);
}

struct gnorm_ctx {
    struct backend *be;
    float *out;
    const float *y, *z;
    int zld;
    const float *w;
    int n, dim, gs, per;
    float eps;
};

static void gnorm_task(void *ctx, int task, int thread) {
    (void)thread;
    struct gnorm_ctx *c = ctx;
    for (int t = task * c->per; t < MIN(c->n, (task + 1) * c->per); t++) {
        const float *yt = c->y + (int64_t)t * c->dim, *zt = c->z + (int64_t)t * c->zld;
        float *ot = c->out + (int64_t)t * c->dim;
        const struct fast_kern *k = fast_k(c->be);
        k->vsilu(ot, zt, c->dim);
        k->mul(ot, yt, c->dim);
        for (int g0 = 0; g0 < c->dim; g0 += c->gs) {
            float r = 1.0f / sqrtf((float)(k->sumsq(ot + g0, c->gs) / c->gs) + c->eps);
            k->rms_apply(ot + g0, ot + g0, c->w + g0, r, c->gs);
        }
    }
}

void fast_gated_rmsnorm(struct backend *be, float *out, const float *y, const float *z, int zld, const float *w, int n,
                        int dim, int group_size, float eps) {
    struct gnorm_ctx c = {be, out, y, z, zld, w, n, dim, group_size, 8, eps};
    cpu_parallel(be, CDIV(n, c.per), gnorm_task, &c);
}
