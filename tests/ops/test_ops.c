// test_ops.c - the CPU reference ops against independent naive versions:
//   chunked SSD scan == sequential recurrence (with and without an initial
//   state, chunks at absolute positions), == repeated decode updates;
//   conv forward == repeated conv updates; state checkpoints written inside a
//   prefill == the state of a prefill that ends there, and a prefill from a
//   restored checkpoint (state_src) == the same tokens in one prefill;
//   paged attention == dense attention;
//   grouped top-k routing; the sampler.
#include <math.h>

#include "backend/backend.h"
#include "core/common.h"
#include "sample/sampler.h"
#include "models/rope.h"
#include "op_util.h"
#include "test.h"

// the decode rows' prologue (attn_decode runs it) without norms or rotation:
// kv_write's k and v
static const struct attn_prep no_prep;

// sequence s continues its slot (init[s]) or starts from zeros
static void make_batch(struct test_batch *h, int n, const int *qlen, const int *ctx, const int *slot, const int *init,
                       int num_decodes) {
    int src[TB_SEQS];
    for (int i = 0; i < n; i++) src[i] = init[i] ? slot[i] : -1;
    test_batch_make(h, n, qlen, ctx, slot, src, num_decodes);
}

static float softplus(float x) { return x > 20 ? x : log1pf(expf(x)); }

static void test_ssd(struct backend *be) {
    struct mamba_dims d = {4, 3, 2, 5, 4, 4, 0, 0.0f, INFINITY};
    int H = d.heads, P = d.head_dim, N = d.state, G = d.groups, I = H * P;
    d.conv_dim = I + 2 * G * N;
    int ld = I + d.conv_dim + H, slots = 4, S = 3;
    int qlen[] = {9, 1, 6}, ctx[] = {0, 5, 3}, slot[] = {2, 0, 3}, init[] = {0, 1, 1};
    struct test_batch hb;
    make_batch(&hb, S, qlen, ctx, slot, init, 0);
    int T = hb.b.num_tokens;
    size_t sn = (size_t)slots * H * P * N;
    float *x = xmalloc(sizeof(float) * T * ld), *y = xcalloc(T * I, sizeof(float)), *y2 = xcalloc(T * I, sizeof(float));
    float *st = xmalloc(sizeof(float) * sn), *st0 = xmalloc(sizeof(float) * sn), *st2 = xmalloc(sizeof(float) * sn);
    float A[4], D[4], dtb[4];
    test_fill(x, (size_t)T * ld, 1.0f);
    test_fill(st0, sn, 1.0f); // slot 2 holds garbage that state_src = -1 must hide
    for (int h = 0; h < H; h++) A[h] = -expf(0.5f * test_frand()), D[h] = 1 + 0.5f * test_frand(), dtb[h] = 0.5f * test_frand();
    memcpy(st, st0, sizeof(float) * sn);
    be->ops->ssd_prefill(be, y, x, ld, dtb, A, D, st, &hb.b, 0, S, &d);

    // sequential recurrence, written independently
    float *ref_st = xmalloc(sizeof(float) * sn), *ref_y = xcalloc(T * I, sizeof(float));
    memcpy(ref_st, st0, sizeof(float) * sn);
    for (int s = 0; s < S; s++)
        for (int h = 0; h < H; h++) {
            float *S0 = ref_st + ((size_t)slot[s] * H + h) * P * N;
            if (!init[s]) memset(S0, 0, sizeof(float) * P * N);
            int g = h / (H / G);
            for (int t = hb.qsl[s]; t < hb.qsl[s + 1]; t++) {
                const float *r = x + (size_t)t * ld;
                float dt = softplus(r[I + d.conv_dim + h] + dtb[h]), dA = expf(dt * A[h]);
                for (int p = 0; p < P; p++) {
                    float acc = 0;
                    for (int n = 0; n < N; n++) {
                        S0[p * N + n] = S0[p * N + n] * dA + dt * r[I + h * P + p] * r[I + I + g * N + n];
                        acc += S0[p * N + n] * r[I + I + G * N + g * N + n];
                    }
                    ref_y[(size_t)t * I + h * P + p] = acc + D[h] * r[I + h * P + p];
                }
            }
        }
    double ey = test_max_rel(y, ref_y, (size_t)T * I), es = test_max_rel(st, ref_st, sn);
    printf("ssd chunked scan vs sequential recurrence: y rel err %.2e, state rel err %.2e\n", ey, es);
    CHECK(ey < 1e-5 && es < 1e-5);

    // the same tokens one decode step at a time, from the same initial states
    memcpy(st2, st0, sizeof(float) * sn);
    for (int s = 0; s < S; s++)
        if (!init[s]) memset(st2 + (size_t)slot[s] * H * P * N, 0, sizeof(float) * H * P * N);
    int maxq = 9;
    for (int i = 0; i < maxq; i++) {
        for (int s = 0; s < S; s++) {
            if (i >= qlen[s]) continue;
            int one[] = {1}, c1[] = {ctx[s] + i}, sl[] = {slot[s]}, in1[] = {1};
            struct test_batch db;
            make_batch(&db, 1, one, c1, sl, in1, 1);
            db.qsl[0] = 0;
            int t = hb.qsl[s] + i;
            be->ops->ssd_decode(be, y2 + (size_t)t * I, x + (size_t)t * ld, ld, dtb, A, D, st2, &db.b, &d);
        }
    }
    double ed = test_max_rel(y2, y, (size_t)T * I), eds = test_max_rel(st2, st, sn);
    printf("ssd chunked scan vs repeated decode: y rel err %.2e, state rel err %.2e\n", ed, eds);
    CHECK(ed < 1e-5 && eds < 1e-5);
    free(x), free(y), free(y2), free(st), free(st0), free(st2), free(ref_st), free(ref_y);
}

