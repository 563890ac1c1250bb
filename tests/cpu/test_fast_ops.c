// test_fast_ops.c - every fast-path op against the reference op of the same
// name, for every kernel set this CPU runs (scalar, avx2, avx512,
// avx512_bf16), on random inputs with awkward shapes (rows not a multiple of
// 16, odd columns, chunk and block boundaries, experts straddling panels).
//
// Tolerances, as max |fast - ref| / max |ref|:
//   fp32 arithmetic (every op but the bf16 dot kernel): 2e-5 (summation order
//   and the vector exp differ);
//   bf16 weights: the reference holds the same bf16 values in fp32, so the
//   fp32-arithmetic kernel is held to 2e-5 too; the bf16 dot kernel (x rounded
//   to bf16) to 2e-5 against the reference fed bf16-rounded x, and to 1e-2
//   against the reference fed x itself.
// Each comparison is a CHECK; the test fails when none ran.
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"
#include "io/dtype.h"
#include "op_util.h"
#include "test.h"

// the decode rows' prologue (attn_decode runs it) without norms or rotation:
// kv_write's k and v
static const struct attn_prep no_prep;

#define TOL 2e-5

static float *dup(const float *x, size_t n) {
    float *y = xmalloc(sizeof(float) * (n ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}

static struct backend *ref, *fast;
static const char *isa;
static long values; // compared in this run

static double cmp(const char *what, const float *got, const float *want, size_t n, double tol) {
    double m = 0, s = 1e-30;
    int bad = n == 0;
    for (size_t i = 0; i < n; i++) {
        s = fmax(s, fabs(want[i]));
        if (!isfinite(got[i])) bad = 1;
        m = fmax(m, fabs((double)got[i] - want[i]));
    }
    double e = bad ? INFINITY : m / s;
    CHECKF(e <= tol, "%s %s: rel err %.3g > %.0g over %zu values", isa, what, e, tol, n);
    values += (long)n;
    return e;
}

// Sequence s (the last one with checkpoints so far) writes n checkpoints.
static void add_ckpts(struct test_batch *h, int s, int n, const int *pos, const int *slot) {
    int k = h->ck_start[h->b.num_seqs];
    for (int j = 0; j < n; j++) h->ck_pos[k + j] = pos[j], h->ck_slot[k + j] = slot[j];
    for (int q = s + 1; q <= h->b.num_seqs; q++) h->ck_start[q] += n;
}

static void test_matmul(void) {
    int shapes[][2] = {{37, 23}, {64, 64}, {100, 130}, {1000, 257}, {16, 1}};
    int ns[] = {1, 2, 3, 4, 5, 7, 9, 16, 17, 40};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int dt = WF_F32; dt <= WF_BF16; dt++) {
            int N = shapes[si][0], K = shapes[si][1];
            float *wh = test_rnd((size_t)N * K, 0.5f), *bias = test_rnd(N, 1);
            struct weight wr, wf;
            CHECK(weight_from_f32(ref, &wr, dt, wh, N, K) == 0);
            CHECK(weight_from_f32(fast, &wf, dt, wh, N, K) == 0);
            CHECK(wf.fmt == (enum wfmt)dt && wr.fmt == (enum wfmt)dt);
            if (si % 2) wr.bias = wf.bias = bias; // every other shape with a bias
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int n = ns[ni];
                float *x = test_rnd((size_t)n * K, 1.0f), *yr = test_rnd((size_t)n * N, 1), *yf = test_rnd((size_t)n * N, 1);
                char what[96];
                snprintf(what, sizeof what, "matmul %s [%d,%d] n=%d", dt ? "bf16" : "fp32", N, K, n);
                fast->ops->matmul(fast, yf, x, &wf, n);
                if (fast_use_dot(fast, &wf, n)) {
                    ref->ops->matmul(ref, yr, x, &wr, n);
                    cmp(what, yf, yr, (size_t)n * N, 1e-2);
                    for (size_t i = 0; i < (size_t)n * K; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
                    strcat(what, " (dot, bf16 x)");
                }
                ref->ops->matmul(ref, yr, x, &wr, n);
                cmp(what, yf, yr, (size_t)n * N, TOL);
                free(x), free(yr), free(yf);
            }
            // the same values from weight_random on both: rows read back by embed
            struct weight rr, rf;
            CHECK(ref->ops->weight_alloc(ref, &rr, dt, N, K) == 0 && ref->ops->weight_random(ref, &rr, 99 + si, 0.3f) == 0);
            CHECK(fast->ops->weight_alloc(fast, &rf, dt, N, K) == 0 && fast->ops->weight_random(fast, &rf, 99 + si, 0.3f) == 0);
            int32_t ids[] = {0, N - 1, N / 2, N / 3};
            float *er = xmalloc(sizeof(float) * 4 * K), *ef = xmalloc(sizeof(float) * 4 * K);
            ref->ops->embed(ref, er, &rr, ids, 4);
            fast->ops->embed(fast, ef, &rf, ids, 4);
            cmp(dt ? "weight_random+embed bf16" : "weight_random+embed fp32", ef, er, (size_t)4 * K, 0);
            ref->ops->embed(ref, er, &wr, ids, 4);
            fast->ops->embed(fast, ef, &wf, ids, 4);
            cmp(dt ? "embed bf16" : "embed fp32", ef, er, (size_t)4 * K, 0);
            free(er), free(ef), free(wh), free(bias);
            struct weight *all[] = {&wr, &wf, &rr, &rf};
            for (int i = 0; i < 4; i++) free(all[i]->data);
        }
}

static void test_norms(void) {
    int n = 37, D = 96;
    float *x = test_rnd((size_t)n * D, 2), *w = test_rnd(D, 1), *res = test_rnd((size_t)n * D, 1), *res2 = dup(res, (size_t)n * D);
    float *o1 = test_rnd((size_t)n * D, 1), *o2 = test_rnd((size_t)n * D, 1);
    ref->ops->rmsnorm(ref, o1, x, w, n, D, 1e-5f);
    fast->ops->rmsnorm(fast, o2, x, w, n, D, 1e-5f);
    cmp("rmsnorm", o2, o1, (size_t)n * D, TOL);
    ref->ops->add_rmsnorm(ref, res, x, o1, w, n, D, 1e-5f);
    fast->ops->add_rmsnorm(fast, res2, x, o2, w, n, D, 1e-5f);
    cmp("add_rmsnorm out", o2, o1, (size_t)n * D, TOL);
    cmp("add_rmsnorm res", res2, res, (size_t)n * D, 0);
    const char *acts[] = {"relu2", "silu", "gelu_tanh"};
    for (int k = ACT_RELU2; k <= ACT_GELU_TANH; k++) { // more than one task of the parallel act
        char what[64];
        float *r1 = test_rnd(70000, 2), *r2 = dup(r1, 70000), *m1 = test_rnd((size_t)40 * 33, 1), *m2 = dup(m1, (size_t)40 * 33);
        ref->ops->act(ref, k, r1, 70000);
        fast->ops->act(fast, k, r2, 70000);
        snprintf(what, sizeof what, "act %s", acts[k]);
        cmp(what, r2, r1, 70000, k == ACT_RELU2 ? 0 : TOL);
        ref->ops->act_mul(ref, k, m1, r1, 40, 33); // x: [40, 66] gate | up
        fast->ops->act_mul(fast, k, m2, r1, 40, 33);
        snprintf(what, sizeof what, "act_mul %s", acts[k]);
        cmp(what, m2, m1, (size_t)40 * 33, TOL);
        free(r1), free(r2), free(m1), free(m2);
    }
    { // rope over q | k heads (5 + 2 of 16) in rows of 120, positions up to 300; q/k head norms
        int T = 37, ld = 120, hd = 16, maxp = 300;
        float *tab = test_rnd((size_t)maxp * hd, 1), *x1 = test_rnd((size_t)T * ld, 2), *x2 = dup(x1, (size_t)T * ld), *hw = test_rnd(hd, 1);
        int32_t pos[37];
        for (int t = 0; t < T; t++) pos[t] = (t * 53) % maxp;
        ref->ops->rope(ref, x1, ld, T, 7, hd, tab, pos);
        fast->ops->rope(fast, x2, ld, T, 7, hd, tab, pos);
        cmp("rope", x2, x1, (size_t)T * ld, 0);
        ref->ops->head_rmsnorm(ref, x1 + 16, ld, T, 5, hd, hw, 1e-6f);
        fast->ops->head_rmsnorm(fast, x2 + 16, ld, T, 5, hd, hw, 1e-6f);
        cmp("head_rmsnorm", x2, x1, (size_t)T * ld, 0);
        free(tab), free(x1), free(x2), free(hw);
    }
    // the routers: 40 tokens (two tasks), 16 experts; grouped: 4 groups, top 3
    // of 2 groups; softmax: top 3, with and without renormalization
    struct moe_route_cfg rcs[3] = {{ROUTE_SIGMOID_GROUPED, 16, 3, 4, 2, 1, 2.5f}, {ROUTE_SOFTMAX_TOPK, 16, 3, 1, 1, 1, 1.0f},
                                   {ROUTE_SOFTMAX_TOPK, 16, 3, 1, 1, 0, 1.0f}};
    for (int k = 0; k < 3; k++) {
        float *lg = test_rnd((size_t)40 * 16, 3), *rb = test_rnd(16, 0.2f), rw1[120], rw2[120];
        int32_t ri1[120], ri2[120];
        ref->ops->moe_route(ref, ri1, rw1, lg, rb, 40, &rcs[k]);
        fast->ops->moe_route(fast, ri2, rw2, lg, rb, 40, &rcs[k]);
        CHECKF(!memcmp(ri1, ri2, sizeof ri1), "%s moe_route %d: different experts", isa, k);
        cmp("moe_route weights", rw2, rw1, 120, 0);
        free(lg), free(rb);
    }
    // gated: z in a wider row, groups of 24
    int zld = 130;
    float *z = test_rnd((size_t)n * zld, 3), *gw = test_rnd(D, 1);
    ref->ops->gated_rmsnorm(ref, o1, x, z, zld, gw, n, D, 24, 1e-5f);
    fast->ops->gated_rmsnorm(fast, o2, x, z, zld, gw, n, D, 24, 1e-5f);
    cmp("gated_rmsnorm", o2, o1, (size_t)n * D, TOL);
    free(x), free(w), free(res), free(res2), free(o1), free(o2), free(z), free(gw);
}

// Mamba2 dims: 8 heads of 4 in 2 groups, state 24, conv 4, chunk 8.
static struct mamba_dims mdims(void) {
    struct mamba_dims d = {8, 4, 2, 24, 4, 8, 0, 0.0f, INFINITY};
    d.conv_dim = d.heads * d.head_dim + 2 * d.groups * d.state;
    return d;
}

static void test_mamba(void) {
    struct mamba_dims d = mdims();
    int H = d.heads, P = d.head_dim, N = d.state, I = H * P, C = d.conv_dim, K = d.conv_kernel;
    int ld = I + C + H + 3; // a wider row, as in_proj's
    // two decodes, then prefills: fresh, chunk-crossing continuation, one token
    int qlen[] = {1, 1, 21, 13, 1, 30}, ctx[] = {5, 9, 0, 6, 11, 3}, init[] = {1, 1, 0, 1, 1, 1}, S = 6, nd = 2;
    struct test_batch h;
    test_batch_paged(&h, S, qlen, ctx, init, nd, 4);
    // prefix caching: seq 2 (fresh) and seq 5 write checkpoints at chunk
    // boundaries, seq 3 restores one (slot 0) and writes two, the first
    // closer to its start than the conv window
    h.src[3] = 0;
    add_ckpts(&h, 2, 2, (int[]){8, 16}, (int[]){9, 10});
    add_ckpts(&h, 3, 2, (int[]){8, 16}, (int[]){14, 15});
    add_ckpts(&h, 5, 4, (int[]){8, 16, 24, 32}, (int[]){1, 4, 5, 6});
    h.ck_dst[0] = 11; // decode 0 (live slot 3) also writes its new state to checkpoint slot 11
    int T = h.b.num_tokens;
    size_t csn = (size_t)16 * (K - 1) * C, ssn = (size_t)16 * H * P * N;
    float *zx = test_rnd((size_t)T * ld, 1), *zx2 = dup(zx, (size_t)T * ld), *cw = test_rnd((size_t)C * K, 0.5f), *cb = test_rnd(C, 0.3f);
    float *cs1 = test_rnd(csn, 1), *cs2 = dup(cs1, csn);
    ref->ops->conv1d_update(ref, zx, ld, cw, cb, cs1, &h.b, &d);
    fast->ops->conv1d_update(fast, zx2, ld, cw, cb, cs2, &h.b, &d);
    ref->ops->conv1d_fwd(ref, zx, ld, cw, cb, cs1, &h.b, nd, S, &d);
    fast->ops->conv1d_fwd(fast, zx2, ld, cw, cb, cs2, &h.b, nd, S, &d);
    cmp("conv1d rows", zx2, zx, (size_t)T * ld, TOL);
    cmp("conv1d state", cs2, cs1, csn, TOL);
    float *dtb = test_rnd(H, 0.5f), *A = test_rnd(H, 1), *D = test_rnd(H, 1);
    for (int i = 0; i < H; i++) A[i] = -expf(A[i]);
    float *st1 = test_rnd(ssn, 1), *st2 = dup(st1, ssn), *y1 = test_rnd((size_t)T * I, 1), *y2 = test_rnd((size_t)T * I, 1);
    ref->ops->ssd_decode(ref, y1, zx, ld, dtb, A, D, st1, &h.b, &d);
    fast->ops->ssd_decode(fast, y2, zx, ld, dtb, A, D, st2, &h.b, &d);
    cmp("ssd_decode y", y2, y1, (size_t)nd * I, TOL);
    ref->ops->ssd_prefill(ref, y1, zx, ld, dtb, A, D, st1, &h.b, nd, S, &d);
    fast->ops->ssd_prefill(fast, y2, zx, ld, dtb, A, D, st2, &h.b, nd, S, &d);
    cmp("ssd_prefill y", y2 + (size_t)nd * I, y1 + (size_t)nd * I, (size_t)(T - nd) * I, TOL);
    cmp("ssd state", st2, st1, ssn, TOL);
    size_t cper = (size_t)(K - 1) * C, sper = (size_t)H * P * N;
    float *cs[2] = {cs1, cs2}, *ss[2] = {st1, st2};
    for (int k = 0; k < 2; k++) // the decode's checkpoint is its new state, exactly
        CHECKF(!memcmp(cs[k] + 11 * cper, cs[k] + 3 * cper, sizeof(float) * cper) &&
                   !memcmp(ss[k] + 11 * sper, ss[k] + 3 * sper, sizeof(float) * sper),
               "%s conv1d_update / ssd_decode: decode checkpoint != the new state", k ? "fast" : "reference");
    free(zx), free(zx2), free(cw), free(cb), free(cs1), free(cs2), free(dtb), free(A), free(D);
    free(st1), free(st2), free(y1), free(y2);
}

static void test_attention(void) {
    struct attn_dims d = {8, 2, 16, 4, 0.25f, 1, 1};
    int qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim, ld = qd + 2 * kvd + 5;
    int qlen[] = {1, 1, 70, 9, 1}, ctx[] = {13, 2, 0, 17, 30}, init[] = {1, 1, 0, 1, 1}, S = 5, nd = 2;
    struct test_batch h;
    test_batch_paged(&h, S, qlen, ctx, init, nd, d.block_size);
    int T = h.b.num_tokens;
    size_t cn = (size_t)16 * 64 * d.block_size * kvd;
    float *kc = test_rnd(cn, 1), *vc = test_rnd(cn, 1), *qkv = test_rnd((size_t)T * ld, 1);
    float *o1 = test_rnd((size_t)T * qd, 1), *o2 = test_rnd((size_t)T * qd, 1);
    ref->ops->kv_write(ref, kc, vc, qkv, ld, &h.b, &d);
    ref->ops->attn_decode(ref, o1, qkv, ld, &no_prep, kc, vc, &h.b, &d);
    fast->ops->attn_decode(fast, o2, qkv, ld, &no_prep, kc, vc, &h.b, &d);
    cmp("attn_decode", o2, o1, (size_t)nd * qd, TOL);
    ref->ops->attn_prefill(ref, o1, qkv, ld, kc, vc, &h.b, nd, S, &d);
    fast->ops->attn_prefill(fast, o2, qkv, ld, kc, vc, &h.b, nd, S, &d);
    cmp("attn_prefill", o2 + (size_t)nd * qd, o1 + (size_t)nd * qd, (size_t)(T - nd) * qd, TOL);
    free(kc), free(vc), free(qkv), free(o1), free(o2);
}

// qk_norm_rope: the reference against the ops it fuses (head_rmsnorm of q
// and k, rope, kv_write), and the fast path's prefill rows (from row nd)
// then attn_decode's prologue of the decode rows against the reference,
// exactly: Qwen3-8B / 30B-A3B / 32B heads (32/8, 32/4, 64/8 of 128), MHA at
// head_dim 64, Llama (no norm), NemotronH (no norm, no positions), a token
// with no KV slot (-1).
static void test_qk_norm_rope(void) {
    static const int cases[][4] = {{32, 8, 128, 3}, {32, 4, 128, 3}, {64, 8, 128, 3}, {4, 4, 64, 3}, {8, 2, 64, 1},
                                   {6, 2, 24, 0}}; // heads, kv_heads, head_dim, 1: rope, 2: norm
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        struct attn_dims d = {cases[ci][0], cases[ci][1], cases[ci][2], 4, 0.25f, 1, 1};
        int rope = cases[ci][3] & 1, norm = cases[ci][3] & 2, hd = d.head_dim, maxp = 128;
        int qd = d.heads * hd, kvd = d.kv_heads * hd, ld = qd + 2 * kvd + 5;
        int qlen[] = {1, 1, 70, 9, 1}, ctx[] = {13, 2, 0, 17, 30}, init[] = {1, 1, 0, 1, 1}, S = 5, nd = 2;
        struct test_batch h;
        test_batch_paged(&h, S, qlen, ctx, init, nd, d.block_size);
        h.slot_map[1] = -1;
        int T = h.b.num_tokens;
        size_t cn = (size_t)16 * 64 * d.block_size * kvd, qn = (size_t)T * ld;
        float *tab = test_rnd((size_t)maxp * hd, 1), *qw = test_rnd(hd, 1), *kw = test_rnd(hd, 1);
        float *q0 = test_rnd(qn, 2), *q1 = dup(q0, qn), *q2 = dup(q0, qn);
        float *k0 = test_rnd(cn, 1), *k1 = dup(k0, cn), *k2 = dup(k0, cn), *v0 = test_rnd(cn, 1), *v1 = dup(v0, cn),
              *v2 = dup(v0, cn);
        if (norm) {
            ref->ops->head_rmsnorm(ref, q0, ld, T, d.heads, hd, qw, 1e-6f);
            ref->ops->head_rmsnorm(ref, q0 + qd, ld, T, d.kv_heads, hd, kw, 1e-6f);
        }
        if (rope) ref->ops->rope(ref, q0, ld, T, d.heads + d.kv_heads, hd, tab, h.b.positions);
        ref->ops->kv_write(ref, k0, v0, q0, ld, &h.b, &d);
        struct attn_prep p = {norm ? qw : NULL, norm ? kw : NULL, rope ? tab : NULL, 1e-6f};
        float *o = xmalloc(sizeof(float) * nd * qd);
        ref->ops->qk_norm_rope(ref, q1, ld, &p, k1, v1, &h.b, 0, &d);
        fast->ops->qk_norm_rope(fast, q2, ld, &p, k2, v2, &h.b, nd, &d);
        fast->ops->attn_decode(fast, o, q2, ld, &p, k2, v2, &h.b, &d);
        char what[96];
        snprintf(what, sizeof what, "qk_norm_rope %d/%d of %d%s%s (reference)", d.heads, d.kv_heads, hd,
                 norm ? " norm" : "", rope ? " rope" : "");
        cmp(what, q1, q0, qn, 0);
        cmp(what, k1, k0, cn, 0);
        cmp(what, v1, v0, cn, 0);
        snprintf(what, sizeof what, "qk_norm_rope %d/%d of %d%s%s", d.heads, d.kv_heads, hd, norm ? " norm" : "",
                 rope ? " rope" : "");
        cmp(what, q2, q1, qn, 0);
        cmp(what, k2, k1, cn, 0);
        cmp(what, v2, v1, cn, 0);
        free(tab), free(qw), free(kw), free(q0), free(q1), free(q2), free(o);
        free(k0), free(k1), free(k2), free(v0), free(v1), free(v2);
    }
}

