// cuda_route.cu - the MoE routers on the GPU: the fp32 router product's
// softmax top-k or sigmoid + correction bias with grouped top-k
// (moe_route), and the router product fused with either at decode sizes
// (moe_gate_route).
#include "backend/cuda/cuda_common.cuh"

#define MAX_EXPERTS CUDA_MAX_EXPERTS

// A block per token, a thread per expert (E <= 1024), so a decode step's
// router is a few microseconds however few tokens there are. Ties go to the
// lower index, as in the CPU reference.
// (v, i) better than (bv, bi): a higher value, ties to the lower index.
__device__ __forceinline__ bool route_better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__device__ __forceinline__ void warp_best(float &v, int &i) {
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        if (route_better(v2, i2, v, i)) v = v2, i = i2;
    }
}

// The block's best (value, index); every thread gets it. sv, si: shared [33].
__device__ __forceinline__ void block_best(float &v, int &i, float *sv, int *si) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    warp_best(v, i);
    __syncthreads(); // the previous call's readers are done with sv
    if (lane == 0) sv[w] = v, si[w] = i;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sv[lane] : -INFINITY, i = lane < nw ? si[lane] : 0x7fffffff;
        warp_best(v, i);
        if (lane == 0) sv[32] = v, si[32] = i;
    }
    __syncthreads();
    v = sv[32], i = si[32];
}

// The top-k of token t by score (thread e = expert e, avail: may be picked);
// weights: the picks' w (in pick order), divided by their sum (+ eps) when
// norm_topk_prob, times the scaling. Each warp takes its own best k by
// shuffles, then warp 0 the best k of those candidates (the block's best k
// are among them): two barriers, not three a pick as k block reductions.
__device__ __forceinline__ void route_topk(int t, float score, float w, bool avail, float eps, int32_t *ids,
                                           float *weights, const moe_route_cfg &c, float *s_w) {
    __shared__ float cv[32 * CUDA_MAX_TOPK], wall[MAX_EXPERTS];
    __shared__ int ci[32 * CUDA_MAX_TOPK];
    int e = threadIdx.x, lane = e & 31, wp = e >> 5, k = c.top_k, nc = (blockDim.x >> 5) * k;
    if (e < c.num_experts) wall[e] = w;
    float v = avail ? score : -INFINITY;
    int ie = avail ? e : 0x7fffffff;
    for (int j = 0; j < k; j++) {
        float bv = v;
        int bi = ie;
        warp_best(bv, bi);
        if (lane == 0) cv[wp * k + j] = bv, ci[wp * k + j] = bi;
        if (ie == bi) v = -INFINITY, ie = 0x7fffffff; // taken
    }
    __syncthreads();
    if (wp == 0) {
        float lv[CUDA_MAX_TOPK]; // nc <= 32 warps x CUDA_MAX_TOPK: lane's candidates lane + 32 m
        int li[CUDA_MAX_TOPK];
#pragma unroll
        for (int m = 0; m < CUDA_MAX_TOPK; m++) {
            int x = lane + 32 * m;
            lv[m] = x < nc ? cv[x] : -INFINITY, li[m] = x < nc ? ci[x] : 0x7fffffff;
        }
        for (int j = 0; j < k; j++) {
            float bv = -INFINITY;
            int bi = 0x7fffffff;
#pragma unroll
            for (int m = 0; m < CUDA_MAX_TOPK; m++)
                if (route_better(lv[m], li[m], bv, bi)) bv = lv[m], bi = li[m];
            warp_best(bv, bi);
#pragma unroll
            for (int m = 0; m < CUDA_MAX_TOPK; m++)
                if (li[m] == bi) lv[m] = -INFINITY, li[m] = 0x7fffffff;
            if (lane == 0 && bi < c.num_experts) s_w[j] = wall[bi], ids[(int64_t)t * k + j] = bi;
        }
    }
    __syncthreads();
    if (e < k) {
        float sum = 0;
        for (int j = 0; j < k; j++) sum += s_w[j];
        float x = s_w[e];
        if (c.norm_topk_prob) x /= sum + eps;
        weights[(int64_t)t * k + e] = x * c.routed_scaling_factor;
    }
}

// Sigmoid + correction bias; experts chosen among the topk_group groups
// whose two best choice scores sum highest (each group scanned in order by
// one thread, as the reference does). Token t by a block of at least E
// threads (thread e = expert e); logits read from L2 (__ldcg: the fused
// router's other blocks wrote them).
__device__ __forceinline__ void route_sigmoid_tok(int t, int32_t *ids, float *weights, const float *logits,
                                                  const float *bias, const moe_route_cfg &c) {
    __shared__ float s_ch[MAX_EXPERTS], gs[CUDA_MAX_GROUPS], s_w[CUDA_MAX_TOPK];
    __shared__ unsigned long long s_groups;
    int e = threadIdx.x, E = c.num_experts;
    bool in = e < E, avail = in;
    float sig = in ? 1.0f / (1.0f + expf(-__ldcg(logits + (int64_t)t * E + e))) : 0.0f;
    float ch = in ? sig + (bias ? bias[e] : 0.0f) : -INFINITY;
    if (c.topk_group < c.n_group) {
        int per = E / c.n_group;
        if (in) s_ch[e] = ch;
        __syncthreads();
        if (e < c.n_group) {
            float a = -INFINITY, b2 = -INFINITY;
            for (int x = e * per; x < (e + 1) * per; x++) {
                float v = s_ch[x];
                if (v > a) b2 = a, a = v;
                else if (v > b2) b2 = v;
            }
            gs[e] = a + (per > 1 ? b2 : 0.0f);
        }
        __syncthreads();
        if (e == 0) {
            unsigned long long taken = 0;
            for (int j = 0; j < c.topk_group; j++) {
                float best = -INFINITY;
                int bg = -1;
                for (int g = 0; g < c.n_group; g++)
                    if (!(taken >> g & 1) && (bg < 0 || gs[g] > best)) best = gs[g], bg = g;
                taken |= 1ull << bg;
            }
            s_groups = taken;
        }
        __syncthreads();
        avail = in && (s_groups >> (e / per) & 1);
    }
    route_topk(t, ch, sig, avail, 1e-20f, ids, weights, c, s_w);
}

