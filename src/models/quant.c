// quant.c - quantization configs of checkpoints (quant.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <fnmatch.h>
#include <pcre2.h>
#include <unistd.h>

#include "core/common.h"
#include "core/json.h"
#include "models/quant.h"

static const char *mode_names[] = {"auto", "none", "fp8", "nvfp4", "fp8_block"};

int quant_mode_parse(const char *s, enum quant_mode *out) {
    if (!s) s = "auto";
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, mode_names[i])) {
            *out = (enum quant_mode)i;
            return VLLM_OK;
        }
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown quantization '%s' (expected auto, none, fp8, nvfp4 or fp8_block)",
                    s);
}

const char *quant_mode_name(enum quant_mode m) { return (unsigned)m < 5 ? mode_names[m] : "?"; }

void quant_cfg_free(struct quant_cfg *q) {
    if (!q) return;
    pcre2_code **re = q->re;
    for (int i = 0; i < q->num_ignore; i++) {
        free(q->ignore[i]);
        if (re && re[i]) pcre2_code_free(re[i]);
    }
    free(q->ignore);
    free(q->re);
    free(q);
}

// The module patterns of a list (NULL: none); "re:" patterns compiled, anchored
// at the start as Python's re.match.
static int read_ignore(struct quant_cfg *q, const json_t *list, const char *what, const char *key) {
    if (!list || json_is_null(list)) return VLLM_OK;
    if (!json_is_array(list)) return vllm_err(VLLM_ERR_FORMAT, "%s: %s is not a list", what, key);
    size_t n = json_array_size(list);
    q->ignore = xcalloc(n + 1, sizeof *q->ignore);
    pcre2_code **re = xcalloc(n + 1, sizeof *re);
    q->re = re;
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(list, i));
        if (!s) return vllm_err(VLLM_ERR_FORMAT, "%s: %s[%zu] is not a string", what, key, i);
        q->ignore[q->num_ignore++] = xstrdup(s);
        if (strncmp(s, "re:", 3)) continue;
        int err;
        PCRE2_SIZE off;
        re[i] = pcre2_compile((PCRE2_SPTR)(s + 3), PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &err, &off, NULL);
        if (!re[i]) return vllm_err(VLLM_ERR_FORMAT, "%s: %s[%zu] '%s' is not a regular expression", what, key, i, s);
    }
    return VLLM_OK;
}

int quant_excluded(const struct quant_cfg *q, const char *module) {
    pcre2_code **re = q->re;
    for (int i = 0; i < q->num_ignore; i++) {
        const char *p = q->ignore[i];
        if (re && re[i]) {
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(re[i], NULL);
            int rc = pcre2_match(re[i], (PCRE2_SPTR)module, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL);
            pcre2_match_data_free(md);
            if (rc >= 0) return 1;
        } else if (!strcmp(p, module) || !fnmatch(p, module, 0)) {
            return 1;
        } else { // a module listed by its parent ("model.layers.0.mixer" covers its projections)
            size_t n = strlen(p);
            if (!strncmp(p, module, n) && module[n] == '.') return 1;
        }
    }
    return 0;
}

// ModelOpt: {"quant_algo": ..., "group_size": 16, "exclude_modules": [...]}
static int read_modelopt(struct quant_cfg *q, const json_t *o, const char *what) {
    const char *algo = json_string_value(json_object_get(o, "quant_algo"));
    if (!algo) return vllm_err(VLLM_ERR_FORMAT, "%s: no quant_algo", what);
    q->scale_suffix = "weight_scale";
    if (!strcmp(algo, "FP8")) {
        q->fmt = WF_FP8, q->scales = QS_TENSOR;
    } else if (!strcmp(algo, "NVFP4")) {
        q->fmt = WF_NVFP4, q->scales = QS_NVFP4;
        const json_t *g = json_object_get(o, "group_size");
        if (g && (!json_is_integer(g) || json_integer_value(g) != WF_NVFP4_GROUP))
            return vllm_err(VLLM_ERR_FORMAT, "%s: NVFP4 group_size must be 16", what);
    } else {
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: unknown quant_algo '%s' (supported: FP8, NVFP4)", what, algo);
    }
    snprintf(q->desc, sizeof q->desc, "modelopt %s", algo);
    const json_t *ex = json_object_get(o, "exclude_modules");
    return read_ignore(q, ex ? ex : json_object_get(o, "ignore"), what, ex ? "exclude_modules" : "ignore");
}

