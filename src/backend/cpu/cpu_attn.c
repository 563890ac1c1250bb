// cpu_attn.c - paged attention reference: GQA, causal, no RoPE.
//
// qkv row (ld floats): q [Hq*Dh] | k [Hkv*Dh] | v [Hkv*Dh]. Caches are
// [num_blocks, block_size, Hkv, Dh] fp32; token j of sequence s lives at
// block_tables[s][j / block_size] * block_size + j % block_size.
#include <float.h>
#include <math.h>

#include "backend/cpu/cpu.h"
#include "core/common.h"

void cpu_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *qkv, int ld, const struct batch *b,
                  const struct attn_dims *d) {
    (void)be;
    int kvd = d->kv_heads * d->head_dim, qd = d->heads * d->head_dim;
    for (int t = 0; t < b->num_tokens; t++) {
        int slot = b->slot_mapping[t];
        if (slot < 0) continue;
        const float *row = qkv + (int64_t)t * ld;
        memcpy((float *)k_cache + (int64_t)slot * kvd, row + qd, sizeof(float) * kvd);
        memcpy((float *)v_cache + (int64_t)slot * kvd, row + qd + kvd, sizeof(float) * kvd);
    }
}

struct attn_ctx {
    struct backend *be;
    float *out;
    const float *qkv;
    int ld;
    const float *kc, *vc;
    const struct batch *b;
    int seq0;
    const struct attn_dims *d;
};

// One (sequence, query head): every query token of the sequence attends to
// cached positions [0, its position].
static void attn_one(void *ctx, int task, int thread) {
    struct attn_ctx *c = ctx;
    const struct attn_dims *d = c->d;
    const struct batch *b = c->b;
    int H = d->heads, Dh = d->head_dim, kvh = (task % H) / (H / d->kv_heads), h = task % H;
    int s = c->seq0 + task / H, kvd = d->kv_heads * Dh, bs = d->block_size;
    int t0 = b->query_start_loc[s], L = b->query_start_loc[s + 1] - t0, ctx0 = b->context_lens[s];
    const int32_t *bt = b->block_tables + (int64_t)s * b->max_blocks_per_seq;
    float *sc = cpu_scratch(c->be, thread, sizeof(float) * (size_t)(ctx0 + L));
    for (int i = 0; i < L; i++) {
        const float *q = c->qkv + (int64_t)(t0 + i) * c->ld + h * Dh;
        int n = ctx0 + i + 1;
        float mx = -FLT_MAX;
        for (int j = 0; j < n; j++) {
            int64_t slot = (int64_t)bt[j / bs] * bs + j % bs;
            const float *k = c->kc + slot * kvd + kvh * Dh;
            float dot = 0;
            for (int e = 0; e < Dh; e++) dot += q[e] * k[e];
            sc[j] = dot * d->scale;
            mx = fmaxf(mx, sc[j]);
        }
        float sum = 0;
        for (int j = 0; j < n; j++) sum += sc[j] = expf(sc[j] - mx);
        float *o = c->out + (int64_t)(t0 + i) * H * Dh + h * Dh;
        memset(o, 0, sizeof(float) * Dh);
        for (int j = 0; j < n; j++) {
            int64_t slot = (int64_t)bt[j / bs] * bs + j % bs;
            const float *v = c->vc + slot * kvd + kvh * Dh;
            float p = sc[j] / sum;
            for (int e = 0; e < Dh; e++) o[e] += p * v[e];
        }
    }
}

void cpu_attn_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                      const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d) {
    struct attn_ctx c = {be, out, qkv, ld, k_cache, v_cache, b, seq0, d};
    cpu_parallel(be, (seq1 - seq0) * d->heads, attn_one, &c);
}

void cpu_attn_decode(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                     const void *v_cache, const struct batch *b, const struct attn_dims *d) {
    struct attn_ctx c = {be, out, qkv, ld, k_cache, v_cache, b, 0, d};
    cpu_parallel(be, b->num_decodes * d->heads, attn_one, &c);
}
