// tp_model.c - writes tiny random NemotronH checkpoints (see tp_model.h).
#include <jansson.h>
#include <math.h>

#include "core/common.h"
#include "tp_model.h"
#include "util.h"

struct tpm_cfg tpm_default(const char *pattern) {
    return (struct tpm_cfg){.pattern = pattern, .vocab = 66, .hidden = 32,
                            .m_heads = 8, .m_head_dim = 4, .m_groups = 4, .m_state = 8, .m_conv = 4, .chunk = 4,
                            .heads = 8, .kv_heads = 2, .head_dim = 8,
                            .mlp_inter = 30,
                            .experts = 8, .top_k = 2, .moe_inter = 12, .shared_inter = 10, .latent = 0,
                            .n_group = 2, .topk_group = 1};
}

struct writer {
    struct tu_tensor t[256];
    char names[256][96];
    int n;
    uint64_t rng;
};

static float urand(struct writer *w) { // uniform in [-1, 1)
    w->rng ^= w->rng << 13, w->rng ^= w->rng >> 7, w->rng ^= w->rng << 17;
    return (float)((w->rng >> 11) * 0x1.0p-53 * 2 - 1);
}

// A tensor of the given shape: base + scale * uniform[-1, 1).
static float *add(struct writer *w, const char *name, int ndim, const int64_t *shape, float base, float scale) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *d = xmalloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) d[i] = base + scale * urand(w);
    struct tu_tensor *t = &w->t[w->n];
    snprintf(w->names[w->n], sizeof w->names[0], "%s", name);
    *t = (struct tu_tensor){w->names[w->n], "F32", ndim, {0}, d, sizeof(float) * n};
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    w->n++;
    return d;
}

#define SHAPE(...) (sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), ((int64_t[]){__VA_ARGS__})

static void add_layer(struct writer *w, const struct tpm_cfg *c, int i, char kind) {
    char p[96], n[160];
    int64_t D = c->hidden;
    snprintf(p, sizeof p, "backbone.layers.%d.", i);
#define NAME(s) (snprintf(n, sizeof n, "%s%s", p, s), n)
    add(w, NAME("norm.weight"), SHAPE(D), 1.0f, 0.2f);
    float s = 1.0f / sqrtf((float)D);
    if (kind == 'M') {
        int64_t H = c->m_heads, I = H * c->m_head_dim, GN = (int64_t)c->m_groups * c->m_state, C = I + 2 * GN;
        add(w, NAME("mixer.in_proj.weight"), SHAPE(2 * I + 2 * GN + H, D), 0, 2 * s);
        add(w, NAME("mixer.out_proj.weight"), SHAPE(D, I), 0, 2.0f / sqrtf((float)I));
        add(w, NAME("mixer.conv1d.weight"), SHAPE(C, 1, c->m_conv), 0, 0.5f);
        add(w, NAME("mixer.conv1d.bias"), SHAPE(C), 0, 0.2f);
        add(w, NAME("mixer.dt_bias"), SHAPE(H), -1.0f, 0.5f);
        add(w, NAME("mixer.D"), SHAPE(H), 1.0f, 0.5f);
        add(w, NAME("mixer.norm.weight"), SHAPE(I), 1.0f, 0.2f);
        float *a = add(w, NAME("mixer.A_log"), SHAPE(H), 0, 0);
        for (int64_t h = 0; h < H; h++) a[h] = logf((float)(h + 1)) * 0.5f;
    } else if (kind == '*') {
        int64_t q = (int64_t)c->heads * c->head_dim, kv = (int64_t)c->kv_heads * c->head_dim;
        add(w, NAME("mixer.q_proj.weight"), SHAPE(q, D), 0, 2 * s);
        add(w, NAME("mixer.k_proj.weight"), SHAPE(kv, D), 0, 2 * s);
        add(w, NAME("mixer.v_proj.weight"), SHAPE(kv, D), 0, 2 * s);
        add(w, NAME("mixer.o_proj.weight"), SHAPE(D, q), 0, 2.0f / sqrtf((float)q));
    } else if (kind == '-') {
        add(w, NAME("mixer.up_proj.weight"), SHAPE(c->mlp_inter, D), 0, 2 * s);
        add(w, NAME("mixer.down_proj.weight"), SHAPE(D, c->mlp_inter), 0, 2.0f / sqrtf((float)c->mlp_inter));
    } else if (kind == 'E') {
        int64_t E = c->experts, I = c->moe_inter, L = c->latent ? c->latent : D;
        add(w, NAME("mixer.gate.weight"), SHAPE(E, D), 0, 2 * s);
        add(w, NAME("mixer.gate.e_score_correction_bias"), SHAPE(E), 0, 0.1f);
        if (c->experts_3d) {
            add(w, NAME("mixer.experts.up_proj"), SHAPE(E, I, L), 0, 2.0f / sqrtf((float)L));
            add(w, NAME("mixer.experts.down_proj"), SHAPE(E, L, I), 0, 2.0f / sqrtf((float)I));
        } else {
            for (int64_t e = 0; e < E; e++) {
                char x[64];
                snprintf(x, sizeof x, "mixer.experts.%lld.up_proj.weight", (long long)e);
                add(w, NAME(x), SHAPE(I, L), 0, 2.0f / sqrtf((float)L));
                snprintf(x, sizeof x, "mixer.experts.%lld.down_proj.weight", (long long)e);
                add(w, NAME(x), SHAPE(L, I), 0, 2.0f / sqrtf((float)I));
            }
        }
        add(w, NAME("mixer.shared_experts.up_proj.weight"), SHAPE(c->shared_inter, D), 0, 2 * s);
        add(w, NAME("mixer.shared_experts.down_proj.weight"), SHAPE(D, c->shared_inter), 0,
            2.0f / sqrtf((float)c->shared_inter));
        if (c->latent) {
            add(w, NAME("mixer.fc1_latent_proj.weight"), SHAPE(L, D), 0, 2 * s);
            add(w, NAME("mixer.fc2_latent_proj.weight"), SHAPE(D, L), 0, 2.0f / sqrtf((float)L));
        }
    }
#undef NAME
}

