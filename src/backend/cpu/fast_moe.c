// fast_moe.c - routed experts of the fast path. Only the selected experts'
// weights are read, each once per call for all of its tokens:
//   1. bucket the (token, slot) assignments by expert, gather their inputs;
//   2. up: tasks over (expert, block of I), h = act(x_e up_e^T), or for
//      gated experts h = act(x_e gate_e^T) * (x_e up_e^T) (the gate block and
//      the matching up block in one task);
//   3. down, few rows (decode): tasks over blocks of L output columns; each
//      walks the experts in ascending order and adds weight * h_e down_e^T
//      into its columns of out;
//      many rows (prefill): tasks over (expert, block of L) as in the up
//      phase, into a row per assignment, then tasks over tokens add each
//      token's rows in ascending expert order.
//   Either way each output element sums the experts in ascending order, as
//   the reference does.
#include <math.h>

#include "backend/cpu/fast.h"
#include "core/common.h"

struct moe_ctx {
    struct backend *be;
    float *out;
    const struct moe_experts *w;
    const float *weights;
    int n, top_k, nact;
    int *act, *off, *cnt; // active experts, their first row in the buckets, their row counts
    int32_t *tok, *slot;  // per bucket row: token and top-k slot
    int32_t *row_of;      // [n, top_k]: the bucket row of each assignment
    const int32_t *ids;
    float *ys;            // [A, L]: per bucket row, its expert's output (many rows)
    int down_blocks;      // L blocks per expert (many rows)
    float *xs, *h;        // [A, ldx] gathered inputs, [A, ldh] hidden
    uint16_t *xsb, *hb;   // bf16 copies for the dot kernel (NULL when unused)
    int64_t ldx, ldh, ldxb, ldhb;
    int up_blocks; // I blocks per expert
    int64_t up_per, down_per;
};

static void up_task(void *ctx, int task, int thread) {
    struct moe_ctx *c = ctx;
    const struct moe_experts *w = c->w;
    int e = c->act[task / c->up_blocks], I = w->inter, r0 = c->off[e], m = c->cnt[e], U = w->gated ? 2 * I : I;
    int64_t a = (int64_t)(task % c->up_blocks) * c->up_per, b = MIN(I, a + c->up_per), nc = b - a;
    if (a >= b) return;
    int dot = fast_use_dot(c->be, &w->up, m);
    float *h = c->h + (int64_t)r0 * c->ldh + a;
    const float *xs = c->xs + (int64_t)r0 * c->ldx;
    const uint16_t *xb = dot ? c->xsb + (int64_t)r0 * c->ldxb : NULL;
    fast_mm_serial(c->be, thread, h, c->ldh, xs, c->ldx, xb, c->ldxb, m, &w->up, (int64_t)e * U + a, (int64_t)e * U + b);
    float *u = NULL;
    if (w->gated) { // the up rows of the same block: [m, nc]
        u = cpu_scratch(c->be, thread, sizeof(float) * (size_t)m * nc);
        fast_mm_serial(c->be, thread, u, nc, xs, c->ldx, xb, c->ldxb, m, &w->up, (int64_t)e * U + I + a,
                       (int64_t)e * U + I + b);
    }
    const struct fast_kern *k = fast_k(c->be);
    for (int r = 0; r < m; r++) {
        float *hr = h + (int64_t)r * c->ldh;
        fast_act_span(k, w->act, hr, nc);
        if (u) k->mul(hr, u + (int64_t)r * nc, nc);
        if (c->hb && fast_use_dot(c->be, &w->down, m)) k->to_bf16(c->hb + (int64_t)(r0 + r) * c->ldhb + a, hr, nc);
    }
}

static void down_task(void *ctx, int task, int thread) {
    struct moe_ctx *c = ctx;
    const struct moe_experts *w = c->w;
    int L = w->dim;
    int64_t a = task * c->down_per, b = MIN(L, a + c->down_per), nc = b - a;
    int maxm = 0;
    for (int i = 0; i < c->nact; i++) maxm = MAX(maxm, c->cnt[c->act[i]]);
    float *ys = cpu_scratch(c->be, thread, sizeof(float) * (size_t)maxm * nc);
    for (int i = 0; i < c->nact; i++) {
        int e = c->act[i], r0 = c->off[e], m = c->cnt[e];
        int dot = c->hb && fast_use_dot(c->be, &w->down, m);
        fast_mm_serial(c->be, thread, ys, nc, c->h + (int64_t)r0 * c->ldh, c->ldh, dot ? c->hb + (int64_t)r0 * c->ldhb : NULL,
                       c->ldhb, m, &w->down, (int64_t)e * L + a, (int64_t)e * L + b);
        for (int r = 0; r < m; r++) {
            float wt = c->weights[(int64_t)c->tok[r0 + r] * c->top_k + c->slot[r0 + r]];
            fast_k(c->be)->axpy(c->out + (int64_t)c->tok[r0 + r] * L + a, wt, ys + (int64_t)r * nc, nc);
        }
    }
}

