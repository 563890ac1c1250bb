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
                   const int32_t *pos, const int32_t *slot_mapping, int t0, int H, int Hkv, int hd, float ks, float vs) {
    __shared__ float sh[QKN_WARPS][CUDA_MAX_HEAD_DIM];
    pdl_wait();
    pdl_trigger();
    int t = t0 + blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = blockIdx.y * QKN_WARPS + w;
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

// qk_norm_rope of rows [t0, t1)
static void qkn_rows(struct backend *be, float *qkv, int ld, const struct attn_prep *p, void *k_cache, void *v_cache,
                     const struct batch *b, int t0, int t1, const struct attn_dims *d) {
    if (t1 <= t0) return;
    dim3 grid(t1 - t0, cdiv(d->heads + 2 * d->kv_heads, QKN_WARPS));
    cudaStream_t s = cu(be)->stream;
    const int32_t *pos = b->positions, *sm = (const int32_t *)b->slot_mapping;
    kv_dispatch(be->kv_dtype, [&](auto *z) {
        typedef typename std::remove_pointer<decltype(z)>::type T;
        launch_pdl(k_qk_norm_rope<T>, grid, 32 * QKN_WARPS, 0, s, qkv, ld, p->q_norm, p->k_norm, p->eps, p->table,
                   (T *)k_cache, (T *)v_cache, pos, sm, t0, d->heads, d->kv_heads, d->head_dim, d->k_scale,
                   d->v_scale);
    });
}

void cuda_qk_norm_rope(struct backend *be, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                       void *v_cache, const struct batch *b, int t0, const struct attn_dims *d) {
    qkn_rows(be, qkv, ld, p, k_cache, v_cache, b, t0, b->num_tokens, d);
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
// heads, split); each K and V row is read once for all the query heads that
// share it (GQA). The design follows from the bytes: at 32k context the KV
// cache is most of what a decode step reads, so the kernel must keep HBM busy
// (some 32 KB in flight per SM at 4.2 TB/s) with arithmetic that never
// waits on a load of its own:
//   - each of the DEC_WARPS warps of a block streams its own tiles of DEC_TK
//     keys (tiles w, w + DEC_WARPS, ... of the block's range) through a ring
//     of NS stages in shared memory, filled by cp.async (16-byte pieces,
//     a key's K or V row of the head contiguous; zero-filled past the range)
//     NS - 1 tiles ahead of the one it computes: a warp synchronizes only
//     with itself, so no warp waits on another's loads or arithmetic;
//   - the slots of a tile's keys (the block table) are read a tile earlier
//     still, so no load's address waits on a load;
//   - rows are padded by 16 bytes in shared memory: the lanes reading one
//     column of 8 rows hit 8 different banks;
//   - scores: two lanes per key (halves of the row, in alternate 16-byte
//     pieces), each with the G heads' dots in registers and q read from
//     shared memory (a broadcast); an online softmax per warp and head
//     (max and sum by shuffles over the tile's 16 keys), p to shared memory;
//   - p * V: a lane per head_dim / 32 output columns of the G heads, in
//     registers, the V row read as one vector per key;
//   - the warps' (m, l, acc) are merged through shared memory at the end
//     (the stages' memory again), then the splits by k_attn_merge.
// The arithmetic is fp32 throughout (the cache's values exactly: bf16 and
// e4m3 codes widen without rounding; an fp8 cache's k_scale is folded into
// q and its v_scale applied to the sums), so every cache type is held to the
// reference as tightly as the order of the sums allows. The limit this
// leaves is arithmetic: G multiply-adds a cache element, so at 4.2 TB/s a
// bf16 cache needs 2.1e12 * G of them a second against the H200's ~3.3e13
// fp32 ones (a quarter of them at G 4, all at G 16), an fp8 cache twice
// that; tensor cores (bf16 products of exact values, q split in bf16 parts)
// would be the next step for G >= 8 and fp8.
// The split count is fixed by the batch's shape and the SM count (so a
// recorded graph covers any context); each sequence cuts its own context
// into that many ranges of a multiple of DEC_WARPS * DEC_TK keys, on the
// device.
#define DEC_WARPS 4
#define DEC_THREADS (32 * DEC_WARPS)
#define DEC_TK 16 // keys per tile: two lanes a key (2 * DEC_TK == 32)
#define DEC_ALIGN (DEC_WARPS * DEC_TK)
#define DEC_MAX_SPLITS 256
#define DEC_MAX_E (CUDA_MAX_HEAD_DIM / 32) // output columns per lane

__device__ __forceinline__ int cdiv_dev(int a, int b) { return (a + b - 1) / b; }
__device__ __forceinline__ int dec_range(int n, int nsplit) { return cdiv_dev(cdiv_dev(n, nsplit), DEC_ALIGN) * DEC_ALIGN; }
// Stages of the ring: 3, or 2 where a row is over 256 bytes (fp32 at
// head_dim 128) or head_dim is not a constant, so that a block fits.
__host__ __device__ constexpr int dec_stages(int esize, int dt) { return dt == 0 || dt * esize > 256 ? 2 : 3; }

// 16 bytes of cache as floats: 4 fp32, 8 bf16 or 16 e4m3 codes (the first
// argument picks the type)
__device__ __forceinline__ void unpack16(const float *, uint4 u, float *f) {
    f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
}
__device__ __forceinline__ void unpack16(const __nv_bfloat16 *, uint4 u, float *f) {
    const __nv_bfloat162 *h2 = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h2[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void unpack16(const __nv_fp8_e4m3 *, uint4 u, float *f) {
    const __nv_fp8x2_storage_t *p = (const __nv_fp8x2_storage_t *)&u;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float2 v = fp8x2_f2(p[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
// f[0..C) = p[0..C), C of 2 or 4 in one load (p aligned to C elements); an
// fp8 cache's codes times s
template <int C>
__device__ __forceinline__ void load_cols(const float *p, float *f, float) {
    if (C == 2) {
        float2 v = *(const float2 *)p;
        f[0] = v.x, f[1] = v.y;
    } else {
        float4 v = *(const float4 *)p;
        f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
    }
}
template <int C>
__device__ __forceinline__ void load_cols(const __nv_bfloat16 *p, float *f, float) {
    __nv_bfloat162 h[C / 2];
    if (C == 2) *(uint32_t *)h = *(const uint32_t *)p;
    else *(uint2 *)h = *(const uint2 *)p;
#pragma unroll
    for (int i = 0; i < C / 2; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
template <int C>
__device__ __forceinline__ void load_cols(const __nv_fp8_e4m3 *p, float *f, float s) {
    uint32_t u = C == 2 ? *(const uint16_t *)p : *(const uint32_t *)p;
    const __nv_fp8x2_storage_t *h = (const __nv_fp8x2_storage_t *)&u;
#pragma unroll
    for (int i = 0; i < C / 2; i++) {
        float2 v = fp8x2_f2(h[i]);
        f[2 * i] = v.x * s, f[2 * i + 1] = v.y * s;
    }
}

// Shared memory: q [G][D] | per warp p [DEC_TK][G] | per warp NS stages
// [K, V][DEC_TK][RS] of 16-byte pieces (RS: a row's pieces + 1 of padding),
// whose memory then holds the warps' (m [G], l [G], acc [G][D]) at the end.
static size_t dec_smem(int G, int D, int esize, int ns) {
    size_t rs = (size_t)D * esize / 16 + 1, head = sizeof(float) * ((size_t)G * D + (size_t)DEC_WARPS * DEC_TK * G);
    size_t stages = 16 * rs * DEC_TK * 2 * ns * DEC_WARPS, fin = sizeof(float) * DEC_WARPS * ((size_t)G * D + 2 * G);
    return head + (stages > fin ? stages : fin);
}

// What one block works on, and its warp's place in it.
struct dec_blk {
    const int32_t *bt; // the sequence's block table
    int64_t kvo;       // the KV head's offset in a cache row
    int j0, j1, nt;    // keys [j0, j1); this warp's tiles
};

// The cache slot of this lane's key (lane % DEC_TK) of the warp's tile i,
// or -1 past the range (slots are int32: batch.slot_mapping)
__device__ __forceinline__ int dec_slot(const attn_args &a, const dec_blk &b, int i) {
    int w = threadIdx.x >> 5, j = b.j0 + (i * DEC_WARPS + w) * DEC_TK + (threadIdx.x & (DEC_TK - 1));
    return i < b.nt && j < b.j1 ? b.bt[j / a.bs] * a.bs + j % a.bs : -1;
}

// cp.async of a tile into stage st [K, V][DEC_TK][RS] (NC pieces a row):
// piece c (lane + 32 i) of the DEC_TK * NC of K and the same of V; sl: the
// slots of dec_slot. One commit group (empty past the warp's tiles).
template <typename T>
__device__ __forceinline__ void dec_issue(uint4 *st, const T *kc, const T *vc, int64_t kvd, const dec_blk &b, int sl,
                                          int NC, int RS, bool any) {
    int lane = threadIdx.x & 31;
    if (any)
        for (int i = 0; i < (DEC_TK * NC + 31) / 32; i++) { // the same count on every lane: the shuffle needs all
            int c = lane + 32 * i, r = c / NC, ch = c - r * NC, s = __shfl_sync(0xffffffffu, sl, r & 31);
            if (c < DEC_TK * NC) {
                int64_t off = (int64_t)(s >= 0 ? s : 0) * kvd + b.kvo + ch * (16 / (int)sizeof(T));
                cp_async16(st + r * RS + ch, kc + off, s >= 0);
                cp_async16(st + (DEC_TK + r) * RS + ch, vc + off, s >= 0);
            }
        }
    asm volatile("cp.async.commit_group;\n");
}
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// The output columns of lane's acc[.][i]: DT / 32 adjacent ones (DT a
// constant), else every 32nd.
template <int DT> __device__ __forceinline__ int dec_col(int lane, int i) { return DT ? lane * (DT / 32) + i : lane + 32 * i; }

// One tile of stage st: scores of its DEC_TK keys (key base + lane % DEC_TK)
// for the G heads, the online softmax (m, l per head; l of this lane's keys
// only), acc rescaled and p * V added. sp: the warp's p [DEC_TK][G].
template <typename T, int G, int DT>
__device__ __forceinline__ void dec_tile(const uint4 *st, const float *q, float *sp, int D, int NC, int RS, bool valid,
                                         float *m, float *l, float (*acc)[DT ? DT / 32 : DEC_MAX_E]) {
    const int EPC = 16 / sizeof(T), E = DT ? DT / 32 : DEC_MAX_E;
    int lane = threadIdx.x & 31, r = lane % DEC_TK, hf = lane / DEC_TK;
    float dot[G], c[G];
#pragma unroll
    for (int h = 0; h < G; h++) dot[h] = 0;
    const uint4 *kr = st + r * RS;
#pragma unroll 4
    for (int ch = hf; ch < NC; ch += 2) {
        float f[EPC];
        unpack16((const T *)0, kr[ch], f);
#pragma unroll
        for (int h = 0; h < G; h++) {
            const float4 *qh = (const float4 *)(q + h * D + ch * EPC);
            float d = 0;
#pragma unroll
            for (int i = 0; i < EPC / 4; i++) {
                float4 x = qh[i];
                d += x.x * f[4 * i] + x.y * f[4 * i + 1] + x.z * f[4 * i + 2] + x.w * f[4 * i + 3];
            }
            dot[h] += d;
        }
    }
#pragma unroll
    for (int h = 0; h < G; h++) {
        float s = dot[h] + __shfl_xor_sync(0xffffffffu, dot[h], DEC_TK);
        s = valid ? s : -INFINITY;
        float mx = s;
#pragma unroll
        for (int o = DEC_TK / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float mn = fmaxf(m[h], mx), p = expf(s - mn); // a tile's first key is in range: mn is finite
        c[h] = expf(m[h] - mn), m[h] = mn, l[h] = l[h] * c[h] + p;
        if (hf == 0) sp[r * G + h] = p;
    }
    __syncwarp();
    const T *vr = (const T *)(st + DEC_TK * RS);
#pragma unroll
    for (int h = 0; h < G; h++)
#pragma unroll
        for (int i = 0; i < E; i++) acc[h][i] *= c[h];
#pragma unroll 2
    for (int j = 0; j < DEC_TK; j++) {
        float v[E];
        const T *row = vr + j * RS * EPC;
        if (DT) {
            load_cols<DT ? DT / 32 : 2>(row + lane * E, v, 1.0f);
        } else {
#pragma unroll
            for (int i = 0; i < E; i++) v[i] = dec_col<DT>(lane, i) < D ? load_kv(row + dec_col<DT>(lane, i), 1.0f) : 0;
        }
        float p[G];
#pragma unroll
        for (int h = 0; h < G; h += 4) { // a broadcast; sp and j * G aligned to 16 bytes when G % 4 == 0
            if (G % 4 == 0) *(float4 *)(p + h) = *(const float4 *)(sp + j * G + h);
            else
                for (int k = h; k < G; k++) p[k] = sp[j * G + k];
        }
#pragma unroll
        for (int h = 0; h < G; h++)
#pragma unroll
            for (int i = 0; i < E; i++) acc[h][i] += p[h] * v[i];
    }
}

// head_dim * sizeof(T) a multiple of 16 and at most 512 bytes (checked by
// the launcher); G heads a block at most; DT: head_dim as a constant (64 or
// 128: the loops over it unroll), or 0 for any other.
template <typename T, int G, int DT>
__global__ void __launch_bounds__(DEC_THREADS) k_attn_dec(attn_args a, const T *kc, const T *vc) {
    constexpr int NS = dec_stages(sizeof(T), DT), E = DT ? DT / 32 : DEC_MAX_E;
    const bool F8 = sizeof(T) == 1;
    pdl_wait();
    pdl_trigger();
    extern __shared__ uint4 smu[];
    const int D = DT ? DT : a.Dh, NC = D * (int)sizeof(T) / 16, RS = NC + 1, g = a.H / a.Hkv, ngrp = cdiv_dev(g, G);
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    int s = a.seq0 + blockIdx.x, t = a.qsl[s], kvh = blockIdx.y / ngrp, h0 = kvh * g + (blockIdx.y % ngrp) * G;
    int nh = min(G, kvh * g + g - h0), n = a.pos[t] + 1, L = dec_range(n, a.nsplit), z = blockIdx.z;
    dec_blk b = {a.btab + (int64_t)s * a.mbps, (int64_t)kvh * D, z * L, min(n, z * L + L), 0};
    if (b.j0 >= n) return; // past this sequence's context: the merge skips it
    b.nt = b.j1 - b.j0 > w * DEC_TK ? cdiv_dev(b.j1 - b.j0 - w * DEC_TK, DEC_ALIGN) : 0;
    float *q = (float *)smu, *sp = q + G * D + w * DEC_TK * G;
    uint4 *stg = smu + (G * D + DEC_WARPS * DEC_TK * G) / 4, *ring = stg + w * NS * 2 * DEC_TK * RS;
    int64_t kvd = (int64_t)a.Hkv * D;
    int sl = dec_slot(a, b, 0);
#pragma unroll
    for (int k = 0; k < NS - 1; k++) {
        dec_issue(ring + k * 2 * DEC_TK * RS, kc, vc, kvd, b, sl, NC, RS, k < b.nt);
        sl = dec_slot(a, b, k + 1);
    }
    float qs = a.scale * (F8 ? a.ks : 1.0f); // an fp8 cache's k_scale folded into q
    // q [G, D]: 16 loads a thread in flight before any store (a loop of
    // load-then-store took one memory latency per element a thread: 16 of
    // them at G 16, most of a short context's time)
    const float *qrow = a.qkv + (int64_t)t * a.ld + (int64_t)h0 * D;
    for (int i0 = 0; i0 < G * D; i0 += 16 * DEC_THREADS) {
        float v[16];
#pragma unroll
        for (int k = 0; k < 16; k++) {
            int i = i0 + tid + k * DEC_THREADS;
            v[k] = i < G * D && i / D < nh ? qrow[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < 16; k++)
            if (i0 + tid + k * DEC_THREADS < G * D) q[i0 + tid + k * DEC_THREADS] = v[k] * qs;
    }
    __syncthreads();
    float m[G], l[G], acc[G][E];
#pragma unroll
    for (int h = 0; h < G; h++) {
        m[h] = -INFINITY, l[h] = 0;
#pragma unroll
        for (int i = 0; i < E; i++) acc[h][i] = 0;
    }
    for (int i = 0; i < b.nt; i++) {
        int k = i + NS - 1;
        dec_issue(ring + k % NS * 2 * DEC_TK * RS, kc, vc, kvd, b, sl, NC, RS, k < b.nt);
        sl = dec_slot(a, b, k + 1); // read now, used by the next tile's issue
        cp_async_wait<NS - 1>();    // tile i's group is complete
        __syncwarp();
        bool valid = b.j0 + (i * DEC_WARPS + w) * DEC_TK + lane % DEC_TK < b.j1;
        dec_tile<T, G, DT>(ring + i % NS * 2 * DEC_TK * RS, q, sp, D, NC, RS, valid, m, l, acc);
        __syncwarp(); // the stage and sp are rewritten next
    }
    cp_async_wait<0>();
    __syncthreads(); // every warp is done with its stages: they hold the warps' results now
    float *wm = (float *)stg + w * (G * D + 2 * G), *wl = wm + G, *wa = wl + G;
#pragma unroll
    for (int h = 0; h < G; h++) {
        float lh = l[h];
#pragma unroll
        for (int o = DEC_TK / 2; o > 0; o >>= 1) lh += __shfl_xor_sync(0xffffffffu, lh, o); // the tile's 16 keys
        if (lane == 0) wm[h] = m[h], wl[h] = lh;
#pragma unroll
        for (int i = 0; i < E; i++)
            if (dec_col<DT>(lane, i) < D) wa[h * D + dec_col<DT>(lane, i)] = acc[h][i];
    }
    __syncthreads();
    float vsc = F8 ? a.vs : 1.0f;
    for (int i = tid; i < nh * D; i += DEC_THREADS) {
        int h = i / D, e = i % D;
        float mx = -INFINITY, lt = 0, o = 0;
        for (int k = 0; k < DEC_WARPS; k++) mx = fmaxf(mx, ((float *)stg)[k * (G * D + 2 * G) + h]);
        for (int k = 0; k < DEC_WARPS; k++) {
            const float *x = (float *)stg + k * (G * D + 2 * G);
            if (x[h] == -INFINITY) continue; // a warp without keys
            float c = expf(x[h] - mx);
            lt += x[G + h] * c, o += x[2 * G + h * D + e] * c;
        }
        int hq = h0 + h;
        if (a.nsplit == 1) {
            a.out[(int64_t)t * a.H * D + hq * D + e] = lt > 0 ? o * vsc / lt : 0.0f;
            continue;
        }
        float *pp = a.part + (((int64_t)(t - a.tok0) * a.H + hq) * a.nsplit + z) * (D + 2);
        pp[e] = o * vsc;
        if (e == 0) pp[D] = mx, pp[D + 1] = lt;
    }
}

// Merges the splits of one (token, head): rescale each by exp(m_i - max m).
// Only the splits that hold keys of the token's context are read: of a.split
// keys each (prefill), or the decode kernel's per-sequence ranges (split 0).
// MERGE_THREADS threads: the maximum over the splits a thread each; then,
// per chunk of MERGE_THREADS splits, each thread's split weight into shared
// memory and every thread's columns summed over the chunk, all its loads
// independent (a split's m, then its row: never a load waiting on a load
// of the same split, as a warp per split did).
#define MERGE_THREADS 128
#define MERGE_E (CUDA_MAX_HEAD_DIM / MERGE_THREADS) // columns a thread
__global__ void __launch_bounds__(MERGE_THREADS) k_attn_merge(attn_args a) {
    __shared__ float red[32], wt[MERGE_THREADS];
    pdl_wait();
    pdl_trigger();
    int t = a.tok0 + blockIdx.x, h = blockIdx.y, n = a.pos[t] + 1, D = a.Dh, S = D + 2, tid = threadIdx.x;
    int ns = min(a.nsplit, cdiv_dev(n, a.split ? a.split : dec_range(n, a.nsplit)));
    const float *pp = a.part + ((int64_t)(t - a.tok0) * a.H + h) * a.nsplit * S;
    float mx = -INFINITY, l = 0, o[MERGE_E];
    for (int i = tid; i < ns; i += MERGE_THREADS) mx = fmaxf(mx, pp[i * S + D]);
    mx = block_reduce<true>(mx, red);
#pragma unroll
    for (int k = 0; k < MERGE_E; k++) o[k] = 0;
    for (int base = 0; base < ns; base += MERGE_THREADS) {
        int i = base + tid, nc = min(MERGE_THREADS, ns - base);
        float mi = i < ns ? pp[i * S + D] : -INFINITY, li = i < ns ? pp[i * S + D + 1] : 0.0f, w = 0;
        if (mi > -INFINITY) w = expf(mi - mx), l += w * li; // a split without keys weighs 0
        __syncthreads(); // the last chunk's readers of wt are done
        wt[tid] = w;
        __syncthreads();
#pragma unroll 4
        for (int j = 0; j < nc; j++) {
            float wj = wt[j];
            const float *row = pp + (int64_t)(base + j) * S;
#pragma unroll
            for (int k = 0; k < MERGE_E; k++) {
                int e = tid + k * MERGE_THREADS;
                float v = e < D ? row[e] : 0.0f;
                o[k] += wj != 0.0f ? wj * v : 0.0f; // a split without keys may hold anything
            }
        }
    }
    l = block_sum(l, red);
#pragma unroll
    for (int k = 0; k < MERGE_E; k++) {
        int e = tid + k * MERGE_THREADS;
        if (e < D) a.out[(int64_t)t * a.H * D + h * D + e] = l > 0 ? o[k] / l : 0.0f;
    }
}

static void merge(struct backend *be, const attn_args *a, int ntok) {
    if (a->nsplit <= 1) return;
    launch_pdl(k_attn_merge, dim3(ntok, a->H), MERGE_THREADS, 0, cu(be)->stream, *a);
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

// The decode kernel for G heads a block at head_dim D (64 and 128: constants).
static int dec_dt(int D) { return D == 64 || D == 128 ? D : 0; }
template <typename T> using dec_fn = void (*)(attn_args, const T *, const T *);
template <typename T, int G> static dec_fn<T> dec_kernel_g(int D) {
    return D == 128 ? k_attn_dec<T, G, 128> : D == 64 ? k_attn_dec<T, G, 64> : k_attn_dec<T, G, 0>;
}
template <typename T> static dec_fn<T> dec_kernel(int G, int D) {
    return G == 1   ? dec_kernel_g<T, 1>(D)
           : G == 2 ? dec_kernel_g<T, 2>(D)
           : G == 4 ? dec_kernel_g<T, 4>(D)
           : G == 8 ? dec_kernel_g<T, 8>(D)
                    : dec_kernel_g<T, 16>(D);
}

void cuda_attn_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                       const void *v_cache, const struct batch *b, int seq0, int seq1, const struct attn_dims *d) {
    if (cuda_flash_prefill(be, out, qkv, ld, k_cache, v_cache, b, seq0, seq1, d)) return; // tensor cores (cuda_flash.cu)
    launch_attn(be, out, qkv, ld, k_cache, v_cache, b, seq0, seq1, d, SPLIT_PREFILL);
}

// The decode kernel's head groups (G query heads of a KV head a block: a
// power of two, at most 16), or 0 where it cannot run the shape: rows of
// head_dim elements must be whole 16-byte pieces, at most 512 bytes
// (registers and shared memory), and its shared memory must fit a block.
static int dec_group(struct backend *be, const struct attn_dims *d) {
    int es = (int)dtype_size(be->kv_dtype), D = d->head_dim, g = d->heads / d->kv_heads, G = 1;
    while (G < g && G < 16) G *= 2;
    if ((D * es) % 16 || D * es > 512 || D > CUDA_MAX_HEAD_DIM) return 0;
    return dec_smem(G, D, es, dec_stages(es, dec_dt(D))) <= cu(be)->smem_optin ? G : 0;
}

// Splits, from the batch's shape and the device alone (a recorded graph
// replays them at any context): blocks fill whole waves of what the SMs hold
// at once (slots) as nearly as they can, over at least two waves (a block's
// first loads then overlap another's stream), fewer splits on a tie (fewer
// partials to merge, longer streams); at most DEC_MAX_SPLITS, and no more
// than ranges of DEC_ALIGN keys of the longest context allow.
static int dec_splits(int blocks, int slots, int maxlen) {
    int lo = cdiv(2 * slots, blocks), hi = MAX(MIN(MIN(2 * lo, DEC_MAX_SPLITS), cdiv(maxlen, DEC_ALIGN)), 1), best = 1;
    double cost = INFINITY; // waves per split's share of the work
    for (int ns = MIN(lo, hi); ns <= hi; ns++) {
        double c = (double)cdiv(blocks * ns, slots) / ns;
        if (c < cost - 1e-12) cost = c, best = ns;
    }
    return best;
}

// The decode kernel for the cache's element type T at G heads a block, its
// shared memory (*smem, set as the kernel's limit) and blocks an SM holds.
template <typename T> static dec_fn<T> dec_prepare(const struct attn_dims *d, int G, size_t *smem, int *per_sm) {
    dec_fn<T> k = dec_kernel<T>(G, d->head_dim);
    *smem = dec_smem(G, d->head_dim, sizeof(T), dec_stages(sizeof(T), dec_dt(d->head_dim)));
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, k, DEC_THREADS, *smem));
    return k;
}

// The decode kernel's blocks a sequence and split: its KV heads' groups of G heads.
static int dec_groups(const struct attn_dims *d, int G) { return d->kv_heads * cdiv(d->heads / d->kv_heads, G); }

// The decode kernel's splits for nd sequences of contexts up to maxlen.
static int dec_nsplit(struct backend *be, const struct attn_dims *d, int G, int per_sm, int nd, int maxlen) {
    return dec_splits(nd * dec_groups(d, G), MAX(per_sm, 1) * cu(be)->num_sms, maxlen);
}

// The decode rows' prologue (qk_norm_rope's kernel), then their attention;
// a shape the decode kernel cannot run takes the generic one.
void cuda_attn_decode(struct backend *be, float *out, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                      void *v_cache, const struct batch *b, const struct attn_dims *d) {
    int nd = b->num_decodes, G = dec_group(be, d);
    if (nd <= 0) return;
    qkn_rows(be, qkv, ld, p, k_cache, v_cache, b, 0, nd, d);
    if (!G) {
        launch_attn(be, out, qkv, ld, k_cache, v_cache, b, 0, nd, d, SPLIT_DECODE);
        return;
    }
    int D = d->head_dim, maxlen = b->max_model_len;
    if (!b->fixed_shapes) {
        maxlen = 0;
        for (int s = 0; s < nd; s++) maxlen = b->h_seq_lens[s] > maxlen ? b->h_seq_lens[s] : maxlen;
    }
    attn_args a = {out, NULL, qkv, ld, d->heads, d->kv_heads, D, d->block_size, b->max_blocks_per_seq, 1,
                   0, d->scale, b->query_start_loc, b->positions, b->block_tables, 0, nd, 0, d->k_scale, d->v_scale};
    cudaStream_t s = cu(be)->stream;
    kv_dispatch(be->kv_dtype, [&](auto *z) {
        typedef typename std::remove_pointer<decltype(z)>::type T;
        size_t smem;
        int per_sm = 0;
        dec_fn<T> k = dec_prepare<T>(d, G, &smem, &per_sm);
        a.nsplit = dec_nsplit(be, d, G, per_sm, nd, maxlen);
        if (a.nsplit > 1) a.part = (float *)cuda_scratch(be, sizeof(float) * (size_t)nd * d->heads * a.nsplit * (D + 2));
        launch_pdl(k, dim3(nd, dec_groups(d, G), a.nsplit), DEC_THREADS, smem, s, a, (const T *)k_cache,
                   (const T *)v_cache);
    });
    LAUNCH_CHECK();
    merge(be, &a, nd);
}

// The partials' scratch over steps of up to max_tokens rows, max_seqs of
// them decodes (0: any), contexts up to max_seq_len: the decode kernel's
// splits at each decode count (a split count falls as the blocks of more
// sequences fill the SMs), or the generic kernel's; the generic kernel's for
// prefill where the tensor-core kernel does not take the shape. Both ops
// take it in turn. Sized by the largest step alone, a 40,000-token context
// at 8,192 rows asked for 42 GB where decode needs a few hundred MB.
size_t cuda_attn_scratch(struct backend *be, const struct attn_dims *d, int max_tokens, int max_seqs, int max_seq_len) {
    size_t row = sizeof(float) * (d->head_dim + 2), T = (size_t)MAX(max_tokens, 1), need = 0;
    int S = MAX(max_seq_len, 1), nd_max = max_seqs > 0 ? MIN(max_seqs, (int)T) : (int)T, G = dec_group(be, d);
    if (!cuda_flash_shape(be, d)) need = T * d->heads * cdiv(S, SPLIT_PREFILL) * row;
    if (!G) return MAX(need, (size_t)nd_max * d->heads * cdiv(S, SPLIT_DECODE) * row);
    kv_dispatch(be->kv_dtype, [&](auto *z) {
        typedef typename std::remove_pointer<decltype(z)>::type T;
        size_t smem;
        int per_sm = 0;
        dec_prepare<T>(d, G, &smem, &per_sm);
        for (int nd = 1; nd <= nd_max; nd++) {
            int ns = dec_nsplit(be, d, G, per_sm, nd, S);
            if (ns > 1) need = MAX(need, (size_t)nd * d->heads * ns * row);
        }
    });
    return need;
}