// matmul_act_mul and matmul_act (one op each on every CPU path: matmul then
// act_mul / act through the backend's own ops) against those ops, decode and
// prefill rows, bf16.
static void test_matmul_act_mul(void) {
    int I = 70, K = 48, ns[] = {1, 4, 19};
    float *wm = test_rnd((size_t)2 * I * K, 0.2f), *x = test_rnd((size_t)19 * K, 1);
    struct weight wr, wf;
    CHECK(weight_from_f32(ref, &wr, WF_BF16, wm, 2 * I, K) == 0);
    CHECK(weight_from_f32(fast, &wf, WF_BF16, wm, 2 * I, K) == 0);
    float *gu = test_rnd((size_t)19 * 2 * I, 1), *o1 = test_rnd((size_t)19 * I, 1), *o2 = test_rnd((size_t)19 * I, 1);
    for (int k = 0; k < 3; k++) {
        int n = ns[k];
        fast->ops->matmul(fast, gu, x, &wf, n);
        fast->ops->act_mul(fast, ACT_SILU, o1, gu, n, I);
        fast->ops->matmul_act_mul(fast, ACT_SILU, o2, x, &wf, n, gu);
        cmp("matmul_act_mul (fast)", o2, o1, (size_t)n * I, 0);
        ref->ops->matmul(ref, gu, x, &wr, n);
        ref->ops->act_mul(ref, ACT_SILU, o1, gu, n, I);
        ref->ops->matmul_act_mul(ref, ACT_SILU, o2, x, &wr, n, gu);
        cmp("matmul_act_mul (reference)", o2, o1, (size_t)n * I, 0);
        // matmul_act (relu2) over the same 2I rows: matmul, then act in place
        for (int p = 0; p < 2; p++) {
            struct backend *be = p ? ref : fast;
            struct weight *w = p ? &wr : &wf;
            be->ops->matmul(be, gu, x, w, n);
            be->ops->act(be, ACT_RELU2, gu, (int64_t)n * 2 * I);
            float *o3 = xmalloc(sizeof(float) * n * 2 * I);
            be->ops->matmul_act(be, ACT_RELU2, o3, x, w, n);
            cmp(p ? "matmul_act (reference)" : "matmul_act (fast)", o3, gu, (size_t)n * 2 * I, 0);
            free(o3);
        }
    }
    ref->ops->free(ref, wr.data);
    fast->ops->free(fast, wf.data);
    free(wm), free(x), free(gu), free(o1), free(o2);
}