// Many rows: one (expert, block of L) into ys.
static void down_rows_task(void *ctx, int task, int thread) {
    struct moe_ctx *c = ctx;
    const struct moe_experts *w = c->w;
    int L = w->dim, e = c->act[task / c->down_blocks], r0 = c->off[e], m = c->cnt[e];
    int64_t a = (int64_t)(task % c->down_blocks) * c->down_per, b = MIN(L, a + c->down_per);
    if (a >= b) return;
    int dot = c->hb && fast_use_dot(c->be, &w->down, m);
    fast_mm_serial(c->be, thread, c->ys + (int64_t)r0 * L + a, L, c->h + (int64_t)r0 * c->ldh, c->ldh,
                   dot ? c->hb + (int64_t)r0 * c->ldhb : NULL, c->ldhb, m, &w->down, (int64_t)e * L + a,
                   (int64_t)e * L + b);
}

// Many rows: tokens [16 i, 16 i + 16), each adding its rows of ys in
// ascending expert order.
static void combine_task(void *ctx, int i, int thread) {
    (void)thread;
    struct moe_ctx *c = ctx;
    int L = c->w->dim, k = c->top_k, n = c->n;
    for (int t = i * 16; t < MIN(n, i * 16 + 16); t++) {
        int order[64];
        for (int j = 0; j < k; j++) { // insertion sort of the slots by expert id
            int q = j;
            while (q > 0 && c->ids[(int64_t)t * k + order[q - 1]] > c->ids[(int64_t)t * k + j]) order[q] = order[q - 1], q--;
            order[q] = j;
        }
        float *o = c->out + (int64_t)t * L;
        for (int j = 0; j < k; j++) {
            int s = order[j];
            fast_k(c->be)->axpy(o, c->weights[(int64_t)t * k + s], c->ys + (int64_t)c->row_of[(int64_t)t * k + s] * L, L);
        }
    }
}

// Rows [16 i, 16 i + 16) of the buckets: their inputs, bf16 copies, pads.
struct gather_ctx {
    struct moe_ctx *c;
    const float *x;
    int A, L, I;
};

static void gather_task(void *ctx, int i, int thread) {
    (void)thread;
    struct gather_ctx *g = ctx;
    struct moe_ctx *c = g->c;
    for (int r = i * 16; r < MIN(g->A, i * 16 + 16); r++) {
        float *d = c->xs + (int64_t)r * c->ldx;
        memcpy(d, g->x + (int64_t)c->tok[r] * g->L, sizeof(float) * g->L);
        if (c->ldx > g->L) d[g->L] = 0;
        if (c->ldh > g->I) c->h[(int64_t)r * c->ldh + g->I] = 0;
        if (c->xsb) {
            fast_k(c->be)->to_bf16(c->xsb + (int64_t)r * c->ldx, d, c->ldx);
            if (c->ldh > g->I) c->hb[(int64_t)r * c->ldh + g->I] = 0;
        }
    }
}

// Columns per task: whole groups of the packed layout, about cols / tasks_wanted.
static int64_t group_block(int64_t cols, int tasks_wanted) {
    return MAX(1, CDIV(CDIV(cols, PKG), MAX(tasks_wanted, 1))) * PKG;
}

// Below this many assignments the down phase runs over L blocks into out
// (few rows), else over (expert, L block) into a row per assignment.
#define MANY_ROWS 64