static void test_conv(struct backend *be) {
    struct mamba_dims d = {2, 2, 1, 2, 4, 4, 0, 0.0f, INFINITY};
    int I = d.heads * d.head_dim;
    d.conv_dim = I + 2 * d.groups * d.state;
    int C = d.conv_dim, K = d.conv_kernel, ld = I + C + d.heads, S = 3, slots = 4;
    int qlen[] = {7, 1, 3}, ctx[] = {0, 4, 2}, slot[] = {1, 3, 0}, init[] = {0, 1, 1};
    struct test_batch hb;
    make_batch(&hb, S, qlen, ctx, slot, init, 0);
    int T = hb.b.num_tokens;
    size_t sn = (size_t)slots * (K - 1) * C;
    float *x = xmalloc(sizeof(float) * T * ld), *x2 = xmalloc(sizeof(float) * T * ld);
    float *st = xmalloc(sizeof(float) * sn), *st2 = xmalloc(sizeof(float) * sn), w[64 * 4], bias[64];
    test_fill(x, (size_t)T * ld, 1.0f);
    memcpy(x2, x, sizeof(float) * T * ld);
    test_fill(st, sn, 1.0f);
    memcpy(st2, st, sizeof(float) * sn);
    test_fill(w, (size_t)C * K, 1.0f);
    test_fill(bias, C, 0.5f);
    be->ops->conv1d_fwd(be, x, ld, w, bias, st, &hb.b, 0, S, &d);
    for (int s = 0; s < S; s++)
        if (!init[s]) memset(st2 + (size_t)slot[s] * (K - 1) * C, 0, sizeof(float) * (K - 1) * C);
    for (int i = 0; i < 7; i++)
        for (int s = 0; s < S; s++) {
            if (i >= qlen[s]) continue;
            int t = hb.qsl[s] + i, one[] = {1}, c1[] = {ctx[s] + i}, sl[] = {slot[s]}, in1[] = {1};
            struct test_batch db;
            make_batch(&db, 1, one, c1, sl, in1, 1);
            be->ops->conv1d_update(be, x2 + (size_t)t * ld, ld, w, bias, st2, &db.b, &d);
        }
    double e1 = test_max_rel(x2, x, (size_t)T * ld), e2 = test_max_rel(st2, st, sn);
    printf("conv forward vs repeated updates: out rel err %.2e, state rel err %.2e\n", e1, e2);
    CHECK(e1 < 1e-6 && e2 < 1e-6);
    free(x), free(x2), free(st), free(st2);
}

