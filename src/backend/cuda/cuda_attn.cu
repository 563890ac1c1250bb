// cuda_attn.cu - paged attention with GQA, no RoPE: KV writes into the block
// pool, and split-KV attention for both prefill (varlen, causal) and decode.
//
// Each warp owns one (query token, query head, KV split) and runs an online
// softmax over its keys; splits are merged by a second kernel. Caches are
// [num_blocks, block_size, kv_heads, head_dim] in fp32, bf16 or e4m3 codes
// (DT_FP8: x / k_scale, x / v_scale written; each code read back as e4m3 *
// scale in fp32, in registers: the CPU reference's values).
#include "backend/cuda/cuda_common.cuh"

// Keys per split: decode has one query per sequence, so it needs short splits
// to give the GPU enough warps; a prefill has a warp per query already.
#define SPLIT_DECODE 128
#define SPLIT_PREFILL 512
#define MAX_E (CUDA_MAX_HEAD_DIM / 32) // head_dim <= 256, checked at load

// One cache element: v as the cache's type (scale: an fp8 cache's k_scale or
// v_scale, unused otherwise), and back as a float.
__device__ __forceinline__ void store_kv(float *dst, float v, float) { *dst = v; }
__device__ __forceinline__ void store_kv(__nv_bfloat16 *dst, float v, float) { *dst = __float2bfloat16(v); }
__device__ __forceinline__ void store_kv(__nv_fp8_e4m3 *dst, float v, float scale) { *dst = fp8_code(v, scale); }
__device__ __forceinline__ float load_kv(const float *p, float) { return *p; }
__device__ __forceinline__ float load_kv(const __nv_bfloat16 *p, float) { return __bfloat162float(*p); }
__device__ __forceinline__ float load_kv(const __nv_fp8_e4m3 *p, float scale) { return fp8_f(*p) * scale; }

template <typename T>
__global__ void k_kv_write(T *kc, T *vc, const float *qkv, int ld, const int32_t *slot_mapping, int qd, int kvd,
                           float ks, float vs) {
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x, slot = slot_mapping[t];
    if (slot < 0) return;
    const float *row = qkv + (int64_t)t * ld + qd;
    for (int i = threadIdx.x; i < kvd; i += blockDim.x) {
        store_kv(kc + (int64_t)slot * kvd + i, row[i], ks);
        store_kv(vc + (int64_t)slot * kvd + i, row[kvd + i], vs);
    }
}

void cuda_kv_write(struct backend *be, void *k_cache, void *v_cache, const float *qkv, int ld, const struct batch *b,
                   const struct attn_dims *d) {
    if (b->num_tokens <= 0) return;
    int qd = d->heads * d->head_dim, kvd = d->kv_heads * d->head_dim;
    cudaStream_t s = cu(be)->stream;
    kv_dispatch(be->kv_dtype, [&](auto *z) {
        typedef typename std::remove_pointer<decltype(z)>::type T;
        launch_pdl(k_kv_write<T>, b->num_tokens, 128, 0, s, (T *)k_cache, (T *)v_cache, qkv, ld,
                   (const int32_t *)b->slot_mapping, qd, kvd, d->k_scale, d->v_scale);
    });
}

