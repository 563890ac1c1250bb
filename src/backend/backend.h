// backend.h - the op interface. The engine, runner and models are one code
// path; only these ops differ per backend. The CPU backend's fp32 ops are the
// reference for every other backend's op of the same name.
//
// Pointers passed to ops are device pointers of that backend (host memory for
// the CPU backend). Activations are fp32; weights carry their format;
// recurrent state is fp32. Ops are asynchronous on devices that can be: the
// host sees results only through download() (which synchronizes). The table
// is model-agnostic: models compose these ops (src/models/layers.h).
#ifndef VLLM_BACKEND_H
#define VLLM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/batch.h"

// Element types of activations and caches. DT_FP8: e4m3 codes (1 byte; the
// KV cache's `--kv-cache-dtype fp8`), stored as vLLM does: e4m3(x / scale)
// rounded to nearest even, saturating at +-448; read back as e4m3(code) *
// scale in fp32, with the attention layer's k_scale / v_scale (attn_dims).
enum dtype { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2, DT_FP8 = 3 };

// Weight formats: how a weight's elements are stored. Every branch on a
// format is an exhaustive switch, so -Wswitch lists each place a new format
// must be handled. The quantized formats (docs/QUANTIZATION.md) carry their
// scales in struct weight, always per row, so that weights assembled from
// several checkpoint tensors (q | k | v, stacked experts) keep each part's
// scales:
// - WF_FP8: e4m3 codes [rows, cols] (1 byte each); scale [rows] fp32, W[r][c]
//   = e4m3(code) * scale[r] (a per-tensor scale repeated over its rows, or
//   per-channel scales as they are).
// - WF_FP8_B128: e4m3 codes [rows, cols]; scale [rows, ceil(cols/128)] fp32,
//   W[r][c] = e4m3(code) * scale[r][c/128] (a 128x128 block's scale repeated
//   over its 128 rows).
// - WF_NVFP4: e2m1 codes [rows, cols/2] bytes, element 2i in the low nibble
//   of byte i; bscale [rows, cols/16] e4m3 (one per block of 16); scale
//   [rows] fp32 (weight_scale_2): W[r][c] = (e2m1 * e4m3(bscale)) * scale[r].
enum wfmt { WF_F32 = 0, WF_BF16 = 1, WF_F16 = 2, WF_FP8 = 3, WF_FP8_B128 = 4, WF_NVFP4 = 5 };
#define WF_B128 128 // columns of a WF_FP8_B128 scale block
#define WF_NVFP4_GROUP 16

// A row-major [rows, cols] matrix on the device: y = x @ W^T (+ bias)
// multiplies by it. A backend may lay the elements out its own way (the CPU
// fast path packs bf16 in panels); only its ops read data.
struct weight {
    void *data;
    enum wfmt fmt;
    int64_t rows, cols;
    float *bias;    // [rows] fp32 on the device, added by matmul; NULL: none
    float *scale;   // quantized formats: [rows, wfmt_scale_cols] fp32 on the device (weight_alloc makes it)
    uint8_t *bscale; // WF_NVFP4: [rows, cols/16] e4m3 block scales on the device
};

enum act { ACT_RELU2, ACT_SILU, ACT_GELU_TANH };

// Routed experts, stored contiguously so that a device can run them as one
// grouped GEMM: up [E * U, L] (expert e's [U, L] at rows e*U), down [E * L, I].
// Gated (SwiGLU): U = 2I, expert e's gate rows then its up rows, and the
// hidden is act(gate x) * (up x); else U = I and the hidden is act(up x).
struct moe_experts {
    struct weight up, down;
    int num_experts, inter, dim; // E, I, L
    int gated;
    enum act act;
};

// A shared expert: one expert (struct moe_experts, E = 1) every token takes
// with weight 1, beside the routed ones, and the caller's buffers for it:
// y: [n, L] its output; h: [n, I] its hidden (act applied); tmp: [n, U]
// (gated: the gate | up product before act). moe_experts adds y to its
// output; a device may compute it in the routed experts' launches.
struct moe_shared {
    const struct moe_experts *w;
    float *h, *tmp, *y;
};

