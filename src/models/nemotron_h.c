// nemotron_h.c - NemotronHForCausalLM: its layer order over the layer
// library. Each layer is one block: Mamba2 (M), attention without RoPE (*),
// relu^2 MLP (-) or MoE (E: sigmoid router with correction bias and grouped
// top-k, relu^2 experts, a shared expert, optional latent projections).
#include "core/common.h"
#include "models/layers.h"
#include "models/nemotron_h.h"

extern const struct model_ops nemotron_h_ops;

static void family_free(void *p) {
    nh_config_free(p);
    free(p);
}

static int load_layer(struct lm *m, struct loader *l, const struct nh_config *c, const char *root, int i) {
    char p[128], n[160];
    snprintf(p, sizeof p, "%slayers.%d.", root, i);
    snprintf(n, sizeof n, "%smixer.", p);
    struct block *b = NULL;
    int rc = VLLM_OK;
    switch (c->kinds[i]) {
    case NH_MAMBA: {
        b = lm_add_block(m, BLK_MAMBA2);
        struct mamba2_cfg mc = {c->m_heads, c->m_head_dim, c->m_groups, c->m_state, c->m_conv, c->chunk, c->conv_bias,
                                c->dt_min, c->dt_max, c->m_groups};
        rc = mamba2_load(m, l, n, &mc, &b->m);
        break;
    }
    case NH_ATTN: {
        b = lm_add_block(m, BLK_ATTN);
        struct attn_cfg ac = {.heads = c->heads, .kv_heads = c->kv_heads, .head_dim = c->head_dim};
        rc = attn_load(m, l, n, &ac, &b->a);
        break;
    }
    case NH_MLP: {
        b = lm_add_block(m, BLK_MLP);
        struct mlp_cfg fc = {c->mlp_inter, ACT_RELU2, 0, 0, "up_proj.weight", NULL, "down_proj.weight"};
        rc = mlp_load(m, l, n, &fc, &b->f);
        break;
    }
    case NH_MOE: {
        b = lm_add_block(m, BLK_MOE);
        struct moe_cfg ec = {
            .route = {ROUTE_SIGMOID_GROUPED, c->experts, c->top_k, c->n_group, c->topk_group, c->norm_topk,
                      c->routed_scale},
            .inter = c->moe_inter, .act = ACT_RELU2, .correction_bias = 1, .latent = c->latent,
            .names = {"experts.%d.up_proj.weight", NULL, "experts.%d.down_proj.weight", "experts.up_proj",
                      "experts.down_proj"},
            .shared = {c->shared_inter, ACT_RELU2, 0, 0, "up_proj.weight", NULL, "down_proj.weight"}};
        rc = moe_load(m, l, n, &ec, &b->e);
        break;
    }
    }
    if (!rc) {
        snprintf(n, sizeof n, "%snorm.weight", p);
        rc = lm_load_norm(m, l, n, &b->norm_w);
    }
    return rc ? vllm_err_prefix(rc, "layer %d", i) : VLLM_OK;
}

static int load_weights(struct lm *m, struct loader *l, const void *arg) {
    const struct nh_config *c = arg;
    const char *root = loader_prefix(l, "backbone.", "model.", "embeddings.weight");
    char n[256];
    snprintf(n, sizeof n, "%sembeddings.weight", root);
    TRY(lm_load_embed_head(m, l, n, "lm_head.weight", c->tie_embeddings));
    snprintf(n, sizeof n, "%snorm_f.weight", root);
    TRY(lm_load_norm(m, l, n, &m->norm_f));
    for (int i = 0; i < c->num_layers; i++) TRY(load_layer(m, l, c, root, i));
    return VLLM_OK;
}

static int nh_load(const char *dir, const json_t *config, const struct model_load_opts *o, struct backend *be,
                   struct model **out) {
    struct nh_config *c = xcalloc(1, sizeof *c);
    char *what = path_join(dir, "config.json");
    int rc = nh_config_parse(config, what, c);
    if (!rc) {
        rc = nh_config_check_tp(c, be->tp_size, what);
        if (rc) nh_config_free(c);
    }
    free(what);
    if (rc) {
        free(c);
        return rc;
    }
    if (be->tp_size > 1 && (!be->ops->all_reduce || !be->ops->all_gather)) {
        family_free(c);
        return vllm_err(VLLM_ERR_UNSUPPORTED, "backend %s has no collectives: it cannot run tensor_parallel_size %d",
                        be->ops->name, be->tp_size);
    }
    struct lm_spec s = {.ops = &nemotron_h_ops, .arch = "NemotronHForCausalLM", .config = c, .config_free = family_free,
                        .hidden = c->hidden, .vocab = c->vocab, .max_position = c->max_position, .eps = c->eps,
                        .eos = c->eos, .num_eos = c->num_eos,
                        // the MoE correction bias stays fp32 in a bf16 model, as transformers and vLLM keep it
                        .keep_fp32 = "e_score_correction_bias", .load_weights = load_weights, .arg = c};
    return lm_load(be, dir, o, &s, out);
}

const struct model_ops nemotron_h_ops = {
    .load = nh_load,
    .free = lm_free,
    .forward = lm_forward,
};
