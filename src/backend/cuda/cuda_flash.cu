// cuda_flash.cu - prefill attention on tensor cores (flash attention):
// the attn_prefill op for a bf16 or fp8 KV cache and head_dim 64 or 128;
// its CPU reference is cpu_attn_prefill (same name), other shapes take the
// split-KV kernel of cuda_attn.cu. The same kernel runs MLA's prefill
// (cuda_mla.cu) over keys expanded per head: K of 192 (K_nope | the shared
// k_r), V of 128, contiguous rows instead of paged ones.
//
// A block takes 64 queries of one sequence and one query head: Q [64, DK]
// rounded to bf16, then for each tile of 64 keys (a source below brings
// them: the paged cache, or MLA's expanded rows) S = Q K^T, the causal mask, an online
// softmax in fp32, O += P V, all with mma.sync m16n8k16 and fp32
// accumulation. 4 warps, 16 query rows each; K / V tiles by cp.async (bf16)
// or, from an fp8 cache, codes loaded to registers and widened to bf16 as
// they are stored (exact: every e4m3 value is a bf16); rows padded by 8
// elements so that ldmatrix is conflict-free. An fp8 cache's scales stay out
// of the tiles: k_scale joins the softmax scale, v_scale the final 1 / l.
#include "backend/cuda/cuda_common.cuh"

#define FQ 64 // queries per block
#define FK 64 // keys per tile

template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *(uint32_t *)&h;
}

struct flash_args {
    float *out;         // [T, H*DV]
    const float *qkv;   // [T, ld]: head h's query at h*DK
    int ld, H, Hkv, bs, mbps, seq0, seq1;
    float scale;        // of the scores (times an fp8 cache's k_scale)
    const int32_t *qsl, *ctx, *btab;
    float vs;           // of the output: an fp8 cache's v_scale, else 1
};

// 8 e4m3 codes (8 bytes, in a register pair) -> 8 bf16 at t (16-byte
// aligned shared memory), each exact.
__device__ __forceinline__ void widen8_bf16(__nv_bfloat16 *t, uint2 u) {
    const __nv_fp8x2_storage_t *p = (const __nv_fp8x2_storage_t *)&u;
    uint4 r;
    __nv_bfloat162 *o = (__nv_bfloat162 *)&r;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = fp8x2_f2(p[i]);
        o[i] = __floats2bfloat162_rn(v.x, v.y);
    }
    *(uint4 *)t = r;
}

// The K and V rows of keys [k0, k0 + FK) into the tiles (keys past `last`:
// zeros), P elements a row: 16-byte async copies from a bf16 cache; from an
// fp8 one, every code of the thread loaded first (its loads in flight
// together), then widened.
template <int D, int P>
__device__ __forceinline__ void load_tiles(const flash_args &a, __nv_bfloat16 *Ks, __nv_bfloat16 *Vs,
                                           const __nv_bfloat16 *kc, const __nv_bfloat16 *vc, const int32_t *bt,
                                           int kvh, int k0, int last) {
    int kvd = a.Hkv * D;
    for (int i = threadIdx.x; i < FK * (D / 8); i += 128) {
        int r = i / (D / 8), c = (i % (D / 8)) * 8, key = k0 + r;
        bool ok = key <= last;
        int64_t slot = ok ? (int64_t)bt[key / a.bs] * a.bs + key % a.bs : 0;
        cp_async16(Ks + r * P + c, kc + slot * kvd + kvh * D + c, ok);
        cp_async16(Vs + r * P + c, vc + slot * kvd + kvh * D + c, ok);
    }
    asm volatile("cp.async.commit_group;\n");
    asm volatile("cp.async.wait_group 0;\n");
}
template <int D, int P>
__device__ __forceinline__ void load_tiles(const flash_args &a, __nv_bfloat16 *Ks, __nv_bfloat16 *Vs,
                                           const __nv_fp8_e4m3 *kc, const __nv_fp8_e4m3 *vc, const int32_t *bt,
                                           int kvh, int k0, int last) {
    static_assert(FK * (D / 8) % 128 == 0, "whole 8-element chunks of a tile per thread");
    constexpr int NL = FK * (D / 8) / 128; // 8-code chunks of each tile a thread loads
    int kvd = a.Hkv * D;
    uint2 ku[NL], vu[NL];
#pragma unroll
    for (int n = 0; n < NL; n++) {
        int i = threadIdx.x + n * 128, r = i / (D / 8), c = (i % (D / 8)) * 8, key = k0 + r;
        ku[n] = vu[n] = make_uint2(0, 0);
        if (key <= last) {
            int64_t off = ((int64_t)bt[key / a.bs] * a.bs + key % a.bs) * kvd + kvh * D + c;
            ku[n] = *(const uint2 *)(kc + off), vu[n] = *(const uint2 *)(vc + off);
        }
    }
#pragma unroll
    for (int n = 0; n < NL; n++) {
        int i = threadIdx.x + n * 128, r = i / (D / 8), c = (i % (D / 8)) * 8;
        widen8_bf16(Ks + r * P + c, ku[n]);
        widen8_bf16(Vs + r * P + c, vu[n]);
    }
}

