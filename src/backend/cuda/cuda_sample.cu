// cuda_sample.cu - the sampler, one block per sampled row, in the CPU
// reference's order: raw log-probs; repetition, frequency and presence
// penalties; greedy, or temperature, min-p, top-k, top-p and an exponential
// race with Philox(seed, step, token). The id goes straight into the token
// table, where the next step's input gather reads it.
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "sample/philox.h"
}

#define NT 1024

struct vi {
    float v;
    int i;
};

// Larger value wins; equal values: lower index (the reference's argmax).
__device__ __forceinline__ vi better(vi a, vi b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

__device__ vi block_argmax(vi x, vi *red) {
    for (int o = 16; o > 0; o >>= 1) {
        vi y = {__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)};
        x = better(x, y);
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[w] = x;
    __syncthreads();
    x = lane < (int)(blockDim.x >> 5) ? red[lane] : vi{-INFINITY, 0x7fffffff};
    for (int o = 16; o > 0; o >>= 1) {
        vi y = {__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)};
        x = better(x, y);
    }
    return x;
}

// Number of p[i] > x (strict) or >= x, and their mass.
__device__ float count_above(const float *p, int V, float x, bool strict, bool mass, float *red) {
    float c = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        bool in = strict ? p[i] > x : p[i] >= x;
        if (in) c += mass ? p[i] : 1.0f;
    }
    return block_sum(c, red);
}

// log-sum-exp of a row of V logits.
__device__ float row_lse(const float *l, int V, float *red, vi *vred) {
    vi m = {-INFINITY, 0x7fffffff};
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = better(m, vi{l[i], i});
    m = block_argmax(m, vred);
    float s = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(l[i] - m.v);
    return m.v + logf(block_sum(s, red));
}

// The top n of a row's log-probs, largest first (ties: lower id), by
// repeated argmax skipping the ids taken, into ti / tl [cap]: entries past n
// (or past the vocabulary) are -1 / -inf.
__device__ void row_top(const float *l, int V, float lse, int n, int cap, int32_t *ti, float *tl, vi *vred) {
    for (int j = 0; j < cap; j++) {
        vi x = {-INFINITY, 0x7fffffff};
        if (j < n)
            for (int i = threadIdx.x; i < V; i += blockDim.x) {
                bool taken = false;
                for (int q = 0; q < j; q++) taken |= ti[q] == i;
                if (!taken) x = better(x, vi{l[i], i});
            }
        x = block_argmax(x, vred);
        if (threadIdx.x == 0) {
            bool ok = j < n && x.i < V;
            ti[j] = ok ? x.i : -1;
            tl[j] = ok ? x.v - lse : -INFINITY;
        }
        __syncthreads();
    }
}

// The sampled id's log-probs when asked (log-sum-exp and the top-n of the
// raw logits), then the id into out and the token table.
__device__ void sample_finish(const float *l, int V, int id, int r, const sample_params &p, int32_t *table,
                              sample_out out, float *red, vi *vred) {
    if (p.num_logprobs >= 0) {
        float lse = row_lse(l, V, red, vred);
        row_top(l, V, lse, min(p.num_logprobs, out.max_top), out.max_top, out.top_ids + (int64_t)r * out.max_top,
                out.top_logprobs + (int64_t)r * out.max_top, vred);
        if (threadIdx.x == 0) out.logprobs[r] = l[id] - lse;
    }
    if (threadIdx.x == 0) {
        out.ids[r] = id;
        table[p.row_base + p.num_tokens] = id; // the next step's input
    }
}

// Greedy rows' arg-max in SAMPLE_PARTS slices of the row, a block each
// (one block streaming a 131k vocabulary alone is ~10x slower): part [n,
// SAMPLE_PARTS] of (value, index), reduced by k_sample.
#define SAMPLE_PARTS 64
__global__ void k_argmax_parts(const float *logits, int V, vi *part) {
    __shared__ vi vred[32];
    pdl_wait();
    pdl_trigger();
    int r = blockIdx.y, per = (V + SAMPLE_PARTS - 1) / SAMPLE_PARTS, lo = blockIdx.x * per, hi = min(V, lo + per);
    const float *l = logits + (int64_t)r * V;
    vi best = {-INFINITY, 0x7fffffff};
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) best = better(best, vi{l[i], i});
    best = block_argmax(best, vred);
    if (threadIdx.x == 0) part[r * SAMPLE_PARTS + blockIdx.x] = best;
}

