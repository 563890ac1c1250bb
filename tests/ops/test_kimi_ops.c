// test_kimi_ops.c - Kimi-Linear's CPU reference ops against independent
// naive versions:
//   kda_gate == -exp(A_log[h]) softplus(g + dt_bias), channel by channel;
//   kda_prefill == the gated delta rule written as matrices,
//     S' = (I - beta k k^T) diag(exp g) S + beta k v^T,  y = S'^T q
//   (fresh slots with garbage, continued slots, a checkpoint inside a
//   prefill); a prefill split over two steps == one; repeated kda_decode ==
//   kda_prefill; head_norm_gate; MLA over cached latents (absorbed) ==
//   attention over keys and values expanded per head (scattered blocks).
#include <math.h>

#include "backend/backend.h"
#include "core/common.h"
#include "op_util.h"
#include "test.h"

static double softplus_d(double x) { return x > 20 ? x : log1p(exp(x)); }

static void test_kda_gate(struct backend *be) {
    struct kda_dims d = {3, 4, 4, 64};
    int H = d.heads, K = d.head_dim, n = 5;
    float g[60], g0[60], A_log[3], dtb[12];
    test_fill(g0, 60, 3.0f), test_fill(A_log, 3, 1.0f), test_fill(dtb, 12, 1.0f);
    memcpy(g, g0, sizeof g);
    be->ops->kda_gate(be, g, A_log, dtb, n, &d);
    double err = 0;
    int distinct = 0;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < K; i++) {
                int k = (t * H + h) * K + i;
                double want = -exp(A_log[h]) * softplus_d((double)g0[k] + dtb[h * K + i]);
                err = fmax(err, fabs(g[k] - want) / fmax(1e-6, fabs(want)));
                distinct += i > 0 && g[k] != g[k - 1];
            }
    printf("kda_gate vs the formula, channel by channel: rel err %.2e (%d channels differ from their neighbour)\n", err,
           distinct);
    CHECK(err < 1e-5 && distinct > 0);
}

// The delta rule in matrix form, in double: per head S [K, K] (key i, value j).
static void kda_naive(double *S, const float *row, const float *g, float *y, int H, int K, int h) {
    double q[16], k[16], nq = 0, nk = 0, M[256], A[256];
    for (int i = 0; i < K; i++) nq += (double)row[h * K + i] * row[h * K + i], nk += (double)row[H * K + h * K + i] * row[H * K + h * K + i];
    for (int i = 0; i < K; i++) q[i] = row[h * K + i] / sqrt(nq + 1e-6) / sqrt((double)K), k[i] = row[H * K + h * K + i] / sqrt(nk + 1e-6);
    const float *v = row + 2 * H * K + h * K;
    double beta = 1 / (1 + exp(-(double)row[3 * H * K + h]));
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++) M[i * K + j] = exp(g[h * K + i]) * S[i * K + j], A[i * K + j] = (i == j) - beta * k[i] * k[j];
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++) {
            double acc = beta * k[i] * v[j];
            for (int l = 0; l < K; l++) acc += A[i * K + l] * M[l * K + j];
            S[i * K + j] = acc;
        }
    for (int j = 0; j < K; j++) {
        double acc = 0;
        for (int i = 0; i < K; i++) acc += S[i * K + j] * q[i];
        y[h * K + j] = (float)acc;
    }
}