// Where a block's K / V tiles come from: bind(s, h) picks the sequence and
// head, load(k0, last) fills the tiles (rows of PK and PV elements) with
// keys [k0, k0 + FK) of the sequence, zeros past `last`, and returns when
// they are in shared memory.
// The paged KV cache (bf16, or fp8 codes: C), K and V of one head_dim D.
template <typename C, int D>
struct flash_paged {
    const C *kc, *vc;
    const int32_t *bt;
    int kvh;
    __device__ __forceinline__ void bind(const flash_args &a, int s, int h) {
        bt = a.btab + (int64_t)s * a.mbps, kvh = h / (a.H / a.Hkv);
    }
    template <int PK, int PV>
    __device__ __forceinline__ void load(const flash_args &a, __nv_bfloat16 *Ks, __nv_bfloat16 *Vs, int k0,
                                         int last) {
        static_assert(PK == PV, "K and V of one head_dim");
        load_tiles<D, PK>(a, Ks, Vs, kc, vc, bt, kvh, k0, last);
    }
};

// MLA's keys expanded per head (cuda_mla.cu): the contexts of sequences
// [a.seq0, a.seq1) back to back from row 0, in bf16. Key row of head h:
// kv[row, h*(N+V) .. + N) (K_nope_h) | lat[row, R .. R + DK - N) (k_r,
// shared by the heads); value row: kv[row, h*(N+V) + N .. + V).
template <int N>
struct flash_mla {
    const __nv_bfloat16 *kv, *lat; // [keys, H*(N+V)], [keys, W]
    const int32_t *seq_lens;
    int R, W;
    int64_t row0; // the sequence's first row
    int h;
    __device__ __forceinline__ void bind(const flash_args &a, int s, int head) {
        row0 = 0, h = head;
        for (int u = a.seq0; u < s; u++) row0 += seq_lens[u];
    }
    template <int PK, int PV>
    __device__ __forceinline__ void load(const flash_args &a, __nv_bfloat16 *Ks, __nv_bfloat16 *Vs, int k0,
                                         int last) {
        constexpr int DK = PK - 8, DV = PV - 8;
        static_assert(N % 8 == 0 && DK > N, "8-element chunks of K_nope, then of k_r");
        int64_t ld = (int64_t)a.H * (N + DV);
        for (int i = threadIdx.x; i < FK * (DK / 8); i += 128) {
            int r = i / (DK / 8), c = (i % (DK / 8)) * 8, key = k0 + r;
            bool ok = key <= last;
            int64_t row = row0 + (ok ? key : 0);
            const __nv_bfloat16 *src = c < N ? kv + row * ld + h * (N + DV) + c : lat + row * W + R + c - N;
            cp_async16(Ks + r * PK + c, src, ok);
        }
        for (int i = threadIdx.x; i < FK * (DV / 8); i += 128) {
            int r = i / (DV / 8), c = (i % (DV / 8)) * 8, key = k0 + r;
            bool ok = key <= last;
            int64_t row = row0 + (ok ? key : 0);
            cp_async16(Vs + r * PV + c, kv + row * ld + h * (N + DV) + N + c, ok);
        }
        asm volatile("cp.async.commit_group;\n");
        asm volatile("cp.async.wait_group 0;\n");
    }
};

// The sequence and first query of block x: sequences in order, ceil(L/64)
// blocks each; -1 past the last.
__device__ __forceinline__ int find_tile(const flash_args &a, int x, int *q0) {
    for (int s = a.seq0; s < a.seq1; s++) {
        int n = (a.qsl[s + 1] - a.qsl[s] + FQ - 1) / FQ;
        if (x < n) {
            *q0 = x * FQ;
            return s;
        }
        x -= n;
    }
    return -1;
}