struct mamba_dims {
    int heads, head_dim, groups, state; // H, P, G, N
    int conv_kernel, chunk_size;        // K, chunk
    int conv_dim;                       // H*P + 2*G*N
    float dt_min, dt_max;               // dt clamp (time_step_limit)
};

// A Mamba2 layer's small parameters, as mamba_decode takes them.
struct mamba_params {
    const float *conv_w, *conv_b; // [conv_dim, K], [conv_dim] (NULL: no bias)
    const float *dt_bias, *A, *D; // [H]; A = -exp(A_log)
    const float *norm_w;          // [H*P], the gated norm's weight
    int norm_group;               // the gated norm's group size
    float eps;
};

struct attn_dims {
    int heads, kv_heads, head_dim;
    int block_size;
    float scale;            // softmax scale
    float k_scale, v_scale; // an fp8 KV cache's per-tensor scales (DT_FP8); unused by other KV dtypes
};

// Attention's per-token prologue (qk_norm_rope): the q and k head norms'
// weights [head_dim] (both NULL: no norm, Llama) and eps, and the rope
// table [positions, head_dim] of cos | sin halves (NULL: no positions,
// NemotronH).
struct attn_prep {
    const float *q_norm, *k_norm, *table;
    float eps;
};

// Kimi Delta Attention (KDA): H heads of head_dim K (keys and values alike),
// a state [K, K] per head (key channel i, value channel j), causal convs of
// conv_kernel taps on q | k | v.
struct kda_dims {
    int heads, head_dim;          // H, K
    int conv_kernel, chunk_size;  // chunk_size: checkpoint positions are multiples of it
};

// Multi-head latent attention (MLA, DeepSeek-V2 / Kimi): the cache keeps per
// token the normalized latent c [R] then the shared key part k_r [P]; head h
// scores q_nope_h . (W_kb_h c) + q_r_h . k_r and reads W_vb_h c.
struct mla_dims {
    int heads, nope, rope, v_dim, rank; // H, N, P, V, R
    int block_size;
    float scale;
};

// How a router scores experts.
enum route_kind {
    ROUTE_SIGMOID_GROUPED, // sigmoid + correction bias, top groups then top-k (NemotronH, DeepSeek-V3, Kimi)
    ROUTE_SOFTMAX_TOPK,    // softmax over all experts, top-k (Qwen3-MoE, Mixtral)
};

// weights: the chosen experts' scores (sigmoid or softmax, never the bias),
// divided by their sum when norm_topk_prob, times routed_scaling_factor.
struct moe_route_cfg {
    enum route_kind kind;
    int num_experts, top_k, n_group, topk_group, norm_topk_prob;
    float routed_scaling_factor;
};

// What a model asks a backend at load time, once per op and shape it will
// run (supports()). An op a backend cannot run at that shape is refused
// there, with an error naming it, never mid-run; the backend also reserves
// the scratch the op needs for max_tokens rows, so the step path allocates
// nothing.
enum op_kind { OP_MATMUL, OP_EMBED, OP_ATTN, OP_MAMBA, OP_MOE_ROUTE, OP_MOE_EXPERTS, OP_KDA, OP_MLA, OP_SAMPLE };
struct op_query {
    enum op_kind op;
    int max_tokens, max_seq_len;       // rows of a step, tokens of a sequence
    int max_seqs;                      // sequences of a step (0: up to max_tokens)
    const struct weight *w;            // OP_MATMUL, OP_EMBED
    const struct attn_dims *attn;      // OP_ATTN (KV in the backend's kv_dtype)
    const struct mamba_dims *mamba;    // OP_MAMBA
    const struct moe_route_cfg *route; // OP_MOE_ROUTE
    const struct moe_experts *moe;     // OP_MOE_EXPERTS (top_k: route->top_k)
    const struct kda_dims *kda;        // OP_KDA (kda_gate, kda_prefill, kda_decode, head_norm_gate)
    const struct mla_dims *mla;        // OP_MLA (mla_kv_write, mla_attn; KV in the backend's kv_dtype)
    int vocab;                         // OP_SAMPLE: sample over max_seqs rows of vocab logits
};