int fast_moe_reserve(struct backend *be, const struct moe_experts *w, int max_tokens, int top_k) {
    size_t A = (size_t)max_tokens * top_k, E = w->num_experts, L = w->dim, I = w->inter;
    size_t ldx = pk_kp(L), ldh = pk_kp(I);
    size_t need[4] = {0, sizeof(int) * (3 * E + 3 * A), (sizeof(float) + sizeof(uint16_t)) * A * (ldx + ldh),
                      sizeof(float) * A * L};
    for (int s = 1; s < 4; s++) TRY(fast_reserve_shared(be, s, need[s], "the MoE experts"));
    TRY(fast_quant_reserve(be, &w->up, (int)A));
    TRY(fast_quant_reserve(be, &w->down, (int)A));
    // per thread: a gated task's up block [m, up_per] (up_per <= I rounded
    // to a group), or the few-rows down block [m, L]
    size_t per = MAX(A * (I + PKG) * (w->gated ? 1 : 0), (size_t)MANY_ROWS * L);
    return cpu_reserve(be, sizeof(float) * per, "the MoE experts");
}

void fast_moe_experts(struct backend *be, float *out, const float *x, const struct moe_experts *w, const int32_t *ids,
                      const float *weights, int n, int top_k, const struct moe_shared *shared) {
    int E = w->num_experts, I = w->inter, L = w->dim, A = n * top_k, nt = be->num_threads;
    memset(out, 0, sizeof(float) * (size_t)n * L);
    if (n <= 0) return;
    if (shared) moe_shared_fwd(be, shared, x, n); // its products first, on their own scratch
    int64_t ldx = pk_kp(L), ldh = pk_kp(I); // even: whole column pairs, zero padded
    size_t ints = (size_t)3 * E + 3 * (size_t)A;
    int *cnt = fast_shared(be, 1, sizeof(int) * ints), *off = cnt + E, *act = off + E;
    int32_t *tok = act + E, *slot = tok + A, *row_of = slot + A;
    memset(cnt, 0, sizeof(int) * E);
    for (int i = 0; i < A; i++) cnt[ids[i]]++;
    int nact = 0;
    for (int e = 0, o = 0; e < E; e++) {
        off[e] = o;
        o += cnt[e];
        if (cnt[e]) act[nact++] = e;
        cnt[e] = 0;
    }
    for (int t = 0; t < n; t++) // token order within an expert, as the reference
        for (int j = 0; j < top_k; j++) {
            int e = ids[(int64_t)t * top_k + j], r = off[e] + cnt[e]++;
            tok[r] = t;
            slot[r] = j;
            row_of[(int64_t)t * top_k + j] = r;
        }
    int any_dot = 0;
    for (int i = 0; i < nact; i++) any_dot |= fast_use_dot(be, &w->up, cnt[act[i]]);
    size_t fl = (size_t)A * (ldx + ldh), bl = any_dot ? (size_t)A * (ldx + ldh) : 0;
    float *xs = fast_shared(be, 2, sizeof(float) * fl + sizeof(uint16_t) * bl), *h = xs + (size_t)A * ldx;
    uint16_t *xsb = any_dot ? (uint16_t *)(h + (size_t)A * ldh) : NULL, *hb = any_dot ? xsb + (size_t)A * ldx : NULL;
    // many rows: top_k rows per token of down output (combined in a last phase)
    int many = top_k <= 64 && A >= MANY_ROWS;
    float *ys = many ? fast_shared(be, 3, sizeof(float) * (size_t)A * L) : NULL;
    struct moe_ctx c = {be, out, w, weights, n, top_k, nact, act, off, cnt, tok, slot, row_of, ids, ys, 1, xs, h, xsb, hb,
                        ldx, ldh, ldx, ldh, 1, 0, 0};
    struct gather_ctx gc = {&c, x, A, L, I};
    cpu_parallel(be, CDIV(A, 16), gather_task, &gc);
    // about 4 tasks per thread in each phase
    c.up_per = group_block(I, CDIV(4 * nt, nact));
    c.up_blocks = (int)CDIV(I, c.up_per);
    cpu_parallel(be, nact * c.up_blocks, up_task, &c);
    if (many) {
        c.down_per = group_block(L, CDIV(4 * nt, nact));
        c.down_blocks = (int)CDIV(L, c.down_per);
        cpu_parallel(be, nact * c.down_blocks, down_rows_task, &c);
        cpu_parallel(be, CDIV(n, 16), combine_task, &c);
    } else {
        c.down_per = group_block(L, 4 * nt);
        cpu_parallel(be, (int)CDIV(L, c.down_per), down_task, &c);
    }
    if (shared) be->ops->add(be, out, shared->y, (int64_t)n * L); // the shared expert's output, last
}
