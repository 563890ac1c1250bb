// cuda_attn.cu - paged attention with GQA, no RoPE: KV writes into the block
// pool, and split-KV attention for both prefill (varlen, causal) and decode.
//
// Each warp owns one (query token, query head, KV split) and runs an online
// softmax over its keys; splits are merged by a second kernel. Caches are
// [num_blocks, block_size, kv_heads, head_dim] in fp32 or bf16.
#include "backend/cuda/cuda_common.cuh"

// Keys per split: decode has one query per sequence, so it needs short splits
// to give the GPU enough warps; a prefill has a warp per query already.
#define SPLIT_DECODE 128
#define SPLIT_PREFILL 512
#define MAX_E (CUDA_MAX_HEAD_DIM / 32) // head_dim <= 256, checked at load

template <typename T>
__device__ __forceinline__ void store_kv(T *dst, float v);
template <>
__device__ __forceinline__ void store_kv<float>(float *dst, float v) { *dst = v; }
template <>
__device__ __forceinline__ void store_kv<__nv_bfloat16>(__nv_bfloat16 *dst, float v) { *dst = __float2bfloat16(v); }

template <typename T>
__global__ void k_kv_write(T *kc, T *vc, const float *qkv, int ld, const int32_t *slot_mapping, int qd, int kvd) {
    int t = blockIdx.x, slot = slot_mapping[t];
    if (slot < 0) return;
    const float *row = qkv + (int64_t)t * ld + qd;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        store_kv(kc + (int64_t)slot * kvd + i, row[i]);
        store_kv(vc + (int64_t)slot * kvd + i, row[kvd + i]);
    }
}

void cuda_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *qkv, int ld, const struct batch *b,
                   const struct attn_dims *d) {
    if (b->num_tokens <= 0) return;
    int qd = d->heads * d->head_dim, kvd = d->kv_heads * d->head_dim;
    cudaStream_t s = cu(be)->stream;
    if (be->kv_dtype == DT_BF16)
        k_kv_write<<<b->num_tokens, 128, 0, s>>>((__nv_bfloat16 *)k_cache, (__nv_bfloat16 *)v_cache, qkv, ld,
                                                 b->slot_mapping, qd, kvd);
    else k_kv_write<<<b->num_tokens, 128, 0, s>>>((float *)k_cache, (float *)v_cache, qkv, ld, b->slot_mapping, qd, kvd);
    LAUNCH_CHECK();
}

struct attn_args {
    float *out;                     // [T, Hq*Dh] (nsplit == 1)
    float *part;                    // [T, Hq, nsplit, Dh + 2] partial acc, m, l
    const float *qkv;
    int ld, H, Hkv, Dh, bs, mbps, nsplit, split;
    float scale;
    const int32_t *qsl, *pos, *btab;
    int seq0, seq1, tok0;
};