static void test_kda(struct backend *be) {
    struct kda_dims d = {2, 8, 4, 4};
    int H = d.heads, K = d.head_dim, HK = H * K, ld = 3 * HK + H + 3, slots = 5;
    int qlen[] = {11, 1, 6}, ctx[] = {0, 0, 5}, slot[] = {2, 0, 3}, src[] = {-1, -1, 1}, S = 3;
    struct test_batch hb;
    test_batch_make(&hb, S, qlen, ctx, slot, src, 0);
    hb.ck_start[0] = 0, hb.ck_start[1] = 1, hb.ck_start[2] = 1, hb.ck_start[3] = 1; // seq 0: a checkpoint at 8
    hb.ck_pos[0] = 8, hb.ck_slot[0] = 4;
    int T = hb.b.num_tokens;
    size_t hs = (size_t)H * K * K, sn = slots * hs;
    float *x = xmalloc(sizeof(float) * T * ld), *g = xmalloc(sizeof(float) * T * HK);
    float *y = xcalloc((size_t)T * HK, sizeof(float)), *ry = xcalloc((size_t)T * HK, sizeof(float));
    float *st0 = xmalloc(sizeof(float) * sn), *st = xmalloc(sizeof(float) * sn);
    test_fill(x, (size_t)T * ld, 1.0f);
    for (int i = 0; i < T * HK; i++) g[i] = -(float)softplus_d(2.0 * test_frand()) * 0.5f; // log-decays < 0
    test_fill(st0, sn, 0.5f); // garbage a fresh slot must hide; slot 1 is seq 2's initial state
    memcpy(st, st0, sizeof(float) * sn);
    be->ops->kda_prefill(be, y, x, ld, g, st, &hb.b, 0, S, &d);
    double *rs = xmalloc(sizeof(double) * sn), *ck = xmalloc(sizeof(double) * hs);
    for (size_t i = 0; i < sn; i++) rs[i] = st0[i];
    for (int s = 0; s < S; s++) {
        double *Sx = rs + (size_t)slot[s] * hs;
        for (size_t i = 0; i < hs; i++) Sx[i] = src[s] < 0 ? 0 : rs[(size_t)src[s] * hs + i];
        for (int t = hb.qsl[s]; t < hb.qsl[s + 1]; t++) {
            for (int h = 0; h < H; h++) kda_naive(Sx + (size_t)h * K * K, x + (size_t)t * ld, g + (size_t)t * HK, ry + (size_t)t * HK, H, K, h);
            if (s == 0 && t == 7) memcpy(ck, Sx, sizeof(double) * hs);
        }
    }
    float *rsf = xmalloc(sizeof(float) * sn), *ckf = xmalloc(sizeof(float) * hs);
    for (size_t i = 0; i < sn; i++) rsf[i] = (float)rs[i];
    for (size_t i = 0; i < hs; i++) ckf[i] = (float)ck[i];
    double ey = test_max_rel(y, ry, (size_t)T * HK), e0 = test_max_rel(st + 2 * hs, rsf + 2 * hs, hs),
           e2 = test_max_rel(st + 3 * hs, rsf + 3 * hs, hs), ec = test_max_rel(st + 4 * hs, ckf, hs);
    printf("kda_prefill vs the matrix-form delta rule: y %.2e, states %.2e %.2e, checkpoint %.2e\n", ey, e0, e2, ec);
    CHECK(ey < 1e-5 && e0 < 1e-5 && e2 < 1e-5 && ec < 1e-5);

    // seq 0 over two steps (7 tokens, then 4 continuing its slot) == in one
    float *y2 = xcalloc((size_t)T * HK, sizeof(float)), *st2 = xmalloc(sizeof(float) * sn);
    memcpy(st2, st0, sizeof(float) * sn);
    int q1[] = {7}, c1[] = {0}, s1[] = {2}, src1[] = {-1}, q2[] = {4}, c2[] = {7}, src2[] = {2};
    struct test_batch a, b2;
    test_batch_make(&a, 1, q1, c1, s1, src1, 0);
    test_batch_make(&b2, 1, q2, c2, s1, src2, 0);
    be->ops->kda_prefill(be, y2, x, ld, g, st2, &a.b, 0, 1, &d);
    be->ops->kda_prefill(be, y2 + 7 * HK, x + 7 * ld, ld, g + 7 * HK, st2, &b2.b, 0, 1, &d);
    double es = test_max_rel(y2, y, 11 * (size_t)HK), ess = test_max_rel(st2 + 2 * hs, st + 2 * hs, hs);
    printf("kda_prefill over two steps vs one: y %.2e, state %.2e\n", es, ess);
    CHECK(es < 1e-6 && ess < 1e-6);

    // seq 0 as 11 decode steps from a zeroed slot == the prefill
    float *y3 = xcalloc((size_t)T * HK, sizeof(float));
    memset(st2 + 2 * hs, 0, sizeof(float) * hs);
    for (int i = 0; i < 11; i++) {
        int one[] = {1}, ci[] = {i}, own[] = {2};
        struct test_batch db;
        test_batch_make(&db, 1, one, ci, s1, own, 1);
        be->ops->kda_decode(be, y3 + (size_t)i * HK, x + (size_t)i * ld, ld, g + (size_t)i * HK, st2, &db.b, &d);
    }
    double ed = test_max_rel(y3, y, 11 * (size_t)HK), eds = test_max_rel(st2 + 2 * hs, st + 2 * hs, hs);
    printf("kda_decode x 11 vs kda_prefill: y %.2e, state %.2e\n", ed, eds);
    CHECK(ed < 1e-6 && eds < 1e-6);

    // head_norm_gate: rmsnorm per head times w times sigmoid(gate)
    float w[8], z[2 * 16], o[2 * 16];
    test_fill(w, 8, 1.0f), test_fill(z, 32, 2.0f);
    memcpy(o, y, sizeof o);
    be->ops->head_norm_gate(be, o, z, w, 2, H, K, 1e-5f);
    double en = 0;
    for (int r = 0; r < 2 * H; r++) {
        double ss = 0;
        for (int i = 0; i < K; i++) ss += (double)y[r * K + i] * y[r * K + i];
        for (int i = 0; i < K; i++) {
            double want = y[r * K + i] / sqrt(ss / K + 1e-5) * w[i] / (1 + exp(-(double)z[r * K + i]));
            en = fmax(en, fabs(o[r * K + i] - want));
        }
    }
    printf("head_norm_gate vs the formula: abs err %.2e\n", en);
    CHECK(en < 1e-5);
    free(x), free(g), free(y), free(ry), free(st0), free(st), free(rs), free(ck), free(rsf), free(ckf), free(y2),
        free(st2), free(y3);
}

