// test_cuda_ops.c - every CUDA op against its CPU reference op of the same
// name, on random inputs at real shapes (Nemotron-3-Nano: hidden 2688, 64
// Mamba heads of 64, state 128, 8 groups, 128 experts top-6, 32/2 heads of
// 128; Kimi-Linear-48B's KDA and MLA). fp32 weights: relative error <= 1e-5; bf16: the tolerances vLLM's
// tests use for these ops (2e-2). The quantized experts: test_cuda_moe_quant.c. Exits 77 (skip) without
// a GPU.
#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "core/common.h"
#include "cuda/cuda_pair.h"
#include "io/dtype.h"
#include "op_util.h"
#include "test.h"

// A batch whose arrays live on both backends.
struct tb {
    struct batch c, g;
    struct pair arr;
    int32_t *h;
};
enum { QSL, SEQ, CTX, POS, SLOT_MAP, BTAB, STATE, SRC, CK_START, CK_POS, CK_SLOT, CK_DST, NARR };

// Prefix caching's part of a batch: per sequence its state_src (-2: its own
// slot when init, else -1) and checkpoint writes; per decode row 1 + the
// checkpoint slot that also gets its new state (batch.ckpt_dst; 0: none).
struct tb_ckpt {
    int src[16], num[16], pos[16], slot[16], dst1[16];
};

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }
// State slots of a batch of n sequences: 16, or a multiple of 16 coprime
// with 5 that holds them all (the live slots are (s * 5 + 3) % tb_slots).
static int tb_slots(int n) {
    int S = n <= 16 ? 16 : 16 * ((n + 15) / 16);
    return S % 5 ? S : S + 16;
}
static int cdiv_i(int a, int b) { return (a + b - 1) / b; }

static void make_tb(struct tb *t, int n, const int *qlen, const int *ctx, const int *init, int nd, int block_size,
                    int mbps, const struct tb_ckpt *ck) {
    int T = 0, nck = 0;
    for (int s = 0; s < n; s++) T += qlen[s], nck += ck ? ck->num[s] : 0;
    size_t sz[NARR] = {(size_t)n + 1, (size_t)n, (size_t)n, (size_t)T, (size_t)T, (size_t)n * mbps, (size_t)n, (size_t)n,
                       (size_t)n + 1, (size_t)nck + 1, (size_t)nck + 1, (size_t)n};
    size_t off[NARR], tot = 0;
    for (int i = 0; i < NARR; i++) off[i] = tot, tot += sz[i];
    int32_t *h = t->h = xcalloc(tot, sizeof(int32_t));
    int mul = 7; // scattered blocks: a multiplier coprime with the pool, so no two sequences share one
    while (gcd(mul, n * mbps) != 1) mul += 2;
    for (int s = 0, tk = 0; s < n; s++) {
        h[off[QSL] + s] = tk;
        h[off[CTX] + s] = ctx[s];
        h[off[SEQ] + s] = ctx[s] + qlen[s];
        h[off[STATE] + s] = (s * 5 + 3) % tb_slots(n); // scattered slots
        h[off[SRC] + s] = ck && ck->src[s] != -2 ? ck->src[s] : init[s] ? h[off[STATE] + s] : -1;
        h[off[CK_START] + s + 1] = h[off[CK_START] + s] + (ck ? ck->num[s] : 0);
        h[off[CK_DST] + s] = ck && s < nd ? ck->dst1[s] - 1 : -1;
        for (int j = 0; j < mbps; j++) h[off[BTAB] + s * mbps + j] = (int)((int64_t)(s * mbps + j) * mul % (n * mbps));
        for (int i = 0; i < qlen[s]; i++, tk++) {
            int p = ctx[s] + i;
            h[off[POS] + tk] = p;
            h[off[SLOT_MAP] + tk] = h[off[BTAB] + s * mbps + p / block_size] * block_size + p % block_size;
        }
    }
    h[off[QSL] + n] = T;
    for (int k = 0; k < nck; k++) h[off[CK_POS] + k] = ck->pos[k], h[off[CK_SLOT] + k] = ck->slot[k];
    t->arr = up(h, tot * sizeof(int32_t));
    struct batch *bs[2] = {&t->c, &t->g};
    for (int k = 0; k < 2; k++) {
        int32_t *d = k ? t->arr.g : t->arr.c;
        struct batch *b = bs[k];
        memset(b, 0, sizeof *b);
        b->num_tokens = T, b->num_seqs = n, b->num_decodes = nd, b->num_prefills = n - nd;
        b->max_blocks_per_seq = mbps;
        b->query_start_loc = d + off[QSL], b->seq_lens = d + off[SEQ], b->context_lens = d + off[CTX];
        b->positions = d + off[POS], b->slot_mapping = d + off[SLOT_MAP], b->block_tables = d + off[BTAB];
        b->state_slots = d + off[STATE], b->state_src = d + off[SRC];
        b->ckpt_start = d + off[CK_START], b->ckpt_pos = d + off[CK_POS], b->ckpt_slot = d + off[CK_SLOT];
        b->ckpt_dst = d + off[CK_DST];
        b->h_query_start_loc = h + off[QSL], b->h_seq_lens = h + off[SEQ], b->h_context_lens = h + off[CTX];
        b->h_state_slots = h + off[STATE], b->h_state_src = h + off[SRC];
    }
}
static void free_tb(struct tb *t) {
    pfree(t->arr);
    free(t->h);
}

// rmsnorm / add_rmsnorm at every width class of the CUDA kernels: the row
// in registers (1, 2, 4 or 8 float4 per thread), a width not a multiple of
// 4 and one too wide for registers (the looping kernel); in place as the
// final norm runs it.
static void test_norm_dims(void) {
    static const int dims[] = {2688, 5120, 8192, 12288, 30000, 36, 70};
    int T = 5;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        int D = dims[i];
        float *x = test_rnd((size_t)T * D, 1), *r = test_rnd((size_t)T * D, 1), *w = test_rnd(D, 1);
        struct pair px = up(x, sizeof(float) * T * D), pr = up(r, sizeof(float) * T * D), pw = up(w, sizeof(float) * D);
        struct pair po = up(x, sizeof(float) * T * D);
        char name[64];
        cpu->ops->add_rmsnorm(cpu, pr.c, px.c, po.c, pw.c, T, D, 1e-5f);
        gpu->ops->add_rmsnorm(gpu, pr.g, px.g, po.g, pw.g, T, D, 1e-5f);
        snprintf(name, sizeof name, "add_rmsnorm d=%d (out)", D);
        cmp(name, po, (size_t)T * D, 1e-5);
        snprintf(name, sizeof name, "add_rmsnorm d=%d (residual)", D);
        cmp(name, pr, (size_t)T * D, 1e-6);
        cpu->ops->rmsnorm(cpu, pr.c, pr.c, pw.c, T, D, 1e-5f);
        gpu->ops->rmsnorm(gpu, pr.g, pr.g, pw.g, T, D, 1e-5f);
        snprintf(name, sizeof name, "rmsnorm d=%d in place", D);
        cmp(name, pr, (size_t)T * D, 1e-5);
        pfree(px), pfree(pr), pfree(pw), pfree(po);
        free(x), free(r), free(w);
    }
}