// compressed-tensors: config_groups.*.weights {num_bits 8, type float,
// strategy tensor | channel | block [128, 128]}; every group the same.
static int read_ct(struct quant_cfg *q, const json_t *o, const char *what) {
    const json_t *groups = json_object_get(o, "config_groups");
    if (!json_is_object(groups) || !json_object_size(groups))
        return vllm_err(VLLM_ERR_FORMAT, "%s: compressed-tensors config has no config_groups", what);
    const char *gname;
    const json_t *g;
    int first = 1;
    json_object_foreach((json_t *)groups, gname, g) {
        const json_t *w = json_object_get(g, "weights");
        const char *type = json_string_value(json_object_get(w, "type"));
        const char *strat = json_string_value(json_object_get(w, "strategy"));
        const json_t *bits = json_object_get(w, "num_bits");
        if (!w || !type || !strat || !json_is_integer(bits))
            return vllm_err(VLLM_ERR_FORMAT, "%s: config_groups.%s.weights needs num_bits, type and strategy", what, gname);
        if (strcmp(type, "float") || json_integer_value(bits) != 8)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: config_groups.%s: %lld-bit %s weights are not supported (FP8 only)",
                            what, gname, (long long)json_integer_value(bits), type);
        enum quant_scales s;
        if (!strcmp(strat, "tensor")) s = QS_TENSOR;
        else if (!strcmp(strat, "channel")) s = QS_CHANNEL;
        else if (!strcmp(strat, "block")) {
            const json_t *bs = json_object_get(w, "block_structure");
            if (json_array_size(bs) != 2 || json_integer_value(json_array_get(bs, 0)) != WF_B128 ||
                json_integer_value(json_array_get(bs, 1)) != WF_B128)
                return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: config_groups.%s: block_structure must be [128, 128]", what,
                                gname);
            s = QS_BLOCK;
        } else {
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: config_groups.%s: unknown strategy '%s' (tensor, channel, block)",
                            what, gname, strat);
        }
        if (!first && s != q->scales)
            return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: config_groups with different strategies", what);
        first = 0;
        q->scales = s;
    }
    q->fmt = q->scales == QS_BLOCK ? WF_FP8_B128 : WF_FP8;
    q->scale_suffix = "weight_scale";
    snprintf(q->desc, sizeof q->desc, "compressed-tensors FP8 (%s)",
             q->scales == QS_BLOCK ? "block" : q->scales == QS_CHANNEL ? "channel" : "tensor");
    return read_ignore(q, json_object_get(o, "ignore"), what, "ignore");
}

// transformers' fp8 (Qwen3-FP8, DeepSeek-V3): {"fmt": "e4m3",
// "weight_block_size": [128, 128]}, scales in weight_scale_inv.
static int read_fp8(struct quant_cfg *q, const json_t *o, const char *what) {
    const char *fmt = json_string_value(json_object_get(o, "fmt"));
    if (fmt && strcmp(fmt, "e4m3"))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: fp8 fmt '%s' is not supported (e4m3 only)", what, fmt);
    const json_t *bs = json_object_get(o, "weight_block_size");
    if (json_array_size(bs) != 2 || json_integer_value(json_array_get(bs, 0)) != WF_B128 ||
        json_integer_value(json_array_get(bs, 1)) != WF_B128)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: fp8 weight_block_size must be [128, 128]", what);
    q->fmt = WF_FP8_B128, q->scales = QS_BLOCK, q->scale_suffix = "weight_scale_inv";
    snprintf(q->desc, sizeof q->desc, "fp8 (128x128 blocks)");
    const json_t *ex = json_object_get(o, "modules_to_not_convert");
    return read_ignore(q, ex, what, "modules_to_not_convert");
}