struct backend;

struct backend_ops {
    const char *name;
    void (*destroy)(struct backend *be);

    // Memory. alloc returns zeroed device memory, NULL when out of memory.
    void *(*alloc)(struct backend *be, size_t bytes);
    void (*free)(struct backend *be, void *p);
    void (*upload)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(struct backend *be, void *dst, const void *src, size_t bytes);
    void (*sync)(struct backend *be);
    // Bytes of this device's memory now free and in all (the CPU: available
    // and physical RAM), for gpu_memory_utilization.
    void (*mem_info)(struct backend *be, int64_t *free_bytes, int64_t *total_bytes);
    // Asynchronous steps. Page-locked host memory (for copies that overlap
    // compute), a copy to the host that does not wait, and fences: fence()
    // marks the point reached so far in the op stream; fence_wait(f) blocks
    // until the device has passed it. Synchronous backends run ops at once.
    void *(*host_alloc)(struct backend *be, size_t bytes);
    void (*host_free)(struct backend *be, void *p);
    void (*download_async)(struct backend *be, void *dst, const void *src, size_t bytes);
    int (*fence)(struct backend *be);
    void (*fence_wait)(struct backend *be, int fence);
    // Graphs (NULL where unsupported): ops issued between graph_begin and
    // graph_end are recorded, not run; graph_launch replays them.
    void (*graph_begin)(struct backend *be);
    void *(*graph_end)(struct backend *be);
    void (*graph_launch)(struct backend *be, void *graph);
    void (*graph_free)(struct backend *be, void *graph);
    // Load-time negotiation (see struct op_query): VLLM_OK, or an error
    // naming the op and the shape this backend cannot run.
    int (*supports)(struct backend *be, const struct op_query *q);
    // Weights. weight_alloc makes a zeroed [rows, cols] weight of format fmt
    // (VLLM_ERR_UNSUPPORTED for a format the backend cannot store);
    // weight_upload_raw writes its rows [row0, row0 + n) from n host rows of
    // w->cols elements of format src_fmt, ld elements apart: checkpoint bytes
    // as they are, converted (rounding to nearest even) only when src_fmt is
    // not w->fmt. weight_random fills w with uniform values of standard
    // deviation std, made on the device (dummy weights: no host copy of
    // billions of values).
    int (*weight_alloc)(struct backend *be, struct weight *w, enum wfmt fmt, int64_t rows, int64_t cols);
    int (*weight_upload_raw)(struct backend *be, struct weight *w, int64_t row0, int64_t n, const void *src,
                             enum wfmt src_fmt, int64_t ld);
    int (*weight_random)(struct backend *be, struct weight *w, uint64_t seed, float std);