static void test_dense(void) {
    int T = 37, D = 2688, N = 4096;
    float *x = test_rnd((size_t)T * D, 1), *r = test_rnd((size_t)T * D, 1), *w = test_rnd(D, 1);
    struct pair px = up(x, sizeof(float) * T * D), pr = up(r, sizeof(float) * T * D), pw = up(w, sizeof(float) * D);
    struct pair po = up(x, sizeof(float) * T * D);
    cpu->ops->rmsnorm(cpu, po.c, px.c, pw.c, T, D, 1e-5f);
    gpu->ops->rmsnorm(gpu, po.g, px.g, pw.g, T, D, 1e-5f);
    cmp("rmsnorm", po, (size_t)T * D, 1e-5);
    cpu->ops->add_rmsnorm(cpu, pr.c, px.c, po.c, pw.c, T, D, 1e-5f);
    gpu->ops->add_rmsnorm(gpu, pr.g, px.g, po.g, pw.g, T, D, 1e-5f);
    cmp("add_rmsnorm (out)", po, (size_t)T * D, 1e-5);
    cmp("add_rmsnorm (residual)", pr, (size_t)T * D, 1e-6);
    const char *acts[] = {"relu2", "silu", "gelu_tanh"};
    for (int k = ACT_RELU2; k <= ACT_GELU_TANH; k++) {
        char name[64];
        cpu->ops->act(cpu, k, pr.c, (int64_t)T * D);
        gpu->ops->act(gpu, k, pr.g, (int64_t)T * D);
        cpu->ops->add(cpu, pr.c, px.c, (int64_t)T * D);
        gpu->ops->add(gpu, pr.g, px.g, (int64_t)T * D);
        snprintf(name, sizeof name, "act %s + add", acts[k]);
        cmp(name, pr, (size_t)T * D, 1e-6);
        cpu->ops->act_mul(cpu, k, po.c, pr.c, T, D / 2); // gate | up halves of each row
        gpu->ops->act_mul(gpu, k, po.g, pr.g, T, D / 2);
        snprintf(name, sizeof name, "act_mul %s", acts[k]);
        cmp(name, po, (size_t)T * D / 2, 1e-6);
    }
    { // rope over q | k (32 + 8 heads of 128, Qwen3-8B's), positions up to 40000; head norms
        int ld = 40 * 128 + 1024, hd = 128, maxp = 40000;
        float *tab = test_rnd((size_t)maxp * hd, 1), *q = test_rnd((size_t)T * ld, 2);
        int32_t pos[37];
        for (int t = 0; t < T; t++) pos[t] = (t * 7919) % maxp;
        struct pair pt = up(tab, sizeof(float) * maxp * hd), pq = up(q, sizeof(float) * T * ld), pp = up(pos, sizeof pos);
        struct pair phw = up(w, sizeof(float) * hd);
        cpu->ops->head_rmsnorm(cpu, pq.c, ld, T, 32, hd, phw.c, 1e-6f);
        gpu->ops->head_rmsnorm(gpu, pq.g, ld, T, 32, hd, phw.g, 1e-6f);
        cpu->ops->rope(cpu, pq.c, ld, T, 40, hd, pt.c, pp.c);
        gpu->ops->rope(gpu, pq.g, ld, T, 40, hd, pt.g, pp.g);
        cmp("head_rmsnorm + rope", pq, (size_t)T * ld, 1e-5);
        pfree(pt), pfree(pq), pfree(pp), pfree(phw);
        free(tab), free(q);
    }
    { // head norms wider than a warp's 8 loads a lane (MLA's 512-wide latent in rows of 576) and odd sizes
        int shapes[3][3] = {{576, 1, 512}, {3 * 72 + 5, 3, 72}, {300, 1, 300}}; // ld, heads, head_dim
        for (int i = 0; i < 3; i++) {
            int ld = shapes[i][0], nh = shapes[i][1], hd = shapes[i][2];
            float *xn = test_rnd((size_t)T * ld, 10 + i), *hw = test_rnd((size_t)hd, 20 + i);
            struct pair pn = up(xn, sizeof(float) * T * ld), pw = up(hw, sizeof(float) * hd);
            cpu->ops->head_rmsnorm(cpu, pn.c, ld, T, nh, hd, pw.c, 1e-5f);
            gpu->ops->head_rmsnorm(gpu, pn.g, ld, T, nh, hd, pw.g, 1e-5f);
            char name[64];
            snprintf(name, sizeof name, "head_rmsnorm %d x %d in rows of %d", nh, hd, ld);
            cmp(name, pn, (size_t)T * ld, 1e-5);
            pfree(pn), pfree(pw), free(xn), free(hw);
        }
    }
    double sc = cpu->ops->sum_sq(cpu, px.c, (int64_t)T * D), sg = gpu->ops->sum_sq(gpu, px.g, (int64_t)T * D);
    CHECKF(fabs(sc - sg) / sc < 1e-5, "sum_sq %g vs %g", sc, sg);
    int32_t rows[5] = {3, 0, 36, 17, 3};
    struct pair prow = up(rows, sizeof rows), pg = up(x, sizeof(float) * 5 * D);
    cpu->ops->gather_rows(cpu, pg.c, px.c, prow.c, 5, D);
    gpu->ops->gather_rows(gpu, pg.g, px.g, prow.g, 5, D);
    cmp("gather_rows", pg, (size_t)5 * D, 0);

    // matmul, fp32, bf16 and fp16 weights, with and without a bias; embedding
    float *wm = test_rnd((size_t)N * D, 0.05f), *bias = test_rnd(N, 1);
    struct weight wc, wg, wb, wh;
    weight_from_f32(cpu, &wc, WF_F32, wm, N, D);
    weight_from_f32(gpu, &wg, WF_F32, wm, N, D);
    weight_from_f32(gpu, &wb, WF_BF16, wm, N, D);
    weight_from_f32(gpu, &wh, WF_F16, wm, N, D);
    struct pair py = up(wm, sizeof(float) * T * N), pbias = up(bias, sizeof(float) * N);
    int ns[3] = {1, 7, T};
    for (int k = 0; k < 6; k++) {
        char name[64];
        int n = ns[k % 3], b = k >= 3;
        wc.bias = b ? pbias.c : NULL, wg.bias = wb.bias = wh.bias = b ? pbias.g : NULL;
        cpu->ops->matmul(cpu, py.c, px.c, &wc, n);
        gpu->ops->matmul(gpu, py.g, px.g, &wg, n);
        snprintf(name, sizeof name, "matmul fp32 n=%d%s", n, b ? " +bias" : "");
        cmp(name, py, (size_t)n * N, 1e-5);
        gpu->ops->matmul(gpu, py.g, px.g, &wb, n);
        snprintf(name, sizeof name, "matmul bf16 n=%d%s", n, b ? " +bias" : "");
        cmp(name, py, (size_t)n * N, 2e-2);
        gpu->ops->matmul(gpu, py.g, px.g, &wh, n);
        snprintf(name, sizeof name, "matmul fp16 n=%d%s", n, b ? " +bias" : "");
        cmp(name, py, (size_t)n * N, 2e-3);
    }
    wc.bias = wg.bias = wb.bias = wh.bias = NULL;
    int32_t ids[6] = {5, 4095, 0, 77, 5, 1000};
    struct pair pid = up(ids, sizeof ids), pe = up(x, sizeof(float) * 6 * D);
    cpu->ops->embed(cpu, pe.c, &wc, pid.c, 6);
    gpu->ops->embed(gpu, pe.g, &wg, pid.g, 6);
    cmp("embed", pe, (size_t)6 * D, 0);
    int32_t table[8] = {9, 8, 7, 6, 5, 4, 3, 2}, src[4] = {7, 0, 3, 3}, got[4];
    struct pair ptab = up(table, sizeof table), psrc = up(src, sizeof src), pids = up(src, sizeof src);
    gpu->ops->gather_ids(gpu, pids.g, ptab.g, psrc.g, 4);
    gpu->ops->download(gpu, got, pids.g, sizeof got);
    CHECK(got[0] == 2 && got[1] == 9 && got[2] == 6 && got[3] == 6);
    cpu->ops->free(cpu, wc.data);
    gpu->ops->free(gpu, wg.data);
    gpu->ops->free(gpu, wb.data);
    gpu->ops->free(gpu, wh.data);
    struct pair all[] = {px, pr, pw, po, prow, pg, py, pid, pe, ptab, psrc, pids, pbias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
    free(x), free(r), free(w), free(wm), free(bias);
}

// A Mamba2 layer's random inputs on both sides: zxbcdt [T, ld], conv weight
// [C, K] and bias, conv states [S, K-1, C], SSM states [S, H, P, N], A < 0,
// D, dt bias, norm weight [I]; y and the normed output [T, I].
struct mamba_io {
    struct pair zx, cw, cb, cs, ss, A, D, dt, nw, y, yn;
};

static struct mamba_io mamba_io_make(const struct mamba_dims *d, int T, int S) {
    int H = d->heads, P = d->head_dim, N = d->state, I = H * P, C = d->conv_dim, K = d->conv_kernel, ld = I + C + H;
    float *zx = test_rnd((size_t)T * ld, 1), *cw = test_rnd((size_t)C * K, 0.5f), *cb = test_rnd(C, 0.2f);
    float *cs = test_rnd((size_t)S * (K - 1) * C, 1), *ss = test_rnd((size_t)S * H * P * N, 0.5f);
    float *A = test_rnd(H, 1), *Dv = test_rnd(H, 1), *dtb = test_rnd(H, 1), *nw = test_rnd(I, 1);
    for (int h = 0; h < H; h++) A[h] = -expf(A[h]);
    struct mamba_io io = {up(zx, sizeof(float) * T * ld), up(cw, sizeof(float) * C * K), up(cb, sizeof(float) * C),
                          up(cs, sizeof(float) * S * (K - 1) * C), up(ss, sizeof(float) * S * H * P * N),
                          up(A, sizeof(float) * H), up(Dv, sizeof(float) * H), up(dtb, sizeof(float) * H),
                          up(nw, sizeof(float) * I), up(zx, sizeof(float) * T * I), up(zx, sizeof(float) * T * I)};
    free(zx), free(cw), free(cb), free(cs), free(ss), free(A), free(Dv), free(dtb), free(nw);
    return io;
}

static void mamba_io_free(struct mamba_io *io) {
    struct pair all[] = {io->zx, io->cw, io->cb, io->cs, io->ss, io->A, io->D, io->dt, io->nw, io->y, io->yn};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
}

static void test_mamba(void) {
    struct mamba_dims d = {64, 64, 8, 128, 4, 128, 0, 0.0f, INFINITY};
    int H = d.heads, P = d.head_dim, G = d.groups, N = d.state, I = H * P;
    d.conv_dim = I + 2 * G * N;
    int C = d.conv_dim, K = d.conv_kernel, ld = I + C + H, slots = 16;
    // 3 decodes, then prefills: fresh, continuing mid-chunk, a 1-token
    // prefill. Prefix caching: the fresh one checkpoints at 128 and 256 (into
    // slots 15, 14), the continuing one restores slot 9 and checkpoints at
    // 256 (slot 10); decodes 0 and 2 also write their new state to
    // checkpoints (slots 11, 1); the live slots are 3, 8, 13, 2, 7, 12.
    int qlen[] = {1, 1, 1, 300, 140, 1}, ctx[] = {40, 9, 500, 0, 128, 0}, init[] = {1, 1, 1, 0, 1, 0};
    struct tb_ckpt ck = {{-2, -2, -2, -2, 9, -2}, {0, 0, 0, 2, 1, 0}, {128, 256, 256}, {15, 14, 10}, {12, 0, 2}};
    struct tb t;
    make_tb(&t, 6, qlen, ctx, init, 3, 16, 40, &ck);
    int T = t.c.num_tokens;
    struct mamba_io io = mamba_io_make(&d, T, slots);
    struct pair pzx = io.zx, pcw = io.cw, pcb = io.cb, pcs = io.cs, pss = io.ss, pA = io.A, pD = io.D, pdt = io.dt,
                pnw = io.nw, py = io.y, pyn = io.yn;
    cpu->ops->conv1d_update(cpu, pzx.c, ld, pcw.c, pcb.c, pcs.c, &t.c, &d);
    gpu->ops->conv1d_update(gpu, pzx.g, ld, pcw.g, pcb.g, pcs.g, &t.g, &d);
    cpu->ops->conv1d_fwd(cpu, pzx.c, ld, pcw.c, pcb.c, pcs.c, &t.c, 3, 6, &d);
    gpu->ops->conv1d_fwd(gpu, pzx.g, ld, pcw.g, pcb.g, pcs.g, &t.g, 3, 6, &d);
    cmp("conv1d_update + conv1d_fwd", pzx, (size_t)T * ld, 1e-5);
    cmp("conv state", pcs, (size_t)slots * (K - 1) * C, 1e-6);
    cpu->ops->ssd_decode(cpu, py.c, pzx.c, ld, pdt.c, pA.c, pD.c, pss.c, &t.c, &d);
    gpu->ops->ssd_decode(gpu, py.g, pzx.g, ld, pdt.g, pA.g, pD.g, pss.g, &t.g, &d);
    cpu->ops->ssd_prefill(cpu, py.c, pzx.c, ld, pdt.c, pA.c, pD.c, pss.c, &t.c, 3, 6, &d);
    gpu->ops->ssd_prefill(gpu, py.g, pzx.g, ld, pdt.g, pA.g, pD.g, pss.g, &t.g, 3, 6, &d);
    cmp("ssd_decode + ssd_prefill (y)", py, (size_t)T * I, 1e-5);
    cmp("ssd state", pss, (size_t)slots * H * P * N, 1e-5);
    cpu->ops->gated_rmsnorm(cpu, pyn.c, py.c, pzx.c, ld, pnw.c, T, I, I / G, 1e-5f);
    gpu->ops->gated_rmsnorm(gpu, pyn.g, py.g, pzx.g, ld, pnw.g, T, I, I / G, 1e-5f);
    cmp("gated_rmsnorm", pyn, (size_t)T * I, 1e-5);
    mamba_io_free(&io);
    free_tb(&t);
}

// Four decodes (contexts of 1,101, 31, 256 and 2,001 tokens: the decode
// kernel's 64-key ranges ending inside a 16-key tile and on one) and three
// prefills, at the GQA shapes in use: 16 and 8 query heads a KV head
// (NemotronH, Qwen3), 32 (two head groups a block), 3 (a partial group), MHA
// at head_dim 64, and head_dim 20 (rows of 80 bytes in fp32: the decode
// kernel with 5 pieces a row; 40 in bf16: the generic kernel). `fixed` runs
// the decode as a recorded graph would (splits sized for max_model_len).
// Long contexts: test_cuda_attn.c.
struct attn_case {
    int heads, kv_heads, head_dim, fixed;
};

// mamba_decode (conv1d_update, ssd_decode and gated_rmsnorm of the decode
// rows [0, nd) in one op) against the reference op, twice in a row (the
// states carry): out, y, the conv outputs left in zxbcdt, both states and
// checkpoints. n - nd prefills of 5 tokens
// follow the decodes: their rows stay as they were. ckpt: decodes 0 and 2
// also write their new states to slots 11 and 1 (n <= 6).
static void test_mamba_decode(struct mamba_dims d, int norm_groups, int n, int nd, int ckpt) {
    int H = d.heads, P = d.head_dim, G = d.groups, N = d.state, I = H * P, K = d.conv_kernel;
    d.conv_dim = I + 2 * G * N;
    int C = d.conv_dim, ld = I + C + H, S = tb_slots(n);
    int qlen[64], ctx[64], init[64];
    for (int s = 0; s < n; s++) qlen[s] = s < nd ? 1 : 5, ctx[s] = 40 + 7 * s, init[s] = 1;
    struct tb_ckpt ck = {{-2, -2, -2, -2, -2, -2}, {0}, {0}, {0}, {12, 0, 2}};
    struct tb t;
    make_tb(&t, n, qlen, ctx, init, nd, 16, 8, ckpt ? &ck : NULL);
    int T = t.c.num_tokens;
    struct mamba_io io = mamba_io_make(&d, T, S);
    struct pair pzx = io.zx, pcw = io.cw, pcb = io.cb, pcs = io.cs, pss = io.ss, pA = io.A, pD = io.D, pdt = io.dt,
                pnw = io.nw, py = io.y, pyn = io.yn;
    struct mamba_params mc = {pcw.c, pcb.c, pdt.c, pA.c, pD.c, pnw.c, I / norm_groups, 1e-5f};
    struct mamba_params mg = {pcw.g, pcb.g, pdt.g, pA.g, pD.g, pnw.g, I / norm_groups, 1e-5f};
    for (int rep = 0; rep < 2; rep++) {
        cpu->ops->mamba_decode(cpu, pyn.c, py.c, pzx.c, ld, &mc, pcs.c, pss.c, &t.c, &d);
        gpu->ops->mamba_decode(gpu, pyn.g, py.g, pzx.g, ld, &mg, pcs.g, pss.g, &t.g, &d);
        char name[96];
        snprintf(name, sizeof name, "mamba_decode H%d P%d G%d/%d N%d K%d %d+%d%s%s", H, P, G, norm_groups, N, K, nd,
                 n - nd, ckpt ? " ckpt" : "", rep ? " again" : "");
        cmp(name, pyn, (size_t)T * I, 1e-5);
        cmp("  y", py, (size_t)T * I, 1e-5);
        cmp("  zxbcdt (conv outputs)", pzx, (size_t)T * ld, 1e-5);
        cmp("  conv state", pcs, (size_t)S * (K - 1) * C, 1e-6);
        cmp("  ssm state", pss, (size_t)S * H * P * N, 1e-5);
    }
    mamba_io_free(&io);
    free_tb(&t);
}


static void test_attention(const struct attn_case *ac, enum dtype kv, double tol) {
    struct attn_dims d = {ac->heads, ac->kv_heads, ac->head_dim, 16, 0, 1, 1};
    d.scale = 1.0f / sqrtf((float)d.head_dim);
    enum { NS = 7, ND = 4 };
    int qlen[NS] = {1, 1, 1, 1, 200, 5, 1}, ctx[NS] = {1100, 30, 255, 2000, 0, 700, 0}, init[NS] = {1, 1, 1, 1, 0, 1, 0};
    int mbps = 130; // 2,080 tokens
    struct tb t;
    make_tb(&t, NS, qlen, ctx, init, ND, 16, mbps, NULL);
    int T = t.c.num_tokens, qd = d.heads * d.head_dim, kvd = d.kv_heads * d.head_dim, ld = qd + 2 * kvd;
    size_t cn = (size_t)NS * mbps * 16 * kvd;
    float *kc = test_rnd(cn, 1), *vc = test_rnd(cn, 1), *qkv = test_rnd((size_t)T * ld, 1);
    gpu->kv_dtype = kv, gpu->weight_dtype = kv == DT_F32 ? WF_F32 : WF_BF16; // bf16: the flash prefill's mode
    struct pair pk = {cpu->ops->alloc(cpu, cn * 4), gpu->ops->alloc(gpu, cn * dtype_size(kv)), 0};
    struct pair pv = {cpu->ops->alloc(cpu, cn * 4), gpu->ops->alloc(gpu, cn * dtype_size(kv)), 0};
    memcpy(pk.c, kc, cn * 4), memcpy(pv.c, vc, cn * 4);
    // the context positions of every sequence, written through kv_write on both sides
    int cq[NS], zero[NS] = {0};
    for (int s = 0; s < NS; s++) cq[s] = ctx[s] + qlen[s];
    struct tb full;
    make_tb(&full, NS, cq, zero, init, 0, 16, mbps, NULL);
    int TF = full.c.num_tokens;
    float *fq = test_rnd((size_t)TF * ld, 1);
    struct pair pfq = up(fq, sizeof(float) * TF * ld);
    cpu->ops->kv_write(cpu, pk.c, pv.c, pfq.c, ld, &full.c, &d);
    gpu->ops->kv_write(gpu, pk.g, pv.g, pfq.g, ld, &full.g, &d);
    struct pair pq = up(qkv, sizeof(float) * T * ld), po = up(qkv, sizeof(float) * T * qd);
    cpu->ops->kv_write(cpu, pk.c, pv.c, pq.c, ld, &t.c, &d);
    gpu->ops->kv_write(gpu, pk.g, pv.g, pq.g, ld, &t.g, &d);
    struct attn_prep none = {0}; // qkv's k and v as kv_write wrote them
    cpu->ops->attn_decode(cpu, po.c, pq.c, ld, &none, pk.c, pv.c, &t.c, &d);
    t.g.fixed_shapes = ac->fixed, t.g.max_model_len = mbps * 16;
    gpu->ops->attn_decode(gpu, po.g, pq.g, ld, &none, pk.g, pv.g, &t.g, &d);
    t.g.fixed_shapes = 0;
    cpu->ops->attn_prefill(cpu, po.c, pq.c, ld, pk.c, pv.c, &t.c, ND, NS, &d);
    gpu->ops->attn_prefill(gpu, po.g, pq.g, ld, pk.g, pv.g, &t.g, ND, NS, &d);
    char name[96];
    snprintf(name, sizeof name, "attention %d/%d heads of %d, %s KV%s", d.heads, d.kv_heads, d.head_dim,
             kv == DT_BF16 ? "bf16" : "fp32", ac->fixed ? ", graph splits" : "");
    cmp(name, po, (size_t)T * qd, tol);
    struct pair all[] = {pk, pv, pfq, pq, po};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
    free_tb(&t), free_tb(&full);
    free(kc), free(vc), free(qkv), free(fq);
    gpu->kv_dtype = DT_F32, gpu->weight_dtype = WF_F32;
}

// Routers (grouped sigmoid, flat sigmoid, softmax with and without
// renormalization) and experts at real shapes: relu^2 at Nemotron-3-Nano's
// (128 experts top-6, I 1856, L 2688), gated SiLU at Qwen3-30B-A3B's (128
// top-8, I 768, L 2048), and widths that are not multiples of 8 (a
// tensor-parallel rank's 12).
// qk_norm_rope at the Qwen3 shapes (32/8, 32/4, 64/8 heads of 128) and
// awkward ones (MHA at head_dim 64, Llama: no norm, NemotronH: no norm nor
// positions, head_dim 24 and 256), 4 decodes and 3 prefills, one token
// without a KV slot (-1), positions up to 2,000: qk_norm_rope over the
// prefill rows (qkv in place), attn_decode with the decode rows' prologue
// (its output), and both caches against the CPU ops. bf16 KV: the caches as
// bf16 values (2e-2).
struct qkn_case {
    int heads, kv_heads, head_dim, norm, rope;
};

static void cmp_kv(const char *what, struct pair p, size_t n, enum dtype kv, double tol) {
    if (kv == DT_F32) {
        cmp(what, p, n, tol);
        return;
    }
    uint16_t *h = xmalloc(2 * n);
    float *f = xmalloc(sizeof(float) * n);
    gpu->ops->download(gpu, h, p.g, 2 * n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&f[i], &u, 4);
    }
    struct pair q = {p.c, gpu->ops->alloc(gpu, sizeof(float) * n), 0};
    gpu->ops->upload(gpu, q.g, f, sizeof(float) * n);
    cmp(what, q, n, tol);
    gpu->ops->free(gpu, q.g);
    free(h), free(f);
}