// The router as a model runs it (the fp32 gate's matmul, then moe_route):
// the fast path's against the reference's, 1 and 40 tokens.
static void test_router(void) {
    int E = 16, K = 48, k = 3, ns[] = {1, 40};
    struct moe_route_cfg c = {ROUTE_SOFTMAX_TOPK, E, k, 1, 1, 1, 1.0f};
    float *wm = test_rnd((size_t)E * K, 0.3f), *x = test_rnd((size_t)40 * K, 1);
    struct weight wr, wf;
    CHECK(weight_from_f32(ref, &wr, WF_F32, wm, E, K) == 0);
    CHECK(weight_from_f32(fast, &wf, WF_F32, wm, E, K) == 0);
    float l1[40 * 16], l2[40 * 16], w1[120], w2[120];
    int32_t i1[120], i2[120];
    for (int j = 0; j < 2; j++) {
        int n = ns[j];
        ref->ops->matmul(ref, l1, x, &wr, n);
        ref->ops->moe_route(ref, i1, w1, l1, NULL, n, &c);
        fast->ops->matmul(fast, l2, x, &wf, n);
        fast->ops->moe_route(fast, i2, w2, l2, NULL, n, &c);
        cmp("router logits", l2, l1, (size_t)n * E, TOL);
        CHECKF(!memcmp(i1, i2, sizeof(int32_t) * n * k), "%s router: expert ids differ", isa);
        cmp("router weights", w2, w1, (size_t)n * k, TOL);
    }
    ref->ops->free(ref, wr.data);
    fast->ops->free(fast, wf.data);
    free(wm), free(x);
}