    // ids[t] = table[src[t]]: the model's input ids, gathered on the device
    // from the token table the sampler writes into.
    void (*gather_ids)(struct backend *be, int32_t *ids, const int32_t *table, const int32_t *src, int n);
    // out: [T, D] = table rows of ids
    void (*embed)(struct backend *be, float *out, const struct weight *table, const int32_t *ids, int n);
    // out = rmsnorm(x) * w over rows of D
    void (*rmsnorm)(struct backend *be, float *out, const float *x, const float *w, int n, int dim,
                    float eps);
    // res += x; out = rmsnorm(res) * w
    void (*add_rmsnorm)(struct backend *be, float *res, const float *x, float *out, const float *w,
                        int n, int dim, float eps);
    // y: [n, W.rows] = x: [n, W.cols] @ W^T (+ W.bias)
    void (*matmul)(struct backend *be, float *y, const float *x, const struct weight *w, int n);
    // out[i] = x[rows[i]] for rows of dim floats
    void (*gather_rows)(struct backend *be, float *out, const float *x, const int32_t *rows, int n, int dim);
    void (*add)(struct backend *be, float *y, const float *x, int64_t n); // y += x
    // x = act(x), in place: relu(x)^2, x sigmoid(x), or GELU (tanh form)
    void (*act)(struct backend *be, enum act kind, float *x, int64_t n);
    // Rotary embedding in place (rotate-half, as HF): in each row of x [n, ld]
    // the first `heads` heads of head_dim d (q then k, adjacent in a qkv
    // row) are rotated by the row's position: for i < d/2,
    //   x[i] = x[i] cos - x[i + d/2] sin,  x[i + d/2] = x[i + d/2] cos + x[i] sin,
    // with cos, sin of positions[t] from table [max_pos, d] (d/2 cosines,
    // then d/2 sines; any scaling already applied).
    void (*rope)(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *table,
                 const int32_t *positions);
    // RMSNorm in place of each of the first `heads` heads of head_dim in each
    // row of x [n, ld], times w [head_dim] (Qwen3's q/k norm).
    void (*head_rmsnorm)(struct backend *be, float *x, int ld, int n, int heads, int head_dim, const float *w,
                         float eps);
    // Attention's per-token prologue in one op, over rows [t0,
    // b->num_tokens) of qkv [T, ld] (q | k | v, heads and kv_heads of struct
    // attn_dims), in place: head_rmsnorm of the q heads by p->q_norm and of
    // the k heads by p->k_norm, then rope of q and k by b->positions from
    // p->table, then kv_write of k and v at b->slot_mapping. The same values
    // as those ops in that order. attn_decode does the decode rows' own.
    void (*qk_norm_rope)(struct backend *be, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                         void *v_cache, const struct batch *b, int t0, const struct attn_dims *d);
    // Gated MLP (silu_mul for SwiGLU): out: [n, inter] = act(x[:, :inter]) *
    // x[:, inter:], x: [n, 2*inter] (gate | up).
    void (*act_mul)(struct backend *be, enum act kind, float *out, const float *x, int n, int inter);
    // A gated MLP's first half in one op: out: [n, W.rows / 2] =
    // act_mul(x @ W^T (+ W.bias)), W: [2I, cols] gate rows then up rows. gu:
    // [n, 2I] scratch that holds the product on backends that run it as
    // matmul + act_mul (a decode GEMV applies act(gate) * up in its epilogue
    // and leaves gu unwritten).
    void (*matmul_act_mul)(struct backend *be, enum act kind, float *out, const float *x, const struct weight *w,
                           int n, float *gu);
    // A plain MLP's first half in one op: out: [n, W.rows] = act(x @ W^T (+
    // W.bias)) (relu2: Nemotron-H's MLPs and shared experts). A decode GEMV
    // applies act in its epilogue; elsewhere it is matmul then act in place.
    void (*matmul_act)(struct backend *be, enum act kind, float *out, const float *x, const struct weight *w, int n);
    // Optional: an MLP as backend_mlp defines it, run the backend's own way,
    // or 0 where it does not take the shape (backend_mlp then composes it
    // from the ops above). CUDA: 16-bit weights past decode rows keep the
    // hidden in 16 bits, which the down product rounds it to anyway.
    int (*mlp)(struct backend *be, float *y, const float *x, const struct weight *up, const struct weight *down,
               int gated, enum act act, float *h, float *tmp, int n);
    // Sum of squares of x[0..n) (a diagnostic; synchronizes).
    double (*sum_sq)(struct backend *be, const float *x, int64_t n);

