// config_reader.c - validating reads of config.json (config_reader.h).
#include <math.h>

#include "core/common.h"
#include "core/json.h"
#include "models/config_reader.h"

const char *cfg_show(const json_t *v, char *buf, size_t n) {
    if (json_is_integer(v)) snprintf(buf, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) snprintf(buf, n, "%.17g", json_real_value(v));
    else {
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!s) snprintf(buf, n, "?");
        else if (strlen(s) < n) snprintf(buf, n, "%s", s);
        else snprintf(buf, n, "%.*s...", (int)(n > 4 ? n - 4 : 0), s); // long values cut for the message only
        free(s);
    }
    return buf;
}

const json_t *cfg_get(const struct cfg_reader *r, const char *const *keys) {
    return json_is_object(r->j) ? json_get_alias(r->j, keys) : NULL;
}

static int missing(const struct cfg_reader *r, const char *key) {
    return vllm_err(VLLM_ERR_FORMAT, "%s: missing required key \"%s\"", r->what, key);
}

static int int_value(const struct cfg_reader *r, const char *key, const json_t *v, int64_t min, int64_t max,
                     int *out) {
    char b[64];
    if (!json_is_integer(v))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" = %s must be an integer in [%lld, %lld]", r->what, key,
                        cfg_show(v, b, sizeof b), (long long)min, (long long)max);
    int64_t x = json_integer_value(v);
    if (x < min || x > max)
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" = %lld is out of range [%lld, %lld]", r->what, key,
                        (long long)x, (long long)min, (long long)max);
    *out = (int)x;
    return VLLM_OK;
}

int cfg_int(const struct cfg_reader *r, const char *const *keys, int64_t min, int64_t max, int *out) {
    const json_t *v = cfg_get(r, keys);
    if (!v) return missing(r, keys[0]);
    return int_value(r, keys[0], v, min, max, out);
}

int cfg_int_opt(const struct cfg_reader *r, const char *const *keys, int64_t min, int64_t max, int dflt, int *out) {
    const json_t *v = cfg_get(r, keys);
    if (!v || json_is_null(v)) return *out = dflt, VLLM_OK;
    return int_value(r, keys[0], v, min, max, out);
}

static int in_range(double d, struct cfg_range g) {
    if (isnan(d)) return 0;
    if (isinf(d) && !isinf(d > 0 ? g.max : g.min)) return 0;
    return (g.min_open ? d > g.min : d >= g.min) && d <= g.max;
}

int cfg_number(const struct cfg_reader *r, const char *name, const json_t *v, struct cfg_range g, double *out) {
    double d;
    char b[64];
    if (json_is_boolean(v) || json_as_double(v, &d))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" = %s must be a number", r->what, name, cfg_show(v, b, sizeof b));
    // checked as stored too: 1e-50 rounds to 0 as a float, 1e39 to inf
    if (!in_range(d, g) || !in_range((float)d, g))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" = %g is out of range %c%g, %g]", r->what, name, d,
                        g.min_open ? '(' : '[', g.min, g.max);
    *out = d;
    return VLLM_OK;
}

int cfg_float(const struct cfg_reader *r, const char *const *keys, struct cfg_range g, float *out) {
    const json_t *v = cfg_get(r, keys);
    if (!v) return missing(r, keys[0]);
    double d;
    TRY(cfg_number(r, keys[0], v, g, &d));
    *out = (float)d;
    return VLLM_OK;
}

int cfg_float_opt(const struct cfg_reader *r, const char *const *keys, struct cfg_range g, float dflt, float *out) {
    const json_t *v = cfg_get(r, keys);
    if (!v || json_is_null(v)) return *out = dflt, VLLM_OK;
    double d;
    TRY(cfg_number(r, keys[0], v, g, &d));
    *out = (float)d;
    return VLLM_OK;
}

static int bool_value(const struct cfg_reader *r, const char *key, const json_t *v, int *out) {
    char b[64];
    if (!json_is_boolean(v))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" = %s must be true or false", r->what, key,
                        cfg_show(v, b, sizeof b));
    *out = json_is_true(v);
    return VLLM_OK;
}

int cfg_bool(const struct cfg_reader *r, const char *const *keys, int *out) {
    const json_t *v = cfg_get(r, keys);
    if (!v) return missing(r, keys[0]);
    return bool_value(r, keys[0], v, out);
}

int cfg_bool_opt(const struct cfg_reader *r, const char *const *keys, int dflt, int *out) {
    const json_t *v = cfg_get(r, keys);
    if (!v || json_is_null(v)) return *out = dflt, VLLM_OK;
    return bool_value(r, keys[0], v, out);
}

int cfg_str_opt(const struct cfg_reader *r, const char *const *keys, const char **out) {
    const json_t *v = cfg_get(r, keys);
    char b[64];
    *out = NULL;
    if (!v || json_is_null(v)) return VLLM_OK;
    if (!json_is_string(v))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" = %s must be a string", r->what, keys[0], cfg_show(v, b, sizeof b));
    *out = json_string_value(v);
    return VLLM_OK;
}

int cfg_eos(const struct cfg_reader *r, int vocab, int max_ids, int32_t *ids, int *num) {
    const json_t *v = cfg_get(r, CFG_KEYS("eos_token_id"));
    char key[48];
    int id;
    *num = 0;
    if (!v || json_is_null(v)) return VLLM_OK;
    if (!json_is_array(v)) {
        TRY(int_value(r, "eos_token_id", v, 0, (int64_t)vocab - 1, &id));
        ids[(*num)++] = id;
        return VLLM_OK;
    }
    if (json_array_size(v) > (size_t)max_ids)
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"eos_token_id\" lists %zu ids; at most %d are supported", r->what,
                        json_array_size(v), max_ids);
    for (size_t i = 0; i < json_array_size(v); i++) {
        snprintf(key, sizeof key, "eos_token_id[%zu]", i);
        TRY(int_value(r, key, json_array_get(v, i), 0, (int64_t)vocab - 1, &id));
        ids[(*num)++] = id;
    }
    return VLLM_OK;
}

int64_t cfg_mul(int64_t a, int64_t b) {
    int64_t p;
    return __builtin_mul_overflow(a, b, &p) ? INT64_MAX : p;
}

int64_t cfg_add(int64_t a, int64_t b) {
    int64_t s;
    return __builtin_add_overflow(a, b, &s) ? INT64_MAX : s;
}

int cfg_limit(const struct cfg_reader *r, const char *desc, int64_t value, int64_t max) {
    if (value <= max) return VLLM_OK;
    if (value == INT64_MAX)
        return vllm_err(VLLM_ERR_FORMAT, "%s: %s overflows 64 bits (at most %lld)", r->what, desc, (long long)max);
    return vllm_err(VLLM_ERR_FORMAT, "%s: %s = %lld exceeds %lld", r->what, desc, (long long)value, (long long)max);
}