// qk_norm_rope (backend.h): block (t, y) of QKN_WARPS warps, a warp per
// head g of token t's q | k | v heads. A q or k head is RMSNormed (when q_norm)
// into shared memory, rotated by pos[t] from there (the pairs (i, i + hd/2)
// cross lanes) back into qkv, and a k head also into the K cache; a v head is
// copied to the V cache. The arithmetic is k_head_rmsnorm's, k_rope's and
// k_kv_write's in their order, so the values are theirs (one kernel, not four).
#define QKN_WARPS 4
template <typename T>
__global__ void __launch_bounds__(32 * QKN_WARPS)
    k_qk_norm_rope(float *qkv, int ld, const float *qn, const float *kn, float eps, const float *table, T *kc, T *vc,
                   const int32_t *pos, const int32_t *slot_mapping, int H, int Hkv, int hd, float ks, float vs) {
    __shared__ float sh[QKN_WARPS][CUDA_MAX_HEAD_DIM];
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = blockIdx.y * QKN_WARPS + w;
    if (g >= H + 2 * Hkv) return; // a whole warp: the shuffles below see every lane
    float *p = qkv + (int64_t)t * ld + (int64_t)g * hd;
    int slot = slot_mapping[t], kvd = Hkv * hd;
    if (g >= H + Hkv) { // v
        if (slot >= 0)
            for (int i = lane; i < hd; i += 32) store_kv(vc + (int64_t)slot * kvd + (g - H - Hkv) * hd + i, p[i], vs);
        return;
    }
    float *s = sh[w];
    const float *nw = g < H ? qn : kn;
    if (nw) {
        float ss = 0;
        for (int i = lane; i < hd; i += 32) ss += p[i] * p[i];
        ss = warp_sum(ss);
        float r = rsqrtf(ss / hd + eps);
        for (int i = lane; i < hd; i += 32) s[i] = nw[i] * (p[i] * r);
    } else {
        for (int i = lane; i < hd; i += 32) s[i] = p[i];
    }
    __syncwarp();
    T *kr = g >= H && slot >= 0 ? kc + (int64_t)slot * kvd + (g - H) * hd : NULL; // this k head's cache row
    if (table) {
        int h2 = hd / 2;
        const float *c = table + (int64_t)pos[t] * hd, *sn = c + h2;
        for (int i = lane; i < h2; i += 32) {
            float u = s[i], v = s[i + h2], a = u * c[i] - v * sn[i], b = v * c[i] + u * sn[i];
            p[i] = a, p[i + h2] = b;
            if (kr) store_kv(kr + i, a, ks), store_kv(kr + i + h2, b, ks);
        }
    } else {
        for (int i = lane; i < hd; i += 32) {
            p[i] = s[i];
            if (kr) store_kv(kr + i, s[i], ks);
        }
    }
}

void cuda_qk_norm_rope(struct backend *be, float *qkv, int ld, const float *q_norm, const float *k_norm, float eps,
                       const float *table, void *k_cache, void *v_cache, const struct batch *b,
                       const struct attn_dims *d) {
    if (b->num_tokens <= 0) return;
    dim3 grid(b->num_tokens, cdiv(d->heads + 2 * d->kv_heads, QKN_WARPS));
    cudaStream_t s = cu(be)->stream;
    const int32_t *pos = b->positions, *sm = (const int32_t *)b->slot_mapping;
    kv_dispatch(be->kv_dtype, [&](auto *z) {
        typedef typename std::remove_pointer<decltype(z)>::type T;
        launch_pdl(k_qk_norm_rope<T>, grid, 32 * QKN_WARPS, 0, s, qkv, ld, q_norm, k_norm, eps, table, (T *)k_cache,
                   (T *)v_cache, pos, sm, d->heads, d->kv_heads, d->head_dim, d->k_scale, d->v_scale);
    });
}

