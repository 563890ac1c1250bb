// cpu_moe.c - MoE reference: the router (sigmoid + correction bias with
// grouped top-k, or softmax top-k), and the experts (relu^2, or SwiGLU-style
// gated) combined in expert order (as HF does).
#include <math.h>

#include "backend/cpu/cpu.h"
#include "core/common.h"

// Picks the k largest of score[0..n) where allowed (ties: lower index).
static void topk_masked(const float *score, const unsigned char *allowed, int n, int k, int32_t *out) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            if (!allowed[i]) continue;
            int taken = 0;
            for (int q = 0; q < j && !taken; q++) taken = out[q] == i;
            if (!taken && (best < 0 || score[i] > score[best])) best = i;
        }
        out[j] = best;
    }
}

// scratch: score, choice, gscore [E] floats; gsel [E] ints; allowed, gall [E] bytes
size_t route_scratch_bytes(int E) { return (size_t)E * (3 * sizeof(float) + sizeof(int32_t) + 2); }

// Sigmoid scores; experts chosen by score + bias among the topk_group groups
// whose two best choice scores sum highest.
static void route_grouped(const float *l, const float *bias, const struct moe_route_cfg *c, float *sig, float *choice,
                          float *gscore, int32_t *gsel, unsigned char *allowed, unsigned char *gall, int32_t *id) {
    int E = c->num_experts, ng = c->n_group, per = E / ng;
    for (int e = 0; e < E; e++) {
        sig[e] = 1.0f / (1.0f + expf(-l[e]));
        choice[e] = sig[e] + (bias ? bias[e] : 0.0f);
    }
    for (int g = 0; g < ng; g++) {
        float a = -INFINITY, b2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            if (choice[e] > a) b2 = a, a = choice[e];
            else if (choice[e] > b2) b2 = choice[e];
        }
        gscore[g] = a + (per > 1 ? b2 : 0.0f);
        gall[g] = 1;
    }
    topk_masked(gscore, gall, ng, c->topk_group, gsel);
    memset(allowed, 0, E);
    for (int j = 0; j < c->topk_group; j++)
        for (int e = gsel[j] * per; e < (gsel[j] + 1) * per; e++) allowed[e] = 1;
    topk_masked(choice, allowed, E, c->top_k, id);
}

// Softmax over every expert (max-subtracted, as torch does); the top-k of it.
static void route_softmax(const float *l, const struct moe_route_cfg *c, float *p, unsigned char *allowed,
                          int32_t *id) {
    int E = c->num_experts;
    float mx = -INFINITY, sum = 0;
    for (int e = 0; e < E; e++) mx = fmaxf(mx, l[e]);
    for (int e = 0; e < E; e++) sum += p[e] = expf(l[e] - mx);
    for (int e = 0; e < E; e++) p[e] /= sum;
    memset(allowed, 1, E);
    topk_masked(p, allowed, E, c->top_k, id);
}

void cpu_route_tokens(int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                      const struct moe_route_cfg *c, void *scratch) {
    int E = c->num_experts;
    float *score = scratch, *choice = score + E, *gscore = choice + E;
    int32_t *gsel = (int32_t *)(gscore + E);
    unsigned char *allowed = (unsigned char *)(gsel + E), *gall = allowed + E;
    for (int t = 0; t < n; t++) {
        const float *l = logits + (int64_t)t * E;
        int32_t *id = ids + (int64_t)t * c->top_k;
        float *w = weights + (int64_t)t * c->top_k;
        switch (c->kind) {
        case ROUTE_SIGMOID_GROUPED: route_grouped(l, bias, c, score, choice, gscore, gsel, allowed, gall, id); break;
        case ROUTE_SOFTMAX_TOPK: route_softmax(l, c, score, allowed, id); break;
        }
        float sum = 0;
        for (int j = 0; j < c->top_k; j++) sum += w[j] = score[id[j]];
        for (int j = 0; j < c->top_k; j++) {
            if (c->norm_topk_prob) w[j] /= sum + (c->kind == ROUTE_SIGMOID_GROUPED ? 1e-20f : 0.0f);
            w[j] *= c->routed_scaling_factor;
        }
    }
}

void cpu_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                   const struct moe_route_cfg *c) {
    cpu_route_tokens(ids, weights, logits, bias, n, c, cpu_scratch(be, 0, route_scratch_bytes(c->num_experts)));
}

// Expert by expert: gather its tokens, up (gate | up), activation, down,
// weighted add.
void cpu_moe_experts(struct backend *be, float *out, const float *x, const struct moe_experts *w, const int32_t *ids,
                     const float *weights, int n, int top_k, const struct moe_shared *shared) {
    int E = w->num_experts, I = w->inter, L = w->dim, U = w->gated ? 2 * I : I;
    if (shared) moe_shared_fwd(be, shared, x, n); // its products first, on their own scratch
    memset(out, 0, sizeof(float) * (size_t)n * L);
    size_t A = (size_t)n * top_k;
    size_t need = sizeof(float) * A * (L + U + L) + sizeof(int32_t) * 2 * A;
    float *xs = cpu_scratch(be, 0, need), *hs = xs + A * L, *ys = hs + A * U;
    int32_t *tok = (int32_t *)(ys + A * L), *slot = tok + A;
    for (int e = 0; e < E; e++) {
        int m = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < top_k; j++)
                if (ids[(int64_t)t * top_k + j] == e) {
                    tok[m] = t;
                    slot[m] = j;
                    memcpy(xs + (int64_t)m * L, x + (int64_t)t * L, sizeof(float) * L);
                    m++;
                }
        if (!m) continue;
        cpu_matmul_rows(be, hs, xs, &w->up, (int64_t)e * U, U, m); // hs: [m, U]
        for (int r = 0; r < m; r++) { // hidden [m, I] in place of the first I columns
            float *h = hs + (int64_t)r * U, *o = hs + (int64_t)r * I;
            for (int i = 0; i < I; i++) o[i] = w->gated ? act_f(w->act, h[i]) * h[I + i] : act_f(w->act, h[i]);
        }
        cpu_matmul_rows(be, ys, hs, &w->down, (int64_t)e * L, L, m);
        for (int r = 0; r < m; r++) {
            float wt = weights[(int64_t)tok[r] * top_k + slot[r]];
            float *o = out + (int64_t)tok[r] * L;
            const float *yr = ys + (int64_t)r * L;
            for (int i = 0; i < L; i++) o[i] += wt * yr[i];
        }
    }
    if (shared) be->ops->add(be, out, shared->y, (int64_t)n * L); // the shared expert's output, last
}