__global__ void k_sample(const float *logits, int V, int32_t *table, const sample_params *params, float *work,
                         int32_t *cnt, const vi *part, sample_out out) {
    __shared__ float red[32];
    __shared__ vi vred[32];
    pdl_wait();
    pdl_trigger();
    int r = blockIdx.x;
    sample_params p = params[r];
    const float *l = logits + (int64_t)r * V;
    float *b = work + (int64_t)r * V;
    const int32_t *toks = table + p.row_base;
    int rep = p.repetition_penalty != 1.0f, pf = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    if (p.temperature <= 0.0f && !rep && !pf) { // greedy on the raw logits: the parts' best
        vi best = threadIdx.x < SAMPLE_PARTS ? part[r * SAMPLE_PARTS + threadIdx.x] : vi{-INFINITY, 0x7fffffff};
        sample_finish(l, V, block_argmax(best, vred).i, r, p, table, out, red, vred);
        return;
    }
    for (int i = threadIdx.x; i < V; i += blockDim.x) b[i] = l[i];
    if (rep || pf) {
        int32_t *all = cnt + (int64_t)r * 2 * V, *outc = all + V;
        for (int i = threadIdx.x; i < 2 * V; i += blockDim.x) all[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < p.num_tokens; i += blockDim.x) {
            int t = toks[i];
            if (t < 0 || t >= V) continue;
            atomicAdd(&all[t], 1);
            if (i >= p.num_prompt) atomicAdd(&outc[t], 1);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            float v = b[i];
            if (rep && all[i]) v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
            if (pf && outc[i]) v -= p.frequency_penalty * outc[i] + p.presence_penalty;
            b[i] = v;
        }
    }
    __syncthreads();
    vi best = {-INFINITY, 0x7fffffff};
    for (int i = threadIdx.x; i < V; i += blockDim.x) best = better(best, vi{b[i], i});
    best = block_argmax(best, vred);
    int id = best.i;
    if (p.temperature > 0.0f) {
        float mx = best.v, s = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) s += b[i] = expf((b[i] - mx) / p.temperature);
        s = block_sum(s, red);
        for (int i = threadIdx.x; i < V; i += blockDim.x) b[i] /= s;
        vi pm = {-INFINITY, 0x7fffffff};
        for (int i = threadIdx.x; i < V; i += blockDim.x) pm = better(pm, vi{b[i], i});
        float pmax = block_argmax(pm, vred).v;
        if (p.min_p > 0)
            for (int i = threadIdx.x; i < V; i += blockDim.x)
                if (b[i] < p.min_p * pmax) b[i] = 0;
        __syncthreads();
        if (p.top_k > 0 && p.top_k < V) {
            // the k-th largest value: the largest x with count(p >= x) >= k (bisection on float bits)
            unsigned lo = 0, hi = __float_as_uint(pmax);
            while (lo < hi) {
                unsigned mid = lo + (hi - lo + 1) / 2;
                if (count_above(b, V, __uint_as_float(mid), false, false, red) >= p.top_k) lo = mid;
                else hi = mid - 1;
            }
            float tau = __uint_as_float(lo);
            int above = (int)count_above(b, V, tau, true, false, red), need = p.top_k - above;
            int ties = (int)count_above(b, V, tau, false, false, red) - above;
            __syncthreads();
            if (threadIdx.x == 0 && tau > 0 && ties > need) // keep the lowest-index ties, as a stable sort does
                for (int i = 0; i < V; i++)
                    if (b[i] == tau) {
                        if (need > 0) need--;
                        else b[i] = 0;
                    }
            for (int i = threadIdx.x; i < V; i += blockDim.x)
                if (b[i] < tau) b[i] = 0;
            __syncthreads();
        }
        if (p.top_p < 1.0f) {
            // keep p >= x for the smallest x with mass(p > x) < top_p * total
            float target = p.top_p * count_above(b, V, 0.0f, true, true, red);
            unsigned lo = 0, hi = __float_as_uint(pmax);
            while (lo < hi) {
                unsigned mid = lo + (hi - lo) / 2;
                if (count_above(b, V, __uint_as_float(mid), true, true, red) < target) hi = mid;
                else lo = mid + 1;
            }
            float x = __uint_as_float(lo);
            for (int i = threadIdx.x; i < V; i += blockDim.x)
                if (b[i] < x) b[i] = 0;
            __syncthreads();
        }
        vi race = {-1.0f, 0x7fffffff};
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            if (b[i] <= 0) continue;
            float e = -logf(philox_uniform(p.seed_lo, p.seed_hi, p.step, (uint32_t)i));
            race = better(race, vi{b[i] / e, i});
        }
        id = block_argmax(race, vred).i;
    }
    sample_finish(l, V, id, r, p, table, out, red, vred);
}

