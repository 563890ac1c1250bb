// layers.h - the layer library: every model is a config parser plus wiring
// over these (attention, MLP, MoE, Mamba2 mixers; the tensor-parallel
// loaders; the embedding, final norm and lm_head; the workspace; timers).
//
// A model is a stack of pre-norm residual blocks over fp32 rows of the flat
// batch: h = embed(ids); for each block: h += mixer(rmsnorm(h)); logits =
// lm_head(rmsnorm_f(h)) for the rows that sample. NemotronH's layers are one
// block each; a Qwen3 / Llama layer is two (attention, then MLP).
//
// Tensor parallelism (Megatron style, docs/TENSOR_PARALLEL.md): a model
// instance holds one rank's shards (be->tp_rank of be->tp_size). A mixer's
// first projection is split by output rows (heads, channels, experts' rows),
// its last by input columns; the partial outputs are summed by one
// all-reduce, so h is the same on every rank. Embeddings, norms and routers
// are replicated; lm_head is split by vocabulary and its logits all-gathered.
#ifndef VLLM_MODELS_LAYERS_H
#define VLLM_MODELS_LAYERS_H

#include "models/loader.h"
#include "models/model.h"
#include "models/rope.h"

// ------------------------------------------------------------ mixers --

struct attn_cfg {
    int heads, kv_heads, head_dim;
    int qkv_bias, o_bias;     // q/k/v and o_proj biases
    int qk_norm;              // RMSNorm of each q and k head before RoPE (Qwen3)
    float norm_eps;           // of qk_norm
    float scale;              // softmax scale (0: 1/sqrt(head_dim))
    const struct rope *rope;  // NULL: no positions (NemotronH)
};
struct attn_layer {
    struct weight qkv, o;     // [(Hq + 2 Hkv) Dh, D] this rank's q | k | v rows, [D, Hq Dh] its columns
    float *q_norm, *k_norm;   // [Dh]
    struct attn_dims d;       // this rank's heads and KV heads
    const struct rope *rope;
    float norm_eps;
};

struct mlp_cfg {
    int inter;
    enum act act;
    int gated;                       // down(act(gate x) * up x), else down(act(up x))
    int bias;                        // biases on every projection (Llama mlp_bias)
    const char *up, *gate, *down;    // tensor names after the prefix: "up_proj.weight", ...
};
struct mlp_layer {
    struct weight up, down; // up: [U, D] (gated: this rank's gate rows, then its up rows), down: [D, I] its columns
    int inter, gated;       // this rank's I
    enum act act;
};

// Routed experts' tensor names after the prefix: per expert (printf with the
// expert index) or fused 3D [E, U, L] / [E, L, I] tensors.
struct expert_names {
    const char *up, *gate, *down;      // "experts.%d.up_proj.weight" (gate NULL unless gated)
    const char *fused_up, *fused_down; // "experts.up_proj" / "experts.gate_up_proj" (gate | up), "experts.down_proj"
};
struct moe_cfg {
    struct moe_route_cfg route;
    int inter, gated;
    enum act act;
    int correction_bias;        // "gate.e_score_correction_bias"
    int latent;                 // > 0: fc1 / fc2 latent projections around the experts (NemotronH)
    struct expert_names names;
    struct mlp_cfg shared;      // shared expert (inter 0: none), under "shared_experts."
};
struct moe_layer {
    struct weight gate;         // router [E, D] fp32: the router runs in fp32
    float *bias;                // [E] correction bias, or NULL
    struct moe_experts experts; // this rank's part of every expert
    struct moe_experts shared;  // the shared expert (E = 1), if has_shared
    struct weight fc1, fc2;     // latent projections (latent > 0), replicated
    struct moe_route_cfg route;
    int latent, has_shared;
};

struct mamba2_layer {
    struct weight in_proj, out_proj; // [2I+2GN+H, D] this rank's z | x | B | C | dt rows, [D, I] its columns
    float *conv_w, *conv_b;          // [C, K], [C] (conv_b NULL without use_conv_bias)
    float *dt_bias, *A, *D, *norm_w; // [H], [H] = -exp(A_log), [H], [I]
    struct mamba_dims d;             // this rank's heads and groups
    int proj_dim;
    int norm_group;                  // width of a gated-norm group
};
struct mamba2_cfg {
    int heads, head_dim, groups, state, conv_kernel, chunk_size, conv_bias;
    float dt_min, dt_max;
    int norm_groups; // groups of the gated norm: n_groups (NemotronH), 1 (Mamba2: over all heads)
};