json_t *tpm_config(const struct tpm_cfg *c) {
    json_t *j = json_pack("{s:[s], s:s, s:i, s:i, s:f, s:b, s:i, s:i}", "architectures", "NemotronHForCausalLM",
                          "hybrid_override_pattern", c->pattern, "vocab_size", c->vocab, "hidden_size", c->hidden,
                          "layer_norm_epsilon", 1e-5, "tie_word_embeddings", c->tie, "max_position_embeddings", 256,
                          "eos_token_id", 1);
    json_t *m = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:s}", "mamba_num_heads", c->m_heads,
                          "mamba_head_dim", c->m_head_dim, "n_groups", c->m_groups, "ssm_state_size", c->m_state,
                          "conv_kernel", c->m_conv, "chunk_size", c->chunk, "use_conv_bias", 1, "use_bias", 0,
                          "mamba_hidden_act", "silu");
    json_t *a = json_pack("{s:i, s:i, s:i, s:i, s:b, s:s}", "num_attention_heads", c->heads, "num_key_value_heads",
                          c->kv_heads, "head_dim", c->head_dim, "intermediate_size", c->mlp_inter, "mlp_bias", 0,
                          "mlp_hidden_act", "relu2");
    json_t *e = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f}", "n_routed_experts", c->experts,
                          "num_experts_per_tok", c->top_k, "moe_intermediate_size", c->moe_inter,
                          "moe_shared_expert_intermediate_size", c->shared_inter, "n_group", c->n_group, "topk_group",
                          c->topk_group, "norm_topk_prob", 1, "routed_scaling_factor", 1.5);
    json_object_set_new(e, "moe_latent_size", c->latent ? json_integer(c->latent) : json_null());
    json_object_update(j, m), json_object_update(j, a), json_object_update(j, e);
    json_decref(m), json_decref(a), json_decref(e);
    return j;
}

char *tpm_write(const struct tpm_cfg *c, uint64_t seed) {
    char *dir = tu_tmpdir();
    if (!dir) return NULL;
    struct writer *w = xcalloc(1, sizeof *w);
    w->rng = seed * 2654435761u + 88172645463325252ull;
    int64_t V = c->vocab, D = c->hidden;
    add(w, "backbone.embeddings.weight", SHAPE(V, D), 0, 1.0f);
    add(w, "backbone.norm_f.weight", SHAPE(D), 1.0f, 0.2f);
    if (!c->tie) add(w, "lm_head.weight", SHAPE(V, D), 0, 2.0f / sqrtf((float)D));
    for (int i = 0; c->pattern[i]; i++) add_layer(w, c, i, c->pattern[i]);
    char *st = path_join(dir, "model.safetensors");
    int rc = tu_write_safetensors(st, w->t, w->n);
    free(st);
    json_t *j = tpm_config(c);
    char *txt = json_dumps(j, JSON_INDENT(2));
    if (!rc) rc = tu_write(dir, "config.json", txt, strlen(txt));
    free(txt);
    json_decref(j);
    for (int i = 0; i < w->n; i++) free((void *)w->t[i].data);
    free(w);
    if (rc) {
        tu_rmdir(dir);
        free(dir);
        return NULL;
    }
    return dir;
}