static void test_qk_norm_rope(const struct qkn_case *qc, enum dtype kv, double tol) {
    struct attn_dims d = {qc->heads, qc->kv_heads, qc->head_dim, 16, 1.0f / sqrtf((float)qc->head_dim), 1, 1};
    enum { NS = 7, ND = 4 };
    int qlen[NS] = {1, 1, 1, 1, 200, 5, 1}, ctx[NS] = {1100, 30, 255, 1999, 0, 700, 0}, init[NS] = {1, 1, 1, 1, 0, 1, 0};
    int mbps = 130, hd = d.head_dim, maxp = mbps * 16;
    struct tb t, full;
    make_tb(&t, NS, qlen, ctx, init, ND, 16, mbps, NULL);
    int T = t.c.num_tokens, qd = d.heads * hd, kvd = d.kv_heads * hd, ld = qd + 2 * kvd + 8;
    t.h[(NS + 1) + 2 * NS + T + 2] = -1; // token 2 (a decode) has no KV slot
    cpu->ops->upload(cpu, t.arr.c, t.h, t.arr.bytes);
    gpu->ops->upload(gpu, t.arr.g, t.h, t.arr.bytes);
    size_t cn = (size_t)NS * mbps * 16 * kvd;
    float *tab = test_rnd((size_t)maxp * hd, 1), *qkv = test_rnd((size_t)T * ld, 2), *w = test_rnd(2 * hd, 1);
    gpu->kv_dtype = kv;
    struct pair pk = {cpu->ops->alloc(cpu, cn * 4), gpu->ops->alloc(gpu, cn * dtype_size(kv)), 0};
    struct pair pv = {cpu->ops->alloc(cpu, cn * 4), gpu->ops->alloc(gpu, cn * dtype_size(kv)), 0};
    // every sequence's context (and the slotless token's row) written first
    int cq[NS], zero[NS] = {0};
    for (int s = 0; s < NS; s++) cq[s] = ctx[s] + qlen[s];
    make_tb(&full, NS, cq, zero, init, 0, 16, mbps, NULL);
    float *fq = test_rnd((size_t)full.c.num_tokens * ld, 1);
    struct pair pfq = up(fq, sizeof(float) * full.c.num_tokens * ld);
    cpu->ops->kv_write(cpu, pk.c, pv.c, pfq.c, ld, &full.c, &d);
    gpu->ops->kv_write(gpu, pk.g, pv.g, pfq.g, ld, &full.g, &d);
    struct pair pt = up(tab, sizeof(float) * maxp * hd), pq = up(qkv, sizeof(float) * T * ld);
    struct pair pw = up(w, sizeof(float) * 2 * hd), po = up(qkv, sizeof(float) * ND * qd);
    struct attn_prep pc = {qc->norm ? pw.c : NULL, qc->norm ? (float *)pw.c + hd : NULL, qc->rope ? pt.c : NULL, 1e-6f};
    struct attn_prep pg = {qc->norm ? pw.g : NULL, qc->norm ? (float *)pw.g + hd : NULL, qc->rope ? pt.g : NULL, 1e-6f};
    // the prefill rows' prologue, then the decode rows' in their attention
    cpu->ops->qk_norm_rope(cpu, pq.c, ld, &pc, pk.c, pv.c, &t.c, ND, &d);
    gpu->ops->qk_norm_rope(gpu, pq.g, ld, &pg, pk.g, pv.g, &t.g, ND, &d);
    cpu->ops->attn_decode(cpu, po.c, pq.c, ld, &pc, pk.c, pv.c, &t.c, &d);
    gpu->ops->attn_decode(gpu, po.g, pq.g, ld, &pg, pk.g, pv.g, &t.g, &d);
    char name[128];
    snprintf(name, sizeof name, "qk_norm_rope %d/%d of %d%s%s, %s KV: prefill rows", d.heads, d.kv_heads, hd,
             qc->norm ? " norm" : "", qc->rope ? " rope" : "", kv == DT_BF16 ? "bf16" : "fp32");
    size_t off = sizeof(float) * ND * ld; // the decode rows of qkv are scratch after attn_decode
    cmp(name, (struct pair){(char *)pq.c + off, (char *)pq.g + off, 0}, (size_t)(T - ND) * ld, 1e-5);
    cmp("  attn_decode with the decode rows' prologue", po, (size_t)ND * qd, kv == DT_F32 ? 1e-5 : tol);
    cmp_kv("  its K cache", pk, cn, kv, tol);
    cmp_kv("  its V cache", pv, cn, kv, tol);
    struct pair all[] = {pk, pv, pt, pq, pw, po, pfq};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
    free_tb(&t), free_tb(&full);
    free(tab), free(qkv), free(w), free(fq);
    gpu->kv_dtype = DT_F32;
}

// matmul_act_mul: SwiGLU's gate | up product with the bias and act(gate) *
// up in the GEMV's epilogue (bf16 / fp16, 1-4 rows), else matmul + act_mul
// (7 rows, fp32 weights): at Qwen3-30B-A3B's dense shape (2048 -> 2 x 6144)
// and an odd hidden count, with and without a bias. The fused GEMV is also
// held to the GPU's own matmul + act_mul bit for bit.
static void test_matmul_act_mul(int K, int I) {
    int N = 2 * I, nmax = 7;
    float *wm = test_rnd((size_t)N * K, 0.05f), *x = test_rnd((size_t)nmax * K, 1), *bias = test_rnd(N, 1);
    struct weight wc, wg[3];
    enum wfmt fm[3] = {WF_BF16, WF_F16, WF_F32};
    weight_from_f32(cpu, &wc, WF_F32, wm, N, K);
    for (int f = 0; f < 3; f++) weight_from_f32(gpu, &wg[f], fm[f], wm, N, K);
    struct pair px = up(x, sizeof(float) * nmax * K), pb = up(bias, sizeof(float) * N);
    struct pair pgu = up(wm, sizeof(float) * nmax * N), po = up(wm, sizeof(float) * nmax * I);
    struct pair pu = up(wm, sizeof(float) * nmax * I);
    static const char *fmn[3] = {"bf16", "fp16", "fp32"};
    for (int f = 0; f < 3; f++)
        for (int n = 1; n <= nmax; n += n < 4 ? 1 : 3)
            for (int b = 0; b < 2; b++) {
                if (b && n != 1) continue;
                wc.bias = b ? pb.c : NULL, wg[f].bias = b ? pb.g : NULL;
                cpu->ops->matmul_act_mul(cpu, ACT_SILU, po.c, px.c, &wc, n, pgu.c);
                gpu->ops->matmul_act_mul(gpu, ACT_SILU, po.g, px.g, &wg[f], n, pgu.g);
                char name[96];
                snprintf(name, sizeof name, "matmul_act_mul %s %d->2x%d n=%d%s", fmn[f], K, I, n, b ? " +bias" : "");
                cmp(name, po, (size_t)n * I, f == 0 ? 2e-2 : f == 1 ? 5e-3 : 1e-5);
                gpu->ops->matmul(gpu, pgu.g, px.g, &wg[f], n);
                gpu->ops->act_mul(gpu, ACT_SILU, pu.g, pgu.g, n, I);
                float *a = xmalloc(sizeof(float) * n * I), *c = xmalloc(sizeof(float) * n * I);
                gpu->ops->download(gpu, a, po.g, sizeof(float) * n * I);
                gpu->ops->download(gpu, c, pu.g, sizeof(float) * n * I);
                CHECKF(!memcmp(a, c, sizeof(float) * n * I), "%s: not the GPU's matmul + act_mul bit for bit", name);
                free(a), free(c);
            }
    cpu->ops->free(cpu, wc.data);
    for (int f = 0; f < 3; f++) gpu->ops->free(gpu, wg[f].data);
    struct pair all[] = {px, pb, pgu, po, pu};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
    free(wm), free(x), free(bias);
}

// matmul_act: a plain MLP's up product with the bias and act in the GEMV's
// epilogue (bf16 / fp16, 1-4 rows), else matmul + act (7 rows, fp32
// weights): relu2 at Nemotron-3 Nano's shared-expert shape (2688 -> 3712)
// and Nemotron-H-8B's MLP (4096 -> 21504, past GEMV16W_MAX_BYTES), silu at
// an odd row count, with and without a bias; the fused GEMV is
// also held to the GPU's own matmul + act bit for bit.
static void test_matmul_act(int K, int N, enum act kind) {
    int nmax = 7;
    float *wm = test_rnd((size_t)N * K, 0.05f), *x = test_rnd((size_t)nmax * K, 1), *bias = test_rnd(N, 1);
    struct weight wc, wg[3];
    enum wfmt fm[3] = {WF_BF16, WF_F16, WF_F32};
    weight_from_f32(cpu, &wc, WF_F32, wm, N, K);
    for (int f = 0; f < 3; f++) weight_from_f32(gpu, &wg[f], fm[f], wm, N, K);
    struct pair px = up(x, sizeof(float) * nmax * K), pb = up(bias, sizeof(float) * N);
    struct pair po = up(wm, sizeof(float) * nmax * N), pu = up(wm, sizeof(float) * nmax * N);
    static const char *fmn[3] = {"bf16", "fp16", "fp32"};
    float *a = xmalloc(sizeof(float) * nmax * N), *c = xmalloc(sizeof(float) * nmax * N);
    for (int f = 0; f < 3; f++)
        for (int n = 1; n <= nmax; n += n < 4 ? 1 : 3)
            for (int b = 0; b < 2; b++) {
                if (b && n != 1) continue;
                wc.bias = b ? pb.c : NULL, wg[f].bias = b ? pb.g : NULL;
                cpu->ops->matmul_act(cpu, kind, po.c, px.c, &wc, n);
                gpu->ops->matmul_act(gpu, kind, po.g, px.g, &wg[f], n);
                char name[96];
                snprintf(name, sizeof name, "matmul_act %s %s %d->%d n=%d%s", kind == ACT_RELU2 ? "relu2" : "silu",
                         fmn[f], K, N, n, b ? " +bias" : "");
                cmp(name, po, (size_t)n * N, f == 0 ? 2e-2 : f == 1 ? 5e-3 : 1e-5);
                gpu->ops->matmul(gpu, pu.g, px.g, &wg[f], n);
                gpu->ops->act(gpu, kind, pu.g, (int64_t)n * N);
                gpu->ops->download(gpu, a, po.g, sizeof(float) * n * N);
                gpu->ops->download(gpu, c, pu.g, sizeof(float) * n * N);
                CHECKF(!memcmp(a, c, sizeof(float) * n * N), "%s: not the GPU's matmul + act bit for bit", name);
            }
    free(a), free(c);
    cpu->ops->free(cpu, wc.data);
    for (int f = 0; f < 3; f++) gpu->ops->free(gpu, wg[f].data);
    struct pair all[] = {px, pb, po, pu};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
    free(wm), free(x), free(bias);
}