__global__ void k_moe_route(int32_t *ids, float *weights, const float *logits, const float *bias, moe_route_cfg c) {
    pdl_wait();
    pdl_trigger();
    route_sigmoid_tok(blockIdx.x, ids, weights, logits, bias, c);
}

// Softmax top-k: probabilities as the reference (max subtracted, expf,
// divided by the sum), then the top-k of them.
// Token t by a block of at least E threads (thread e = expert e); logits
// read from L2 (__ldcg: the fused router's other blocks wrote them).
__device__ __forceinline__ void route_softmax_tok(int t, int32_t *ids, float *weights, const float *logits,
                                                  const moe_route_cfg &c) {
    __shared__ float sv[33], red[32], s_w[CUDA_MAX_TOPK];
    __shared__ int si[33];
    int e = threadIdx.x, E = c.num_experts;
    bool in = e < E, avail = in;
    float lg = in ? __ldcg(logits + (int64_t)t * E + e) : -INFINITY, mx = lg;
    int im = e;
    block_best(mx, im, sv, si);
    float p = in ? expf(lg - mx) : 0.0f;
    p /= block_sum(p, red);
    route_topk(t, p, p, avail, 0.0f, ids, weights, c, s_w);
}

__global__ void k_moe_route_softmax(int32_t *ids, float *weights, const float *logits, moe_route_cfg c) {
    pdl_wait();
    pdl_trigger();
    route_softmax_tok(blockIdx.x, ids, weights, logits, c);
}

// moe_gate_route at decode sizes (NB = n <= 4 tokens, E <= 256 experts, an
// fp32 gate; softmax top-k, or sigmoid + bias with grouped top-k): the
// router GEMV (gemv32_row, a block per expert) whose last block to finish
// routes the NB tokens, so the step has one router kernel, not two. Each block fences its logits and counts
// itself in *done; the last one (count E - 1) reads them all and resets
// *done to 0 for the next layer (kernels run in stream order, so no two
// routers overlap; a replayed graph finds it 0).
#define ROUTER_FUSED_MAX_E 256
template <int NB>
__global__ void __launch_bounds__(256) k_moe_gate_route(int32_t *ids, float *weights, float *logits, const float *x,
                                                        const float *w, const float *bias, int K, moe_route_cfg c,
                                                        unsigned *done) {
    __shared__ bool last;
    gemv32_row<NB>(logits, x, w, NULL, c.num_experts, K, blockIdx.x);
    __threadfence(); // this block's logits reach L2 before it counts itself
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1u) == (unsigned)c.num_experts - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int t = 0; t < NB; t++) {
        if (c.kind == ROUTE_SOFTMAX_TOPK) route_softmax_tok(t, ids, weights, logits, c);
        else route_sigmoid_tok(t, ids, weights, logits, bias, c);
        __syncthreads();
    }
    if (threadIdx.x == 0) *done = 0;
}

// The fused router where it fits (k_moe_gate_route), else matmul + moe_route.
void cuda_moe_gate_route(struct backend *be, int32_t *ids, float *weights, float *logits, const float *x,
                         const struct weight *gate, const float *bias, int n, const struct moe_route_cfg *c) {
    if (n <= 0) return;
    int E = (int)gate->rows, K = (int)gate->cols;
    bool fuse = n <= 4 && E == c->num_experts && E <= ROUTER_FUSED_MAX_E &&
                gate->fmt == WF_F32 && !gate->bias && K % 8 == 0 && !((uintptr_t)x & 15) &&
                !((uintptr_t)gate->data & 15); // gemv32_row's float4 loads
    if (!fuse) {
        be->ops->matmul(be, logits, x, gate, n);
        cuda_moe_route(be, ids, weights, logits, bias, n, c);
        return;
    }
    cudaStream_t s = cu(be)->stream;
    const float *w = (const float *)gate->data;
    unsigned *done = cu(be)->done; // its first counter
    switch (n) {
    case 1: launch_pdl(k_moe_gate_route<1>, E, 256, 0, s, ids, weights, logits, x, w, bias, K, *c, done); break;
    case 2: launch_pdl(k_moe_gate_route<2>, E, 256, 0, s, ids, weights, logits, x, w, bias, K, *c, done); break;
    case 3: launch_pdl(k_moe_gate_route<3>, E, 256, 0, s, ids, weights, logits, x, w, bias, K, *c, done); break;
    default: launch_pdl(k_moe_gate_route<4>, E, 256, 0, s, ids, weights, logits, x, w, bias, K, *c, done); break;
    }
}

void cuda_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                    const struct moe_route_cfg *c) {
    if (n <= 0) return; // shapes checked at load (cu_supports)
    cudaStream_t s = cu(be)->stream;
    int th = (c->num_experts + 31) / 32 * 32; // E <= CUDA_MAX_EXPERTS = 1024
    switch (c->kind) {
    case ROUTE_SIGMOID_GROUPED: launch_pdl(k_moe_route, n, th, 0, s, ids, weights, logits, bias, *c); break;
    case ROUTE_SOFTMAX_TOPK: launch_pdl(k_moe_route_softmax, n, th, 0, s, ids, weights, logits, *c); break;
    }
}