    // Mamba2. zxbcdt: [T, ld] rows of in_proj output, z | xBC | dt.
    // Causal depthwise conv + bias + SiLU over xBC, in place, for the prefill
    // sequences [seq0, seq1) of the batch; reads each sequence's conv state
    // from slot state_src (zeros for -1: the gather zeroes fresh slots and
    // restores checkpoints), writes the last K-1 inputs to its state slot, and
    // the K-1 inputs before each checkpoint position to that checkpoint's
    // slot. conv_state: [slots, K-1, conv_dim].
    void (*conv1d_fwd)(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                       float *conv_state, const struct batch *b, int seq0, int seq1,
                       const struct mamba_dims *d);
    // The same for one token of each decode sequence [0, num_decodes), which
    // continues its state slot and also writes the new state to checkpoint
    // slot ckpt_dst[s] where that is >= 0 (batch.h).
    void (*conv1d_update)(struct backend *be, float *zxbcdt, int ld, const float *w, const float *bias,
                          float *conv_state, const struct batch *b, const struct mamba_dims *d);
    // SSD chunked scan for prefill sequences [seq0, seq1): y: [T, H*P].
    // dt = softplus(dt + dt_bias), A = -exp(A_log) given as A; chunks align to
    // absolute positions (multiples of chunk_size); the initial state is slot
    // state_src's (zeros for -1), the final state goes to the state slot, and
    // the state at each checkpoint position (a chunk boundary) to that
    // checkpoint's slot. ssm_state: [slots, H, P, N] fp32.
    void (*ssd_prefill)(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias,
                        const float *A, const float *D, float *ssm_state, const struct batch *b,
                        int seq0, int seq1, const struct mamba_dims *d);
    // Recurrent update for the decode sequences, state updated in place (and
    // written to checkpoint slot ckpt_dst[s] too where that is >= 0).
    void (*ssd_decode)(struct backend *be, float *y, const float *zxbcdt, int ld, const float *dt_bias,
                       const float *A, const float *D, float *ssm_state, const struct batch *b,
                       const struct mamba_dims *d);
    // out = rmsnorm_groups(y * silu(z)) * w; z: [n, zld] (first I columns).
    void (*gated_rmsnorm)(struct backend *be, float *out, const float *y, const float *z, int zld,
                          const float *w, int n, int dim, int group_size, float eps);
    // A Mamba2 layer's decode rows [0, num_decodes) between its two
    // products, in one op: conv1d_update, ssd_decode into y, then
    // gated_rmsnorm of those rows into out: [T, H*P] (the seam where a
    // backend may fuse them; every backend runs backend_mamba_decode today,
    // CUDA's one kernel having measured slower: cuda_backend.cu).
    void (*mamba_decode)(struct backend *be, float *out, float *y, float *zxbcdt, int ld,
                         const struct mamba_params *p, float *conv_state, float *ssm_state,
                         const struct batch *b, const struct mamba_dims *d);

    // Attention. qkv: [T, ld] rows holding q | k | v. Writes k and v of each
    // token into the paged caches at slot_mapping[t]; caches: [blocks,
    // block_size, kv_heads, head_dim] in the backend's KV dtype (DT_FP8:
    // codes of k / d->k_scale and v / d->v_scale, see enum dtype).
    void (*kv_write)(struct backend *be, void *k_cache, void *v_cache, const float *qkv, int ld,
                     const struct batch *b, const struct attn_dims *d);
    // Causal attention of sequences [seq0, seq1) over their cached context.
    // out: [T, heads*head_dim].
    void (*attn_prefill)(struct backend *be, float *out, const float *qkv, int ld, const void *k_cache,
                         const void *v_cache, const struct batch *b, int seq0, int seq1,
                         const struct attn_dims *d);
    // Decode: rows [0, b->num_decodes) of qkv as the q | k | v projection
    // made them; the op runs their prologue (qk_norm_rope by p, which writes
    // their k and v into the caches; those rows of qkv are scratch after)
    // and their attention, so a GPU can do both in one kernel.
    void (*attn_decode)(struct backend *be, float *out, float *qkv, int ld, const struct attn_prep *p, void *k_cache,
                        void *v_cache, const struct batch *b, const struct attn_dims *d);