// Prefix caching's state ops. One prefill of 11 tokens (chunk 4) behind a
// 3-token distractor writes checkpoints at 4 and 8 (slots 4, 5): each must
// equal the final state of a prefill of that prefix alone, and a prefill of
// tokens [8, 11) restoring slot 5 (state_src) must give the last rows and the
// final state of the one prefill. Slots start as garbage (zeros: src -1).
static void test_ckpt(struct backend *be) {
    struct mamba_dims d = {4, 3, 2, 5, 4, 4, 0, 0.0f, INFINITY};
    int H = d.heads, P = d.head_dim, N = d.state, G = d.groups, I = H * P;
    d.conv_dim = I + 2 * G * N;
    int C = d.conv_dim, K = d.conv_kernel, ld = I + C + H, L = 11, slots = 6;
    size_t cs = (size_t)(K - 1) * C, ss = (size_t)H * P * N;
    float *x = xmalloc(sizeof(float) * (3 + L) * ld), A[4], D[4], dtb[4];
    test_fill(x, (size_t)(3 + L) * ld, 1.0f);
    for (int h = 0; h < H; h++) A[h] = -expf(0.5f * test_frand()), D[h] = 1 + 0.5f * test_frand(), dtb[h] = 0.5f * test_frand();
    float *cw = xmalloc(sizeof(float) * C * K), *cb = xmalloc(sizeof(float) * C);
    test_fill(cw, (size_t)C * K, 1.0f);
    test_fill(cb, C, 0.5f);
    // run r: the prefix [0, n) (r 0: all, with checkpoints; r 1, 2: [0, 4), [0, 8));
    // r 3: [8, 11) from checkpoint slot 5 of run 0. Outputs: conv rows, y, states.
    float *xo[4], *y[4], *cst[4], *sst[4];
    for (int r = 0; r < 4; r++) {
        int q0 = r == 3 ? 8 : 0, n = r == 0 || r == 3 ? L - q0 : 4 * r;
        int qlen[] = {3, n}, ctx[] = {0, q0}, slot[] = {1, 2}, init[] = {0, 0};
        struct test_batch hb;
        make_batch(&hb, 2, qlen, ctx, slot, init, 0);
        if (r == 0) { // sequence 1 checkpoints at 4 and 8
            hb.ck_start[2] = 2;
            hb.ck_pos[0] = 4, hb.ck_slot[0] = 4, hb.ck_pos[1] = 8, hb.ck_slot[1] = 5;
        }
        if (r == 3) hb.src[1] = 5;
        xo[r] = xmalloc(sizeof(float) * (3 + n) * ld);
        memcpy(xo[r], x, sizeof(float) * 3 * ld);                                  // the distractor
        memcpy(xo[r] + (size_t)3 * ld, x + (size_t)(3 + q0) * ld, sizeof(float) * n * ld); // the subject's tokens
        y[r] = xcalloc((size_t)(3 + n) * I, sizeof(float));
        cst[r] = xmalloc(sizeof(float) * slots * cs);
        sst[r] = xmalloc(sizeof(float) * slots * ss);
        test_fill(cst[r], slots * cs, 1.0f);
        test_fill(sst[r], slots * ss, 1.0f);
        if (r == 3) { // the checkpoint restored: run 0's
            memcpy(cst[3] + 5 * cs, cst[0] + 5 * cs, sizeof(float) * cs);
            memcpy(sst[3] + 5 * ss, sst[0] + 5 * ss, sizeof(float) * ss);
        }
        be->ops->conv1d_fwd(be, xo[r], ld, cw, cb, cst[r], &hb.b, 0, 2, &d);
        be->ops->ssd_prefill(be, y[r], xo[r], ld, dtb, A, D, sst[r], &hb.b, 0, 2, &d);
    }
    for (int r = 1; r <= 2; r++) { // checkpoint slot 3 + r of run 0 == final state of run r
        double ec = test_max_rel(cst[0] + (3 + r) * cs, cst[r] + 2 * cs, cs), es = test_max_rel(sst[0] + (3 + r) * ss, sst[r] + 2 * ss, ss);
        printf("checkpoint at %d vs a prefill ending there: conv state rel err %.2e, ssm state %.2e\n", 4 * r, ec, es);
        CHECK(ec < 1e-6 && es < 1e-5);
    }
    double ex = test_max_rel(xo[3] + (size_t)3 * ld, xo[0] + (size_t)(3 + 8) * ld, (size_t)3 * ld);
    double ey = test_max_rel(y[3] + (size_t)3 * I, y[0] + (size_t)(3 + 8) * I, (size_t)3 * I);
    double ec = test_max_rel(cst[3] + 2 * cs, cst[0] + 2 * cs, cs), es = test_max_rel(sst[3] + 2 * ss, sst[0] + 2 * ss, ss);
    printf("prefill from a restored checkpoint vs one prefill: conv %.2e, y %.2e, states %.2e %.2e\n", ex, ey, ec, es);
    CHECK(ex < 1e-6 && ey < 1e-5 && ec < 1e-6 && es < 1e-5);
    for (int r = 0; r < 4; r++) free(xo[r]), free(y[r]), free(cst[r]), free(sst[r]);
    free(x), free(cw), free(cb);
}