struct attn_args {
    float *out;                     // [T, Hq*Dh] (nsplit == 1)
    float *part;                    // [T, Hq, nsplit, Dh + 2] partial acc, m, l
    const float *qkv;
    int ld, H, Hkv, Dh, bs, mbps, nsplit, split;
    float scale;
    const int32_t *qsl, *pos, *btab;
    int seq0, seq1, tok0;
    float ks, vs; // an fp8 cache's k_scale, v_scale (load_kv)
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
        for (int i = 0, e = lane; i < ne; i++, e += 32) dot += q[i] * load_kv(k + e, a.ks);
        dot = warp_sum(dot);
        float mn = fmaxf(m, dot), c = expf(m - mn), p = expf(dot - mn);
        l = l * c + p;
        for (int i = 0, e = lane; i < ne; i++, e += 32) acc[i] = acc[i] * c + p * load_kv(v + e, a.vs);
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

// Decode: a block per (sequence, KV head, group of up to G of its query
// heads, split). The K and V rows of a KV head are read once for all the
// query heads that share them (GQA), in chunks of DEC_CHUNK keys:
//   1. scores: four threads per key, each a quarter of the head (16-byte
//      loads), reduced by shuffles; sc[G][DEC_CHUNK] in shared memory;
//   2. an online softmax per head over the chunk (a warp per head);
//   3. outputs: a thread per C columns (8, 4 or 2 as G allows) and key lane,
//      p * V summed in registers for the G heads, key lanes reduced through
//      shared memory.
// The split count is fixed by the batch's shape and the SM count (so a
// recorded graph covers any context); each sequence cuts its own context
// into that many ranges of a multiple of 32 keys, on the device.
#define DEC_THREADS 128
#define DEC_TPK 4
#define DEC_CHUNK 256
#define DEC_MAX_SPLITS 256

__device__ __forceinline__ int cdiv_dev(int a, int b) { return (a + b - 1) / b; }
__device__ __forceinline__ int dec_range(int n, int nsplit) { return (cdiv_dev(n, nsplit) + 31) & ~31; }

// 8 cache elements at k in one load (32, 16 or 8 bytes) as floats (an fp8
// cache's codes times its scale s)
__device__ __forceinline__ void load8(const float *k, float *f, float) {
    float4 a = *(const float4 *)k, b = *(const float4 *)(k + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ __forceinline__ void load8(const __nv_bfloat16 *k, float *f, float) {
    uint4 u = *(const uint4 *)k;
    const __nv_bfloat162 *h2 = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h2[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void load8(const __nv_fp8_e4m3 *k, float *f, float s) {
    uint2 u = *(const uint2 *)k;
    const __nv_fp8x2_storage_t *p = (const __nv_fp8x2_storage_t *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = fp8x2_f2(p[i]);
        f[2 * i] = v.x * s, f[2 * i + 1] = v.y * s;
    }
}
// dot[h] += q[h] . k over the chunks of 8 of this thread (sub of DEC_TPK);
// s: an fp8 cache's k_scale
template <int G, int DT, typename T>
__device__ __forceinline__ void dot_part(float *dot, const float *q, int qs, const T *k, int D, int sub, float s) {
#pragma unroll
    for (int e = sub * 8; e < (DT ? DT : D); e += DEC_TPK * 8) {
        float f[8];
        load8(k + e, f, s);
#pragma unroll
        for (int h = 0; h < G; h++) {
            const float *qh = q + h * qs + e;
            float d = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) d += qh[i] * f[i];
            dot[h] += d;
        }
    }
}
// f[0..C) = p[0..C), C of 2, 4 or 8 in one load (p aligned to C elements);
// an fp8 cache's codes times its v_scale s
template <int C>
__device__ __forceinline__ void load_cols(const float *p, float *f, float) {
    if (C == 2) {
        float2 v = *(const float2 *)p;
        f[0] = v.x, f[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < C; i += 4) {
            float4 v = *(const float4 *)(p + i);
            f[i] = v.x, f[i + 1] = v.y, f[i + 2] = v.z, f[i + 3] = v.w;
        }
    }
}
template <int C>
__device__ __forceinline__ void load_cols(const __nv_bfloat16 *p, float *f, float) {
    __nv_bfloat162 h[C / 2];
    if (C == 2) *(uint32_t *)h = *(const uint32_t *)p;
    else if (C == 4) *(uint2 *)h = *(const uint2 *)p;
    else *(uint4 *)h = *(const uint4 *)p;
#pragma unroll
    for (int i = 0; i < C / 2; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
template <int C>
__device__ __forceinline__ void load_cols(const __nv_fp8_e4m3 *p, float *f, float s) {
    uint2 u = {0, 0};
    if (C == 2) u.x = *(const uint16_t *)p;
    else if (C == 4) u.x = *(const uint32_t *)p;
    else u = *(const uint2 *)p;
    const __nv_fp8x2_storage_t *h = (const __nv_fp8x2_storage_t *)&u;
#pragma unroll
    for (int i = 0; i < C / 2; i++) {
        float2 v = fp8x2_f2(h[i]);
        f[2 * i] = v.x * s, f[2 * i + 1] = v.y * s;
    }
}
// Output columns per thread: as many as the accumulators (G heads) allow.
template <int G> struct dec_cols { static const int C = G <= 4 ? 8 : G <= 8 ? 4 : 2; };

// Shared memory: slots [DEC_CHUNK], q [G][D], sc [G][DEC_CHUNK], m/l/c [3][G],
// red [KL-1][G][D] (key lanes past the first).
static size_t dec_smem(int G, int D) {
    int C = G <= 4 ? 8 : G <= 8 ? 4 : 2, KL = DEC_THREADS / (D / C);
    return sizeof(float) * ((size_t)G * D + (size_t)G * DEC_CHUNK + 3 * G + (size_t)(KL - 1) * G * D) +
           sizeof(int64_t) * DEC_CHUNK;
}

// head_dim % 8 == 0 (checked by the launcher); G heads a block at most; DT:
// head_dim as a constant (so the loops over it unroll and their loads are in
// flight together), or 0 for any other.
template <typename T, int G, int DT>
__global__ void __launch_bounds__(DEC_THREADS) k_attn_dec(attn_args a, const T *kc, const T *vc) {
    pdl_wait();
    pdl_trigger();
    extern __shared__ int64_t sm[];
    const int D = DT ? DT : a.Dh, g = a.H / a.Hkv, ngrp = cdiv_dev(g, G), tid = threadIdx.x;
    int s = a.seq0 + blockIdx.x, t = a.qsl[s], kvh = blockIdx.y / ngrp, h0 = kvh * g + (blockIdx.y % ngrp) * G;
    int nh = min(G, kvh * g + g - h0), n = a.pos[t] + 1, L = dec_range(n, a.nsplit);
    int j0 = blockIdx.z * L, j1 = min(n, j0 + L);
    if (j0 >= n) return; // past this sequence's context: the merge skips it
    const int C = dec_cols<G>::C;
    int KL = DEC_THREADS / (D / C), kvd = a.Hkv * D;
    int64_t *slot = (int64_t *)sm; // first: 8-byte aligned
    float *q = (float *)(slot + DEC_CHUNK), *sc = q + G * D, *mh = sc + G * DEC_CHUNK, *lh = mh + G, *ch = lh + G;
    float *red = ch + G;
    for (int i = tid; i < G * D; i += DEC_THREADS) {
        int hh = i / D;
        q[i] = hh < nh ? a.qkv[(int64_t)t * a.ld + (h0 + hh) * D + i % D] * a.scale : 0.0f;
    }
    if (tid < G) mh[tid] = -INFINITY, lh[tid] = 0;
    const int32_t *bt = a.btab + (int64_t)s * a.mbps;
    int cp = tid % (D / C), kl = tid / (D / C);
    float acc[G][C];
#pragma unroll
    for (int h = 0; h < G; h++)
#pragma unroll
        for (int c = 0; c < C; c++) acc[h][c] = 0;
    for (int c0 = j0; c0 < j1; c0 += DEC_CHUNK) {
        int nk = min(DEC_CHUNK, j1 - c0);
        for (int j = tid; j < nk; j += DEC_THREADS) slot[j] = (int64_t)bt[(c0 + j) / a.bs] * a.bs + (c0 + j) % a.bs;
        __syncthreads();
        // 1. scores, KP keys per pass (their loads in flight together; one
        // at G = 16, whose accumulators fill the registers); the loop is
        // uniform across a warp: the shuffles need every lane
        const int KP = G >= 16 ? 1 : 2, KG = DEC_THREADS / DEC_TPK;
        for (int base = 0; base < nk; base += KP * KG) {
            float d[KP][G];
#pragma unroll
            for (int k = 0; k < KP; k++) {
                int j = base + k * KG + tid / DEC_TPK;
#pragma unroll
                for (int h = 0; h < G; h++) d[k][h] = 0;
                if (j < nk) dot_part<G, DT>(d[k], q, D, kc + slot[j] * kvd + kvh * D, D, tid % DEC_TPK, a.ks);
            }
#pragma unroll
            for (int k = 0; k < KP; k++) {
                int j = base + k * KG + tid / DEC_TPK;
#pragma unroll
                for (int h = 0; h < G; h++) {
                    d[k][h] += __shfl_xor_sync(0xffffffffu, d[k][h], 1);
                    d[k][h] += __shfl_xor_sync(0xffffffffu, d[k][h], 2);
                }
                if (j < nk && tid % DEC_TPK == 0) {
#pragma unroll
                    for (int h = 0; h < G; h++) sc[h * DEC_CHUNK + j] = d[k][h];
                }
            }
        }
        __syncthreads();
        // 2. online softmax: chunk max, rescale of what came before
        int lane = tid & 31;
        for (int h = tid >> 5; h < nh; h += DEC_THREADS / 32) {
            float mx = -INFINITY;
            for (int j = lane; j < nk; j += 32) mx = fmaxf(mx, sc[h * DEC_CHUNK + j]);
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float mo = mh[h], mn = fmaxf(mo, mx), sum = 0;
            for (int j = lane; j < nk; j += 32) {
                float p = expf(sc[h * DEC_CHUNK + j] - mn);
                sc[h * DEC_CHUNK + j] = p, sum += p;
            }
            sum = warp_sum(sum);
            __syncwarp();
            if (lane == 0) {
                float c = mo == -INFINITY ? 0.0f : expf(mo - mn);
                ch[h] = c, lh[h] = lh[h] * c + sum, mh[h] = mn;
            }
        }
        __syncthreads();
        // 3. p * V
        if (kl < KL) {
#pragma unroll
            for (int h = 0; h < G; h++) {
                float c = h < nh ? ch[h] : 0.0f;
#pragma unroll
                for (int i = 0; i < C; i++) acc[h][i] *= c;
            }
#pragma unroll 4
            for (int j = kl; j < nk; j += KL) {
                float v[C];
                load_cols<C>(vc + slot[j] * kvd + kvh * D + C * cp, v, a.vs);
#pragma unroll
                for (int h = 0; h < G; h++) {
                    float p = sc[h * DEC_CHUNK + j];
#pragma unroll
                    for (int i = 0; i < C; i++) acc[h][i] += p * v[i];
                }
            }
        }
        __syncthreads(); // sc and slot are rewritten by the next chunk
    }
    if (kl > 0 && kl < KL) {
        float *r = red + (kl - 1) * G * D + C * cp;
#pragma unroll
        for (int h = 0; h < G; h++)
#pragma unroll
            for (int i = 0; i < C; i++) r[h * D + i] = acc[h][i];
    }
    __syncthreads();
    if (kl != 0) return;
    for (int k = 1; k < KL; k++) {
        const float *r = red + (k - 1) * G * D + C * cp;
#pragma unroll
        for (int h = 0; h < G; h++)
#pragma unroll
            for (int i = 0; i < C; i++) acc[h][i] += r[h * D + i];
    }
#pragma unroll
    for (int h = 0; h < G; h++) {
        if (h >= nh) break;
        int hq = h0 + h;
        if (a.nsplit == 1) {
            float inv = lh[h] > 0 ? 1.0f / lh[h] : 0.0f;
            float *o = a.out + (int64_t)t * a.H * D + hq * D + C * cp;
#pragma unroll
            for (int i = 0; i < C; i++) o[i] = acc[h][i] * inv;
            continue;
        }
        float *pp = a.part + (((int64_t)(t - a.tok0) * a.H + hq) * a.nsplit + blockIdx.z) * (D + 2);
#pragma unroll
        for (int i = 0; i < C; i++) pp[C * cp + i] = acc[h][i];
        if (cp == 0) pp[D] = mh[h], pp[D + 1] = lh[h];
    }
}

// Merges the splits of one (token, head): rescale each by exp(m_i - max m).
// Only the splits that hold keys of the token's context are read: of a.split
// keys each (prefill), or the decode kernel's per-sequence ranges (split 0).
__global__ void k_attn_merge(attn_args a) {
    pdl_wait();
    pdl_trigger();
    int t = a.tok0 + blockIdx.x, h = blockIdx.y, n = a.pos[t] + 1;
    int ns = min(a.nsplit, cdiv_dev(n, a.split ? a.split : dec_range(n, a.nsplit)));
    const float *pp = a.part + ((int64_t)(t - a.tok0) * a.H + h) * a.nsplit * (a.Dh + 2);
    float mx = -INFINITY;
    for (int i = 0; i < ns; i++) mx = fmaxf(mx, pp[i * (a.Dh + 2) + a.Dh]);
    float l = 0;
    for (int i = 0; i < ns; i++) {
        float mi = pp[i * (a.Dh + 2) + a.Dh];
        if (mi > -INFINITY) l += pp[i * (a.Dh + 2) + a.Dh + 1] * expf(mi - mx);
    }
    for (int e = threadIdx.x; e < a.Dh; e += blockDim.x) {
        float o = 0;
        for (int i = 0; i < ns; i++) {
            float mi = pp[i * (a.Dh + 2) + a.Dh];
            if (mi > -INFINITY) o += pp[i * (a.Dh + 2) + e] * expf(mi - mx);
        }
        a.out[(int64_t)t * a.H * a.Dh + h * a.Dh + e] = l > 0 ? o / l : 0.0f;
    }
}

static void merge(struct backend *be, const attn_args *a, int ntok) {
    if (a->nsplit <= 1) return;
    launch_pdl(k_attn_merge, dim3(ntok, a->H), 128, 0, cu(be)->stream, *a);
}

// The generic kernel: a warp per (token, head, split of `split` keys).
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
                   split, d->scale, b->query_start_loc, b->positions, b->block_tables, seq0, seq1, tok0,
                   d->k_scale, d->v_scale};
    if (nsplit > 1) a.part = (float *)cuda_scratch(be, sizeof(float) * (size_t)ntok * d->heads * nsplit * (d->head_dim + 2));
    int wpb = 4;
    dim3 grid(ntok, cdiv(d->heads, wpb), nsplit);
    cudaStream_t s = cu(be)->stream;
    kv_dispatch(be->kv_dtype, [&](auto *z) {
        typedef typename std::remove_pointer<decltype(z)>::type T;
        k_attn<<<grid, 32 * wpb, 0, s>>>(a, (const T *)kc, (const T *)vc);
    });
    LAUNCH_CHECK();
    merge(be, &a, ntok);
}

template <typename T, int G>
static void launch_dec_g(const attn_args &a, dim3 grid, size_t smem, cudaStream_t s, const void *kc, const void *vc) {
    if (a.Dh == 128) launch_pdl(k_attn_dec<T, G, 128>, grid, DEC_THREADS, smem, s, a, (const T *)kc, (const T *)vc);
    else if (a.Dh == 64) launch_pdl(k_attn_dec<T, G, 64>, grid, DEC_THREADS, smem, s, a, (const T *)kc, (const T *)vc);
    else launch_pdl(k_attn_dec<T, G, 0>, grid, DEC_THREADS, smem, s, a, (const T *)kc, (const T *)vc);
}

template <typename T>
static void launch_dec_t(const attn_args &a, int G, dim3 grid, cudaStream_t s, const void *kc, const void *vc) {
    size_t smem = dec_smem(G, a.Dh);
    if (G == 1) launch_dec_g<T, 1>(a, grid, smem, s, kc, vc);
    else if (G == 2) launch_dec_g<T, 2>(a, grid, smem, s, kc, vc);
    else if (G == 4) launch_dec_g<T, 4>(a, grid, smem, s, kc, vc);
    else if (G == 8) launch_dec_g<T, 8>(a, grid, smem, s, kc, vc);
    else launch_dec_g<T, 16>(a, grid, smem, s, kc, vc);
}

void cuda_attn_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                       const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d) {
    if (cuda_flash_prefill(be, out, qkv, ld, k_cache, v_cache, b, seq0, seq1, d)) return; // tensor cores (cuda_flash.cu)
    launch_attn(be, out, qkv, ld, k_cache, v_cache, b, seq0, seq1, d, SPLIT_PREFILL);
}

// Splits: enough blocks for eight per SM (32 warps: the loads of one block
// are too few to keep HBM busy), from the batch's shape alone (a
// recorded graph replays them at any context), at most DEC_MAX_SPLITS and
// no more than 32-key ranges of the longest context allow.
void cuda_attn_decode(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                      const void *v_cache, const struct batch *b, const struct attn_dims *d) {
    int nd = b->num_decodes;
    if (nd <= 0) return;
    if (d->head_dim % 8) { // the generic kernel (16-byte loads need head_dim % 8 == 0)
        launch_attn(be, out, qkv, ld, k_cache, v_cache, b, 0, nd, d, SPLIT_DECODE);
        return;
    }
    int g = d->heads / d->kv_heads, G = 1;
    while (G < g && G < 16) G *= 2;
    int blocks = nd * d->kv_heads * cdiv(g, G), maxlen = b->max_model_len;
    if (!b->fixed_shapes) {
        maxlen = 0;
        for (int s = 0; s < nd; s++) maxlen = b->h_seq_lens[s] > maxlen ? b->h_seq_lens[s] : maxlen;
    }
    int nsplit = cdiv(8 * cu(be)->num_sms, blocks);
    nsplit = nsplit < DEC_MAX_SPLITS ? nsplit : DEC_MAX_SPLITS;
    nsplit = nsplit < cdiv(maxlen, 32) ? nsplit : cdiv(maxlen, 32);
    nsplit = nsplit > 1 ? nsplit : 1;
    attn_args a = {out, NULL, qkv, ld, d->heads, d->kv_heads, d->head_dim, d->block_size, b->max_blocks_per_seq, nsplit,
                   0, d->scale, b->query_start_loc, b->positions, b->block_tables, 0, nd, 0, d->k_scale, d->v_scale};
    if (nsplit > 1) a.part = (float *)cuda_scratch(be, sizeof(float) * (size_t)nd * d->heads * nsplit * (d->head_dim + 2));
    dim3 grid(nd, d->kv_heads * cdiv(g, G), nsplit);
    cudaStream_t s = cu(be)->stream;
    kv_dispatch(be->kv_dtype, [&](auto *z) {
        launch_dec_t<typename std::remove_pointer<decltype(z)>::type>(a, G, grid, s, k_cache, v_cache);
    });
    LAUNCH_CHECK();
    merge(be, &a, nd);
}