    // Kimi Delta Attention (struct kda_dims; NULL on a backend without it,
    // which refuses OP_KDA at load). proj: [T, ld] rows q | k | v [H*K each,
    // after the conv] | b [H] (beta logits). g: [T, H*K] the forget gate's
    // log-decays (kda_gate). Per token and head, with q, k L2-normalized and q
    // scaled by 1/sqrt(K), beta = sigmoid(b):
    //   S[i][:] *= exp(g[i]);  S[i][j] += k[i] * beta * (v[j] - sum_i' S[i'][j] k[i'])
    //   y[j] = sum_i S[i][j] q[i]
    // y: [T, H*K]; state: [slots, H, K, K] fp32. Prefill sequences [seq0,
    // seq1) start from slot state_src (zeros for -1, a checkpoint's copy), end
    // in their state slot, and write the state after each checkpoint position
    // to its slot; decodes continue their own slot (and write the new state
    // to checkpoint slot ckpt_dst[s] too where that is >= 0).
    void (*kda_prefill)(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                        const struct batch *b, int seq0, int seq1, const struct kda_dims *d);
    void (*kda_decode)(struct backend *be, float *y, const float *proj, int ld, const float *g, float *state,
                       const struct batch *b, const struct kda_dims *d);
    // The channel-wise forget gate, in place: g[t][h*K + i] =
    // -exp(A_log[h]) * softplus(g + dt_bias[h*K + i]); A_log: [H], dt_bias: [H*K].
    void (*kda_gate)(struct backend *be, float *g, const float *A_log, const float *dt_bias, int n,
                     const struct kda_dims *d);
    // y = rmsnorm(y_h) * w * sigmoid(gate_h) per head of head_dim: y, gate:
    // [n, heads*head_dim], w: [head_dim] (KDA's output norm and gate).
    void (*head_norm_gate)(struct backend *be, float *y, const float *gate, const float *w, int n, int heads,
                           int head_dim, float eps);
    // MLA (struct mla_dims; NULL where refused at load). lat: [T, ld] rows of
    // c [R] (normalized) | k_r [P], written to cache: [blocks, block_size, R+P]
    // at slot_mapping[t].
    void (*mla_kv_write)(struct backend *be, void *cache, const float *lat, int ld, const struct batch *b,
                         const struct mla_dims *d);
    // Causal attention of sequences [seq0, seq1) over the cached latents.
    // q: [T, H*(N+P)] (q_nope | q_r per head); kv_b: [H*(N+V), R] fp32 (head
    // h's W_kb rows then its W_vb rows); out: [T, H*V].
    void (*mla_attn)(struct backend *be, float *out, const float *q, const void *cache, const float *kv_b,
                     const struct batch *b, int seq0, int seq1, const struct mla_dims *d);

    // MoE. logits: [n, E] fp32 -> ids, weights: [n, top_k] (struct
    // moe_route_cfg); bias: [E] (ROUTE_SIGMOID_GROUPED, may be NULL).
    void (*moe_route)(struct backend *be, int32_t *ids, float *weights, const float *logits,
                      const float *bias, int n, const struct moe_route_cfg *c);
    // out: [n, L] = sum_k weights[k] * down_e(hidden_e(x)) (struct moe_experts),
    // the experts of a token summed in ascending expert order, then + the
    // shared expert's y (struct moe_shared; NULL: none)
    void (*moe_experts)(struct backend *be, float *out, const float *x, const struct moe_experts *w,
                        const int32_t *ids, const float *weights, int n, int top_k, const struct moe_shared *shared);