// Experts of inter 24 (panels straddle experts) and dim 40; from one token
// (decode) to 96 (each expert past the dot kernel's row threshold).
// Relu^2 experts, and gated SiLU experts (up holds each expert's gate rows then its up rows).
static void test_moe(void) {
    int E = 6, I = 24, L = 40, top_k = 2, ns[] = {1, 3, 96};
    for (int v = 0; v < 4; v++) {
        int dt = v % 2, gated = v / 2, U = gated ? 2 * I : I;
        float *up = test_rnd((size_t)E * U * L, 0.3f), *down = test_rnd((size_t)E * L * I, 0.3f);
        struct moe_experts wr = {.num_experts = E, .inter = I, .dim = L, .gated = gated, .act = gated ? ACT_SILU : ACT_RELU2};
        struct moe_experts wf = wr;
        CHECK(weight_from_f32(ref, &wr.up, dt, up, (int64_t)E * U, L) == 0);
        CHECK(weight_from_f32(ref, &wr.down, dt, down, (int64_t)E * L, I) == 0);
        CHECK(weight_from_f32(fast, &wf.up, dt, up, (int64_t)E * U, L) == 0);
        CHECK(weight_from_f32(fast, &wf.down, dt, down, (int64_t)E * L, I) == 0);
        for (int k = 0; k < 3; k++) {
            int n = ns[k];
            float *x = test_rnd((size_t)n * L, 1), *wt = test_rnd((size_t)n * top_k, 1);
            int32_t *ids = xmalloc(sizeof(int32_t) * n * top_k);
            for (int t = 0; t < n; t++) { // two distinct experts per token; expert 4 never chosen
                ids[t * 2] = t % 3;
                ids[t * 2 + 1] = 3 + t % 2 * 2;
            }
            float *o1 = test_rnd((size_t)n * L, 1), *o2 = test_rnd((size_t)n * L, 1);
            char what[64];
            snprintf(what, sizeof what, "moe_experts %s%s n=%d", dt ? "bf16" : "fp32", gated ? " gated" : "", n);
            fast->ops->moe_experts(fast, o2, x, &wf, ids, wt, n, top_k, NULL);
            ref->ops->moe_experts(ref, o1, x, &wr, ids, wt, n, top_k, NULL);
            if (dt == WF_BF16 && fast_k(fast)->mm_pk_dot && n >= 48) {
                // the dot kernel rounds x and the hidden activations to bf16
                cmp(what, o2, o1, (size_t)n * L, 2e-2);
            } else {
                cmp(what, o2, o1, (size_t)n * L, TOL);
            }
            free(x), free(wt), free(ids), free(o1), free(o2);
        }
        free(up), free(down);
        free(wr.up.data), free(wr.down.data), free(wf.up.data), free(wf.down.data);
    }
}