// The mlp op (16-bit weights past decode rows: the hidden kept in 16 bits)
// against the CPU's composed MLP (backend_mlp: matmul_act(_mul) + matmul,
// fp32 weights): relu2 at Nemotron-3 Nano's shared expert (2688 -> 3712) and
// Nemotron-H-8B's MLP (4096 -> 21504), SwiGLU at Qwen3-8B's (4096 -> 2 x
// 12288) and a small odd one. The op must take every case (a check that
// compared the composed path would prove nothing of it), and it must refuse
// decode rows and an I that is not a multiple of 8.
static void test_mlp(int K, int I, int gated, enum act act, int n) {
    int U = gated ? 2 * I : I;
    float *wu = test_rnd((size_t)U * K, 0.05f), *wd = test_rnd((size_t)K * I, 0.05f), *x = test_rnd((size_t)n * K, 1);
    static const enum wfmt fm[2] = {WF_BF16, WF_F16};
    struct weight cu_, cd, gu, gd;
    weight_from_f32(cpu, &cu_, WF_F32, wu, U, K);
    weight_from_f32(cpu, &cd, WF_F32, wd, K, I);
    struct pair px = up(x, sizeof(float) * n * K), py = up(x, sizeof(float) * n * K);
    struct pair ph = up(wu, sizeof(float) * n * I), pt = up(wu, sizeof(float) * n * U);
    for (int f = 0; f < 2; f++) {
        weight_from_f32(gpu, &gu, fm[f], wu, U, K);
        weight_from_f32(gpu, &gd, fm[f], wd, K, I);
        backend_mlp(cpu, py.c, px.c, &cu_, &cd, gated, act, ph.c, gated ? pt.c : ph.c, n);
        int took = gpu->ops->mlp(gpu, py.g, px.g, &gu, &gd, gated, act, ph.g, gated ? pt.g : ph.g, n);
        char name[96];
        snprintf(name, sizeof name, "mlp %s %s %d->%s%d n=%d", fm[f] == WF_BF16 ? "bf16" : "fp16",
                 act == ACT_RELU2 ? "relu2" : "silu", K, gated ? "2x" : "", I, n);
        CHECKF(took, "%s: the mlp op did not take it", name);
        cmp(name, py, (size_t)n * K, f == 0 ? 2e-2 : 5e-3);
        CHECKF(!gpu->ops->mlp(gpu, py.g, px.g, &gu, &gd, gated, act, ph.g, gated ? pt.g : ph.g, 4),
               "%s: the mlp op took 4 rows (the decode GEMVs')", name);
        gpu->ops->free(gpu, gu.data), gpu->ops->free(gpu, gd.data);
    }
    cpu->ops->free(cpu, cu_.data), cpu->ops->free(cpu, cd.data);
    pfree(px), pfree(py), pfree(ph), pfree(pt);
    free(wu), free(wd), free(x);
}

static void test_mlps(void) {
    test_mlp(2688, 3712, 0, ACT_RELU2, 77);
    test_mlp(4096, 21504, 0, ACT_RELU2, 40);
    test_mlp(4096, 12288, 1, ACT_SILU, 24);
    test_mlp(48, 72, 1, ACT_SILU, 300);
    struct weight u, d; // I = 71: not a multiple of 8
    float *w = test_rnd(71 * 48, 0.05f);
    weight_from_f32(gpu, &u, WF_BF16, w, 71, 48);
    weight_from_f32(gpu, &d, WF_BF16, w, 48, 71);
    struct pair px = up(w, sizeof(float) * 71 * 48);
    CHECKF(!gpu->ops->mlp(gpu, px.g, px.g, &u, &d, 0, ACT_RELU2, px.g, px.g, 8), "mlp took I = 71");
    gpu->ops->free(gpu, u.data), gpu->ops->free(gpu, d.data);
    pfree(px);
    free(w);
}

struct moe_shape {
    int E, k, I, L, gated;
    enum act act;
    int Is; // the shared expert's width
    const char *name;
};

static void test_experts(const struct moe_shape *m, struct pair pids, struct pair pw, int T) {
    int E = m->E, k = m->k, I = m->I, L = m->L, U = m->gated ? 2 * I : I;
    float *x = test_rnd((size_t)T * L, 1), *up_w = test_rnd((size_t)E * U * L, 0.03f), *down_w = test_rnd((size_t)E * L * I, 0.03f);
    struct pair px = up(x, sizeof(float) * T * L), po = up(x, sizeof(float) * T * L);
    struct moe_experts mc = {{0}, {0}, E, I, L, m->gated, m->act}, mg = mc, mb = mc;
    weight_from_f32(cpu, &mc.up, WF_F32, up_w, (int64_t)E * U, L);
    weight_from_f32(cpu, &mc.down, WF_F32, down_w, (int64_t)E * L, I);
    weight_from_f32(gpu, &mg.up, WF_F32, up_w, (int64_t)E * U, L);
    weight_from_f32(gpu, &mg.down, WF_F32, down_w, (int64_t)E * L, I);
    weight_from_f32(gpu, &mb.up, WF_BF16, up_w, (int64_t)E * U, L);
    weight_from_f32(gpu, &mb.down, WF_BF16, down_w, (int64_t)E * L, I);
    // Shared routing: every token picks token 0's experts, so each expert's
    // segment holds all n rows (random routing rarely puts two of a few
    // tokens on one expert): the GEMV's rows per weight pass must cover n.
    int32_t *ids = xmalloc(sizeof(int32_t) * T * k), *same = xmalloc(sizeof(int32_t) * T * k);
    cpu->ops->download(cpu, ids, pids.c, sizeof(int32_t) * T * k);
    for (int t = 0; t < T * k; t++) same[t] = ids[t % k];
    struct pair psame = up(same, sizeof(int32_t) * T * k);
    // the GEMV at 1, 4 and 8 rows and in passes of 8 (<= 32), the thin-tile
    // grouped GEMM (33..512: ~2 rows per expert at 33, ~9 at 200), the
    // 128-row one (T = 600); then shared routing (64: 4 thin tiles per expert)
    enum { NR = 9, NS = 13 };
    int ns[NS] = {1, 3, 7, 20, 33, 64, 96, 200, T, 3, 12, 20, 64};
    for (int i = 0; i < NS; i++) {
        char name[96];
        struct pair pi = i < NR ? pids : psame;
        const char *how = i < NR ? "" : " shared";
        cpu->ops->moe_experts(cpu, po.c, px.c, &mc, pi.c, pw.c, ns[i], k, NULL);
        gpu->ops->moe_experts(gpu, po.g, px.g, &mg, pi.g, pw.g, ns[i], k, NULL);
        snprintf(name, sizeof name, "moe_experts %s fp32 n=%d%s", m->name, ns[i], how);
        cmp(name, po, (size_t)ns[i] * L, 1e-5);
        gpu->ops->moe_experts(gpu, po.g, px.g, &mb, pi.g, pw.g, ns[i], k, NULL);
        snprintf(name, sizeof name, "moe_experts %s bf16 n=%d%s", m->name, ns[i], how);
        cmp(name, po, (size_t)ns[i] * L, 2e-2);
    }
    // + a shared expert (struct moe_shared) of width m->Is: in the GEMV's
    // launches at 1..32 tokens (1 twice: the combine's counters are back to
    // 0; 20, 32: passes of 8), its down in 1, 2, 4 or 8 slices of K by the
    // shapes' Is / I, beside the routed experts on the grouped GEMMs' paths
    // and in fp32, and beside them with fp32 shared weights (no fusion)
    int Is = m->Is, Us = m->gated ? 2 * Is : Is;
    float *s_up = test_rnd((size_t)Us * L, 0.03f), *s_down = test_rnd((size_t)L * Is, 0.03f);
    struct moe_experts sc = {{0}, {0}, 1, Is, L, m->gated, m->act}, sg = sc, sb = sc;
    weight_from_f32(cpu, &sc.up, WF_F32, s_up, Us, L);
    weight_from_f32(cpu, &sc.down, WF_F32, s_down, L, Is);
    weight_from_f32(gpu, &sg.up, WF_F32, s_up, Us, L);
    weight_from_f32(gpu, &sg.down, WF_F32, s_down, L, Is);
    weight_from_f32(gpu, &sb.up, WF_BF16, s_up, Us, L);
    weight_from_f32(gpu, &sb.down, WF_BF16, s_down, L, Is);
    float *zero = xcalloc((size_t)T * Us, sizeof(float));
    struct pair ph = up(zero, sizeof(float) * T * Is), pt = up(zero, sizeof(float) * T * Us),
                py = up(zero, sizeof(float) * T * L);
    struct moe_shared shc = {&sc, ph.c, pt.c, py.c}, shg = {&sg, ph.g, pt.g, py.g}, shb = {&sb, ph.g, pt.g, py.g};
    enum { NSH = 10 };
    int sn[NSH] = {1, 1, 3, 8, 20, 32, 64, T, 3, 3};
    for (int i = 0; i < NSH; i++) {
        char name[96];
        int f32 = i == 8, mixed = i == 9;
        cpu->ops->moe_experts(cpu, po.c, px.c, &mc, pids.c, pw.c, sn[i], k, &shc);
        gpu->ops->moe_experts(gpu, po.g, px.g, f32 ? &mg : &mb, pids.g, pw.g, sn[i], k, f32 || mixed ? &shg : &shb);
        snprintf(name, sizeof name, "moe_experts %s %s n=%d + shared %d", m->name,
                 f32 ? "fp32" : mixed ? "bf16, fp32 shared" : "bf16", sn[i], Is);
        cmp(name, po, (size_t)sn[i] * L, f32 ? 1e-5 : 2e-2);
    }
    struct weight sw[] = {sc.up, sc.down, sg.up, sg.down, sb.up, sb.down};
    for (int i = 0; i < 6; i++) (i < 2 ? cpu : gpu)->ops->free(i < 2 ? cpu : gpu, sw[i].data);
    pfree(ph), pfree(pt), pfree(py);
    free(zero), free(s_up), free(s_down);
    pfree(psame);
    free(ids), free(same);
    cpu->ops->free(cpu, mc.up.data), cpu->ops->free(cpu, mc.down.data);
    gpu->ops->free(gpu, mg.up.data), gpu->ops->free(gpu, mg.down.data);
    gpu->ops->free(gpu, mb.up.data), gpu->ops->free(gpu, mb.down.data);
    pfree(px), pfree(po);
    free(x), free(up_w), free(down_w);
}