static void test_attention(struct backend *be) {
    struct attn_dims d = {4, 2, 8, 4, 0, 1, 1};
    d.scale = 1.0f / sqrtf(8);
    int Hq = d.heads, Hk = d.kv_heads, Dh = d.head_dim, bs = d.block_size, S = 3, nblocks = 16;
    int qlen[] = {1, 5, 4}, ctx[] = {9, 0, 3}, slot[] = {0, 0, 0}, init[] = {1, 0, 1};
    struct test_batch hb;
    make_batch(&hb, S, qlen, ctx, slot, init, 1); // seq 0 decodes
    int perm[16];
    for (int i = 0; i < nblocks; i++) perm[i] = (i * 7 + 3) % nblocks; // scattered blocks
    int mb = 4;
    hb.b.max_blocks_per_seq = mb;
    for (int s = 0; s < S; s++)
        for (int j = 0; j < mb; j++) hb.btab[s * mb + j] = perm[s * mb + j];
    int T = hb.b.num_tokens, qd = Hq * Dh, kvd = Hk * Dh, ld = qd + 2 * kvd;
    for (int s = 0, t = 0; s < S; s++)
        for (int i = 0; i < qlen[s]; i++, t++) {
            int p = ctx[s] + i;
            hb.slot_map[t] = hb.btab[s * mb + p / bs] * bs + p % bs;
        }
    size_t cn = (size_t)nblocks * bs * kvd;
    float *kc = xcalloc(cn, sizeof(float)), *vc = xcalloc(cn, sizeof(float));
    // context k/v (positions before the query), kept densely for the reference
    float *dk = xmalloc(sizeof(float) * S * 16 * kvd), *dv = xmalloc(sizeof(float) * S * 16 * kvd);
    test_fill(dk, (size_t)S * 16 * kvd, 1.0f);
    test_fill(dv, (size_t)S * 16 * kvd, 1.0f);
    for (int s = 0; s < S; s++)
        for (int p = 0; p < ctx[s]; p++) {
            size_t sl = (size_t)hb.btab[s * mb + p / bs] * bs + p % bs;
            memcpy(kc + sl * kvd, dk + ((size_t)s * 16 + p) * kvd, sizeof(float) * kvd);
            memcpy(vc + sl * kvd, dv + ((size_t)s * 16 + p) * kvd, sizeof(float) * kvd);
        }
    float *qkv = xmalloc(sizeof(float) * T * ld), *out = xcalloc((size_t)T * qd, sizeof(float));
    test_fill(qkv, (size_t)T * ld, 1.0f);
    for (int s = 0, t = 0; s < S; s++)
        for (int i = 0; i < qlen[s]; i++, t++) {
            memcpy(dk + ((size_t)s * 16 + ctx[s] + i) * kvd, qkv + (size_t)t * ld + qd, sizeof(float) * kvd);
            memcpy(dv + ((size_t)s * 16 + ctx[s] + i) * kvd, qkv + (size_t)t * ld + qd + kvd, sizeof(float) * kvd);
        }
    be->ops->kv_write(be, kc, vc, qkv, ld, &hb.b, &d);
    be->ops->attn_decode(be, out, qkv, ld, &no_prep, kc, vc, &hb.b, &d);
    be->ops->attn_prefill(be, out, qkv, ld, kc, vc, &hb.b, 1, S, &d);
    float *ref = xcalloc((size_t)T * qd, sizeof(float));
    for (int s = 0, t = 0; s < S; s++)
        for (int i = 0; i < qlen[s]; i++, t++)
            for (int h = 0; h < Hq; h++) {
                int kh = h / (Hq / Hk), n = ctx[s] + i + 1;
                double sc[32], mx = -1e30, sum = 0;
                for (int j = 0; j < n; j++) {
                    double dot = 0;
                    for (int e = 0; e < Dh; e++) dot += qkv[(size_t)t * ld + h * Dh + e] * dk[((size_t)s * 16 + j) * kvd + kh * Dh + e];
                    sc[j] = dot * d.scale;
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j < n; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int e = 0; e < Dh; e++) {
                    double o = 0;
                    for (int j = 0; j < n; j++) o += sc[j] / sum * dv[((size_t)s * 16 + j) * kvd + kh * Dh + e];
                    ref[(size_t)t * qd + h * Dh + e] = (float)o;
                }
            }
    double err = test_max_rel(out, ref, (size_t)T * qd);
    printf("paged attention vs dense attention (GQA, scattered blocks): rel err %.2e over %d tokens\n", err, T);
    CHECK(err < 1e-5 && T == 10);
    free(kc), free(vc), free(dk), free(dv), free(qkv), free(out), free(ref);
}