// The KDA recurrence: 3 heads of 20 (rows not a multiple of the vector
// width), two decodes, a fresh prefill with checkpoints at 16 and 32, a
// prefill continuing its slot, and a 1-token prefill.
static void test_kda(void) {
    struct kda_dims d = {3, 20, 4, 16};
    int H = d.heads, K = d.head_dim, HK = H * K, ld = 3 * HK + H + 3;
    int qlen[] = {1, 1, 40, 9, 1}, ctx[] = {13, 2, 0, 17, 0}, init[] = {1, 1, 0, 1, 0}, S = 5, nd = 2;
    struct test_batch h;
    test_batch_paged(&h, S, qlen, ctx, init, nd, 4);
    add_ckpts(&h, 2, 2, (int[]){16, 32}, (int[]){0, 1});
    h.ck_dst[0] = 11; // decode 0 (live slot 3) also writes its new state to checkpoint slot 11
    int T = h.b.num_tokens;
    size_t sn = (size_t)16 * H * K * K;
    float *x = test_rnd((size_t)T * ld, 1), *g = test_rnd((size_t)T * HK, 1), *st1 = test_rnd(sn, 0.3f), *st2 = dup(st1, sn);
    for (int i = 0; i < T * HK; i++) g[i] = -0.3f * (g[i] + 1.0f); // log-decays <= 0
    float *y1 = test_rnd((size_t)T * HK, 1), *y2 = dup(y1, (size_t)T * HK);
    ref->ops->kda_decode(ref, y1, x, ld, g, st1, &h.b, &d);
    fast->ops->kda_decode(fast, y2, x, ld, g, st2, &h.b, &d);
    ref->ops->kda_prefill(ref, y1, x, ld, g, st1, &h.b, nd, S, &d);
    fast->ops->kda_prefill(fast, y2, x, ld, g, st2, &h.b, nd, S, &d);
    cmp("kda_decode + kda_prefill", y2, y1, (size_t)T * HK, TOL);
    cmp("kda state and checkpoints", st2, st1, sn, TOL);
    size_t per = (size_t)H * K * K;
    CHECKF(!memcmp(st1 + 11 * per, st1 + 3 * per, sizeof(float) * per) &&
               !memcmp(st2 + 11 * per, st2 + 3 * per, sizeof(float) * per),
           "kda_decode: decode checkpoint != the new state");
    free(x), free(g), free(st1), free(st2), free(y1), free(y2);
}