// The router as a model runs it, the fp32 gate's matmul then moe_route, at
// real shapes (Qwen3-30B-A3B's softmax 128 top-8 from 2,048; nano30b's
// sigmoid 128 top-6 from 2,688 with its correction bias and scaling; 256
// experts in 8 groups, 4 taken, as DeepSeek-style routers; 512 experts) at
// 1 to 7 tokens: logits, ids and weights against the CPU ops.
static void test_router(void) {
    static const struct {
        int E, k, K, kind, groups, take, bias;
        float scale;
    } cases[] = {{128, 8, 2048, ROUTE_SOFTMAX_TOPK, 1, 1, 0, 1.0f}, {128, 6, 2688, ROUTE_SIGMOID_GROUPED, 1, 1, 1, 2.5f},
                 {16, 8, 64, ROUTE_SOFTMAX_TOPK, 1, 1, 0, 1.0f},    {16, 8, 64, ROUTE_SIGMOID_GROUPED, 1, 1, 0, 1.0f},
                 {256, 8, 1024, ROUTE_SOFTMAX_TOPK, 1, 1, 0, 1.0f}, {256, 8, 2304, ROUTE_SIGMOID_GROUPED, 8, 4, 1, 2.446f},
                 {512, 8, 2048, ROUTE_SOFTMAX_TOPK, 1, 1, 0, 1.0f}, {512, 8, 2048, ROUTE_SIGMOID_GROUPED, 1, 1, 1, 1.0f}};
    for (size_t si = 0; si < sizeof cases / sizeof cases[0]; si++) {
        int E = cases[si].E, k = cases[si].k, K = cases[si].K, nmax = 7;
        struct moe_route_cfg c = {cases[si].kind, E, k, cases[si].groups, cases[si].take, 1, cases[si].scale};
        float *wm = test_rnd((size_t)E * K, 0.05f), *x = test_rnd((size_t)nmax * K, 1), *bias = test_rnd(E, 0.5f);
        struct weight wc, wg;
        weight_from_f32(cpu, &wc, WF_F32, wm, E, K);
        weight_from_f32(gpu, &wg, WF_F32, wm, E, K);
        struct pair px = up(x, sizeof(float) * nmax * K), pl = up(wm, sizeof(float) * nmax * E);
        struct pair pids = up(wm, sizeof(int32_t) * nmax * k), pw = up(wm, sizeof(float) * nmax * k);
        struct pair pb = up(bias, sizeof(float) * E);
        const float *bc = cases[si].bias ? pb.c : NULL, *bg = cases[si].bias ? pb.g : NULL;
        for (int n = 1; n <= nmax; n += n < 4 ? 1 : 3) {
            cpu->ops->matmul(cpu, pl.c, px.c, &wc, n);
            cpu->ops->moe_route(cpu, pids.c, pw.c, pl.c, bc, n, &c);
            gpu->ops->matmul(gpu, pl.g, px.g, &wg, n);
            gpu->ops->moe_route(gpu, pids.g, pw.g, pl.g, bg, n, &c);
            char name[128];
            snprintf(name, sizeof name, "router %s%s %d top-%d from %d (groups %d/%d), n=%d",
                     c.kind == ROUTE_SOFTMAX_TOPK ? "softmax" : "sigmoid", bc ? "+bias" : "", E, k, K, c.topk_group,
                     c.n_group, n);
            cmp(name, pl, (size_t)n * E, 1e-5);
            int32_t *gi = xmalloc(sizeof(int32_t) * n * k);
            gpu->ops->download(gpu, gi, pids.g, sizeof(int32_t) * n * k);
            CHECKF(!memcmp(gi, pids.c, sizeof(int32_t) * n * k), "%s: expert ids differ", name);
            free(gi);
            cmp("  its weights", pw, (size_t)n * k, 1e-6);
        }
        cpu->ops->free(cpu, wc.data);
        gpu->ops->free(gpu, wg.data);
        struct pair all[] = {px, pl, pids, pw, pb};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
        free(wm), free(x), free(bias);
    }
}