template <typename T>
__global__ void k_attn(attn_args a, const T *kc, const T *vc) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int t = a.tok0 + blockIdx.x, h = blockIdx.y * (blockDim.x >> 5) + w, split = blockIdx.z;
    if (h >= a.H) return;
    int lo = a.seq0, hi = a.seq1 - 1; // the sequence of token t
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (a.qsl[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    int s = lo, kvh = h / (a.H / a.Hkv), kvd = a.Hkv * a.Dh, n = a.pos[t] + 1;
    int j0 = split * a.split, j1 = min(n, j0 + a.split);
    float q[MAX_E], acc[MAX_E];
    int ne = 0;
    for (int e = lane; e < a.Dh; e += 32) q[ne] = a.qkv[(int64_t)t * a.ld + h * a.Dh + e] * a.scale, acc[ne++] = 0;
    float m = -INFINITY, l = 0;
    const int32_t *bt = a.btab + (int64_t)s * a.mbps;
    for (int j = j0; j < j1; j++) {
        int64_t slot = (int64_t)bt[j / a.bs] * a.bs + j % a.bs;
        const T *k = kc + slot * kvd + kvh * a.Dh, *v = vc + slot * kvd + kvh * a.Dh;
        float dot = 0;
        for (int i = 0, e = lane; i < ne; i++, e += 32) dot += q[i] * load_f(k + e);
        dot = warp_sum(dot);
        float mn = fmaxf(m, dot), c = expf(m - mn), p = expf(dot - mn);
        l = l * c + p;
        for (int i = 0, e = lane; i < ne; i++, e += 32) acc[i] = acc[i] * c + p * load_f(v + e);
        m = mn;
    }
    if (a.nsplit == 1) {
        float inv = l > 0 ? 1.0f / l : 0.0f;
        for (int i = 0, e = lane; i < ne; i++, e += 32) a.out[(int64_t)t * a.H * a.Dh + h * a.Dh + e] = acc[i] * inv;
        return;
    }
    float *pp = a.part + (((int64_t)(t - a.tok0) * a.H + h) * a.nsplit + split) * (a.Dh + 2);
    for (int i = 0, e = lane; i < ne; i++, e += 32) pp[e] = acc[i];
    if (lane == 0) pp[a.Dh] = m, pp[a.Dh + 1] = l;
}

// q . k over a head: 16-byte loads when D % 8 == 0 (every head_dim in use)
__device__ __forceinline__ float dot_row(const float *q, const __nv_bfloat16 *k, int D) {
    float d = 0;
    if (D % 8 == 0) {
        for (int e = 0; e < D; e += 8) {
            uint4 u = *(const uint4 *)(k + e);
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float2 f = __bfloat1622float2(h[i]);
                d += q[e + 2 * i] * f.x + q[e + 2 * i + 1] * f.y;
            }
        }
        return d;
    }
    for (int e = 0; e < D; e++) d += q[e] * __bfloat162float(k[e]);
    return d;
}
__device__ __forceinline__ float dot_row(const float *q, const float *k, int D) {
    float d = 0;
    if (D % 4 == 0) {
        for (int e = 0; e < D; e += 4) {
            float4 f = *(const float4 *)(k + e);
            d += q[e] * f.x + q[e + 1] * f.y + q[e + 2] * f.z + q[e + 3] * f.w;
        }
        return d;
    }
    for (int e = 0; e < D; e++) d += q[e] * k[e];
    return d;
}

