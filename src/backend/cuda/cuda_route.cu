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

// The top-k of token t by score (thread e = expert e, avail: may be picked)
// by rank: each thread counts the experts that beat it (a higher score, ties
// to the lower index: the CPU reference's order) over the scores in shared
// memory (broadcast reads, four a load), and one with rank j < k is pick j.
// One barrier and E / 4 loads a thread, where k rounds of warp shuffles
// then k more in one warp were k dependent reductions (qwen3_30b_a3b's
// softmax top-8 of 128 added 5.7 us a layer to a decode step in its graph on the
// H100). weights: the picks' w (in pick order), divided by their sum (+
// eps) when norm_topk_prob, times the scaling.
__device__ __forceinline__ void route_topk(int t, float score, float w, bool avail, float eps, int32_t *ids,
                                           float *weights, const moe_route_cfg &c, float *s_w) {
    __shared__ __align__(16) float sc[MAX_EXPERTS]; // blockDim.x entries: -inf past E (never beats a pick)
    int e = threadIdx.x, k = c.top_k, nb = blockDim.x;
    float v = avail && score == score ? score : -INFINITY; // a NaN score never beats anything
    sc[e] = v;
    if (e < k) s_w[e] = 0, ids[(int64_t)t * k + e] = 0; // a valid id where fewer than k scores are finite
    __syncthreads();
    if (avail) {
        const float4 *s4 = (const float4 *)sc;
        int rank = 0;
        for (int j = 0; j < nb && rank < k; j += 4) {
            float4 x = s4[j >> 2];
            rank += (x.x > v || (x.x == v && j < e)) + (x.y > v || (x.y == v && j + 1 < e)) +
                    (x.z > v || (x.z == v && j + 2 < e)) + (x.w > v || (x.w == v && j + 3 < e));
        }
        if (rank < k) s_w[rank] = w, ids[(int64_t)t * k + rank] = e;
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
    __shared__ float red[32], s_w[CUDA_MAX_TOPK];
    pdl_wait();
    pdl_trigger();
    int t = blockIdx.x, e = threadIdx.x, E = c.num_experts;
    bool in = e < E, avail = in;
    float lg = in ? logits[(int64_t)t * E + e] : -INFINITY;
    float mx = block_reduce<true>(lg, red);
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