static void test_route(struct backend *be) {
    // 8 experts in 4 groups of 2; pick 2 groups, then 3 experts.
    struct moe_route_cfg c = {ROUTE_SIGMOID_GROUPED, 8, 3, 4, 2, 1, 2.0f};
    float logits[8] = {0.1f, 0.2f, 3.0f, -1.0f, 1.0f, 1.1f, -2.0f, 0.5f}, bias[8] = {0};
    bias[7] = 2.0f; // lifts group 3 for selection only
    int32_t ids[3];
    float w[3];
    be->ops->moe_route(be, ids, w, logits, bias, 1, &c);
    // choice = sigmoid + bias; group score = sum of its two: g0 .52+.55, g1 .95+.27, g2 .73+.75,
    // g3 .12+2.62 -> groups 3 and 2; experts by choice among 4..7: 7 (2.62), 5 (.75), 4 (.73)
    int want[3] = {7, 5, 4};
    float sig[3], sum = 0;
    for (int j = 0; j < 3; j++) sum += sig[j] = 1.0f / (1.0f + expf(-logits[want[j]]));
    int ok = 1;
    for (int j = 0; j < 3; j++) ok &= ids[j] == want[j] && fabsf(w[j] - 2.0f * sig[j] / sum) < 1e-6f;
    printf("grouped top-k routing: experts %d %d %d\n", ids[0], ids[1], ids[2]);
    CHECK(ok);
    // softmax over all 8, top 3 (2, 5, 4), renormalized or not (Qwen3-MoE)
    for (int norm = 0; norm < 2; norm++) {
        struct moe_route_cfg s = {ROUTE_SOFTMAX_TOPK, 8, 3, 1, 1, norm, 1.0f};
        be->ops->moe_route(be, ids, w, logits, NULL, 1, &s);
        double z = 0, p[3], top = 0;
        for (int e = 0; e < 8; e++) z += exp(logits[e]);
        int want2[3] = {2, 5, 4};
        for (int j = 0; j < 3; j++) top += p[j] = exp(logits[want2[j]]) / z;
        ok = 1;
        for (int j = 0; j < 3; j++) ok &= ids[j] == want2[j] && fabs(w[j] - (norm ? p[j] / top : p[j])) < 1e-6;
        CHECKF(ok, "softmax top-k routing (norm %d): experts %d %d %d", norm, ids[0], ids[1], ids[2]);
    }
}