// Decode: a warp per (token, head, split) as k_attn, but each lane takes a
// key of every 32 (its dot product over the whole head, q from shared
// memory), so the softmax costs two warp reductions per 32 keys instead of one
// per key; then the 32 keys' weights and slots are broadcast to the lanes,
// which own head_dim / 32 output columns each.
template <typename T>
__global__ void k_attn_dec(attn_args a, const T *kc, const T *vc) {
    __shared__ float qs[4][32 * MAX_E];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int t = a.tok0 + blockIdx.x, h = blockIdx.y * (blockDim.x >> 5) + w, split = blockIdx.z;
    if (h >= a.H) return;
    int lo = a.seq0, hi = a.seq1 - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (a.qsl[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    int s = lo, kvh = h / (a.H / a.Hkv), kvd = a.Hkv * a.Dh, n = a.pos[t] + 1, D = a.Dh;
    int j0 = split * a.split, j1 = min(n, j0 + a.split);
    float *q = qs[w], acc[MAX_E];
    int ne = 0;
    for (int e = lane; e < D; e += 32) q[e] = a.qkv[(int64_t)t * a.ld + h * D + e] * a.scale, acc[ne++] = 0;
    __syncwarp();
    float m = -INFINITY, l = 0;
    const int32_t *bt = a.btab + (int64_t)s * a.mbps;
    for (int jb = j0; jb < j1; jb += 32) {
        int j = jb + lane;
        bool ok = j < j1;
        int64_t slot = ok ? (int64_t)bt[j / a.bs] * a.bs + j % a.bs : 0;
        float dot = -INFINITY;
        if (ok) dot = dot_row(q, kc + slot * kvd + kvh * D, D);
        float mx = dot;
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float mn = fmaxf(m, mx), c = m == -INFINITY ? 0.0f : expf(m - mn), p = ok ? expf(dot - mn) : 0.0f;
        l = l * c + warp_sum(p);
        for (int i = 0; i < ne; i++) acc[i] *= c;
        int nk = min(32, j1 - jb);
        for (int jj = 0; jj < nk; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            int64_t sj = __shfl_sync(0xffffffffu, slot, jj);
            const T *v = vc + sj * kvd + kvh * D;
            for (int i = 0, e = lane; i < ne; i++, e += 32) acc[i] += pj * load_f(v + e);
        }
        m = mn;
    }
    if (a.nsplit == 1) {
        float inv = l > 0 ? 1.0f / l : 0.0f;
        for (int i = 0, e = lane; i < ne; i++, e += 32) a.out[(int64_t)t * a.H * D + h * D + e] = acc[i] * inv;
        return;
    }
    float *pp = a.part + (((int64_t)(t - a.tok0) * a.H + h) * a.nsplit + split) * (D + 2);
    for (int i = 0, e = lane; i < ne; i++, e += 32) pp[e] = acc[i];
    if (lane == 0) pp[D] = m, pp[D + 1] = l;
}

// Merges the splits of one (token, head): rescale each by exp(m_i - max m).
__global__ void k_attn_merge(attn_args a) {
    int t = a.tok0 + blockIdx.x, h = blockIdx.y;
    const float *pp = a.part + ((int64_t)(t - a.tok0) * a.H + h) * a.nsplit * (a.Dh + 2);
    float mx = -INFINITY;
    for (int i = 0; i < a.nsplit; i++) mx = fmaxf(mx, pp[i * (a.Dh + 2) + a.Dh]);
    float l = 0;
    for (int i = 0; i < a.nsplit; i++) {
        float mi = pp[i * (a.Dh + 2) + a.Dh];
        if (mi > -INFINITY) l += pp[i * (a.Dh + 2) + a.Dh + 1] * expf(mi - mx);
    }
    for (int e = threadIdx.x; e < a.Dh; e += blockDim.x) {
        float o = 0;
        for (int i = 0; i < a.nsplit; i++) {
            float mi = pp[i * (a.Dh + 2) + a.Dh];
            if (mi > -INFINITY) o += pp[i * (a.Dh + 2) + e] * expf(mi - mx);
        }
        a.out[(int64_t)t * a.H * a.Dh + h * a.Dh + e] = o / l;
    }
}

static void launch_attn(struct backend *be, float *out, const float *qkv, int ld, const void *kc, const void *vc,
                        const struct batch *b, int seq0, int seq1, const struct attn_dims *d, int split) {
    if (seq1 <= seq0) return;
    int tok0 = b->h_query_start_loc[seq0], ntok = b->h_query_start_loc[seq1] - tok0;
    if (ntok <= 0) return;
    int maxlen = 0; // a recorded graph covers any context: splits past a sequence's end exit at once
    if (b->fixed_shapes) maxlen = b->max_model_len;
    else
        for (int s = seq0; s < seq1; s++) maxlen = b->h_seq_lens[s] > maxlen ? b->h_seq_lens[s] : maxlen;
    int nsplit = cdiv(maxlen, split);
    attn_args a = {out, NULL, qkv, ld, d->heads, d->kv_heads, d->head_dim, d->block_size, b->max_blocks_per_seq, nsplit,
                   split, d->scale, b->query_start_loc, b->positions, b->block_tables, seq0, seq1, tok0};
    if (nsplit > 1) a.part = (float *)cuda_scratch(be, sizeof(float) * (size_t)ntok * d->heads * nsplit * (d->head_dim + 2));
    int wpb = 4;
    dim3 grid(ntok, cdiv(d->heads, wpb), nsplit);
    cudaStream_t s = cu(be)->stream;
    bool dec = split == SPLIT_DECODE;
    if (be->kv_dtype == DT_BF16 && dec)
        k_attn_dec<<<grid, 32 * wpb, 0, s>>>(a, (const __nv_bfloat16 *)kc, (const __nv_bfloat16 *)vc);
    else if (dec) k_attn_dec<<<grid, 32 * wpb, 0, s>>>(a, (const float *)kc, (const float *)vc);
    else if (be->kv_dtype == DT_BF16)
        k_attn<<<grid, 32 * wpb, 0, s>>>(a, (const __nv_bfloat16 *)kc, (const __nv_bfloat16 *)vc);
    else k_attn<<<grid, 32 * wpb, 0, s>>>(a, (const float *)kc, (const float *)vc);
    LAUNCH_CHECK();
    if (nsplit > 1) {
        k_attn_merge<<<dim3(ntok, d->heads), 128, 0, s>>>(a);
        LAUNCH_CHECK();
    }
}

void cuda_attn_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                       const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d) {
    if (cuda_flash_prefill(be, out, qkv, ld, k_cache, v_cache, b, seq0, seq1, d)) return; // tensor cores (cuda_flash.cu)
    launch_attn(be, out, qkv, ld, k_cache, v_cache, b, seq0, seq1, d, SPLIT_PREFILL);
}

void cuda_attn_decode(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                      const void *v_cache, const struct batch *b, const struct attn_dims *d) {
    launch_attn(be, out, qkv, ld, k_cache, v_cache, b, 0, b->num_decodes, d, SPLIT_DECODE);
}
