// chat_template.c - the model directory's chat template, rendered for a chat
// request the way transformers' apply_chat_template does: the request's keys
// are the template's variables, plus bos_token / eos_token from
// tokenizer_config.json and add_generation_prompt (false unless given).
#include "core/json.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

#include "core/common.h"

struct chat_template {
    struct jinja_template *tmpl;
    struct jinja_template *tool_use; // a named "tool_use" template, for requests with tools
    char *bos, *eos;                 // NULL when the config has none
};

// A special token: "<s>", {"content": "<s>", ...} (an AddedToken), or null.
static int token_string(const json_t *cfg, const char *key, const char *path, char **out) {
    *out = NULL;
    const json_t *v = cfg ? json_object_get(cfg, key) : NULL;
    if (v && json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return VLLM_OK;
    if (!json_is_string(v)) return vllm_err(VLLM_ERR_FORMAT, "%s: %s is not a string", path, key);
    *out = xstrdup(json_string_value(v));
    return VLLM_OK;
}

static int parse_into(const char *src, const char *where, struct jinja_template **out) {
    int rc = jinja_parse(src, strlen(src), out);
    return rc ? vllm_err_prefix(rc, "%s", where) : VLLM_OK;
}

// "chat_template" of tokenizer_config.json: a string, or a list of
// {"name", "template"} of which "default" (and "tool_use") are used.
static int config_templates(const json_t *cfg, const char *path, struct chat_template *ct, int *found) {
    const json_t *t = json_object_get(cfg, "chat_template");
    *found = 0;
    if (!t || json_is_null(t)) return VLLM_OK;
    if (json_is_string(t)) {
        *found = 1;
        return parse_into(json_string_value(t), path, &ct->tmpl);
    }
    if (!json_is_array(t)) return vllm_err(VLLM_ERR_FORMAT, "%s: chat_template is neither a string nor a list", path);
    size_t i;
    const json_t *e;
    json_array_foreach(t, i, e) {
        const json_t *name = json_object_get(e, "name"), *src = json_object_get(e, "template");
        if (!json_is_string(name) || !json_is_string(src))
            return vllm_err(VLLM_ERR_FORMAT, "%s: chat_template[%zu] is not {\"name\", \"template\"}", path, i);
        struct jinja_template **slot = !strcmp(json_string_value(name), "default")    ? &ct->tmpl
                                       : !strcmp(json_string_value(name), "tool_use") ? &ct->tool_use
                                                                                      : NULL;
        if (slot && !*slot) TRY(parse_into(json_string_value(src), path, slot));
    }
    if (!ct->tmpl)
        return vllm_err(VLLM_ERR_FORMAT, "%s: chat_template lists named templates but none is \"default\"", path);
    *found = 1;
    return VLLM_OK;
}

static int load(const char *dir, struct chat_template *ct) {
    char *cfg_path = path_join(dir, "tokenizer_config.json");
    char *jinja_path = path_join(dir, "chat_template.jinja");
    json_t *cfg = NULL;
    int rc = VLLM_OK, found = 0;
    if (file_exists(cfg_path)) rc = json_load_path(cfg_path, &cfg);
    if (!rc && cfg && !json_is_object(cfg)) rc = vllm_err(VLLM_ERR_FORMAT, "%s: not a JSON object", cfg_path);
    // chat_template.jinja takes precedence over the config's template, as in transformers.
    if (!rc && file_exists(jinja_path)) {
        char *src;
        rc = read_file(jinja_path, &src, NULL);
        if (!rc) {
            rc = parse_into(src, jinja_path, &ct->tmpl);
            free(src);
            found = 1;
        }
    } else if (!rc && cfg) rc = config_templates(cfg, cfg_path, ct, &found);
    if (!rc && !found)
        rc = vllm_err(VLLM_ERR_IO, "%s: no chat template (tokenizer_config.json \"chat_template\" or chat_template.jinja)",
                      dir);
    if (!rc) rc = token_string(cfg, "bos_token", cfg_path, &ct->bos);
    if (!rc) rc = token_string(cfg, "eos_token", cfg_path, &ct->eos);
    json_decref(cfg);
    free(cfg_path);
    free(jinja_path);
    return rc;
}

int chat_template_load(const char *model_dir, struct chat_template **out) {
    *out = NULL;
    struct chat_template *ct = xcalloc(1, sizeof *ct);
    int rc = load(model_dir, ct);
    if (rc) {
        chat_template_free(ct);
        return rc;
    }
    *out = ct;
    return VLLM_OK;
}

int chat_template_from_source(const char *src, const struct chat_template *base, struct chat_template **out) {
    *out = NULL;
    struct chat_template *ct = xcalloc(1, sizeof *ct);
    int rc = parse_into(src, "chat_template", &ct->tmpl);
    if (rc) {
        chat_template_free(ct);
        return rc;
    }
    ct->bos = base && base->bos ? xstrdup(base->bos) : NULL;
    ct->eos = base && base->eos ? xstrdup(base->eos) : NULL;
    *out = ct;
    return VLLM_OK;
}

void chat_template_free(struct chat_template *ct) {
    if (!ct) return;
    jinja_free(ct->tmpl);
    jinja_free(ct->tool_use);
    free(ct->bos);
    free(ct->eos);
    free(ct);
}

int chat_template_render_opts(const struct chat_template *ct, const json_t *request,
                              const struct jinja_render_opts *opts, char **out) {
    *out = NULL;
    if (!request || !json_is_object(request))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "chat request must be a JSON object");
    if (!json_is_array(json_object_get(request, "messages")))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "chat request needs a \"messages\" list");
    json_t *vars = json_object();
    if (ct->bos) json_object_set_new(vars, "bos_token", json_string(ct->bos));
    if (ct->eos) json_object_set_new(vars, "eos_token", json_string(ct->eos));
    json_object_set_new(vars, "add_generation_prompt", json_false());
    json_object_update(vars, (json_t *)request); // the request's own keys win
    const json_t *tools = json_object_get(request, "tools");
    const struct jinja_template *t = ct->tool_use && tools && !json_is_null(tools) ? ct->tool_use : ct->tmpl;
    int rc = jinja_render(t, vars, opts, out, NULL);
    json_decref(vars);
    return rc;
}

int chat_template_render(const struct chat_template *ct, const json_t *request, char **out) {
    return chat_template_render_opts(ct, request, NULL, out);
}