// DK, DV: the head_dim of Q and K, of V and the output; Src: where the K / V
// tiles come from (flash_paged, flash_mla).
template <int DK, int DV, class Src>
__global__ void __launch_bounds__(128) k_flash(flash_args a, Src src) {
    typedef __nv_bfloat16 T; // Q, K, V and P on the tensor cores
    static_assert(DK % 16 == 0 && DV % 16 == 0, "whole k-steps of 16 and pairs of 8-column blocks");
    constexpr int PK = DK + 8, PV = DV + 8; // padded rows
    extern __shared__ __align__(16) unsigned char fsm[];
    T *Qs = (T *)fsm, *Ks = Qs + FQ * PK, *Vs = Ks + FK * PK;
    int q0, s = find_tile(a, blockIdx.x, &q0), h = blockIdx.y;
    if (s < 0) return;
    int t0 = a.qsl[s], L = a.qsl[s + 1] - t0, ctx0 = a.ctx[s], nq = min(FQ, L - q0);
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    src.bind(a, s, h);
    // Q tile: fp32 rows of qkv -> 16 bits (pad rows zero)
    for (int i = tid; i < FQ * DK; i += 128) {
        int r = i / DK, c = i % DK;
        float v = r < nq ? a.qkv[(int64_t)(t0 + q0 + r) * a.ld + h * DK + c] : 0.0f;
        Qs[r * PK + c] = (T)v;
    }
    float o[DV / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < DV / 8; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) o[j][q] = 0;
    int last = ctx0 + q0 + nq - 1; // the last key any query of the tile sees
    int row_pos[2] = {ctx0 + q0 + warp * 16 + (lane >> 2), ctx0 + q0 + warp * 16 + (lane >> 2) + 8};
    for (int k0 = 0; k0 <= last; k0 += FK) {
        __syncthreads(); // the previous tile's K / V are no longer read
        src.template load<PK, PV>(a, Ks, Vs, k0, last);
        __syncthreads();
        // S [16 rows of this warp, 64 keys] = Q K^T
        float sc[FK / 8][4];
#pragma unroll
        for (int j = 0; j < FK / 8; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) sc[j][q] = 0;
#pragma unroll
        for (int kk = 0; kk < DK; kk += 16) {
            uint32_t af[4];
            ldsm_x4(af, Qs + (warp * 16 + (lane & 15)) * PK + kk + (lane >> 4) * 8);
#pragma unroll
            for (int j = 0; j < FK / 8; j += 2) {
                uint32_t r[4], b0[2], b1[2];
                ldsm_x4(r, Ks + (j * 8 + (lane & 7) + ((lane >> 4) << 3)) * PK + kk + ((lane >> 3) & 1) * 8);
                b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
                mma16<T>::run(sc[j], af, b0);
                mma16<T>::run(sc[j + 1], af, b1);
            }
        }
        // scale, causal mask, online softmax (a row's 4 threads: lanes of one quad)
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < FK / 8; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int key = k0 + j * 8 + (lane & 3) * 2 + (q & 1), hr = q >> 1;
                float v = key <= row_pos[hr] ? sc[j][q] * a.scale : -INFINITY;
                sc[j][q] = v;
                mx[hr] = fmaxf(mx[hr], v);
            }
        float corr[2], rs[2] = {0, 0};
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
            corr[hr] = mx[hr] == -INFINITY ? 1.0f : expf(m[hr] - mx[hr]);
            m[hr] = mx[hr];
        }
#pragma unroll
        for (int j = 0; j < FK / 8; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int hr = q >> 1;
                float p = sc[j][q] == -INFINITY ? 0.0f : expf(sc[j][q] - m[hr]);
                sc[j][q] = p;
                rs[hr] += p;
            }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 1);
            rs[hr] += __shfl_xor_sync(0xffffffffu, rs[hr], 2);
            l[hr] = l[hr] * corr[hr] + rs[hr];
        }
#pragma unroll
        for (int j = 0; j < DV / 8; j++) o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
        // O += P V: P's accumulators become the A fragments of 16-key steps
#pragma unroll
        for (int kc16 = 0; kc16 < FK / 16; kc16++) {
            uint32_t pa[4] = {pack2<T>(sc[2 * kc16][0], sc[2 * kc16][1]), pack2<T>(sc[2 * kc16][2], sc[2 * kc16][3]),
                              pack2<T>(sc[2 * kc16 + 1][0], sc[2 * kc16 + 1][1]),
                              pack2<T>(sc[2 * kc16 + 1][2], sc[2 * kc16 + 1][3])};
#pragma unroll
            for (int j = 0; j < DV / 8; j += 2) {
                uint32_t r[4], b0[2], b1[2];
                ldsm_x4_trans(r, Vs + (kc16 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * PV + j * 8 + (lane >> 4) * 8);
                b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
                mma16<T>::run(o[j], pa, b0);
                mma16<T>::run(o[j + 1], pa, b1);
            }
        }
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        int r = warp * 16 + (lane >> 2) + hr * 8;
        if (r >= nq) continue;
        float inv = l[hr] > 0 ? a.vs / l[hr] : 0.0f;
        float *op = a.out + (int64_t)(t0 + q0 + r) * a.H * DV + h * DV;
#pragma unroll
        for (int j = 0; j < DV / 8; j++) {
            int c = j * 8 + (lane & 3) * 2;
            *(float2 *)(op + c) = make_float2(o[j][hr * 2] * inv, o[j][hr * 2 + 1] * inv);
        }
    }
}

