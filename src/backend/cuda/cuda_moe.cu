// cuda_moe.cu - MoE on the GPU: the fp32 router (sigmoid + correction bias
// with grouped top-k, or softmax top-k), tokens permuted by expert,
// per-expert up / activation (gated or not) / down over each expert's token
// segment, and the weighted combine in expert order (the order of the CPU
// reference).
#include "backend/cuda/cuda_common.cuh"

#define MAX_EXPERTS CUDA_MAX_EXPERTS

// One warp per token. Lanes hold experts e = lane + 32 q; group scores
// and the top-k are warp reductions; ties go to the lower index, as in the
// CPU reference.
#define ROUTE_Q (MAX_EXPERTS / 32)

__device__ __forceinline__ void warp_best(float &v, int &i) {
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
    }
}

__global__ void k_moe_route(int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                            moe_route_cfg c) {
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= n) return;
    int E = c.num_experts, per = E / c.n_group, nq = (E + 31) / 32;
    const float *l = logits + (int64_t)t * E;
    float sig[ROUTE_Q], ch[ROUTE_Q];
    bool allowed[ROUTE_Q];
#pragma unroll
    for (int q = 0; q < ROUTE_Q; q++) {
        int e = lane + 32 * q;
        bool in = q < nq && e < E;
        sig[q] = in ? 1.0f / (1.0f + expf(-l[e])) : 0.0f;
        ch[q] = in ? sig[q] + (bias ? bias[e] : 0.0f) : -INFINITY;
        allowed[q] = false;
    }
    // groups: score = sum of the group's two best choice scores
    uint64_t taken_groups = 0;
    for (int j = 0; j < c.topk_group; j++) {
        float best = -INFINITY;
        int bestg = 0x7fffffff;
        for (int g = 0; g < c.n_group; g++) {
            if (taken_groups >> g & 1) continue;
            float a = -INFINITY, b2 = -INFINITY;
            int ia = 0x7fffffff;
#pragma unroll
            for (int q = 0; q < ROUTE_Q; q++) { // best in group
                int e = lane + 32 * q;
                float v = (e >= g * per && e < (g + 1) * per) ? ch[q] : -INFINITY;
                int ie = e;
                warp_best(v, ie);
                if (v > a || (v == a && ie < ia)) a = v, ia = ie;
            }
            if (per > 1) // second best in group
#pragma unroll
                for (int q = 0; q < ROUTE_Q; q++) {
                    int e = lane + 32 * q;
                    float v = (e >= g * per && e < (g + 1) * per && e != ia) ? ch[q] : -INFINITY;
                    int ie = e;
                    warp_best(v, ie);
                    b2 = fmaxf(b2, v);
                }
            float gs = a + (per > 1 ? b2 : 0.0f);
            if (gs > best || (gs == best && g < bestg)) best = gs, bestg = g;
        }
        taken_groups |= 1ull << bestg;
    }
#pragma unroll
    for (int q = 0; q < ROUTE_Q; q++) {
        int e = lane + 32 * q;
        allowed[q] = e < E && (taken_groups >> (e / per) & 1);
    }
    int32_t *id = ids + (int64_t)t * c.top_k;
    float *w = weights + (int64_t)t * c.top_k, sum = 0;
    for (int j = 0; j < c.top_k; j++) {
        float v = -INFINITY;
        int ie = 0x7fffffff;
#pragma unroll
        for (int q = 0; q < ROUTE_Q; q++) {
            int e = lane + 32 * q;
            float cv = allowed[q] ? ch[q] : -INFINITY;
            if (cv > v || (cv == v && e < ie)) v = cv, ie = e;
        }
        warp_best(v, ie);
#pragma unroll
        for (int q = 0; q < ROUTE_Q; q++)
            if (lane + 32 * q == ie) allowed[q] = false;
        float s_ = 1.0f / (1.0f + expf(-l[ie]));
        if (lane == 0) id[j] = ie, w[j] = s_;
        sum += s_;
    }
    if (lane == 0)
        for (int j = 0; j < c.top_k; j++) {
            if (c.norm_topk_prob) w[j] /= sum + 1e-20f;
            w[j] *= c.routed_scaling_factor;
        }
}

