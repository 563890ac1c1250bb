// registry.c - architecture name to model.
#include "core/common.h"
#include "core/json.h"
#include "models/model.h"

extern const struct model_ops nemotron_h_ops;

static const struct model_ops *const registry[] = {
    &nemotron_h_ops,
};

const struct model_ops *model_find(const char *arch) {
    for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++)
        if (!strcmp(registry[i]->arch, arch)) return registry[i];
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
    const struct model_ops *ops = arch ? model_find(arch) : NULL;
    if (!arch) rc = vllm_err(VLLM_ERR_FORMAT, "%s: no \"architectures\" list", path);
    else if (!ops) {
        char known[256] = "";
        for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", registry[i]->arch);
        rc = vllm_err(VLLM_ERR_UNSUPPORTED, "%s: unknown architecture %s (supported: %s)", path, arch, known);
    } else rc = ops->load(dir, cfg, o, be, out);
    json_decref(cfg);
    free(path);
    return rc;
}

void model_free(struct model *m) {
    if (m) m->ops->free(m);
}