static int read_cfg(const char *dir, struct quant_cfg *q) {
    char *hf = path_join(dir, "hf_quant_config.json"), *cp = path_join(dir, "config.json");
    json_t *j = NULL;
    int rc = VLLM_OK;
    if (!access(hf, F_OK)) { // ModelOpt's own file: {"quantization": {...}}
        rc = json_load_path(hf, &j);
        const json_t *o = rc ? NULL : json_object_get(j, "quantization");
        if (!rc && !json_is_object(o)) rc = vllm_err(VLLM_ERR_FORMAT, "%s: no \"quantization\" object", hf);
        if (!rc) rc = read_modelopt(q, o, hf);
        if (!rc) strncat(q->desc, " (hf_quant_config.json)", sizeof q->desc - strlen(q->desc) - 1);
    } else if (!access(cp, F_OK)) {
        rc = json_load_path(cp, &j);
        const json_t *o = rc ? NULL : json_object_get(j, "quantization_config");
        if (!rc && o && !json_is_null(o)) {
            const char *m = json_string_value(json_object_get(o, "quant_method"));
            if (!m) rc = vllm_err(VLLM_ERR_FORMAT, "%s: quantization_config has no quant_method", cp);
            else if (!strcmp(m, "modelopt")) rc = read_modelopt(q, o, cp);
            else if (!strcmp(m, "compressed-tensors")) rc = read_ct(q, o, cp);
            else if (!strcmp(m, "fp8")) rc = read_fp8(q, o, cp);
            else
                rc = vllm_err(VLLM_ERR_UNSUPPORTED,
                              "%s: unknown quantization_config.quant_method '%s' (supported: modelopt, compressed-tensors, fp8)",
                              cp, m);
        } else if (!rc) {
            rc = 1; // no config: not quantized
        }
    } else {
        rc = 1;
    }
    json_decref(j);
    free(hf), free(cp);
    return rc;
}

int quant_cfg_read(const char *dir, struct quant_cfg **out) {
    *out = NULL;
    struct quant_cfg *q = xcalloc(1, sizeof *q);
    int rc = read_cfg(dir, q);
    if (rc == 1) rc = VLLM_OK, quant_cfg_free(q), q = NULL;
    if (rc) quant_cfg_free(q), q = NULL;
    *out = q;
    return rc;
}

int quant_mode_check(enum quant_mode m, const struct quant_cfg *q) {
    if (m == QUANT_AUTO) return VLLM_OK;
    int ok = 0;
    switch (m) {
    case QUANT_AUTO: ok = 1; break;
    case QUANT_NONE: ok = !q; break;
    case QUANT_FP8: ok = q && q->fmt == WF_FP8; break;
    case QUANT_NVFP4: ok = q && q->fmt == WF_NVFP4; break;
    case QUANT_FP8_BLOCK: ok = q && q->fmt == WF_FP8_B128; break;
    }
    if (ok) return VLLM_OK;
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "--quantization %s, but the checkpoint is %s", quant_mode_name(m),
                    q ? q->desc : "not quantized");
}

int quant_mode_dummy_fmt(enum quant_mode m, enum wfmt *fmt) {
    switch (m) {
    case QUANT_AUTO:
    case QUANT_NONE: return 0;
    case QUANT_FP8: *fmt = WF_FP8; return 1;
    case QUANT_NVFP4: *fmt = WF_NVFP4; return 1;
    case QUANT_FP8_BLOCK: *fmt = WF_FP8_B128; return 1;
    }
    return 0;
}