// Softmax top-k, one warp per token: probabilities as the reference (max
// subtracted, expf, divided by the sum), top-k by warp arg-max, ties to the
// lower index.
__global__ void k_moe_route_softmax(int32_t *ids, float *weights, const float *logits, int n, moe_route_cfg c) {
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= n) return;
    int E = c.num_experts, nq = (E + 31) / 32;
    const float *l = logits + (int64_t)t * E;
    float p[ROUTE_Q], mx = -INFINITY, sum = 0;
#pragma unroll
    for (int q = 0; q < ROUTE_Q; q++) {
        int e = lane + 32 * q;
        p[q] = q < nq && e < E ? l[e] : -INFINITY;
        mx = fmaxf(mx, p[q]);
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
#pragma unroll
    for (int q = 0; q < ROUTE_Q; q++) {
        p[q] = p[q] == -INFINITY ? 0.0f : expf(p[q] - mx);
        sum += p[q];
    }
    sum = warp_sum(sum);
    bool taken[ROUTE_Q];
#pragma unroll
    for (int q = 0; q < ROUTE_Q; q++) p[q] /= sum, taken[q] = lane + 32 * q >= E;
    int32_t *id = ids + (int64_t)t * c.top_k;
    float *w = weights + (int64_t)t * c.top_k, tot = 0;
    for (int j = 0; j < c.top_k; j++) {
        float v = -INFINITY;
        int ie = 0x7fffffff;
#pragma unroll
        for (int q = 0; q < ROUTE_Q; q++) {
            int e = lane + 32 * q;
            if (!taken[q] && (p[q] > v || (p[q] == v && e < ie))) v = p[q], ie = e;
        }
        warp_best(v, ie);
#pragma unroll
        for (int q = 0; q < ROUTE_Q; q++)
            if (lane + 32 * q == ie) taken[q] = true;
        if (lane == 0) id[j] = ie, w[j] = v;
        tot += v;
    }
    if (lane == 0)
        for (int j = 0; j < c.top_k; j++) {
            if (c.norm_topk_prob) w[j] /= tot;
            w[j] *= c.routed_scaling_factor;
        }
}

void cuda_moe_route(struct backend *be, int32_t *ids, float *weights, const float *logits, const float *bias, int n,
                    const struct moe_route_cfg *c) {
    if (n <= 0) return; // shapes checked at load (cu_supports)
    cudaStream_t s = cu(be)->stream;
    switch (c->kind) {
    case ROUTE_SIGMOID_GROUPED: k_moe_route<<<cdiv(n, 4), 128, 0, s>>>(ids, weights, logits, bias, n, *c); break;
    case ROUTE_SOFTMAX_TOPK: k_moe_route_softmax<<<cdiv(n, 4), 128, 0, s>>>(ids, weights, logits, n, *c); break;
    }
    LAUNCH_CHECK();
}

// Stable counting sort of the n*k assignments by expert (one block):
// offsets [E+1], perm[r] = assignment (t*k + j) at position r, slot_of the inverse.
__global__ void k_moe_sort(const int32_t *ids, int nk, int E, int32_t *offsets, int32_t *perm, int32_t *slot_of) {
    __shared__ int cnt[MAX_EXPERTS + 1];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int c = 0;
        for (int a = 0; a < nk; a++) c += ids[a] == e;
        cnt[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int e = 0; e < E; e++) {
            int c = cnt[e];
            cnt[e] = run;
            run += c;
        }
        cnt[E] = run;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = cnt[e];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int r = cnt[e];
        for (int a = 0; a < nk; a++)
            if (ids[a] == e) perm[r] = a, slot_of[a] = r, r++;
    }
}

