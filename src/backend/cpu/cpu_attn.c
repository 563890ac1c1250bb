// cpu_attn.c - paged attention reference: GQA, causal, no RoPE.
//
// qkv row (ld floats): q [Hq*Dh] | k [Hkv*Dh] | v [Hkv*Dh]. Caches are
// [num_blocks, block_size, Hkv, Dh] fp32, or e4m3 codes (DT_FP8: enum dtype,
// read back to fp32 exactly before any arithmetic); token j of sequence s
// lives at block_tables[s][j / block_size] * block_size + j % block_size.
#include <float.h>
#include <math.h>
#include <pthread.h>

#include "backend/cpu/cpu.h"
#include "core/common.h"
#include "io/dtype.h"

static float fp8_val[256]; // e4m3 code -> its value, exactly
static pthread_once_t fp8_once = PTHREAD_ONCE_INIT;
static void fp8_init(void) {
    for (int i = 0; i < 256; i++) fp8_val[i] = fp8e4m3_to_f32((uint8_t)i);
}

void cpu_kv_store(void *cache, enum dtype dt, int64_t off, const float *x, int n, float scale) {
    if (dt != DT_FP8) {
        memcpy((float *)cache + off, x, sizeof(float) * n);
        return;
    }
    uint8_t *c = (uint8_t *)cache + off;
    for (int i = 0; i < n; i++) c[i] = f32_to_fp8e4m3(x[i] / scale);
}

void cpu_kv_load(float *dst, const void *cache, enum dtype dt, int64_t off, int n, float scale) {
    if (dt != DT_FP8) {
        memcpy(dst, (const float *)cache + off, sizeof(float) * n);
        return;
    }
    pthread_once(&fp8_once, fp8_init);
    const uint8_t *c = (const uint8_t *)cache + off;
    for (int i = 0; i < n; i++) dst[i] = fp8_val[c[i]] * scale;
}

void cpu_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *qkv, int ld, const struct batch *b,
                  const struct attn_dims *d) {
    int kvd = d->kv_heads * d->head_dim, qd = d->heads * d->head_dim;
    for (int t = 0; t < b->num_tokens; t++) {
        int slot = b->slot_mapping[t];
        if (slot < 0) continue;
        const float *row = qkv + (int64_t)t * ld;
        cpu_kv_store(k_cache, be->kv_dtype, (int64_t)slot * kvd, row + qd, kvd, d->k_scale);
        cpu_kv_store(v_cache, be->kv_dtype, (int64_t)slot * kvd, row + qd + kvd, kvd, d->v_scale);
    }
}

// Head kvh of cached token `slot` as fp32: the cache row itself (fp32), or
// its values read into buf [Dh] (fp8).
static const float *kv_row(const void *cache, enum dtype dt, int64_t slot, int kvd, int kvh, int Dh, float scale,
                           float *buf) {
    int64_t off = slot * kvd + (int64_t)kvh * Dh;
    if (dt != DT_FP8) return (const float *)cache + off;
    cpu_kv_load(buf, cache, dt, off, Dh, scale);
    return buf;
}

struct attn_ctx {
    struct backend *be;
    float *out;
    const float *qkv;
    int ld;
    const void *kc, *vc;
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
    float *sc = cpu_scratch(c->be, thread, sizeof(float) * ((size_t)ctx0 + L + Dh)), *buf = sc + ctx0 + L;
    enum dtype dt = c->be->kv_dtype;
    for (int i = 0; i < L; i++) {
        const float *q = c->qkv + (int64_t)(t0 + i) * c->ld + h * Dh;
        int n = ctx0 + i + 1;
        float mx = -FLT_MAX;
        for (int j = 0; j < n; j++) {
            int64_t slot = (int64_t)bt[j / bs] * bs + j % bs;
            const float *k = kv_row(c->kc, dt, slot, kvd, kvh, Dh, d->k_scale, buf);
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
            const float *v = kv_row(c->vc, dt, slot, kvd, kvh, Dh, d->v_scale, buf);
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

void cpu_attn_decode(struct backend *be, float *out, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                     void *v_cache, const struct batch *b, const struct attn_dims *d) {
    for (int t = 0; t < b->num_decodes; t++) cpu_qk_norm_rope_row(qkv, ld, t, p, k_cache, v_cache, be->kv_dtype, b, d);
    struct attn_ctx c = {be, out, qkv, ld, k_cache, v_cache, b, 0, d};
    cpu_parallel(be, b->num_decodes * d->heads, attn_one, &c);
}