// The routers, and the fp32 / bf16 experts on their routes.
static void test_moe(void) {
    int T = 600, E = 128, kmax = 8; // T > 512: the 128-row grouped GEMM
    struct moe_route_cfg cfgs[4] = {{ROUTE_SIGMOID_GROUPED, E, 6, 8, 4, 0, 1.5f},
                                    {ROUTE_SIGMOID_GROUPED, E, 6, 1, 1, 1, 2.5f},
                                    {ROUTE_SOFTMAX_TOPK, E, 8, 1, 1, 1, 1.0f},
                                    {ROUTE_SOFTMAX_TOPK, E, 8, 1, 1, 0, 1.0f}};
    const char *names[4] = {"grouped sigmoid", "sigmoid", "softmax renorm", "softmax"};
    float *lg = test_rnd((size_t)T * E, 3), *bias = test_rnd(E, 0.1f);
    struct pair pl = up(lg, sizeof(float) * T * E), pb = up(bias, sizeof(float) * E);
    struct pair pids = up(lg, sizeof(int32_t) * T * kmax), pw = up(lg, sizeof(float) * T * kmax);
    // shared widths: nano30b's (2 I), 3 I; then L = 40 (a column block
    // past L), shared K in 4 (one slice empty), 1 and 8 slices
    struct moe_shape shapes[6] = {{E, 6, 1856, 2688, 0, ACT_RELU2, 3712, "relu2 nano"},
                                  {E, 8, 768, 2048, 1, ACT_SILU, 2304, "swiglu qwen3-30b"},
                                  {E, 6, 12, 44, 1, ACT_SILU, 24, "swiglu width 12"},
                                  {E, 6, 16, 40, 1, ACT_SILU, 56, "swiglu width 16"},
                                  {E, 6, 16, 40, 0, ACT_RELU2, 8, "relu2 width 16"},
                                  {E, 6, 16, 40, 1, ACT_SILU, 136, "swiglu width 16"}};
    for (int c = 0; c < 4; c++) {
        const float *b = cfgs[c].kind == ROUTE_SIGMOID_GROUPED ? pb.c : NULL, *bg = b ? pb.g : NULL;
        int k = cfgs[c].top_k;
        cpu->ops->moe_route(cpu, pids.c, pw.c, pl.c, b, T, &cfgs[c]);
        gpu->ops->moe_route(gpu, pids.g, pw.g, pl.g, bg, T, &cfgs[c]);
        int32_t *gi = xmalloc(sizeof(int32_t) * T * k);
        gpu->ops->download(gpu, gi, pids.g, sizeof(int32_t) * T * k);
        CHECKF(!memcmp(gi, pids.c, sizeof(int32_t) * T * k), "moe_route %s: expert ids differ", names[c]);
        char name[64];
        snprintf(name, sizeof name, "moe_route weights (%s)", names[c]);
        cmp(name, pw, (size_t)T * k, 1e-6);
        free(gi);
        if (c == 1) test_experts(&shapes[0], pids, pw, T);
        if (c == 2) test_experts(&shapes[1], pids, pw, T);
        if (c == 1)
            for (int i = 2; i < 6; i++) test_experts(&shapes[i], pids, pw, T);
    }
    struct pair all[] = {pl, pb, pids, pw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
    free(lg), free(bias);
}

static void test_sample(void) {
    enum { V = 131072, R = 8, TOK = 64 };
    float *lg = test_rnd((size_t)R * V, 4);
    int32_t *table = xcalloc((size_t)R * TOK, sizeof(int32_t));
    for (int i = 0; i < R * TOK; i++) table[i] = (int32_t)(test_frand() * 0.5f * V + 0.5f * V);
    struct sample_params sp[R];
    memset(sp, 0, sizeof sp);
    for (int r = 0; r < R; r++) {
        struct sample_params *p = &sp[r];
        p->temperature = r < 2 ? 0.0f : 0.7f + 0.1f * r;
        p->top_p = r == 3 || r == 7 ? 0.9f : 1.0f;
        p->top_k = r == 4 || r == 7 ? 40 : 0;
        p->min_p = r == 5 ? 0.05f : 0.0f;
        p->repetition_penalty = r == 1 || r == 6 ? 1.3f : 1.0f;
        p->presence_penalty = r == 6 ? 0.5f : 0.0f;
        p->frequency_penalty = r == 6 ? 0.3f : 0.0f;
        p->row_base = r * TOK;
        p->num_prompt = 20;
        p->num_tokens = 40;
        p->num_logprobs = r % 2 ? 5 : -1;
        p->seed_lo = 1000 + r;
        p->step = 3;
    }
    struct pair pl = up(lg, sizeof(float) * R * V), pt = up(table, sizeof(int32_t) * R * TOK), pp = up(sp, sizeof sp);
    struct pair pi = up(table, sizeof(int32_t) * R), plp = up(lg, sizeof(float) * R), pti = up(table, sizeof(int32_t) * R * 5),
                ptl = up(lg, sizeof(float) * R * 5);
    struct batch bc = {0}, bg = {0};
    bc.num_sample = bg.num_sample = R;
    bc.sample_params = pp.c, bg.sample_params = pp.g;
    bc.h_sample_params = bg.h_sample_params = sp;
    struct sample_out oc = {pi.c, plp.c, pti.c, ptl.c, 5}, og = {pi.g, plp.g, pti.g, ptl.g, 5};
    cpu->ops->sample(cpu, pl.c, V, pt.c, &bc, &oc);
    gpu->ops->sample(gpu, pl.g, V, pt.g, &bg, &og);
    int32_t gi[R], gt[R * TOK], gti[R * 5];
    gpu->ops->download(gpu, gi, pi.g, sizeof gi);
    gpu->ops->download(gpu, gt, pt.g, sizeof gt);
    gpu->ops->download(gpu, gti, pti.g, sizeof gti);
    int same = 0, table_ok = 1;
    for (int r = 0; r < R; r++) {
        same += gi[r] == ((int32_t *)pi.c)[r];
        table_ok &= gt[r * TOK + 40] == gi[r];
        printf("  sample row %d: cpu %d gpu %d\n", r, ((int32_t *)pi.c)[r], gi[r]);
    }
    CHECKF(same == R, "sampled ids agree on %d/%d rows", same, R);
    CHECK(table_ok);
    CHECK(!memcmp(gti, pti.c, sizeof gti));
    cmp("sample logprobs", plp, R, 1e-5);
    struct pair all[] = {pl, pt, pp, pi, plp, pti, ptl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
    free(lg), free(table);
}

// The attention partials' scratch is reserved at load (OP_ATTN) for the
// longest context, and no more than decode and prefill can take: at h8b's
// shape (32/8 heads of 128, bf16 KV and weights: flash prefill) with 8,192
// rows a step, 256 sequences and a 40,000-token context, supports() takes
// under 256 MB (sized by rows alone it took 42 GB), and graph-shaped decode
// steps of 1 to 256 sequences then take no device memory (the control: on
// a fresh backend the 1-sequence step takes what its splits need).
static void test_attn_reserved(void) {
    enum { H = 32, HKV = 8, D = 128, BS = 16, LEN = 40000, T = 8192, R = 256 };
    int ld = (H + 2 * HKV) * D, mbps = cdiv_i(LEN, BS);
    struct attn_dims d = {H, HKV, D, BS, 1.0f / sqrtf((float)D), 1, 1};
    for (int reserve = 0; reserve < 2; reserve++) {
        struct backend *g;
        CHECK(backend_create("cuda", 0, DT_BF16, &g) == 0);
        g->weight_dtype = WF_BF16;
        // every sequence at position 0 of block 0; qsl [R + 1], positions [R], block tables [R, mbps]: zeros but qsl
        int32_t *h = xcalloc((size_t)2 * R + 1 + (size_t)R * mbps, sizeof(int32_t));
        for (int s = 0; s <= R; s++) h[s] = s;
        int32_t *meta = g->ops->alloc(g, sizeof(int32_t) * ((size_t)2 * R + 1 + (size_t)R * mbps));
        g->ops->upload(g, meta, h, sizeof(int32_t) * ((size_t)2 * R + 1 + (size_t)R * mbps));
        void *kc = g->ops->alloc(g, (size_t)BS * HKV * D * 2), *vc = g->ops->alloc(g, (size_t)BS * HKV * D * 2);
        float *qkv = g->ops->alloc(g, sizeof(float) * R * ld), *out = g->ops->alloc(g, sizeof(float) * R * H * D);
        int64_t free0, free1, total, took = 0;
        g->ops->sync(g);
        g->ops->mem_info(g, &free0, &total);
        if (reserve) {
            CHECK(g->ops->supports(g, &(struct op_query){.op = OP_ATTN, .attn = &d, .max_tokens = T, .max_seqs = R,
                                                         .max_seq_len = LEN}) == 0);
            g->ops->sync(g);
            g->ops->mem_info(g, &free1, &total);
            printf("  attention scratch reserved at %d rows, %d sequences, context %d: %lld MB\n", T, R, LEN,
                   (long long)((free0 - free1) >> 20));
            CHECKF(free0 - free1 < (256LL << 20), "supports(OP_ATTN) took %lld bytes", (long long)(free0 - free1));
            free0 = free1;
        }
        struct batch b = {0};
        b.fixed_shapes = 1, b.max_model_len = LEN, b.max_blocks_per_seq = mbps;
        b.query_start_loc = meta, b.positions = meta + R + 1, b.block_tables = meta + 2 * R + 1;
        b.slot_mapping = b.positions; // slot 0, the row of position 0 in block 0
        struct attn_prep none = {0};
        for (int nd = 1; nd <= (reserve ? R : 1); nd++) {
            b.num_tokens = b.num_seqs = b.num_decodes = nd;
            g->ops->attn_decode(g, out, qkv, ld, &none, kc, vc, &b, &d);
        }
        g->ops->sync(g);
        g->ops->mem_info(g, &free1, &total);
        took = free0 - free1;
        if (reserve) CHECKF(took < (2 << 20), "decode steps after OP_ATTN took %lld bytes", (long long)took);
        else CHECKF(took >= (1 << 20), "the unreserved 1-sequence step took %lld bytes", (long long)took);
        void *bufs[] = {meta, kc, vc, qkv, out};
        for (int i = 0; i < 5; i++) g->ops->free(g, bufs[i]);
        free(h);
        backend_free(g);
    }
}

// The sampler's scratch is reserved at load (OP_SAMPLE), so a step grows
// nothing: on a fresh backend a 64-row step (its work rows and penalties'
// counts: ~100 MB) takes device memory it had not (the control: the
// measurement sees it), and after supports() on another it takes none.
static void test_sample_reserved(void) {
    enum { V = 131072, R = 64, TOK = 8 };
    for (int reserve = 0; reserve < 2; reserve++) {
        struct backend *g;
        CHECK(backend_create("cuda", 0, DT_F32, &g) == 0);
        if (reserve) CHECK(g->ops->supports(g, &(struct op_query){.op = OP_SAMPLE, .max_seqs = R, .vocab = V}) == 0);
        struct sample_params sp[R];
        memset(sp, 0, sizeof sp);
        for (int r = 0; r < R; r++) sp[r].temperature = 1.0f, sp[r].top_p = 1.0f, sp[r].repetition_penalty = 1.0f,
                                    sp[r].row_base = r * TOK, sp[r].num_tokens = 1, sp[r].num_logprobs = -1;
        float *logits = g->ops->alloc(g, sizeof(float) * R * V);
        int32_t *table = g->ops->alloc(g, sizeof(int32_t) * R * TOK), *ids = g->ops->alloc(g, sizeof(int32_t) * R);
        float *lp = g->ops->alloc(g, sizeof(float) * R);
        void *params = g->ops->alloc(g, sizeof sp);
        g->ops->upload(g, params, sp, sizeof sp);
        struct batch b = {0};
        b.num_sample = R, b.fixed_shapes = 1, b.sample_params = params, b.h_sample_params = sp;
        struct sample_out o = {ids, lp, NULL, NULL, 0};
        int64_t free0, free1, total;
        g->ops->sync(g);
        g->ops->mem_info(g, &free0, &total);
        g->ops->sample(g, logits, V, table, &b, &o);
        g->ops->sync(g);
        g->ops->mem_info(g, &free1, &total);
        int64_t took = free0 - free1, need = (int64_t)R * V * 12;
        printf("  sampler step after %s: %lld MB of device memory taken\n", reserve ? "OP_SAMPLE" : "no reservation",
               (long long)(took >> 20));
        if (reserve) CHECKF(took < (4 << 20), "a step after OP_SAMPLE took %lld bytes", (long long)took);
        else CHECKF(took >= need, "the unreserved step took %lld bytes, not the %lld it needs", (long long)took,
                    (long long)need);
        void *bufs[] = {logits, table, ids, lp, params};
        for (int i = 0; i < 5; i++) g->ops->free(g, bufs[i]);
        backend_free(g);
    }
}

// The chunked KDA prefill (k_kda_chunk: pieces of 16 tokens at absolute
// positions, cut at checkpoints) against the CPU reference's recurrence
// (token by token), every sequence a prefill: from zeros 1, 15, 16, 17, 63,
// 64, 65, 197 and 1000 tokens (one piece, chunk ends, many chunks); 100
// continuing its own slot from position 37 with checkpoints at 64, 100 and
// 128 (100 cuts a chunk); 150 from position 64 off a checkpoint's copy
// (slot 23) with checkpoints at 128 and 192; 123 from position 5 with
// checkpoints at 64 and at its end (128). Log-decays near zero ([-1e-3, 0])
// and strong ([-20, 0] per token: exp(-G) of a chunk would overflow). At
// Kimi-Linear-48B's heads (32 of 128), at 4 of 64, 2 of 48 (a block's
// value columns past K) and 4 of 16 (the kimi_linear fixtures' heads, which
// the fp32 gates run), and 3 of 20 (no chunks: k_kda_step).
static void test_kda_chunks(struct backend *ref, struct kda_dims d) {
    int H = d.heads, K = d.head_dim, HK = H * K, ld = 3 * HK + H + 1, slots = 24, S = 12;
    int qlen[] = {1, 15, 16, 17, 63, 64, 65, 197, 1000, 100, 150, 123}, ctx[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 37, 64, 5};
    int init[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1};
    struct tb_ckpt ck = {{-2, -2, -2, -2, -2, -2, -2, -2, -2, -2, 23, -2}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 2, 2},
                         {64, 100, 128, 128, 192, 64, 128}, {16, 17, 18, 19, 20, 21, 22}, {0}};
    struct tb t;
    make_tb(&t, S, qlen, ctx, init, 0, 16, 64, &ck);
    int T = t.c.num_tokens;
    size_t sn = (size_t)slots * HK * K;
    for (int v = 0; v < 2; v++) {
        float depth = v ? 10.0f : 5e-4f;
        float *x = test_rnd((size_t)T * ld, 1), *g = test_rnd((size_t)T * HK, depth), *st = test_rnd(sn, 0.3f);
        float *y = test_rnd((size_t)T * HK, 1);
        for (size_t i = 0; i < (size_t)T * HK; i++) g[i] -= depth; // [-2 depth, 0]
        struct pair px = up(x, sizeof(float) * T * ld), pg = up(g, sizeof(float) * T * HK);
        struct pair pst = up(st, sizeof(float) * sn), py = up(y, sizeof(float) * T * HK);
        ref->ops->kda_prefill(ref, py.c, px.c, ld, pg.c, pst.c, &t.c, 0, S, &d);
        gpu->ops->kda_prefill(gpu, py.g, px.g, ld, pg.g, pst.g, &t.g, 0, S, &d);
        char what[2][64];
        snprintf(what[0], sizeof what[0], "kda chunks %dx%d %s: y", H, K, v ? "strong" : "weak");
        snprintf(what[1], sizeof what[1], "kda chunks %dx%d %s: states", H, K, v ? "strong" : "weak");
        cmp(what[0], py, (size_t)T * HK, 1e-5);
        cmp(what[1], pst, sn, 1e-5);
        pfree(px), pfree(pg), pfree(pst), pfree(py);
        free(x), free(g), free(st), free(y);
    }
    free_tb(&t);
}

// Kimi-Linear at Kimi-Linear-48B-A3B's shapes: KDA of 32 heads of 128 (the
// q | k | v conv through conv1d, then the recurrence with checkpoints and a
// restored slot), its gate and gated norm (MLA: test_mla).
static void test_kimi_kda(void) {
    struct kda_dims d = {32, 128, 4, 64};
    int H = d.heads, K = d.head_dim, HK = H * K, ld = 3 * HK + H + 8, slots = 16;
    struct mamba_dims conv = {.conv_kernel = 4, .chunk_size = 64, .conv_dim = 3 * HK};
    int qlen[] = {1, 1, 1, 200, 70, 1}, ctx[] = {40, 9, 500, 0, 64, 0}, init[] = {1, 1, 1, 0, 1, 0};
    // decodes 0 and 2 checkpoint their new state (conv and KDA) into slots 11 and 1
    struct tb_ckpt ck = {{-2, -2, -2, -2, 9, -2}, {0, 0, 0, 2, 1, 0}, {64, 128, 128}, {15, 14, 10}, {12, 0, 2}};
    struct tb t;
    make_tb(&t, 6, qlen, ctx, init, 3, 16, 40, &ck);
    int T = t.c.num_tokens;
    size_t sn = (size_t)slots * H * K * K;
    float *x = test_rnd((size_t)T * ld, 1), *cw = test_rnd((size_t)3 * HK * 4, 0.5f), *cs = test_rnd((size_t)slots * 3 * 3 * HK, 1);
    float *st = test_rnd(sn, 0.2f), *g = test_rnd((size_t)T * HK, 2), *Al = test_rnd(H, 1), *dtb = test_rnd(HK, 1), *w = test_rnd(K, 1);
    float *z = test_rnd((size_t)T * HK, 2);
    struct pair px = up(x, sizeof(float) * T * ld), pcw = up(cw, sizeof(float) * 3 * HK * 4);
    struct pair pcs = up(cs, sizeof(float) * slots * 3 * 3 * HK), pst = up(st, sizeof(float) * sn);
    struct pair pg = up(g, sizeof(float) * T * HK), pAl = up(Al, sizeof(float) * H), pdt = up(dtb, sizeof(float) * HK);
    struct pair pw = up(w, sizeof(float) * K), pz = up(z, sizeof(float) * T * HK), py = up(z, sizeof(float) * T * HK);
    cpu->ops->kda_gate(cpu, pg.c, pAl.c, pdt.c, T, &d);
    gpu->ops->kda_gate(gpu, pg.g, pAl.g, pdt.g, T, &d);
    cmp("kda_gate", pg, (size_t)T * HK, 1e-5);
    cpu->ops->conv1d_update(cpu, px.c, ld, pcw.c, NULL, pcs.c, &t.c, &conv);
    gpu->ops->conv1d_update(gpu, px.g, ld, pcw.g, NULL, pcs.g, &t.g, &conv);
    cpu->ops->conv1d_fwd(cpu, px.c, ld, pcw.c, NULL, pcs.c, &t.c, 3, 6, &conv);
    gpu->ops->conv1d_fwd(gpu, px.g, ld, pcw.g, NULL, pcs.g, &t.g, 3, 6, &conv);
    cmp("KDA q | k | v conv", px, (size_t)T * ld, 1e-5);
    cpu->ops->kda_decode(cpu, py.c, px.c, ld, pg.c, pst.c, &t.c, &d);
    gpu->ops->kda_decode(gpu, py.g, px.g, ld, pg.g, pst.g, &t.g, &d);
    cpu->ops->kda_prefill(cpu, py.c, px.c, ld, pg.c, pst.c, &t.c, 3, 6, &d);
    gpu->ops->kda_prefill(gpu, py.g, px.g, ld, pg.g, pst.g, &t.g, 3, 6, &d);
    cmp("kda_decode + kda_prefill (y)", py, (size_t)T * HK, 1e-5);
    cmp("KDA state (and checkpoints)", pst, sn, 1e-5);
    cpu->ops->head_norm_gate(cpu, py.c, pz.c, pw.c, T, H, K, 1e-5f);
    gpu->ops->head_norm_gate(gpu, py.g, pz.g, pw.g, T, H, K, 1e-5f);
    cmp("head_norm_gate", py, (size_t)T * HK, 1e-5);
    struct pair all[] = {px, pcw, pcs, pst, pg, pAl, pdt, pw, pz, py};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
    free_tb(&t);
    free(x), free(cw), free(cs), free(st), free(g), free(Al), free(dtb), free(w), free(z);
}

// The KDA decode step (k_kda_step: a block per 32 value columns of a head,
// its rows of the state in registers) against the CPU reference: 1, 3 and
// 64 decodes, every third also writing its new state to a checkpoint slot
// (ckpt_dst), each with a state_src naming an extra slot it must not read (a
// decode continues its own slot, as the reference), in one step with two
// prefills (kda_prefill: k_kda_chunk, or k_kda_step where the head takes no
// chunks): 1 token off a restored checkpoint's copy with a checkpoint at its
// end (64), and 5 continuing their own slot from 62 with one after their
// second token; then the decodes' next token. Log-decays in [-2, 0]. Every
// slot's state is compared: those written and those left alone.
static void test_kda_decode(struct backend *ref, struct kda_dims d) {
    static const int nds[] = {1, 3, 64};
    int H = d.heads, K = d.head_dim, HK = H * K, ld = 3 * HK + H + 1;
    for (size_t c = 0; c < sizeof nds / sizeof nds[0]; c++) {
        int nd = nds[c], n = nd + 2, T = nd + 6, slots = 2 * nd + 6;
        // qsl [n+1] | ctx [n] | slot [n] | src [n] | ck_start [n+1] | ck_pos [2] | ck_slot [2] | ck_dst [n]
        size_t na = 6 * (size_t)n + 6;
        int32_t *h = xcalloc(na, sizeof(int32_t));
        int32_t *qsl = h, *ctx = qsl + n + 1, *slot = ctx + n, *src = slot + n, *cks = src + n;
        int32_t *ckp = cks + n + 1, *ckl = ckp + 2, *dst = ckl + 2;
        for (int s = 0; s < nd; s++) {
            qsl[s] = s, ctx[s] = 3 + 17 * s, slot[s] = (5 * s + 2) % nd, src[s] = 2 * nd;
            dst[s] = s % 3 ? -1 : nd + (7 * s + 1) % nd;
        }
        qsl[nd] = nd, qsl[nd + 1] = nd + 1, qsl[nd + 2] = T;
        ctx[nd] = 63, slot[nd] = 2 * nd + 1, src[nd] = 2 * nd + 2, dst[nd] = -1;
        ctx[nd + 1] = 62, slot[nd + 1] = src[nd + 1] = 2 * nd + 3, dst[nd + 1] = -1;
        cks[nd + 1] = 1, cks[nd + 2] = 2;
        ckp[0] = 64, ckl[0] = 2 * nd + 4, ckp[1] = 64, ckl[1] = 2 * nd + 5;
        struct pair pa = up(h, na * sizeof(int32_t));
        struct batch bc, bg, *bs[2] = {&bc, &bg};
        for (int k = 0; k < 2; k++) {
            int32_t *a = k ? pa.g : pa.c;
            struct batch *b = bs[k];
            memset(b, 0, sizeof *b);
            b->num_tokens = T, b->num_seqs = n, b->num_decodes = nd, b->num_prefills = 2;
            b->query_start_loc = a, b->context_lens = a + (ctx - h), b->state_slots = a + (slot - h);
            b->state_src = a + (src - h), b->ckpt_start = a + (cks - h), b->ckpt_pos = a + (ckp - h);
            b->ckpt_slot = a + (ckl - h), b->ckpt_dst = a + (dst - h);
            b->h_query_start_loc = qsl, b->h_context_lens = ctx, b->h_state_slots = slot, b->h_state_src = src;
        }
        size_t sn = (size_t)slots * HK * K;
        float *x = test_rnd((size_t)2 * T * ld, 1), *g = test_rnd((size_t)2 * T * HK, 1), *st = test_rnd(sn, 0.3f);
        float *y = test_rnd((size_t)2 * T * HK, 1);
        for (size_t i = 0; i < (size_t)2 * T * HK; i++) g[i] -= 1.0f; // [-2, 0]
        struct pair px = up(x, sizeof(float) * 2 * T * ld), pg = up(g, sizeof(float) * 2 * T * HK);
        struct pair pst = up(st, sizeof(float) * sn), py = up(y, sizeof(float) * 2 * T * HK);
        ref->ops->kda_decode(ref, py.c, px.c, ld, pg.c, pst.c, &bc, &d);
        gpu->ops->kda_decode(gpu, py.g, px.g, ld, pg.g, pst.g, &bg, &d);
        ref->ops->kda_prefill(ref, py.c, px.c, ld, pg.c, pst.c, &bc, nd, n, &d);
        gpu->ops->kda_prefill(gpu, py.g, px.g, ld, pg.g, pst.g, &bg, nd, n, &d);
        size_t o = (size_t)T * ld, og = (size_t)T * HK; // the next token's rows
        ref->ops->kda_decode(ref, (float *)py.c + og, (float *)px.c + o, ld, (float *)pg.c + og, pst.c, &bc, &d);
        gpu->ops->kda_decode(gpu, (float *)py.g + og, (float *)px.g + o, ld, (float *)pg.g + og, pst.g, &bg, &d);
        char what[2][64];
        snprintf(what[0], sizeof what[0], "kda decode %dx%d, %d decodes: y", H, K, nd);
        snprintf(what[1], sizeof what[1], "kda decode %dx%d, %d decodes: states", H, K, nd);
        cmp(what[0], py, (size_t)2 * T * HK, 1e-5);
        cmp(what[1], pst, sn, 1e-5);
        pfree(pa), pfree(px), pfree(pg), pfree(pst), pfree(py);
        free(h), free(x), free(g), free(st), free(y);
    }
}

// MLA (mla_kv_write, then mla_attn over the whole batch in one call, as
// the runner makes it: decode rows first, then prefills, with
// query_start_loc). Decode contexts of 1, 31, 32, 33, 201, 1,000 and 5,004
// keys (one split, a split's edge, many splits); prefills from zero (1, 40
// and 200 tokens), continuing (33 after 17; 16 after 3,000: a chunked
// prefill's later chunk). The decodes again as a recorded graph runs them
// (splits for a max_model_len of 32k: most of them past every context). At
// Kimi-Linear-48B's shapes (32 heads, latent 512 + 64), at 40 heads of a
// small latent (a second, partial head group; 1,100 prefill tokens: two
// passes) and at the kimi fixtures' 4 heads. In 16-bit mode (weight_dtype
// bf16, 2e-2) the prefills at 48B's shapes take the tensor-core path (their
// contexts expanded per head, then cuda_flash.cu's kernel), several
// sequences in one group: the cases above over an fp32 cache, and over a
// bf16 one a chunk of 1,100 tokens after 3,000 with two more prefills; the
// other shapes keep k_mla_split there.
#define MLA_SEQS 40 // sequences of an MLA case at most
struct mla_case {
    struct mla_dims d;
    int n, nd, qlen[MLA_SEQS], ctx[MLA_SEQS];
};

static void test_mla(const struct mla_case *mc, enum dtype kv, enum wfmt wf, double tol) {
    struct mla_dims d = mc->d;
    d.scale = 1.0f / sqrtf((float)(d.nope + d.rope));
    int S = mc->n, H = d.heads, W = d.rank + d.rope, qw = H * (d.nope + d.rope), init[MLA_SEQS] = {0}, mbps = 1;
    for (int s = 0; s < S; s++) mbps = MAX(mbps, cdiv_i(mc->ctx[s] + mc->qlen[s], d.block_size));
    struct tb t;
    make_tb(&t, S, mc->qlen, mc->ctx, init, mc->nd, d.block_size, mbps, NULL);
    int T = t.c.num_tokens;
    // the context of every sequence, written through mla_kv_write on both sides
    int cq[MLA_SEQS] = {0}, zero[MLA_SEQS] = {0};
    for (int s = 0; s < S; s++) cq[s] = mc->ctx[s] + mc->qlen[s];
    struct tb full;
    make_tb(&full, S, cq, zero, init, 0, d.block_size, mbps, NULL);
    int TF = full.c.num_tokens;
    size_t cn = (size_t)S * mbps * d.block_size * W;
    gpu->kv_dtype = kv, gpu->weight_dtype = wf;
    int longest = 0; // the scratch reserved as at load (in 16-bit mode it sizes the flash path's groups)
    for (int s = 0; s < S; s++) longest = MAX(longest, mc->ctx[s] + mc->qlen[s]);
    CHECK(gpu->ops->supports(gpu, &(struct op_query){.op = OP_MLA, .max_tokens = T, .max_seq_len = longest,
                                                      .mla = &d}) == VLLM_OK);
    struct pair pc = {cpu->ops->alloc(cpu, cn * 4), gpu->ops->alloc(gpu, cn * dtype_size(kv)), 0};
    float *fl = test_rnd((size_t)TF * W, 1), *lat = test_rnd((size_t)T * (W + 3), 1), *q = test_rnd((size_t)T * qw, 1);
    float *kvb = test_rnd((size_t)H * (d.nope + d.v_dim) * d.rank, 0.05f);
    if (kv == DT_BF16) { // the CPU reference keeps fp32: give both the same bf16-representable latents
        for (size_t i = 0; i < (size_t)TF * W; i++) fl[i] = (float)(int)(fl[i] * 64) / 64;
        for (size_t i = 0; i < (size_t)T * (W + 3); i++) lat[i] = (float)(int)(lat[i] * 64) / 64;
    }
    struct pair pfl = up(fl, sizeof(float) * TF * W), plat = up(lat, sizeof(float) * T * (W + 3));
    struct pair pq = up(q, sizeof(float) * T * qw), pkvb = up(kvb, sizeof(float) * H * (d.nope + d.v_dim) * d.rank);
    struct pair po = up(q, sizeof(float) * T * H * d.v_dim);
    cpu->ops->mla_kv_write(cpu, pc.c, pfl.c, W, &full.c, &d);
    gpu->ops->mla_kv_write(gpu, pc.g, pfl.g, W, &full.g, &d);
    cpu->ops->mla_kv_write(cpu, pc.c, plat.c, W + 3, &t.c, &d);
    gpu->ops->mla_kv_write(gpu, pc.g, plat.g, W + 3, &t.g, &d);
    cpu->ops->mla_attn(cpu, po.c, pq.c, pc.c, pkvb.c, &t.c, 0, S, &d);
    char name[96];
    for (int fixed = 0; fixed < 2; fixed++) {
        gpu->ops->upload(gpu, po.g, q, sizeof(float) * T * H * d.v_dim); // no output left from the run before
        if (fixed) { // the decodes as a recorded graph, then the prefills
            t.g.fixed_shapes = 1, t.g.max_model_len = 1 << 15; // splits for a model's length: most empty
            gpu->ops->mla_attn(gpu, po.g, pq.g, pc.g, pkvb.g, &t.g, 0, mc->nd, &d);
            t.g.fixed_shapes = 0;
            gpu->ops->mla_attn(gpu, po.g, pq.g, pc.g, pkvb.g, &t.g, mc->nd, S, &d);
        } else gpu->ops->mla_attn(gpu, po.g, pq.g, pc.g, pkvb.g, &t.g, 0, S, &d);
        snprintf(name, sizeof name, "MLA %d heads, latent %d+%d, %s KV%s%s", H, d.rank, d.rope,
                 kv == DT_BF16 ? "bf16" : "fp32", wf == WF_F32 ? "" : ", 16-bit", fixed ? ", graph splits" : "");
        cmp(name, po, (size_t)T * H * d.v_dim, tol);
    }
    struct pair all[] = {pc, pfl, plat, pq, pkvb, po};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pfree(all[i]);
    free_tb(&t), free_tb(&full);
    free(fl), free(lat), free(q), free(kvb);
    gpu->kv_dtype = DT_F32, gpu->weight_dtype = WF_F32;
}

// MLA decodes alone, on both sides of cuda_mla.cu's thresholds: 1, 2, 4, 16
// and 17 sequences (the absorbs on k_mla_absorb_q / _v up to 16 tokens,
// cuBLAS above; k_mla_split in groups of 8 heads, HPW 1) and 40 at 32 heads
// (groups of 32, HPW 4), at 32, 16 and 20 heads (a partial group of 8),
// contexts of 7 and 2,000 keys alternating (one split and many; 1 sequence:
// each), fp32 and bf16 caches.
static void test_mla_decodes(void) {
    static const int heads[] = {32, 16, 20}, seqs[] = {1, 1, 2, 4, 16, 17, 40};
    for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++)
        for (size_t i = 0; i < sizeof seqs / sizeof seqs[0]; i++) {
            int n = seqs[i];
            if (n == 40 && heads[h] != 32) continue;
            struct mla_case mc = {{heads[h], 128, 64, 128, 512, 16, 0}, n, n, {0}, {0}};
            for (int s = 0; s < n; s++) mc.qlen[s] = 1, mc.ctx[s] = (s + (i == 1)) % 2 ? 1999 : 6;
            test_mla(&mc, DT_F32, WF_F32, 1e-5);
            test_mla(&mc, DT_BF16, WF_F32, 1e-4);
        }
}