__device__ __forceinline__ void load8(const __nv_bfloat16 *p, float f[8]) {
    uint4 u = __ldg((const uint4 *)p);
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void load8(const __half *p, float f[8]) {
    uint4 u = __ldg((const uint4 *)p);
    const __half2 *h = (const __half2 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __half22float2(h[i]);
        f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
}
__device__ __forceinline__ void load8(const float *p, float f[8]) {
    float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}

#define MOE_NB 8 // segment rows that share one pass over a weight row

// out[r, row] = W_e[wrow0 + row] . in[src(r)] for the rows r of expert e's
// segment (GATHER: src(r) is the assignment's token, else r itself), out
// rows ldo floats apart. Each warp owns weight rows and streams each once
// per MOE_NB segment rows: VEC, 8 values per lane per load (cols % 8 == 0),
// else one value a lane a step (any width).
template <typename WT, bool GATHER, bool VEC>
__global__ void __launch_bounds__(256) k_moe_mm(const WT *w, const float *in, float *out, const int32_t *offsets,
                                                const int32_t *perm, int k, int wrows, int wrow0, int rows, int ldo,
                                                int cols, int rows_per_block) {
    int e = blockIdx.x, r0 = offsets[e], cnt = offsets[e + 1] - r0;
    if (cnt == 0) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int rbeg = blockIdx.y * rows_per_block, rend = min(rows, rbeg + rows_per_block);
    for (int row = rbeg + warp; row < rend; row += nw) {
        const WT *wr = w + ((int64_t)e * wrows + wrow0 + row) * cols;
        for (int rb = r0; rb < r0 + cnt; rb += MOE_NB) {
            int nb = min(MOE_NB, r0 + cnt - rb);
            const float *src[MOE_NB];
            float acc[MOE_NB];
#pragma unroll
            for (int b = 0; b < MOE_NB; b++) {
                int r = rb + (b < nb ? b : 0);
                src[b] = GATHER ? in + (int64_t)(perm[r] / k) * cols : in + (int64_t)r * cols;
                acc[b] = 0;
            }
            if (VEC) {
                for (int c8 = lane * 8; c8 < cols; c8 += 256) {
                    float wf[8];
                    load8(wr + c8, wf);
#pragma unroll
                    for (int b = 0; b < MOE_NB; b++) {
                        if (b >= nb) break;
                        float xs[8];
                        load8(src[b] + c8, xs);
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[b] += wf[i] * xs[i];
                    }
                }
            } else {
                for (int c = lane; c < cols; c += 32) {
                    float wv = load_f(wr + c);
#pragma unroll
                    for (int b = 0; b < MOE_NB; b++)
                        if (b < nb) acc[b] += wv * src[b][c];
                }
            }
#pragma unroll
            for (int b = 0; b < MOE_NB; b++) {
                if (b >= nb) break;
                float dot = warp_sum(acc[b]);
                if (lane == 0) out[(int64_t)(rb + b) * ldo + row] = dot;
            }
        }
    }
}

// h [A, I] = act(gu[:, :I]) * gu[:, I:] (gated, gu [A, 2I]) or act(gu) (gu [A, I])
__global__ void k_moe_act(float *h, const float *gu, int64_t A, int I, int gated, enum act kind) {
    int U = gated ? 2 * I : I;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < A * I; i += (int64_t)gridDim.x * blockDim.x) {
        const float *g = gu + (i / I) * U + i % I;
        h[i] = gated ? act_dev(kind, g[0]) * g[I] : act_dev(kind, g[0]);
    }
}

// out[t] = sum over its k experts, in ascending expert order, of w * y.
__global__ void k_moe_combine(float *out, const float *y, const int32_t *ids, const float *weights,
                              const int32_t *slot_of, int k, int L) {
    int t = blockIdx.x;
    int order[16];
    for (int j = 0; j < k; j++) order[j] = j;
    for (int a = 1; a < k; a++) // insertion sort by expert id
        for (int b = a; b > 0 && ids[t * k + order[b]] < ids[t * k + order[b - 1]]; b--) {
            int tmp = order[b];
            order[b] = order[b - 1];
            order[b - 1] = tmp;
        }
    for (int l = threadIdx.x; l < L; l += blockDim.x) {
        float acc = 0;
        for (int q = 0; q < k; q++) {
            int j = order[q];
            acc += weights[t * k + j] * y[(int64_t)slot_of[t * k + j] * L + l];
        }
        out[(int64_t)t * L + l] = acc;
    }
}

// out [segment rows, rows] = the experts' W (rows [0, rows) of each
// expert's wrows) applied to their segment rows of in (gathered by token
// when gather), for weights of type WT.
template <typename WT>
static void experts_mm(cudaStream_t st, const WT *w, const float *in, float *out, const int32_t *offsets,
                       const int32_t *perm, int top_k, int E, int rows, int cols, bool gather) {
    const int rpb = 8; // one weight row per warp: many warps in flight at decode sizes
    dim3 g(E, cdiv(rows, rpb));
    bool vec = cols % 8 == 0;
    if (gather && vec) k_moe_mm<WT, true, true><<<g, 256, 0, st>>>(w, in, out, offsets, perm, top_k, rows, 0, rows, rows, cols, rpb);
    else if (gather) k_moe_mm<WT, true, false><<<g, 256, 0, st>>>(w, in, out, offsets, perm, top_k, rows, 0, rows, rows, cols, rpb);
    else if (vec) k_moe_mm<WT, false, true><<<g, 256, 0, st>>>(w, in, out, offsets, perm, top_k, rows, 0, rows, rows, cols, rpb);
    else k_moe_mm<WT, false, false><<<g, 256, 0, st>>>(w, in, out, offsets, perm, top_k, rows, 0, rows, rows, cols, rpb);
    LAUNCH_CHECK();
}

static void experts_fmt(cudaStream_t st, const struct weight *w, const float *in, float *out, const int32_t *offsets,
                        const int32_t *perm, int top_k, int E, int rows, int cols, bool gather) {
    switch (w->fmt) {
    case WF_F32: experts_mm(st, (const float *)w->data, in, out, offsets, perm, top_k, E, rows, cols, gather); break;
    case WF_BF16: experts_mm(st, (const __nv_bfloat16 *)w->data, in, out, offsets, perm, top_k, E, rows, cols, gather); break;
    case WF_F16: experts_mm(st, (const __half *)w->data, in, out, offsets, perm, top_k, E, rows, cols, gather); break;
    }
}

void cuda_moe_experts(struct backend *be, float *out, const float *x, const struct moe_experts *w, const int32_t *ids,
                      const float *weights, int n, int top_k) {
    if (n <= 0) return; // expert count and top_k checked at load (cu_supports)
    int E = w->num_experts, I = w->inter, L = w->dim, nk = n * top_k, U = w->gated ? 2 * I : I;
    size_t ints = (size_t)(E + 1) + 2 * (size_t)nk, floats = (size_t)nk * (U + I + L);
    char *s = (char *)cuda_scratch(be, ints * 4 + 256 + floats * 4);
    int32_t *offsets = (int32_t *)s, *perm = offsets + E + 1, *slot_of = perm + nk;
    float *gu = (float *)(s + ((ints * 4 + 255) & ~(size_t)255)), *h = gu + (size_t)nk * U, *y = h + (size_t)nk * I;
    cudaStream_t st = cu(be)->stream;
    k_moe_sort<<<1, 1024, 0, st>>>(ids, nk, E, offsets, perm, slot_of);
    LAUNCH_CHECK();
    experts_fmt(st, &w->up, x, gu, offsets, perm, top_k, E, U, L, true);
    int64_t nh = (int64_t)nk * I;
    k_moe_act<<<(int)(nh < 4096LL * 256 ? cdiv(nh, 256) : 4096), 256, 0, st>>>(h, gu, nk, I, w->gated, w->act);
    LAUNCH_CHECK();
    experts_fmt(st, &w->down, h, y, offsets, perm, top_k, E, L, I, false);
    k_moe_combine<<<n, 256, 0, st>>>(out, y, ids, weights, slot_of, top_k, L);
    LAUNCH_CHECK();
}
