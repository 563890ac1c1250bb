// sg_registry.c - compiled grammars by request spec: the key is the spec's
// kind and its canonical JSON text (sorted keys, compact), so a repeated
// schema reuses one grammar and the mask cache it has filled. A small LRU
// under a mutex; compiling happens outside the lock (two threads missing on
// one key both compile; the first to insert wins).
#include <pthread.h>

#include "core/common.h"
#include "structured/sg_internal.h"

struct reg_entry {
    char *key;
    uint64_t hash, used;
    struct sg_grammar *g;
};

struct sg_registry {
    pthread_mutex_t mu;
    struct reg_entry *e;
    int n, cap;
    uint64_t clock;
};

struct sg_registry *sg_registry_create(int capacity) {
    struct sg_registry *r = xcalloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    r->cap = MAX(capacity, 1);
    r->e = xcalloc((size_t)r->cap, sizeof *r->e);
    return r;
}

void sg_registry_free(struct sg_registry *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        free(r->e[i].key);
        sg_grammar_free(r->e[i].g);
    }
    free(r->e);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static int compile_spec(enum sg_spec kind, const json_t *spec, struct sg_grammar **out) {
    switch (kind) {
    case SG_SPEC_JSON_SCHEMA: return sg_compile_json_schema(spec, out);
    case SG_SPEC_JSON_OBJECT: return sg_compile_json_object(out);
    case SG_SPEC_REGEX:
    case SG_SPEC_GBNF:
        if (!json_is_string(spec)) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar spec: expected a string");
        return kind == SG_SPEC_REGEX ? sg_compile_regex(json_string_value(spec), out)
                                     : sg_compile_gbnf(json_string_value(spec), out);
    case SG_SPEC_CHOICE: {
        if (!json_is_array(spec)) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "choice: expected an array of strings");
        int n = (int)json_array_size(spec);
        const char **c = xmalloc((size_t)MAX(n, 1) * sizeof *c);
        for (int i = 0; i < n; i++) c[i] = json_string_value(json_array_get(spec, (size_t)i));
        int rc = sg_compile_choice(c, n, out);
        free(c);
        return rc;
    }
    }
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar spec: unknown kind %d", (int)kind);
}

int sg_registry_get(struct sg_registry *r, enum sg_spec kind, const json_t *spec, struct sg_grammar **out) {
    *out = NULL;
    char *text = spec && kind != SG_SPEC_JSON_OBJECT ? json_dumps(spec, JSON_ENCODE_ANY | JSON_COMPACT | JSON_SORT_KEYS)
                                                       : xstrdup("");
    size_t tl = strlen(text);
    char *key = xmalloc(tl + 3);
    key[0] = (char)('0' + kind), key[1] = ':';
    memcpy(key + 2, text, tl + 1);
    free(text);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = key; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++)
        if (r->e[i].hash == h && !strcmp(r->e[i].key, key)) {
            r->e[i].used = ++r->clock;
            *out = sg_grammar_ref(r->e[i].g);
            pthread_mutex_unlock(&r->mu);
            free(key);
            return VLLM_OK;
        }
    pthread_mutex_unlock(&r->mu);
    struct sg_grammar *g;
    int rc = compile_spec(kind, spec, &g);
    if (rc) {
        free(key);
        return rc;
    }
    pthread_mutex_lock(&r->mu);
    int slot = -1;
    for (int i = 0; i < r->n && slot < 0; i++)
        if (r->e[i].hash == h && !strcmp(r->e[i].key, key)) slot = i; // another thread won
    if (slot >= 0) {
        sg_grammar_free(g);
        free(key);
    } else {
        if (r->n < r->cap) slot = r->n++;
        else { // evict the least recently used
            slot = 0;
            for (int i = 1; i < r->n; i++)
                if (r->e[i].used < r->e[slot].used) slot = i;
            free(r->e[slot].key);
            sg_grammar_free(r->e[slot].g);
        }
        r->e[slot] = (struct reg_entry){key, h, 0, g};
    }
    r->e[slot].used = ++r->clock;
    *out = sg_grammar_ref(r->e[slot].g);
    pthread_mutex_unlock(&r->mu);
    return VLLM_OK;
}