// Kimi Delta Attention (Kimi-Linear's linear attention): q | k | v | beta
// projections, short causal convs on q, k and v, a low-rank forget gate
// (channel-wise decay) and output gate, the gated delta rule, a per-head
// gated RMSNorm, o_proj.
struct kda_cfg {
    int heads, head_dim, conv_kernel, chunk_size;
};
struct kda_layer {
    struct weight in_proj;            // [3HK + H, D]: q | k | v | b rows
    struct weight f_a, f_b, g_a, g_b; // forget / output gate, low rank: [K, D], [HK, K]
    struct weight o;                  // [D, HK]
    float *conv_w;                    // [3HK, conv_kernel]: q | k | v channels
    float *A_log, *dt_bias, *norm_w;  // [H], [HK], [K]
    struct kda_dims d;
    struct mamba_dims conv;           // the q | k | v conv as conv1d_fwd sees it (channels at column 0)
};

// Multi-head latent attention (Kimi-Linear's full attention, NoPE): the
// cache holds the latent [R] and the shared key part [P] per token.
struct mla_cfg {
    int heads, nope, rope, v_dim, rank; // H, N, P, V, R
    int q_lora;                         // 0: q_proj, else q_a_proj -> RMSNorm -> q_b_proj of this rank
    float norm_eps;                     // of the latent norms (kv_a_layernorm, q_a_layernorm)
};
struct mla_layer {
    struct weight q, q_a, q_b, kv_a, o; // q [H(N+P), D] or q_a [Q, D] + q_b [H(N+P), Q]; kv_a [R+P, D]; o [D, HV]
    float *q_a_norm, *kv_a_norm;        // [Q], [R]
    float *kv_b;                        // [H(N+V), R] fp32: head h's W_kb rows, then its W_vb rows
    struct mla_dims d;
    int q_lora;
    float norm_eps;
};

enum blk_kind { BLK_ATTN, BLK_MLP, BLK_MOE, BLK_MAMBA2, BLK_KDA, BLK_MLA };
struct block {
    enum blk_kind kind;
    float *norm_w; // pre-norm RMSNorm [D]
    int cache;     // cache layer (attention, Mamba2), -1 for none
    union {
        struct attn_layer a;
        struct mlp_layer f;
        struct moe_layer e;
        struct mamba2_layer m;
        struct kda_layer k;
        struct mla_layer l;
    };
};

// ------------------------------------------------------------ a model --

// Step workspace, rows = max_tokens (widths from the blocks, planned at load).
struct lm_ws {
    float *res, *x, *mix;     // [T, D]
    float *proj;              // [T, wide]: the first projection of any mixer
    float *y, *yn;            // [T, mid]: a mixer's inner rows, the shared expert's output
    float *hid;               // [T, hid]: a gated MLP's hidden
    float *rlogits, *rw;      // [T, E], [T, k]
    int32_t *rids;            // [T, k]
    float *xl, *eo;           // [T, L] latent in / expert out
    float *sel;               // [logit rows, D]
    float *lg;                // [logit rows, vocab_part] this rank's logits before the all-gather (tp > 1)
    void *base;
    int64_t wide, mid, hidw, experts, topk, latent; // the plan
};

enum { T_EMBED, T_NORM, T_M_IN, T_M_CONV_SSD, T_M_OUT, T_ATTN_QKV, T_ATTN, T_ATTN_O, T_MLP, T_ROUTER, T_EXPERTS,
       T_HEAD, T_COMM, T_N };

struct lm {
    struct model base;
    struct backend *be;
    int tp, rank;     // tensor parallelism: the shards of rank `rank` of tp
    int hidden, vocab, vocab_part; // vocab_part: lm_head rows per rank (the last rank's padded with zero rows)
    float eps;        // the blocks' and the final norm's RMSNorm epsilon
    struct weight embed, lm_head;
    float *norm_f;
    struct rope rope; // the attention blocks' positions (rope.table NULL: none)
    struct block *blocks;
    int num_blocks, num_caches;
    int blocks_cap; // of blocks[], grown geometrically (up to 2 x CFG_MAX_LAYERS blocks)
    struct lm_ws ws;
    int max_tokens, max_rows, max_seq_len;
    void *family;                  // a family's own state (config), freed by family_free
    void (*family_free)(void *);
    // VLLM_DIAG=time: device time per part of the forward (synchronizes),
    // summed apart for steps with prompt tokens [1] and pure-decode steps [0]
    int tdiag, diag_state, tkind, tsteps[2];
    double tlast, tsum[2][T_N];
};