static void test_mla(struct backend *be) {
    struct mla_dims d = {3, 4, 2, 5, 6, 4, 0};
    int H = d.heads, N = d.nope, P = d.rope, V = d.v_dim, R = d.rank, W = R + P, bs = d.block_size, S = 3, nb = 12;
    d.scale = 1.0f / sqrtf((float)(N + P));
    int qlen[] = {1, 5, 3}, ctx[] = {6, 0, 2}, slot[] = {0, 0, 0}, src[] = {0, -1, 0};
    struct test_batch hb;
    test_batch_make(&hb, S, qlen, ctx, slot, src, 1); // seq 0 decodes
    int mb = 3;
    hb.b.max_blocks_per_seq = mb;
    for (int s = 0; s < S; s++)
        for (int j = 0; j < mb; j++) hb.btab[s * mb + j] = (s * mb + j) * 5 % nb; // scattered
    int T = hb.b.num_tokens;
    for (int s = 0, t = 0; s < S; s++)
        for (int i = 0; i < qlen[s]; i++, t++) hb.slot_map[t] = hb.btab[s * mb + (ctx[s] + i) / bs] * bs + (ctx[s] + i) % bs;
    float *cache = xcalloc((size_t)nb * bs * W, sizeof(float)), dense[3][12][11];
    for (int s = 0; s < S; s++)
        for (int p = 0; p < 12; p++)
            for (int e = 0; e < W; e++) dense[s][p][e] = test_frand();
    for (int s = 0; s < S; s++)
        for (int p = 0; p < ctx[s]; p++)
            memcpy(cache + ((size_t)hb.btab[s * mb + p / bs] * bs + p % bs) * W, dense[s][p], sizeof(float) * W);
    float *lat = xmalloc(sizeof(float) * T * (W + 1)), *q = xmalloc(sizeof(float) * T * H * (N + P));
    float *kvb = xmalloc(sizeof(float) * H * (N + V) * R), *out = xcalloc((size_t)T * H * V, sizeof(float));
    test_fill(lat, (size_t)T * (W + 1), 1.0f), test_fill(q, (size_t)T * H * (N + P), 1.0f), test_fill(kvb, (size_t)H * (N + V) * R, 0.5f);
    for (int s = 0, t = 0; s < S; s++)
        for (int i = 0; i < qlen[s]; i++, t++) memcpy(dense[s][ctx[s] + i], lat + (size_t)t * (W + 1), sizeof(float) * W);
    be->ops->mla_kv_write(be, cache, lat, W + 1, &hb.b, &d);
    be->ops->mla_attn(be, out, q, cache, kvb, &hb.b, 0, 1, &d);
    be->ops->mla_attn(be, out, q, cache, kvb, &hb.b, 1, S, &d);
    // expanded: k_h = [W_kb_h c | k_r], v_h = W_vb_h c, softmax attention per head
    float *ref = xcalloc((size_t)T * H * V, sizeof(float));
    for (int s = 0, t = 0; s < S; s++)
        for (int i = 0; i < qlen[s]; i++, t++)
            for (int h = 0; h < H; h++) {
                const float *wk = kvb + (size_t)h * (N + V) * R, *wv = wk + (size_t)N * R, *qh = q + ((size_t)t * H + h) * (N + P);
                int n = ctx[s] + i + 1;
                double sc[12], mx = -1e30, sum = 0, vals[12][8];
                for (int j = 0; j < n; j++) {
                    const float *c = dense[s][j];
                    double dot = 0;
                    for (int e = 0; e < N; e++) {
                        double k = 0;
                        for (int r = 0; r < R; r++) k += (double)wk[e * R + r] * c[r];
                        dot += qh[e] * k;
                    }
                    for (int e = 0; e < P; e++) dot += (double)qh[N + e] * c[R + e];
                    for (int e = 0; e < V; e++) {
                        vals[j][e] = 0;
                        for (int r = 0; r < R; r++) vals[j][e] += (double)wv[e * R + r] * c[r];
                    }
                    sc[j] = dot * d.scale;
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j < n; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int e = 0; e < V; e++) {
                    double o = 0;
                    for (int j = 0; j < n; j++) o += sc[j] / sum * vals[j][e];
                    ref[((size_t)t * H + h) * V + e] = (float)o;
                }
            }
    double err = test_max_rel(out, ref, (size_t)T * H * V);
    printf("MLA over cached latents (absorbed) vs expanded per-head attention: rel err %.2e over %d tokens\n", err, T);
    CHECK(err < 1e-5 && T == 9);
    free(cache), free(lat), free(q), free(kvb), free(out), free(ref);
}

int main(void) {
    struct backend *be;
    if (backend_cpu_create(2, DT_F32, &be)) return 1;
    test_kda_gate(be);
    test_kda(be);
    test_mla(be);
    backend_free(be);
    return test_summary("kimi ops");
}