// Constrained decoding's mask: a vocabulary that is no multiple of 32 (a last
// partial word), rows of every density; the logits must match bit for bit.
static void test_mask_logits(void) {
    enum { V = 151669, R = 5, W = (V + 31) / 32 };
    float *lg = test_rnd((size_t)R * V, 4);
    uint32_t *mask = xmalloc(sizeof(uint32_t) * R * W);
    for (int r = 0; r < R; r++)
        for (int w = 0; w < W; w++) {
            uint32_t x = (uint32_t)(test_frand() * 2147483647.0f) ^ ((uint32_t)w * 2654435761u);
            mask[r * W + w] = r == 0 ? 0 : r == 1 ? 0xffffffffu : r == 2 ? (x & (x >> 3) & (x >> 7)) : x;
        }
    struct pair pl = up(lg, sizeof(float) * R * V), pm = up(mask, sizeof(uint32_t) * R * W);
    cpu->ops->mask_logits(cpu, pl.c, R, V, pm.c);
    gpu->ops->mask_logits(gpu, pl.g, R, V, pm.g);
    float *h = xmalloc(sizeof(float) * R * V);
    gpu->ops->download(gpu, h, pl.g, sizeof(float) * R * V);
    size_t same = 0, masked = 0;
    for (size_t i = 0; i < (size_t)R * V; i++) {
        same += !memcmp(&h[i], &((float *)pl.c)[i], sizeof(float));
        masked += isinf(h[i]) != 0; // glibc: -1 for -inf
    }
    printf("  mask_logits: %zu/%zu logits agree, %zu masked\n", same, (size_t)R * V, masked);
    CHECKF(same == (size_t)R * V && masked > (size_t)V, "mask_logits agrees on %zu of %zu", same, (size_t)R * V);
    pfree(pl), pfree(pm);
    free(lg), free(mask), free(h);
}

// logit_bias: distinct flat indices over several rows, bit for bit.
static void test_bias_logits(void) {
    enum { V = 151669, R = 4, N = 3 * 300 };
    float *lg = test_rnd((size_t)R * V, 4), *val = test_rnd(N, 100);
    int64_t *idx = xmalloc(sizeof(int64_t) * N);
    for (int i = 0; i < N; i++) idx[i] = (int64_t)(i % R) * V + (int64_t)i * 7919 % V; // distinct: 7919 is prime to V
    struct pair pl = up(lg, sizeof(float) * R * V), pi = up(idx, sizeof(int64_t) * N), pv = up(val, sizeof(float) * N);
    cpu->ops->bias_logits(cpu, pl.c, N, pi.c, pv.c);
    gpu->ops->bias_logits(gpu, pl.g, N, pi.g, pv.g);
    float *h = xmalloc(sizeof(float) * R * V);
    gpu->ops->download(gpu, h, pl.g, sizeof(float) * R * V);
    size_t same = 0, moved = 0;
    for (size_t i = 0; i < (size_t)R * V; i++) {
        same += !memcmp(&h[i], &((float *)pl.c)[i], sizeof(float));
        moved += h[i] != lg[i];
    }
    printf("  bias_logits: %zu/%zu logits agree, %zu biased\n", same, (size_t)R * V, moved);
    CHECKF(same == (size_t)R * V && moved > N / 2, "bias_logits agrees on %zu of %zu (%zu moved)", same,
           (size_t)R * V, moved);
    pfree(pl), pfree(pi), pfree(pv);
    free(lg), free(val), free(idx), free(h);
}