template <int DK, int DV, class Src>
static void launch(struct backend *be, const flash_args &a, const Src &src, int blocks) {
    size_t sm = sizeof(__nv_bfloat16) * ((size_t)(FQ + FK) * (DK + 8) + (size_t)FK * (DV + 8));
    CUDA_CHECK(cudaFuncSetAttribute(k_flash<DK, DV, Src>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    k_flash<DK, DV, Src><<<dim3(blocks, a.H), 128, sm, cu(be)->stream>>>(a, src);
    LAUNCH_CHECK();
}

template <typename C, int D>
static void launch_paged(struct backend *be, const flash_args &a, const void *kc, const void *vc, int blocks) {
    flash_paged<C, D> src = {(const C *)kc, (const C *)vc, NULL, 0};
    launch<D, D>(be, a, src, blocks);
}

// Blocks of sequences [seq0, seq1): ceil(L / FQ) each (find_tile's order).
static int flash_blocks(const struct batch *b, int seq0, int seq1) {
    int blocks = 0;
    for (int s = seq0; s < seq1; s++) blocks += cdiv(b->h_query_start_loc[s + 1] - b->h_query_start_loc[s], FQ);
    return blocks;
}

// Runs prefill attention here when the shape allows it; 0 when not (the
// caller takes the split-KV kernel).
// bf16 Q and P: not in the fp32 mode (weight_dtype float32), whatever the cache
int cuda_flash_shape(const struct backend *be, const struct attn_dims *d) {
    int D = d->head_dim;
    return be->weight_dtype != WF_F32 && (be->kv_dtype == DT_BF16 || be->kv_dtype == DT_FP8) && (D == 64 || D == 128);
}

int cuda_flash_prefill(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                                    const void *v_cache, const struct batch *b, int seq0, int seq1,
                                    const struct attn_dims *d) {
    int D = d->head_dim, fp8 = be->kv_dtype == DT_FP8;
    if (!cuda_flash_shape(be, d) || b->fixed_shapes) return 0;
    int blocks = flash_blocks(b, seq0, seq1);
    if (!blocks) return 1;
    flash_args a = {out, qkv, ld, d->heads, d->kv_heads, d->block_size, b->max_blocks_per_seq, seq0, seq1,
                    fp8 ? d->scale * d->k_scale : d->scale, b->query_start_loc, b->context_lens, b->block_tables,
                    fp8 ? d->v_scale : 1.0f};
    if (fp8) {
        if (D == 64) launch_paged<__nv_fp8_e4m3, 64>(be, a, k_cache, v_cache, blocks);
        else launch_paged<__nv_fp8_e4m3, 128>(be, a, k_cache, v_cache, blocks);
    } else {
        if (D == 64) launch_paged<__nv_bfloat16, 64>(be, a, k_cache, v_cache, blocks);
        else launch_paged<__nv_bfloat16, 128>(be, a, k_cache, v_cache, blocks);
    }
    return 1;
}

int cuda_flash_mla_shape(const struct mla_dims *d) {
    return d->nope == 128 && d->nope + d->rope == 192 && d->v_dim == 128 && d->rank % 8 == 0;
}

// MLA prefill of sequences [seq0, seq1) over their contexts' keys expanded
// per head (cuda_mla.cu: kv, lat), a shape cuda_flash_mla_shape takes.
void cuda_flash_mla(struct backend *be, float *out, const float *q, const __nv_bfloat16 *kv,
                    const __nv_bfloat16 *lat, const struct batch *b, int seq0, int seq1, const struct mla_dims *d) {
    int blocks = flash_blocks(b, seq0, seq1);
    if (!blocks) return;
    flash_args a = {out, q, d->heads * (d->nope + d->rope), d->heads, d->heads, 0, 0, seq0, seq1, d->scale,
                    b->query_start_loc, b->context_lens, NULL, 1.0f};
    flash_mla<128> src = {kv, lat, b->seq_lens, d->rank, d->rank + d->rope, 0, 0};
    launch<192, 128>(be, a, src, blocks);
}
