// cpu_moe.c - NemotronH MoE reference: sigmoid router with correction bias
// and grouped top-k; relu^2 experts combined in expert order (as HF does).
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

void cpu_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                   const struct moe_route_cfg *c) {
    (void)be;
    int E = c->num_experts, ng = c->n_group, per = E / ng;
    float sig[1024], choice[1024], gscore[1024];
    unsigned char allowed[1024], gall[1024];
    int32_t gsel[1024];
    for (int t = 0; t < n; t++) {
        const float *l = logits + (int64_t)t * E;
        for (int e = 0; e < E; e++) {
            sig[e] = 1.0f / (1.0f + expf(-l[e]));
            choice[e] = sig[e] + (bias ? bias[e] : 0.0f);
        }
        // group score: the sum of the group's two best choice scores
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
        int32_t *id = ids + (int64_t)t * c->top_k;
        float *w = weights + (int64_t)t * c->top_k;
        topk_masked(choice, allowed, E, c->top_k, id);
        float sum = 0;
        for (int j = 0; j < c->top_k; j++) sum += w[j] = sig[id[j]];
        for (int j = 0; j < c->top_k; j++) {
            if (c->norm_topk_prob) w[j] /= sum + 1e-20f;
            w[j] *= c->routed_scaling_factor;
        }
    }
}

// Expert by expert: gather its tokens, up, relu^2, down, weighted add.
void cpu_moe_experts(struct backend *be, float *out, const float *x, const struct moe_experts *w, const int32_t *ids,
                     const float *weights, int n, int top_k) {
    int E = w->num_experts, I = w->inter, L = w->dim;
    memset(out, 0, sizeof(float) * (size_t)n * L);
    size_t need = sizeof(float) * (size_t)n * (L + I + L) + sizeof(int32_t) * 2 * (size_t)n;
    float *xs = cpu_scratch(be, 0, need), *hs = xs + (size_t)n * L, *ys = hs + (size_t)n * I;
    int32_t *tok = (int32_t *)(ys + (size_t)n * L), *slot = tok + n;
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
        struct weight up = {(float *)w->up.data + (int64_t)e * I * L, DT_F32, I, L};
        struct weight down = {(float *)w->down.data + (int64_t)e * L * I, DT_F32, L, I};
        cpu_matmul(be, hs, xs, &up, m);
        for (int64_t i = 0; i < (int64_t)m * I; i++) hs[i] = hs[i] > 0 ? hs[i] * hs[i] : 0.0f;
        cpu_matmul(be, ys, hs, &down, m);
        for (int r = 0; r < m; r++) {
            float wt = weights[(int64_t)tok[r] * top_k + slot[r]];
            float *o = out + (int64_t)tok[r] * L;
            const float *yr = ys + (int64_t)r * L;
            for (int i = 0; i < L; i++) o[i] += wt * yr[i];
        }
    }
}