// The chunked KDA prefill (fast_kimi.c) at Kimi-Linear-48B's shapes (32
// heads of 128, chunk_size 64), every sequence a prefill: 1 token, 63, 64,
// 65, 3*64+5 from zeros; 100 continuing its slot from position 37 with
// checkpoints at 64 and 128; 150 from zeros with checkpoints at 64, 100
// and 128 (100: a piece cut inside a chunk). Log-decays near zero
// ([-1e-3, 0]) and strong ([-20, 0] per token: exp(-G) of the whole chunk
// would overflow).
static void test_kda_chunks(void) {
    struct kda_dims d = {32, 128, 4, 64};
    int H = d.heads, K = d.head_dim, HK = H * K, ld = 3 * HK + H + 1;
    int qlen[] = {1, 63, 64, 65, 197, 100, 150}, ctx[] = {0, 0, 0, 0, 0, 37, 0}, init[] = {0, 0, 0, 0, 0, 1, 0}, S = 7;
    struct test_batch h;
    test_batch_paged(&h, S, qlen, ctx, init, 0, 4);
    add_ckpts(&h, 5, 2, (int[]){64, 128}, (int[]){0, 4});
    add_ckpts(&h, 6, 3, (int[]){64, 100, 128}, (int[]){5, 6, 9});
    int T = h.b.num_tokens;
    size_t sn = (size_t)16 * HK * K;
    for (int v = 0; v < 2; v++) {
        float depth = v ? 10.0f : 5e-4f;
        float *x = test_rnd((size_t)T * ld, 1), *g = test_rnd((size_t)T * HK, depth), *st1 = test_rnd(sn, 0.3f);
        float *st2 = dup(st1, sn), *y1 = test_rnd((size_t)T * HK, 1), *y2 = dup(y1, (size_t)T * HK);
        for (int i = 0; i < T * HK; i++) g[i] -= depth; // [-2 depth, 0]
        ref->ops->kda_prefill(ref, y1, x, ld, g, st1, &h.b, 0, S, &d);
        fast->ops->kda_prefill(fast, y2, x, ld, g, st2, &h.b, 0, S, &d);
        double ey = cmp(v ? "kda chunks, strong decay: y" : "kda chunks, weak decay: y", y2, y1, (size_t)T * HK, TOL);
        double es = cmp(v ? "kda chunks, strong decay: states" : "kda chunks, weak decay: states", st2, st1, sn, TOL);
        printf("%-12s kda chunks, %s decay: rel err y %.2g, states and checkpoints %.2g\n", isa, v ? "strong" : "weak",
               ey, es);
        free(x), free(g), free(st1), free(st2), free(y1), free(y2);
    }
}

