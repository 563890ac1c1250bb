// cuda_route.cu - the MoE routers on the GPU: the fp32 router product's
// softmax top-k or sigmoid + correction bias with grouped top-k
// (moe_route). The router product is a matmul before it: fused into one
// kernel whose last block routes, it measured no faster in a graph with
// PDL (nano30b, H100: docs/BENCHMARKS.md, session of Dec 6).
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
// one thread, as the reference does). Token t by block t of at least E
// threads (thread e = expert e).
__global__ void k_moe_route(int32_t *ids, float *weights, const float *logits, const float *bias, moe_route_cfg c) {
    __shared__ float s_ch[MAX_EXPERTS], gs[CUDA_MAX_GROUPS], s_w[CUDA_MAX_TOPK];
    __shared__ unsigned long long s_groups;
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x, e = threadIdx.x, E = c.num_experts;
    bool in = e < E, avail = in;
    float sig = in ? 1.0f / (1.0f + expf(-logits[(int64_t)t * E + e])) : 0.0f;
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

// Softmax top-k: probabilities as the reference (max subtracted, expf,
// divided by the sum), then the top-k of them.
// Token t by block t of at least E threads (thread e = expert e).
__global__ void k_moe_route_softmax(int32_t *ids, float *weights, const float *logits, moe_route_cfg c) {
    __shared__ float sv[33], red[32], s_w[CUDA_MAX_TOPK];
    __shared__ int si[33];
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x, e = threadIdx.x, E = c.num_experts;
    bool in = e < E, avail = in;
    float lg = in ? logits[(int64_t)t * E + e] : -INFINITY, mx = lg;
    int im = e;
    block_best(mx, im, sv, si);
    float p = in ? expf(lg - mx) : 0.0f;
    p /= block_sum(p, red);
    route_topk(t, p, p, avail, 0.0f, ids, weights, c, s_w);
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

