// gen_config.c - generation_config.json, as vLLM reads it by default
// (--generation-config auto): its extra eos_token_id entries stop every
// request, and its sampling keys (temperature, top_p, top_k, min_p,
// repetition_penalty, max_new_tokens) become the defaults of requests that
// do not set them (the server applies those: vllm_model_info.
// generation_defaults). "vllm" reads none of it; another value is the
// directory to read it from. Every request also stops at the tokenizer's
// eos_token, besides config.json's eos_token_id.
#include "core/common.h"
#include "core/json.h"
#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

static void add_eos(struct vllm_engine *e, json_int_t id) {
    if (id < 0 || id >= e->model[0]->spec.vocab_size) return; // not a token of this model: it can never be sampled
    for (int i = 0; i < e->num_eos; i++)
        if (e->eos[i] == id) return;
    if (e->num_eos < (int)(sizeof e->eos / sizeof e->eos[0])) e->eos[e->num_eos++] = (int32_t)id;
}

// tokenizer_config.json's eos_token, when it is one token.
static void tokenizer_eos(struct vllm_engine *e) {
    if (!e->tok) return;
    char *path = path_join(e->model_dir, "tokenizer_config.json");
    json_t *cfg = NULL;
    if (file_exists(path) && !json_load_path(path, &cfg)) {
        const json_t *t = json_object_get(cfg, "eos_token");
        if (json_is_object(t)) t = json_object_get(t, "content");
        int32_t *ids = NULL;
        int n = 0;
        if (json_is_string(t) && !tok_encode(e->tok, json_string_value(t), json_string_length(t), 0, &ids, &n) && n == 1)
            add_eos(e, ids[0]);
        free(ids);
    }
    vllm_err_clear(); // a config that does not parse was reported by the chat template's loader
    json_decref(cfg);
    free(path);
}

int engine_generation_config(struct vllm_engine *e) {
    const struct model_spec *sp = &e->model[0]->spec;
    e->num_eos = 0;
    for (int i = 0; i < sp->num_eos; i++) add_eos(e, sp->eos_ids[i]);
    tokenizer_eos(e);
    e->gen_defaults = xstrdup("{}");
    const char *policy = e->params.generation_config;
    if (policy && !strcmp(policy, "vllm")) return VLLM_OK;
    char *path = path_join(policy && strcmp(policy, "auto") ? policy : e->model_dir, "generation_config.json");
    if (!file_exists(path)) {
        int rc = policy && strcmp(policy, "auto")
                     ? vllm_err(VLLM_ERR_IO, "--generation-config %s: no generation_config.json there", policy)
                     : VLLM_OK;
        free(path);
        return rc;
    }
    json_t *g;
    int rc = json_load_path(path, &g);
    if (!rc && !json_is_object(g)) rc = vllm_err(VLLM_ERR_FORMAT, "%s: not a JSON object", path);
    if (rc) {
        free(path);
        json_decref(g);
        return rc;
    }
    const json_t *eos = json_object_get(g, "eos_token_id"), *x;
    size_t i;
    if (json_is_integer(eos)) add_eos(e, json_integer_value(eos));
    json_array_foreach(eos, i, x) {
        if (json_is_integer(x)) add_eos(e, json_integer_value(x));
    }
    static const char *const keys[] = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens",
                                       NULL};
    json_t *d = json_object();
    for (int k = 0; keys[k]; k++) {
        const json_t *v = json_object_get(g, keys[k]);
        if (json_is_number(v)) json_object_set(d, keys[k], (json_t *)v);
        else if (v && !json_is_null(v))
            fprintf(stderr, "vllm: warning: %s: %s is not a number; ignored\n", path, keys[k]);
    }
    free(e->gen_defaults);
    e->gen_defaults = json_dumps(d, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(d);
    json_decref(g);
    free(path);
    return VLLM_OK;
}