    // Constrained decoding: logits [rows, vocab] fp32 in place; mask [rows,
    // CDIV(vocab, 32)]: a clear bit (id % 32 of word id / 32) sets the logit
    // to -inf. Before sample, so log-probs and penalties see the masked row.
    void (*mask_logits)(struct backend *be, float *logits, int rows, int vocab, const uint32_t *mask);
    // logit_bias: logits[idx[i]] += val[i] for i < n (idx = row * vocab + id,
    // distinct), in place, beside mask_logits and before sample.
    void (*bias_logits)(struct backend *be, float *logits, int n, const int64_t *idx, const float *val);
    // Samples one token per row of logits [b->num_sample, vocab] with the
    // rows' sample_params; writes each id into token_table[dst] (the next
    // step's input) and into out->ids; log-probs as asked.
    void (*sample)(struct backend *be, const float *logits, int vocab, int32_t *token_table,
                   const struct batch *b, struct sample_out *out);
    // Prompt log-probs: for i < n, row rows[i] of raw logits [*, vocab]:
    // lp[i] = log_softmax(row)[targets[i]] over the whole vocabulary,
    // rank[i] = the ids whose logit is >= the target's (1: the most likely),
    // and top_ids / top_lp [n, k] the k largest, largest first (ties: lower
    // id); sample/sampler.h's logprob_row is the reference.
    void (*token_logprobs)(struct backend *be, const float *logits, int vocab, const int32_t *rows,
                           const int32_t *targets, int n, int k, float *lp, int32_t *rank, int32_t *top_ids,
                           float *top_lp);

    // Tensor parallelism (NULL on a backend that cannot join a group; see
    // backend_create_group). Every rank of the group calls each collective
    // with the same sizes in the same order, each from its own thread.
    // x: [n] summed over the ranks in place; every rank gets the same bits.
    void (*all_reduce)(struct backend *be, float *x, int64_t n);
    // out: [rows, out_cols]. Rank r's in: [rows, in_cols] fills columns
    // [r*in_cols, (r+1)*in_cols), cut at out_cols (a last shard may be padded).
    void (*all_gather)(struct backend *be, float *out, int out_cols, const float *in, int in_cols, int rows);
    // The device's limits, measured now (vllm bench's roofline; NULL where
    // not measured): bytes per second of a large copy (read + write) and
    // FLOP/s of a large 16-bit matrix product.
    int (*peaks)(struct backend *be, double *bytes_per_s, double *flops_per_s);
    // Makes be the calling thread's device (CUDA's current device is per
    // thread); a thread calls it before it issues ops of a group's backend.
    void (*bind)(struct backend *be);
};

struct backend {
    const struct backend_ops *ops;
    int num_threads;
    enum dtype kv_dtype; // of the KV cache
    // The model's --dtype (engine_init sets it; WF_F32 until then, the exact
    // choice), which is also the compute mode: WF_F32 is the exactness mode,
    // where ops that have a faster 16-bit form keep their fp32 kernels (CUDA:
    // flash prefill, the SSD products); a backend that multiplies quantized
    // weights through a dense GEMM dequantizes them to it (CUDA prefill).
    // kv_dtype cannot say it: it is its own flag (an fp8 cache under fp32
    // weights computes in fp32).
    enum wfmt weight_dtype;
    int graph_epoch;     // bumped when device buffers recorded graphs use move: re-record them
    int tp_rank, tp_size; // this backend's rank in its tensor-parallel group; 0, 1 alone
    void *impl;
};

// Creates the backend for device "cpu" or "cuda". VLLM_ERR_UNSUPPORTED when
// the build has no such backend.
// kv_dtype: the KV cache's element type (a backend refuses one it cannot keep).
int backend_create(const char *device, int num_threads, enum dtype kv_dtype, struct backend **out);
void backend_free(struct backend *be);
// Tensor parallelism: n backends of `device` joined in one group, rank r at
// out[r] (n == 1: backend_create). CPU ranks share num_threads; "cuda" rank r
// runs on GPU r, with NCCL. VLLM_ERR_UNSUPPORTED when the build cannot.
int backend_create_group(const char *device, int n, int num_threads, enum dtype kv_dtype, struct backend **out);
// be->ops->bind, where the backend has one.
void backend_bind(struct backend *be);