// cuda_sample's scratch at n rows, reserved at load (OP_SAMPLE): the work
// rows [n, V] fp32, the penalties' counts [n, 2V] (read only by rows with
// penalties), then the argmax parts.
size_t cuda_sample_scratch(int n, int vocab) {
    return (sizeof(float) + 2 * sizeof(int32_t)) * (size_t)n * vocab + sizeof(vi) * SAMPLE_PARTS * n;
}

void cuda_sample(struct backend *be, const float *logits, int vocab, int32_t *token_table, const struct batch *b,
                 struct sample_out *out) {
    int n = b->num_sample;
    if (n <= 0) return;
    size_t wbytes = sizeof(float) * (size_t)n * vocab, cbytes = sizeof(int32_t) * 2 * (size_t)n * vocab;
    char *s = (char *)cuda_scratch(be, cuda_sample_scratch(n, vocab));
    vi *part = (vi *)(s + wbytes + cbytes);
    cudaStream_t st = cu(be)->stream;
    launch_pdl(k_argmax_parts, dim3(SAMPLE_PARTS, n), 256, 0, st, logits, vocab, part);
    launch_pdl(k_sample, n, NT, 0, st, logits, vocab, token_table, (const sample_params *)b->sample_params, (float *)s,
               (int32_t *)(s + wbytes), (const vi *)part, *out);
}

// Prompt log-probs, a block per row: the log-sum-exp, the target's rank
// (ids with a logit >= its own) and the top k by repeated argmax.
__global__ void k_token_logprobs(const float *logits, int V, const int32_t *rows, const int32_t *targets, int k,
                                 float *lp, int32_t *rank, int32_t *top_ids, float *top_lp) {
    __shared__ float red[32];
    __shared__ vi vred[32];
    int r = blockIdx.x;
    const float *l = logits + (int64_t)rows[r] * V;
    float t = l[targets[r]], lse = row_lse(l, V, red, vred);
    float n = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) n += l[i] >= t ? 1.0f : 0.0f;
    n = block_sum(n, red);
    row_top(l, V, lse, k, k, top_ids + (int64_t)r * k, top_lp + (int64_t)r * k, vred);
    if (threadIdx.x == 0) {
        lp[r] = t - lse;
        rank[r] = (int32_t)n;
    }
}

void cuda_token_logprobs(struct backend *be, const float *logits, int vocab, const int32_t *rows,
                         const int32_t *targets, int n, int k, float *lp, int32_t *rank, int32_t *top_ids,
                         float *top_lp) {
    if (n <= 0) return;
    k_token_logprobs<<<n, NT, 0, cu(be)->stream>>>(logits, vocab, rows, targets, k, lp, rank, top_ids, top_lp);
    LAUNCH_CHECK();
}

// Constrained decoding: a thread per id, a row per blockIdx.y; the mask's
// words are read once per 32 ids (a warp shares one word).
__global__ void k_mask_logits(float *logits, int V, const uint32_t *mask, int W) {
    int r = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= V) return;
    uint32_t w = mask[(int64_t)r * W + (i >> 5)];
    if (!((w >> (i & 31)) & 1u)) logits[(int64_t)r * V + i] = -INFINITY;
}

// logit_bias: a thread per (distinct) entry.
__global__ void k_bias_logits(float *logits, int n, const int64_t *idx, const float *val) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) logits[idx[i]] += val[i];
}

void cuda_bias_logits(struct backend *be, float *logits, int n, const int64_t *idx, const float *val) {
    if (n <= 0) return;
    k_bias_logits<<<CDIV(n, 256), 256, 0, cu(be)->stream>>>(logits, n, idx, val);
    LAUNCH_CHECK();
}

void cuda_mask_logits(struct backend *be, float *logits, int rows, int vocab, const uint32_t *mask) {
    if (rows <= 0) return;
    dim3 grid((unsigned)CDIV(vocab, 256), (unsigned)rows);
    k_mask_logits<<<grid, 256, 0, cu(be)->stream>>>(logits, vocab, mask, CDIV(vocab, 32));
    LAUNCH_CHECK();
}