// What a family's load hands lm_load once its config is parsed.
struct lm_spec {
    const struct model_ops *ops;
    const char *arch;                  // the architecture the model reports
    void *config;                      // the family's config: the model owns it (also when lm_load fails)
    void (*config_free)(void *);
    int hidden, vocab, max_position;   // max_position 0: none (sequences default to 4096)
    float eps;
    const int32_t *eos;                // num_eos ids, in config (lives as long as the model)
    int num_eos;
    struct rope rope;                  // the attention blocks' positions (rope.table NULL: none)
    const char *keep_fp32;             // a tensor name kept fp32 in a 16-bit model, or NULL
    // Loads the embedding, norms and blocks (lm_add_block); arg: s->arg.
    int (*load_weights)(struct lm *m, struct loader *l, const void *arg);
    const void *arg;
};
// Starts the model on be with o's sizes, loads dir's weights through
// s->load_weights, then fills the model spec (sizes, cache layers) and
// allocates the workspace: the tail every family's load shares.
int lm_load(struct backend *be, const char *dir, const struct model_load_opts *o, const struct lm_spec *s,
            struct model **out);
// Adds a block (its cache layer assigned for attention and Mamba2).
struct block *lm_add_block(struct lm *m, enum blk_kind kind);
// The generic forward and free (model_ops.forward / .free).
void lm_forward(struct model *base, const struct batch *b, struct caches *c, float *logits, int all_rows);
void lm_free(struct model *base);
// Rank r's part of n things.
struct span lm_part(const struct lm *m, int64_t n);
// VLLM_ERR_UNSUPPORTED when the backend cannot run q (names the block).
int lm_require(struct lm *m, struct op_query q, const char *what);

// -------------------------------------------------------------- loading --

// The embedding (replicated, fp32) and lm_head (this rank's vocabulary rows,
// padded; tied to the embedding when the checkpoint has no head and tie is set).
int lm_load_embed_head(struct lm *m, struct loader *l, const char *embed, const char *head, int tie);
int lm_load_norm(struct lm *m, struct loader *l, const char *name, float **w);
int attn_load(struct lm *m, struct loader *l, const char *prefix, const struct attn_cfg *c, struct attn_layer *a);
int mlp_load(struct lm *m, struct loader *l, const char *prefix, const struct mlp_cfg *c, struct mlp_layer *f);
int moe_load(struct lm *m, struct loader *l, const char *prefix, const struct moe_cfg *c, struct moe_layer *e);
int mamba2_load(struct lm *m, struct loader *l, const char *prefix, const struct mamba2_cfg *c, struct mamba2_layer *w);
// Kimi-Linear's mixers (layers_kimi.c), split by heads over the ranks.
int kda_load(struct lm *m, struct loader *l, const char *prefix, const struct kda_cfg *c, struct kda_layer *w);
int mla_load(struct lm *m, struct loader *l, const char *prefix, const struct mla_cfg *c, struct mla_layer *w);

// ------------------------------------------------------------- forward --

// x: [T, D] normalized input -> out: [T, D] (this rank's partial sum
// all-reduced), through the model's workspace.
void attn_fwd(struct lm *m, const struct attn_layer *a, int cache, const struct batch *b, struct caches *c,
              const float *x, float *out);
void mlp_fwd(struct lm *m, const struct mlp_layer *f, const float *x, float *out, int T);
void moe_fwd(struct lm *m, const struct moe_layer *e, const float *x, float *out, int T);
void mamba2_mixer_fwd(struct lm *m, const struct mamba2_layer *w, int cache, const struct batch *b, struct caches *c,
                      const float *x, float *out);
void kda_fwd(struct lm *m, const struct kda_layer *w, int cache, const struct batch *b, struct caches *c,
             const float *x, float *out);
void mla_fwd(struct lm *m, const struct mla_layer *w, int cache, const struct batch *b, struct caches *c,
             const float *x, float *out);
// The Kimi blocks' parts of the spec, workspace plan, cost and free (layers.c's switches).
void kimi_cache_spec(const struct block *b, struct layer_cache_spec *s);
void kimi_plan_ws(const struct block *b, struct lm_ws *w);
void kimi_cost(const struct block *b, struct model_cost *c, int64_t *dense, double *flops);
void kimi_free_block(struct backend *be, struct block *b);
// Sums the ranks' partial outputs of a split projection: x: [n] in place.
void lm_all_reduce(struct lm *m, float *x, int64_t n);
// Charges the device time since the last tick to part k (VLLM_DIAG=time).
void lm_tick(struct lm *m, int k);

#endif
