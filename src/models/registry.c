// registry.c - architecture names to model families, declared once.
#include "core/common.h"
#include "core/json.h"
#include "models/model.h"

extern const struct model_ops nemotron_h_ops, qwen3_ops, qwen3_moe_ops, llama_ops, qwen2_ops, mamba2_ops,
    kimi_linear_ops;

#define ARCHS(...) ((const char *const[]){__VA_ARGS__, NULL})

static const struct model_family registry[] = {
    {"nemotron_h", ARCHS("NemotronHForCausalLM"), &nemotron_h_ops},
    {"qwen3", ARCHS("Qwen3ForCausalLM"), &qwen3_ops},
    {"qwen3_moe", ARCHS("Qwen3MoeForCausalLM"), &qwen3_moe_ops},
    {"llama", ARCHS("LlamaForCausalLM", "MistralForCausalLM"), &llama_ops},
    {"qwen2", ARCHS("Qwen2ForCausalLM"), &qwen2_ops},
    {"mamba2", ARCHS("Mamba2ForCausalLM"), &mamba2_ops},
    {"kimi_linear", ARCHS("KimiLinearForCausalLM"), &kimi_linear_ops},
};

const struct model_family *model_families(int *n) {
    *n = (int)(sizeof registry / sizeof registry[0]);
    return registry;
}

const struct model_family *model_find(const char *arch) {
    for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++)
        for (const char *const *a = registry[i].archs; *a; a++)
            if (!strcmp(*a, arch)) return &registry[i];
    return NULL;
}

const char *model_arch_name(const char *arch) {
    for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++)
        for (const char *const *a = registry[i].archs; *a; a++)
            if (!strcmp(*a, arch)) return *a;
    return NULL;
}

int model_load(const char *dir, const json_t *config_override, const struct model_load_opts *o,
               struct backend *be, struct model **out) {
    json_t *cfg = NULL;
    char *path = path_join(dir, "config.json");
    int rc = config_override ? (cfg = json_incref((json_t *)config_override), VLLM_OK) : json_load_path(path, &cfg);
    if (rc) {
        free(path);
        return rc;
    }
    json_t *archs = json_object_get(cfg, "architectures");
    const char *arch = json_string_value(json_array_get(archs, 0));
    const struct model_family *f = arch ? model_find(arch) : NULL;
    if (!arch) rc = vllm_err(VLLM_ERR_FORMAT, "%s: no \"architectures\" list", path);
    else if (!f) {
        char known[512] = "";
        for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++)
            for (const char *const *a = registry[i].archs; *a; a++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", known[0] ? ", " : "", *a);
        rc = vllm_err(VLLM_ERR_UNSUPPORTED, "%s: unknown architecture %s (supported: %s)", path, arch, known);
    } else rc = f->ops->load(dir, cfg, o, be, out);
    // Messages about a file name it (the shard, config.json); one that names
    // none (a tensor no shard has, an allocation) gets the model directory.
    if (rc && f && !strstr(vllm_last_error(), dir)) vllm_err_prefix(rc, "%s", dir);
    json_decref(cfg);
    free(path);
    return rc;
}

int caches_alloc(struct backend *be, const struct model_spec *sp, int num_blocks, int block_size, int num_slots,
                 struct caches *c, int64_t *kv_bytes, int64_t *state_bytes) {
    int L = sp->num_layers;
    memset(c, 0, sizeof *c);
    c->num_layers = L;
    c->block_size = block_size;
    c->num_blocks = num_blocks;
    c->num_slots = num_slots;
    c->k = xcalloc(MAX(L, 1), sizeof(void *));
    c->v = xcalloc(MAX(L, 1), sizeof(void *));
    c->state = xcalloc(MAX(L, 1), sizeof(float **));
    size_t es = dtype_size(be->kv_dtype), tokens = (size_t)num_blocks * block_size;
    for (int i = 0; i < L; i++) { // addressed by cache layer
        const struct layer_cache_spec *ls = &sp->layers[i];
        int64_t per[2] = {ls->k_per_token, ls->v_per_token};
        void **dst[2] = {&c->k[i], &c->v[i]};
        for (int j = 0; j < 2; j++) {
            if (!per[j]) continue;
            size_t b = tokens * per[j] * es;
            if (!(*dst[j] = be->ops->alloc(be, b)))
                return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes on the device for the KV cache", b);
            if (kv_bytes) *kv_bytes += (int64_t)b;
        }
        c->state[i] = xcalloc(MAX_STATE_BUFS, sizeof(float *));
        for (int j = 0; j < ls->num_states; j++) {
            size_t b = sizeof(float) * num_slots * ls->states[j].floats;
            if (!(c->state[i][j] = be->ops->alloc(be, b)))
                return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes on the device for the %s state", b,
                                ls->states[j].name);
            if (state_bytes) *state_bytes += (int64_t)b;
        }
    }
    return VLLM_OK;
}

void caches_release(struct backend *be, struct caches *c) {
    for (int i = 0; i < c->num_layers; i++) {
        if (c->k) be->ops->free(be, c->k[i]);
        if (c->v) be->ops->free(be, c->v[i]);
        for (int j = 0; c->state && c->state[i] && j < MAX_STATE_BUFS; j++) be->ops->free(be, c->state[i][j]);
        if (c->state) free(c->state[i]);
    }
    free(c->k);
    free(c->v);
    free(c->state);
    memset(c, 0, sizeof *c);
}

void model_free(struct model *m) {
    if (m) m->ops->free(m);
}
