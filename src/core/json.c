// json.c - Python-flavoured JSON on top of jansson.
#include <math.h>

#include "core/common.h"
#include "core/json.h"

// Copies text, quoting bare Infinity / -Infinity / NaN tokens outside strings
// so that jansson accepts them; json_as_double reads the strings back.
static char *quote_python_floats(const char *s, size_t len, size_t *out_len) {
    size_t cap = len + len / 4 + 16, n = 0;
    char *o = xmalloc(cap);
    int in_str = 0;
    for (size_t i = 0; i < len; i++) {
        if (n + 16 > cap) o = xrealloc(o, cap *= 2);
        char c = s[i];
        if (in_str) {
            o[n++] = c;
            if (c == '\\' && i + 1 < len) o[n++] = s[++i];
            else if (c == '"') in_str = 0;
            continue;
        }
        if (c == '"') in_str = 1;
        const char *tok = NULL;
        size_t tl = 0;
        if (c == 'I' && i + 8 <= len && !memcmp(s + i, "Infinity", 8)) tok = "Infinity", tl = 8;
        else if (c == '-' && i + 9 <= len && !memcmp(s + i, "-Infinity", 9)) tok = "-Infinity", tl = 9;
        else if (c == 'N' && i + 3 <= len && !memcmp(s + i, "NaN", 3)) tok = "NaN", tl = 3;
        if ((c >= '0' && c <= '9') && (i == 0 || !strchr("0123456789.eE+-", s[i - 1]))) {
            // an integer past int64 (1e30 as model_max_length, written as digits):
            // jansson rejects it, so it becomes a real by gaining ".0"
            size_t j = i;
            while (j < len && s[j] >= '0' && s[j] <= '9') j++;
            int is_int = j == len || !strchr(".eE", s[j]);
            if (is_int && j - i > 18) {
                if (n + (j - i) + 4 > cap) o = xrealloc(o, cap = cap * 2 + (j - i));
                memcpy(o + n, s + i, j - i);
                n += j - i;
                memcpy(o + n, ".0", 2);
                n += 2;
                i = j - 1;
                continue;
            }
        }
        if (tok) {
            o[n++] = '"';
            memcpy(o + n, tok, tl);
            n += tl;
            o[n++] = '"';
            i += tl - 1;
            continue;
        }
        o[n++] = c;
    }
    *out_len = n;
    return o;
}

int json_parse_python(const char *text, size_t len, const char *what, json_t **out) {
    return json_parse_python_flags(text, len, 0, what, out);
}

int json_parse_python_flags(const char *text, size_t len, size_t flags, const char *what, json_t **out) {
    size_t n;
    char *q = quote_python_floats(text, len, &n);
    json_error_t e;
    json_t *j = json_loadb(q, n, JSON_ALLOW_NUL | flags, &e);
    free(q);
    if (!j) return vllm_err(VLLM_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", what, e.line, e.column, e.text);
    *out = j;
    return VLLM_OK;
}

int json_load_path(const char *path, json_t **out) {
    char *data;
    size_t len;
    TRY(read_file(path, &data, &len));
    int rc = json_parse_python(data, len, path, out);
    free(data);
    return rc;
}

static int parse_float_word(const char *s, double *out) {
    if (!strcmp(s, "Infinity") || !strcmp(s, "inf") || !strcmp(s, "+inf")) *out = INFINITY;
    else if (!strcmp(s, "-Infinity") || !strcmp(s, "-inf")) *out = -INFINITY;
    else if (!strcmp(s, "NaN") || !strcmp(s, "nan")) *out = NAN;
    else return -1;
    return 0;
}

int json_as_double(const json_t *v, double *out) {
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return 0;
    }
    if (json_is_string(v)) return parse_float_word(json_string_value(v), out);
    if (json_is_object(v)) {
        const json_t *f = json_object_get(v, "__float__");
        if (f && json_is_string(f)) return parse_float_word(json_string_value(f), out);
        if (f && json_is_number(f)) return *out = json_number_value(f), 0;
    }
    return -1;
}

int json_req_int(const json_t *obj, const char *key, const char *what, int64_t *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v) return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"%s\"", what, key);
    if (!json_is_integer(v)) return vllm_err(VLLM_ERR_FORMAT, "%s: key \"%s\" must be an integer", what, key);
    *out = json_integer_value(v);
    return VLLM_OK;
}

int json_req_double(const json_t *obj, const char *key, const char *what, double *out) {
    const json_t *v = json_object_get(obj, key);
    if (!v) return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"%s\"", what, key);
    if (json_as_double(v, out)) return vllm_err(VLLM_ERR_FORMAT, "%s: key \"%s\" must be a number", what, key);
    return VLLM_OK;
}

json_t *json_get_alias(const json_t *obj, const char *const *keys) {
    for (; *keys; keys++) {
        json_t *v = json_object_get(obj, *keys);
        if (v) return v;
    }
    return NULL;
}