// The 16-bit decode GEMV under each VLLM_GEMV16 kernel (0: k_gemv16, 1:
// k_gemv16w; the GPU backend made again per kernel), bf16 and fp16
// weights, 1-4 rows, with and without a bias: NemotronH-Nano's dense shapes
// (K/8 = 336 and 464: a ragged last step for every U), Qwen3-8B's (gate | up
// GATED, 12,288 units: warps loop over many groups), odd N and N no multiple of
// the rows per group, K = 8 * odd, K/8 below one warp's step, x too large for
// shared memory. GATED results are also held to the same backend's matmul +
// act_mul bit for bit. The reference takes what the kernel takes, weights and
// x rounded to the 16-bit type: with fp32 ones, a product of K = 8 terms over 6
// outputs is 2e-2 off in 4 of 1,000 draws (a 2 x 3 x 8 case seen at 2.08e-2).
struct gemv_case {
    int N, K, gated;
};
static float *round16(const float *a, size_t n, int f16) {
    float *r = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) r[i] = f16 ? f16_to_f32(f32_to_f16(a[i])) : bf16_to_f32(f32_to_bf16(a[i]));
    return r;
}
static void gemv16_case(const struct gemv_case *cs) {
    int N = cs->N, K = cs->K, M = cs->gated ? N / 2 : N;
    float *wm = test_rnd((size_t)N * K, 0.05f), *x = test_rnd((size_t)4 * K, 1), *bias = test_rnd(N, 1);
    int nf = (int64_t)N * K < (1 << 24) ? 2 : 1; // fp16 too where it is quick
    float *cx = cpu->ops->alloc(cpu, sizeof(float) * 4 * K), *cb = cpu->ops->alloc(cpu, sizeof(float) * N);
    float *gu = cpu->ops->alloc(cpu, sizeof(float) * 4 * N), *ref[2][2][4], *got = xmalloc(sizeof(float) * 4 * N);
    cpu->ops->upload(cpu, cb, bias, sizeof(float) * N);
    for (int f = 0; f < nf; f++) { // the references: bf16, fp16; 1-4 rows; without and with the bias
        float *w16 = round16(wm, (size_t)N * K, f), *x16 = round16(x, (size_t)4 * K, f);
        struct weight wc;
        weight_from_f32(cpu, &wc, WF_F32, w16, N, K);
        cpu->ops->upload(cpu, cx, x16, sizeof(float) * 4 * K);
        for (int b = 0; b < 2; b++)
            for (int n = 1; n <= 4; n++) {
                float *r = ref[f][b][n - 1] = cpu->ops->alloc(cpu, sizeof(float) * n * M);
                wc.bias = b ? cb : NULL;
                if (cs->gated) cpu->ops->matmul_act_mul(cpu, ACT_SILU, r, cx, &wc, n, gu);
                else cpu->ops->matmul(cpu, r, cx, &wc, n);
            }
        cpu->ops->free(cpu, wc.data);
        free(w16), free(x16);
    }
    for (int v = 0; v <= 1; v++) {
        char val[8];
        snprintf(val, sizeof val, "%d", v);
        setenv("VLLM_GEMV16", val, 1);
        backend_free(gpu);
        if (backend_cuda_create(DT_F32, &gpu)) {
            CHECKF(0, "cuda: %s", vllm_last_error());
            return;
        }
        float *gx = gpu->ops->alloc(gpu, sizeof(float) * 4 * K), *gb = gpu->ops->alloc(gpu, sizeof(float) * N);
        float *gy = gpu->ops->alloc(gpu, sizeof(float) * 4 * N), *gg = gpu->ops->alloc(gpu, sizeof(float) * 4 * N);
        float *gc = gpu->ops->alloc(gpu, sizeof(float) * 4 * N);
        gpu->ops->upload(gpu, gx, x, sizeof(float) * 4 * K);
        gpu->ops->upload(gpu, gb, bias, sizeof(float) * N);
        for (int f = 0; f < nf; f++) {
            struct weight wg;
            weight_from_f32(gpu, &wg, f ? WF_F16 : WF_BF16, wm, N, K);
            for (int b = 0; b < 2; b++)
                for (int n = 1; n <= 4; n++) {
                    wg.bias = b ? gb : NULL;
                    if (cs->gated) gpu->ops->matmul_act_mul(gpu, ACT_SILU, gy, gx, &wg, n, gg);
                    else gpu->ops->matmul(gpu, gy, gx, &wg, n);
                    gpu->ops->download(gpu, got, gy, sizeof(float) * n * M);
                    char name[96];
                    snprintf(name, sizeof name, "gemv16 v%d %s %s%d x %d n=%d%s", v, f ? "fp16" : "bf16",
                             cs->gated ? "GATED 2x" : "", M, K, n, b ? " +bias" : "");
                    double e = test_max_rel(got, ref[f][b][n - 1], (size_t)n * M), tol = f ? 2e-3 : 2e-2;
                    if (v == 0 || n == 4 || e > tol) printf("  %-48s rel err %.2e (tol %.0e)\n", name, e, tol);
                    CHECKF(e <= tol && isfinite(e), "%s: %.3g > %.0g", name, e, tol);
                    if (!cs->gated) continue;
                    gpu->ops->matmul(gpu, gg, gx, &wg, n); // the GATED GEMV is the kernel's own product, bit for bit
                    gpu->ops->act_mul(gpu, ACT_SILU, gc, gg, n, M);
                    float *c = xmalloc(sizeof(float) * n * M);
                    gpu->ops->download(gpu, c, gc, sizeof(float) * n * M);
                    CHECKF(!memcmp(got, c, sizeof(float) * n * M), "%s: not the GPU's matmul + act_mul bit for bit",
                           name);
                    free(c);
                }
            gpu->ops->free(gpu, wg.data);
        }
        gpu->ops->free(gpu, gx), gpu->ops->free(gpu, gb), gpu->ops->free(gpu, gy), gpu->ops->free(gpu, gg);
        gpu->ops->free(gpu, gc);
    }
    unsetenv("VLLM_GEMV16");
    for (int f = 0; f < nf; f++)
        for (int b = 0; b < 2; b++)
            for (int n = 0; n < 4; n++) cpu->ops->free(cpu, ref[f][b][n]);
    cpu->ops->free(cpu, cx), cpu->ops->free(cpu, cb), cpu->ops->free(cpu, gu);
    free(wm), free(x), free(bias), free(got);
}

static void test_gemv16(void) {
    static const struct gemv_case cs[] = {
        {2 * 64 * 64 + 2 * 8 * 128 + 64, 2688, 0}, {2688, 4096, 0}, {3712, 2688, 0}, {2688, 3712, 0}, // Nano
        {6144, 4096, 0}, {4096, 4096, 0}, {2 * 12288, 4096, 1}, {4096, 12288, 0},                  // Qwen3-8B
        {1001, 2664, 0}, {2 * 1001, 2664, 1}, {7, 24, 0}, {2 * 3, 8, 1}, {4103, 8 * 45, 0}, {2 * 4103, 8 * 45, 1},
        {65, 8 * 2049, 0}}; // x [4, 16392] fp32 over the shared memory: k_gemv16w reads it from L1
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) gemv16_case(&cs[i]);
    backend_free(gpu); // the default kernel again for what follows
    if (backend_cuda_create(DT_F32, &gpu)) CHECKF(0, "cuda: %s", vllm_last_error());
}

// Prompt log-probs: rows picked out of a logits block (one row twice), a
// full vocabulary; log-probs close, ranks and top ids the same.
static void test_token_logprobs(void) {
    enum { V = 151669, R = 6, N = 5, KT = 20 };
    float *lg = test_rnd((size_t)R * V, 8);
    int32_t rows[N] = {4, 0, 2, 4, 5}, tgt[N] = {17, V - 1, 99, 151000, 3}, rk[N], top_ids[N * KT];
    struct pair pl = up(lg, sizeof(float) * R * V), pr = up(rows, sizeof rows), pt = up(tgt, sizeof tgt);
    struct pair lp = up(lg, sizeof(float) * N), rank = up(rows, sizeof rows), ti = up(lg, sizeof(int32_t) * N * KT),
                tl = up(lg, sizeof(float) * N * KT);
    cpu->ops->token_logprobs(cpu, pl.c, V, pr.c, pt.c, N, KT, lp.c, rank.c, ti.c, tl.c);
    gpu->ops->token_logprobs(gpu, pl.g, V, pr.g, pt.g, N, KT, lp.g, rank.g, ti.g, tl.g);
    cmp("token_logprobs", lp, N, 1e-5);
    cmp("token_logprobs top", tl, N * KT, 1e-5);
    gpu->ops->download(gpu, rk, rank.g, sizeof rk);
    gpu->ops->download(gpu, top_ids, ti.g, sizeof top_ids);
    CHECK(!memcmp(rk, rank.c, sizeof rk) && !memcmp(top_ids, ti.c, sizeof top_ids));
    pfree(pl), pfree(pr), pfree(pt), pfree(lp), pfree(rank), pfree(ti), pfree(tl);
    free(lg);
}

// `test_cuda_ops moe`: the MoE cases only.
int main(int argc, char **argv) {
#ifndef VLLM_HAVE_CUDA
    (void)argc, (void)argv;
    TEST_SKIP("built without CUDA");
#else
    if (backend_cuda_create(DT_F32, &gpu)) TEST_SKIP("no GPU: %s", vllm_last_error());
    if (backend_cpu_create(0, DT_F32, &cpu)) return 1;
    if (argc > 1 && !strcmp(argv[1], "moe")) {
        test_moe();
        backend_free(gpu);
        backend_free(cpu);
        return test_summary("cuda ops (moe)");
    }
    test_dense();
    test_norm_dims();
    test_mamba();
    struct mamba_dims nano = {64, 64, 8, 128, 4, 128, 0, 0.0f, INFINITY}, m2 = {24, 64, 1, 128, 4, 256, 0, 0.0f, INFINITY};
    struct mamba_dims odd = {6, 48, 2, 64, 2, 64, 0, 0.0f, INFINITY};
    test_mamba_decode(nano, 8, 1, 1, 0);
    test_mamba_decode(nano, 8, 3, 3, 1);
    test_mamba_decode(nano, 8, 6, 3, 1);
    test_mamba_decode(nano, 8, 64, 64, 0);
    test_mamba_decode(m2, 1, 2, 2, 0);
    test_mamba_decode(odd, 2, 5, 5, 1);
    test_mamba_decode(odd, 3, 5, 4, 0); // norm groups of 2 heads, SSM groups of 3
    // ssd_decode's unsliced blocks (sequences x heads >= 2 x 132 SMs: 8 rows a
    // warp) with checkpoints, and state 256 (two 128-wide pieces a lane)
    struct mamba_dims h8 = {128, 64, 8, 128, 4, 128, 0, 0.0f, INFINITY}, s256 = {64, 64, 2, 256, 4, 128, 0, 0.0f, INFINITY};
    test_mamba_decode(h8, 8, 6, 3, 1);
    test_mamba_decode(s256, 2, 1, 1, 0);
    test_mamba_decode(s256, 2, 6, 6, 1);
    static const struct attn_case attn[] = {{32, 2, 128, 0}, {32, 4, 128, 1}, {64, 2, 128, 0},
                                            {24, 8, 96, 1},  {16, 16, 64, 0}, {12, 3, 20, 0}};
    for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) {
        test_attention(&attn[i], DT_F32, 1e-5);
        test_attention(&attn[i], DT_BF16, 2e-2);
    }
    static const struct qkn_case qkn[] = {{32, 8, 128, 1, 1}, {32, 4, 128, 1, 1}, {64, 8, 128, 1, 1}, {16, 16, 64, 1, 1},
                                          {32, 8, 128, 0, 1},  {32, 2, 128, 0, 0}, {12, 3, 24, 1, 1},  {8, 2, 256, 1, 1}};
    for (size_t i = 0; i < sizeof qkn / sizeof qkn[0]; i++) {
        test_qk_norm_rope(&qkn[i], DT_F32, 1e-5);
        test_qk_norm_rope(&qkn[i], DT_BF16, 2e-2);
    }
    test_matmul_act_mul(2048, 6144);
    test_matmul_act_mul(48, 71);
    test_matmul_act(2688, 3712, ACT_RELU2);
    test_matmul_act(4096, 21504, ACT_RELU2); // 176 MB: k_gemv16, not k_gemv16w
    test_matmul_act(48, 71, ACT_SILU);
    test_mlps();
    test_gemv16();
    test_router();
    test_moe();
    test_kimi_kda();
    struct backend *ref;
    if (cpu_backend_create(0, 1, -1, &ref)) return 1;
    static const struct kda_dims kda[] = {{32, 128, 4, 64}, {4, 64, 4, 64}, {2, 48, 4, 64}, {4, 16, 4, 64},
                                          {3, 20, 4, 64}};
    for (size_t i = 0; i < sizeof kda / sizeof kda[0]; i++) test_kda_chunks(ref, kda[i]);
    for (size_t i = 0; i < sizeof kda / sizeof kda[0]; i++) test_kda_decode(ref, kda[i]);
    backend_free(ref);
    static const struct mla_case mla[] = {
        {{32, 128, 64, 128, 512, 16, 0}, 12, 7, {1, 1, 1, 1, 1, 1, 1, 40, 16, 1, 33, 200},
         {0, 30, 31, 32, 200, 999, 5003, 0, 3000, 0, 17, 0}},
        {{40, 16, 8, 16, 32, 16, 0}, 4, 2, {1, 1, 1100, 7}, {3, 100, 0, 50}},
        {{4, 16, 8, 16, 32, 16, 0}, 4, 2, {1, 1, 20, 5}, {0, 64, 0, 9}},
    };
    for (size_t i = 0; i < sizeof mla / sizeof mla[0]; i++) {
        test_mla(&mla[i], DT_F32, WF_F32, 1e-5);
        test_mla(&mla[i], DT_BF16, WF_F32, 1e-4);
        test_mla(&mla[i], DT_F32, WF_BF16, 2e-2); // 16-bit mode over an fp32 cache
    }
    // 16-bit mode, bf16 cache: a decode, then 1,100 tokens after 3,000, 64
    // after 500 and 300 from zero: the three prefills on tensor cores
    static const struct mla_case mla16 = {{32, 128, 64, 128, 512, 16, 0}, 4, 1, {1, 1100, 64, 300}, {99, 3000, 500, 0}};
    test_mla(&mla16, DT_BF16, WF_BF16, 2e-2);
    test_mla_decodes();
    test_sample();
    test_sample_reserved();
    test_attn_reserved();
    test_mask_logits();
    test_bias_logits();
    test_token_logprobs();
    backend_free(gpu);
    backend_free(cpu);
    return test_summary("cuda ops");
#endif
}