// MLA over cached latents: 16 heads (two groups of 8) and 3 (one group of
// all), decodes and prefills longer than a task's 8 queries, scattered blocks.
static void test_mla(void) {
    for (int v = 0; v < 2; v++) {
        struct mla_dims d = {v ? 3 : 16, 16, 8, 12, 40, 4, 0};
        d.scale = 1.0f / sqrtf(24.0f);
        int H = d.heads, W = d.rank + d.rope, qw = H * (d.nope + d.rope);
        int qlen[] = {1, 1, 21, 9, 1}, ctx[] = {13, 2, 0, 17, 30}, init[] = {1, 1, 0, 1, 1}, S = 5, nd = 2;
        struct test_batch h;
        test_batch_paged(&h, S, qlen, ctx, init, nd, d.block_size);
        int T = h.b.num_tokens;
        size_t cn = (size_t)16 * 64 * d.block_size * W;
        float *cache = test_rnd(cn, 1), *lat = test_rnd((size_t)T * W, 1), *q = test_rnd((size_t)T * qw, 1);
        float *kvb = test_rnd((size_t)H * (d.nope + d.v_dim) * d.rank, 0.3f);
        float *o1 = test_rnd((size_t)T * H * d.v_dim, 1), *o2 = dup(o1, (size_t)T * H * d.v_dim);
        ref->ops->mla_kv_write(ref, cache, lat, W, &h.b, &d);
        ref->ops->mla_attn(ref, o1, q, cache, kvb, &h.b, 0, nd, &d);
        fast->ops->mla_attn(fast, o2, q, cache, kvb, &h.b, 0, nd, &d);
        ref->ops->mla_attn(ref, o1, q, cache, kvb, &h.b, nd, S, &d);
        fast->ops->mla_attn(fast, o2, q, cache, kvb, &h.b, nd, S, &d);
        cmp(v ? "mla_attn (3 heads)" : "mla_attn (16 heads)", o2, o1, (size_t)T * H * d.v_dim, TOL);
        free(cache), free(lat), free(q), free(kvb), free(o1), free(o2);
    }
}

int main(void) {
    test_rng = 0x2545F4914F6CDD1Dull;
    int best = fast_detect(), runs = 0;
    printf("this CPU: %s\n", fast_isa_name(best));
    for (int i = FAST_SCALAR; i <= best; i++) {
        CHECK(cpu_backend_create(2, 1, -1, &ref) == 0);
        CHECK(cpu_backend_create(2, 0, i, &fast) == 0);
        isa = fast_isa_name(i);
        values = 0;
        test_matmul();
        test_norms();
        test_mamba();
        test_attention();
        test_qk_norm_rope();
        test_matmul_act_mul();
        test_router();
        test_mla();
        test_kda();
        test_kda_chunks();
        test_moe();
        printf("%-12s %ld values compared against the reference\n", isa, values);
        CHECKF(values > 0, "%s: nothing compared", isa);
        backend_free(fast);
        backend_free(ref);
        runs++;
    }
    CHECK(runs >= 1);
    return test_summary("cpu_fast_ops");
}