// RoPE from the table of models/rope.c: rotating q and k by their positions
// keeps |q| and makes q.k depend only on the distance between positions.
static void test_rope(struct backend *be) {
    struct rope rp = {.type = ROPE_DEFAULT, .head_dim = 8, .theta = 10000, .factor = 1};
    float tab[64 * 8];
    rope_table(&rp, 64, tab);
    float q0[8], k0[8];
    for (int i = 0; i < 8; i++) q0[i] = (float)(i + 1) * 0.3f - 1, k0[i] = (float)(7 - i) * 0.2f;
    double dots[2];
    int pairs[2][2] = {{3, 10}, {20, 27}}; // both 7 apart
    for (int p = 0; p < 2; p++) {
        float x[16];
        memcpy(x, q0, sizeof q0), memcpy(x + 8, k0, sizeof k0);
        int32_t pos[2] = {pairs[p][0], pairs[p][1]};
        float rows[2][8];
        memcpy(rows[0], q0, sizeof q0), memcpy(rows[1], k0, sizeof k0);
        be->ops->rope(be, &rows[0][0], 8, 2, 1, 8, tab, pos);
        double d = 0, n0 = 0, n1 = 0;
        for (int i = 0; i < 8; i++) d += rows[0][i] * rows[1][i], n0 += rows[0][i] * rows[0][i], n1 += q0[i] * q0[i];
        dots[p] = d;
        CHECKF(fabs(n0 - n1) < 1e-4, "rope changed |q|: %g vs %g", n0, n1);
        (void)x;
    }
    printf("rope: q.k at distance 7 from positions 3 and 20: %.6f %.6f\n", dots[0], dots[1]);
    CHECK(fabs(dots[0] - dots[1]) < 1e-4);
    // position 0 leaves a vector as it is
    float r[8];
    memcpy(r, q0, sizeof q0);
    int32_t z = 0;
    be->ops->rope(be, r, 8, 1, 1, 8, tab, &z);
    CHECK(!memcmp(r, q0, sizeof r));
}

static void test_sampler(void) {
    enum { V = 50 };
    float logits[V];
    test_fill(logits, V, 3.0f);
    logits[17] = 5.0f;
    int32_t prompt[4] = {17, 3, 4, 17}, top_ids[5];
    float lp, top_lp[5];
    void *scratch = xmalloc(sample_scratch_bytes(V));
    struct sample_params p = {0};
    p.top_p = 1;
    p.repetition_penalty = 1;
    p.num_prompt = p.num_tokens = 4;
    p.num_logprobs = 5;
    int32_t id = sample_row(logits, V, prompt, &p, scratch, &lp, top_ids, top_lp, 5);
    CHECK(id == 17 && top_ids[0] == 17 && fabsf(lp - top_lp[0]) < 1e-6f);
    double mass = 0;
    for (int i = 0; i < V; i++) mass += exp(logits[i] - (logits[17] - lp));
    CHECKF(fabs(mass - 1) < 1e-4, "logprobs sum to %g", mass);
    p.repetition_penalty = 10; // token 17 is in the prompt: pushed down
    CHECK(sample_row(logits, V, prompt, &p, scratch, &lp, top_ids, top_lp, 5) != 17);
    p.repetition_penalty = 1;
    p.temperature = 1.0f;
    p.seed_lo = 1234;
    int counts[V] = {0}, same = 1;
    for (uint32_t s = 0; s < 400; s++) {
        p.step = s;
        int32_t a = sample_row(logits, V, prompt, &p, scratch, &lp, top_ids, top_lp, 5);
        same &= a == sample_row(logits, V, prompt, &p, scratch, &lp, top_ids, top_lp, 5);
        counts[a]++;
    }
    int distinct = 0;
    for (int i = 0; i < V; i++) distinct += counts[i] > 0;
    CHECKF(same && distinct > 3 && counts[17] > 40, "seeded sampling: same %d distinct %d top %d", same, distinct, counts[17]);
    p.top_k = 1; // top-k 1 is greedy
    CHECK(sample_row(logits, V, prompt, &p, scratch, &lp, top_ids, top_lp, 5) == 17);
    p.top_k = 0;
    p.top_p = 1e-6f;
    CHECK(sample_row(logits, V, prompt, &p, scratch, &lp, top_ids, top_lp, 5) == 17);
    p.top_p = 1;
    p.min_p = 1.0f;
    CHECK(sample_row(logits, V, prompt, &p, scratch, &lp, top_ids, top_lp, 5) == 17);
    free(scratch);
}

int main(void) {
    test_rng = 88172645463325252ull;
    struct backend *be;
    if (backend_cpu_create(2, DT_F32, &be)) return 1;
    test_ssd(be);
    test_conv(be);
    test_ckpt(be);
    test_attention(be);
    test_route(be);
    test_rope(be);
    test_sampler();
    backend_free(be);
    return test_summary("ops");
}