int backend_cpu_create(int num_threads, enum dtype kv_dtype, struct backend **out);
int backend_cpu_create_group(int n, int num_threads, enum dtype kv_dtype, struct backend **out);
#ifdef VLLM_HAVE_CUDA
int backend_cuda_create(enum dtype kv_dtype, struct backend **out);
int backend_cuda_create_group(int n, enum dtype kv_dtype, struct backend **out);
#endif

// Fails (VLLM_ERR_INTERNAL) naming the first required op a table leaves NULL;
// every backend_create* checks its table with it.
int backend_check_ops(const struct backend_ops *o);

size_t dtype_size(enum dtype d);
const char *dtype_name(enum dtype d);
size_t wfmt_size(enum wfmt f); // bytes per element as a checkpoint stores it (WF_NVFP4: 0, see wfmt_bytes)
size_t wfmt_bytes(enum wfmt f, int64_t n); // bytes of n elements of a row (WF_NVFP4: n/2, n even)
const char *wfmt_name(enum wfmt f);
int wfmt_quantized(enum wfmt f); // WF_FP8, WF_FP8_B128, WF_NVFP4
// fp32 scales per row of a quantized [rows, cols] weight (0 unquantized)
int64_t wfmt_scale_cols(enum wfmt f, int64_t cols);
// Bytes a [rows, cols] weight of format f reads from memory in a product:
// its elements and its scales.
int64_t wfmt_weight_bytes(enum wfmt f, int64_t rows, int64_t cols);
// Element [r][c] of a quantized weight as fp32, from host copies of its
// codes (rows of wfmt_bytes(f, cols)), scale and bscale: the exact
// dequantization every backend's reference holds to.
float wfmt_dequant(enum wfmt f, const uint8_t *codes, const float *scale, const uint8_t *bscale, int64_t cols,
                   int64_t r, int64_t c);
// Dummy quantized weights for any backend: uniform values of standard
// deviation std (the xorshift64 stream of weight_random), quantized on the
// host in blocks of rows with scales from each row's (block's) largest
// magnitude, uploaded through weight_upload_raw and upload.
int weight_random_quant(struct backend *be, struct weight *w, uint64_t seed, float std);
// Writes rows [row0, row0 + n) of a quantized weight's scales from host
// arrays ([n, wfmt_scale_cols] fp32; bscale [n, cols/16] e4m3, NVFP4 only).
void weight_upload_scales(struct backend *be, struct weight *w, int64_t row0, int64_t n, const float *scale,
                          const uint8_t *bscale);
// y: [n, L] = down(act(up x)) or down(act(gate x) * up x): be's mlp op where
// it takes the shape, else through be's own matmul ops; h: [n, I] the
// hidden; tmp: [n, 2I] (gated: the gate | up product before act); h and tmp
// may be one buffer when not gated.
void backend_mlp(struct backend *be, float *y, const float *x, const struct weight *up, const struct weight *down,
                 int gated, enum act act, float *h, float *tmp, int n);
// The shared expert as an MLP (backend_mlp), where a device does not fuse it.
void moe_shared_fwd(struct backend *be, const struct moe_shared *s, const float *x, int n);
// mamba_decode as its three ops through be's own (every backend's today).
void backend_mamba_decode(struct backend *be, float *out, float *y, float *zxbcdt, int ld, const struct mamba_params *p,
                          float *conv_state, float *ssm_state, const struct batch *b, const struct mamba_dims *d);
// weight_alloc + weight_upload_raw of a host fp32 [rows, cols] matrix (tests,
// tensors assembled on the host).
int weight_from_f32(struct backend *be, struct weight *w, enum wfmt fmt, const float *src, int64_t rows, int64_t cols);
// Host conversion of n elements between formats (round to nearest even).
void wfmt_convert(enum wfmt dst_fmt, void *dst, enum wfmt src_fmt, const void *src, int64_t n);

#endif
