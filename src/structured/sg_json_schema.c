// sg_json_schema.c - JSON Schema -> IR. The grammar generates a subset of
// the schema's valid values (never a value the schema rejects):
//
//   type (or a list), enum, const, properties + required (in the schema's
//   order), additionalProperties (absent means none, as xgrammar's strict
//   mode: extra keys come after the listed ones), items, prefixItems,
//   minItems / maxItems, anyOf, oneOf (branches must be provably disjoint:
//   by JSON type or by a required property with distinct const/enum values),
//   allOf (merged when the branches combine keyword by keyword), $ref into
//   the document (#, #/$defs/..., #/definitions/..., any JSON pointer;
//   recursion allowed), string minLength / maxLength, pattern (the regex
//   front end, whole-string match), format (date, time, date-time, uuid,
//   email, ipv4), integer / number minimum, maximum, exclusiveMinimum,
//   exclusiveMaximum (numbers or draft-4 booleans), nullable (OpenAPI),
//   unevaluatedProperties / unevaluatedItems false (what strict mode does).
//   Annotations (title, description, default, examples, ...) are ignored.
//
// Every other keyword is VLLM_ERR_INVALID_ARGUMENT naming it and its
// location. Whitespace: sg_json_ws, between tokens only (none before or
// after the top-level value).
#include <math.h>

#include "core/common.h"
#include "structured/sg_internal.h"

struct sg_expr *sg_json_int_range(struct sg_ir *ir, int64_t lo, int64_t hi);
struct sg_expr *sg_json_number_any(struct sg_ir *ir, int integer);
struct sg_expr *sg_json_number_range(struct sg_ir *ir, int integer, double lo, int ex_lo, double hi, int ex_hi);

#define MAX_DEPTH 64
#define MAX_LENGTH 2048 // string lengths a grammar unrolls
#define MAX_ITEMS 256   // array lengths

struct js {
    struct sg_ir *ir;
    const json_t *doc;
    char **ref_key;
    int *ref_rule;
    int n_refs, cap_refs;
    int depth;
    char path[512];
    json_t *owned; // merged schemas (allOf, anyOf siblings) kept alive until the end
};

static int js_err(struct js *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int js_err(struct js *j, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "JSON schema at #%s: %s", j->path, msg);
}

// path push/pop around a sub-schema, for error messages
static size_t path_push(struct js *j, const char *a, const char *b) {
    size_t n = strlen(j->path);
    snprintf(j->path + n, sizeof j->path - n, "/%s%s%s", a, b ? "/" : "", b ? b : "");
    return n;
}
static void path_pop(struct js *j, size_t n) { j->path[n] = 0; }

static json_t *keep(struct js *j, json_t *v) { // owned by j until the end
    json_array_append_new(j->owned, v);
    return v;
}

// --------------------------------------------------------------- pieces --

struct sg_expr *sg_json_ws(struct sg_ir *ir) {
    uint32_t sp[4] = {' ', ' ', '\t', '\t'};
    struct sg_expr *nl = sg_seqv(ir, sg_lits(ir, "\n"), sg_opt(ir, sg_lits(ir, "\n")),
                                 sg_rep(ir, sg_class(ir, sp, 2, 0), 0, 20), NULL);
    return sg_opt(ir, sg_altv(ir, sg_lits(ir, " "), nl, NULL));
}

static struct sg_expr *hexd(struct sg_ir *ir) {
    uint32_t r[6] = {'0', '9', 'A', 'F', 'a', 'f'};
    return sg_class(ir, r, 3, 0);
}

// JSON string content for one code point of ranges (sorted, disjoint):
// plain characters as themselves, '"' '\\' and controls escaped.
struct sg_expr *sg_json_class(struct sg_ir *ir, const uint32_t *ranges, int n) {
    struct sg_expr *alt = sg_alt(ir);
    uint32_t *plain = xmalloc((size_t)(n + 2) * 2 * sizeof *plain);
    int np = 0;
    static const char *const ESC[32] = {
        "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007", "\\b", "\\t", "\\n",
        "\\u000b", "\\f", "\\r", "\\u000e", "\\u000f", "\\u0010", "\\u0011", "\\u0012", "\\u0013", "\\u0014",
        "\\u0015", "\\u0016", "\\u0017", "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e",
        "\\u001f"};
    for (int i = 0; i < n; i++) {
        uint32_t lo = ranges[2 * i], hi = ranges[2 * i + 1];
        for (uint32_t c = lo; c <= MIN(hi, 0x1Fu); c++) sg_push(alt, sg_lits(ir, ESC[c]));
        lo = MAX(lo, 0x20u);
        const uint32_t cut[2] = {'"', '\\'};
        for (int k = 0; k < 2 && lo <= hi; k++) {
            if (cut[k] < lo || cut[k] > hi) continue;
            if (cut[k] > lo) plain[2 * np] = lo, plain[2 * np + 1] = cut[k] - 1, np++;
            sg_push(alt, sg_lits(ir, cut[k] == '"' ? "\\\"" : "\\\\"));
            lo = cut[k] + 1;
        }
        if (lo <= hi) plain[2 * np] = lo, plain[2 * np + 1] = hi, np++;
    }
    if (np) sg_push(alt, sg_class(ir, plain, np, 0));
    free(plain);
    return alt->n == 1 ? alt->sub[0] : alt;
}

// One character of a JSON string, any escape included (\uXXXX only as a
// scalar value or a valid surrogate pair, so that every parser takes it).
static struct sg_expr *json_char(struct sg_ir *ir) {
    uint32_t plain[6] = {0x20, 0x21, 0x23, 0x5B, 0x5D, 0x10FFFF};
    uint32_t simple[16] = {'"', '"', '/', '/', '\\', '\\', 'b', 'b', 'f', 'f', 'n', 'n', 'r', 'r', 't', 't'};
    uint32_t nd[12] = {'0', '9', 'A', 'C', 'E', 'F', 'a', 'c', 'e', 'f'}, d[4] = {'D', 'D', 'd', 'd'};
    uint32_t lo8[2] = {'0', '7'}, hs[8] = {'8', '9', 'A', 'B', 'a', 'b'}, ls[4] = {'C', 'F', 'c', 'f'};
    struct sg_expr *bmp = sg_altv(ir, sg_seqv(ir, sg_class(ir, nd, 5, 0), hexd(ir), hexd(ir), hexd(ir), NULL),
                                  sg_seqv(ir, sg_class(ir, d, 2, 0), sg_class(ir, lo8, 1, 0), hexd(ir), hexd(ir), NULL),
                                  NULL);
    struct sg_expr *pair = sg_seqv(ir, sg_class(ir, d, 2, 0), sg_class(ir, hs, 3, 0), hexd(ir), hexd(ir),
                                   sg_lits(ir, "\\u"), sg_class(ir, d, 2, 0), sg_class(ir, ls, 2, 0), hexd(ir),
                                   hexd(ir), NULL);
    struct sg_expr *esc = sg_seqv(ir, sg_lits(ir, "\\"),
                                  sg_altv(ir, sg_class(ir, simple, 8, 0),
                                          sg_seqv(ir, sg_lits(ir, "u"), sg_altv(ir, bmp, pair, NULL), NULL), NULL),
                                  NULL);
    return sg_altv(ir, sg_class(ir, plain, 3, 0), esc, NULL);
}

// Shared rules, made once per IR and never inlined: their cache entries
// serve every use.
static int shared_rule(struct sg_ir *ir, const char *name, int *fresh) {
    int r = sg_ir_rule(ir, name);
    *fresh = !ir->body[r];
    if (*fresh) sg_ir_keep(ir, r);
    return r;
}

static struct sg_expr *string_rule(struct sg_ir *ir) {
    int fresh, r = shared_rule(ir, "json-string", &fresh);
    if (fresh)
        sg_ir_define(ir, r, sg_seqv(ir, sg_lits(ir, "\""), sg_rep(ir, json_char(ir), 0, -1), sg_lits(ir, "\""), NULL));
    return sg_ref(ir, r);
}

static struct sg_expr *number_rule(struct sg_ir *ir, int integer) {
    int fresh, r = shared_rule(ir, integer ? "json-integer" : "json-number", &fresh);
    if (fresh) sg_ir_define(ir, r, sg_json_number_any(ir, integer));
    return sg_ref(ir, r);
}

// Any JSON value (objects and arrays of anything).
static struct sg_expr *value_rule(struct sg_ir *ir) {
    int fresh, r = shared_rule(ir, "json-value", &fresh);
    if (!fresh) return sg_ref(ir, r);
    int fo, ro = shared_rule(ir, "json-object", &fo), fa, ra = shared_rule(ir, "json-array", &fa);
    struct sg_expr *member = sg_seqv(ir, string_rule(ir), sg_json_ws(ir), sg_lits(ir, ":"), sg_json_ws(ir),
                                     sg_ref(ir, r), sg_json_ws(ir), NULL);
    struct sg_expr *more = sg_rep(ir, sg_seqv(ir, sg_lits(ir, ","), sg_json_ws(ir), member, NULL), 0, -1);
    sg_ir_define(ir, ro, sg_seqv(ir, sg_lits(ir, "{"), sg_json_ws(ir), sg_opt(ir, sg_seqv(ir, member, more, NULL)),
                                 sg_lits(ir, "}"), NULL));
    struct sg_expr *item = sg_seqv(ir, sg_ref(ir, r), sg_json_ws(ir), NULL);
    struct sg_expr *items = sg_rep(ir, sg_seqv(ir, sg_lits(ir, ","), sg_json_ws(ir), item, NULL), 0, -1);
    sg_ir_define(ir, ra, sg_seqv(ir, sg_lits(ir, "["), sg_json_ws(ir), sg_opt(ir, sg_seqv(ir, item, items, NULL)),
                                 sg_lits(ir, "]"), NULL));
    sg_ir_define(ir, r, sg_altv(ir, sg_ref(ir, ro), sg_ref(ir, ra), string_rule(ir), number_rule(ir, 0),
                                sg_lits(ir, "true"), sg_lits(ir, "false"), sg_lits(ir, "null"), NULL));
    return sg_ref(ir, r);
}

static struct sg_expr *json_text(struct sg_ir *ir, const json_t *v) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    struct sg_expr *e = sg_lits(ir, s ? s : "null");
    free(s);
    return e;
}

// ---------------------------------------------------------------- formats --

static const char *const FORMATS[][2] = {
    {"date", "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"},
    {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"date-time", "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
                  "T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"email", "[A-Za-z0-9_%+-]{1,16}(\\.[A-Za-z0-9_%+-]{1,16}){0,2}@([A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?\\.){1,3}[A-Za-z]{2,8}"},
    {"ipv4", "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])){3}"},
};

// ------------------------------------------------------------- keywords --

static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$comment", "$schema", "$id",
                                          "deprecated", "readOnly", "writeOnly", "contentMediaType",
                                          "contentEncoding", "discriminator", "$defs", "definitions", "$anchor", NULL};
static const char *const SUPPORTED[] = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                        "items", "prefixItems", "additionalItems", "minItems", "maxItems", "anyOf",
                                        "oneOf", "allOf", "$ref", "minLength", "maxLength", "pattern", "format",
                                        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "nullable",
                                        "unevaluatedProperties", "unevaluatedItems", "uniqueItems", NULL};

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int is_annotation(const char *k) { return in_list(ANNOTATIONS, k); }

static int check_keywords(struct js *j, const json_t *s) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (is_annotation(k)) continue;
        if (!in_list(SUPPORTED, k)) return js_err(j, "unsupported keyword '%s'", k);
        if ((!strcmp(k, "unevaluatedProperties") || !strcmp(k, "unevaluatedItems")) && !json_is_false(v))
            return js_err(j, "unsupported keyword '%s' (only false)", k);
        if (!strcmp(k, "uniqueItems") && json_is_true(v)) return js_err(j, "unsupported keyword 'uniqueItems' (true)");
    }
    return VLLM_OK;
}

// Whether s has a constraining keyword other than those in `except` (a
// space-separated list).
static int constrains(const json_t *s, const char *except) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (is_annotation(k) || !strcmp(k, "uniqueItems") || !strcmp(k, "unevaluatedProperties") ||
            !strcmp(k, "unevaluatedItems"))
            continue;
        if (except) {
            size_t n = strlen(k);
            const char *p = except;
            int listed = 0;
            while (!listed && (p = strstr(p, k))) {
                listed = (p == except || p[-1] == ' ') && (p[n] == ' ' || !p[n]);
                p += n;
            }
            if (listed) continue;
        }
        return 1;
    }
    return 0;
}

// ------------------------------------------------------------------ $ref --

// The target of a local reference: "#" or "#/json/pointer" (~0 ~1 escapes).
static const json_t *ref_target(struct js *j, const char *ref) {
    if (ref[0] != '#') return NULL;
    const json_t *cur = j->doc;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char tok[256];
        size_t n = 0;
        for (; *p && *p != '/' && n + 1 < sizeof tok; p++) {
            if (*p == '~' && p[1] == '0') tok[n++] = '~', p++;
            else if (*p == '~' && p[1] == '1') tok[n++] = '/', p++;
            else tok[n++] = *p;
        }
        tok[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, tok);
        else if (json_is_array(cur)) cur = json_array_get(cur, (size_t)strtol(tok, NULL, 10));
        else cur = NULL;
    }
    return *p ? NULL : cur;
}

static int schema_expr(struct js *j, const json_t *s, struct sg_expr **out);

static int ref_expr(struct js *j, const char *ref, struct sg_expr **out) {
    for (int i = 0; i < j->n_refs; i++)
        if (!strcmp(j->ref_key[i], ref)) {
            *out = sg_ref(j->ir, j->ref_rule[i]);
            return VLLM_OK;
        }
    const json_t *t = ref_target(j, ref);
    if (!t) return js_err(j, "$ref '%s' is not a pointer into this document", ref);
    char name[300];
    snprintf(name, sizeof name, "ref%p%s", (const void *)j->doc, ref + 1);
    int r = sg_ir_rule(j->ir, name);
    if (j->n_refs == j->cap_refs) {
        j->cap_refs = j->cap_refs ? j->cap_refs * 2 : 8;
        j->ref_key = xrealloc(j->ref_key, (size_t)j->cap_refs * sizeof *j->ref_key);
        j->ref_rule = xrealloc(j->ref_rule, (size_t)j->cap_refs * sizeof *j->ref_rule);
    }
    j->ref_key[j->n_refs] = xstrdup(ref);
    j->ref_rule[j->n_refs++] = r;
    char save[sizeof j->path];
    memcpy(save, j->path, sizeof save);
    snprintf(j->path, sizeof j->path, "%s", ref + 1);
    struct sg_expr *body;
    int rc = schema_expr(j, t, &body);
    memcpy(j->path, save, sizeof save);
    TRY(rc);
    sg_ir_define(j->ir, r, body);
    *out = sg_ref(j->ir, r);
    return VLLM_OK;
}

// A schema with its $ref (and annotation siblings only) followed.
static int deref(struct js *j, const json_t *s, const json_t **out) {
    for (int hops = 0; hops < 32; hops++) {
        const json_t *r = json_is_object(s) ? json_object_get(s, "$ref") : NULL;
        if (!json_is_string(r)) {
            *out = s;
            return VLLM_OK;
        }
        if (constrains(s, "$ref")) return js_err(j, "$ref with other constraining keywords is unsupported");
        s = ref_target(j, json_string_value(r));
        if (!s) return js_err(j, "$ref '%s' is not a pointer into this document", json_string_value(r));
    }
    return js_err(j, "$ref chain too long");
}

// ----------------------------------------------------------------- allOf --

static int type_mask_of(const json_t *t); // below

static const char *const TYPES[] = {"null", "boolean", "integer", "number", "string", "object", "array"};
enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_OBJ = 32, T_ARR = 64, T_ALL = 127 };

static int type_mask_of(const json_t *t) {
    if (!t) return T_ALL;
    int m = 0;
    if (json_is_string(t)) {
        for (int i = 0; i < 7; i++)
            if (!strcmp(json_string_value(t), TYPES[i])) m = 1 << i;
        if (m == T_NUM) m |= T_INT;
        return m ? m : -1;
    }
    if (!json_is_array(t)) return -1;
    size_t i;
    json_t *x;
    json_array_foreach(t, i, x) {
        int b = type_mask_of(x);
        if (b < 0 || !json_is_string(x)) return -1;
        m |= b;
    }
    return m;
}

static json_t *type_json(int m) {
    json_t *a = json_array();
    for (int i = 0; i < 7; i++) {
        if (!(m & (1 << i))) continue;
        if (i == 2 && (m & T_NUM)) continue; // number covers integer
        json_array_append_new(a, json_string(TYPES[i]));
    }
    if (json_array_size(a) == 1) {
        json_t *one = json_incref(json_array_get(a, 0));
        json_decref(a);
        return one;
    }
    return a;
}

static int merge(struct js *j, const json_t *a, const json_t *b, json_t **out);

// dst gets src's keywords combined with its own.
static int merge_into(struct js *j, json_t *dst, const json_t *src) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)src, k, v) {
        json_t *d = json_object_get(dst, k);
        if (!d) {
            json_object_set(dst, k, v);
            continue;
        }
        if (json_equal(d, v) || is_annotation(k)) continue;
        if (!strcmp(k, "required")) {
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) {
                int have = 0;
                size_t q;
                json_t *y;
                json_array_foreach(d, q, y) have |= json_equal(x, y);
                if (!have) json_array_append(d, x);
            }
        } else if (!strcmp(k, "properties") && json_is_object(d) && json_is_object(v)) {
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                json_t *dv = json_object_get(d, pk), *m;
                if (!dv) json_object_set(d, pk, pv);
                else if (!json_equal(dv, pv)) {
                    TRY(merge(j, dv, pv, &m));
                    json_object_set_new(d, pk, m);
                }
            }
        } else if (!strcmp(k, "type")) {
            int m = type_mask_of(d) & type_mask_of(v);
            if (type_mask_of(d) < 0 || type_mask_of(v) < 0 || !m) return js_err(j, "allOf: types do not intersect");
            json_object_set_new(dst, k, type_json(m));
        } else if (!strcmp(k, "minimum") || !strcmp(k, "minLength") || !strcmp(k, "minItems")) {
            if (json_number_value(v) > json_number_value(d)) json_object_set(dst, k, v);
        } else if (!strcmp(k, "maximum") || !strcmp(k, "maxLength") || !strcmp(k, "maxItems")) {
            if (json_number_value(v) < json_number_value(d)) json_object_set(dst, k, v);
        } else if (!strcmp(k, "additionalProperties") && (json_is_false(d) || json_is_false(v))) {
            json_object_set_new(dst, k, json_false());
        } else {
            return js_err(j, "allOf: cannot combine two different '%s'", k);
        }
    }
    return VLLM_OK;
}

// Properties that a branch with additionalProperties false does not list
// would be rejected by it: the merge refuses them.
static int check_closed(struct js *j, const json_t *branch, const json_t *merged) {
    if (!json_is_false(json_object_get(branch, "additionalProperties"))) return VLLM_OK;
    const json_t *bp = json_object_get(branch, "properties");
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(merged, "properties"), k, v) if (!json_object_get(bp, k)) return js_err(
        j, "allOf: property '%s' is not allowed by a branch with additionalProperties false", k);
    return VLLM_OK;
}

static int merge(struct js *j, const json_t *a, const json_t *b, json_t **out) {
    *out = NULL;
    TRY(deref(j, a, &a));
    TRY(deref(j, b, &b));
    if (json_is_true(a) || (json_is_object(a) && !json_object_size(a))) {
        *out = json_deep_copy(b);
        return VLLM_OK;
    }
    if (json_is_true(b) || (json_is_object(b) && !json_object_size(b))) {
        *out = json_deep_copy(a);
        return VLLM_OK;
    }
    if (!json_is_object(a) || !json_is_object(b)) return js_err(j, "allOf: a branch is not a schema");
    json_t *m = json_deep_copy(a);
    int rc = merge_into(j, m, b);
    if (!rc) rc = check_closed(j, a, m);
    if (!rc) rc = check_closed(j, b, m);
    if (rc) {
        json_decref(m);
        return rc;
    }
    *out = m;
    return VLLM_OK;
}

// s with its allOf folded into one schema (owned by j), or s itself.
static int fold_allof(struct js *j, const json_t *s, const json_t **out) {
    const json_t *all = json_object_get(s, "allOf");
    *out = s;
    if (!all) return VLLM_OK;
    if (!json_is_array(all) || !json_array_size(all)) return js_err(j, "allOf must be a non-empty array");
    json_t *acc = json_deep_copy(s);
    json_object_del(acc, "allOf");
    size_t i;
    json_t *x;
    json_array_foreach(all, i, x) {
        json_t *m;
        int rc = merge(j, acc, x, &m);
        json_decref(acc);
        if (rc) return rc;
        acc = m;
    }
    *out = keep(j, acc);
    return VLLM_OK;
}

// ------------------------------------------------------------------ oneOf --

// Which JSON types a schema can produce (for oneOf's disjointness).
static int kinds(struct js *j, const json_t *s, int depth) {
    if (depth > 16 || deref(j, s, &s)) return T_ALL;
    if (!json_is_object(s)) return json_is_false(s) ? 0 : T_ALL;
    const json_t *c = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    if (c || json_is_array(e)) {
        int m = 0;
        size_t i;
        json_t *x;
        json_t *one = c ? json_pack("[O]", c) : NULL;
        json_array_foreach(c ? one : e, i, x) {
            if (json_is_null(x)) m |= T_NULL;
            else if (json_is_boolean(x)) m |= T_BOOL;
            else if (json_is_integer(x) || (json_is_real(x) && floor(json_real_value(x)) == json_real_value(x))) m |= T_INT;
            else if (json_is_number(x)) m |= T_NUM;
            else if (json_is_string(x)) m |= T_STR;
            else if (json_is_object(x)) m |= T_OBJ;
            else m |= T_ARR;
        }
        json_decref(one);
        return m;
    }
    int m = type_mask_of(json_object_get(s, "type"));
    if (m < 0) m = T_ALL;
    if (json_is_true(json_object_get(s, "nullable"))) m |= T_NULL;
    const char *alts[] = {"anyOf", "oneOf"};
    for (int a = 0; a < 2; a++) {
        const json_t *l = json_object_get(s, alts[a]);
        if (!json_is_array(l)) continue;
        int u = 0;
        size_t i;
        json_t *x;
        json_array_foreach(l, i, x) u |= kinds(j, x, depth + 1);
        m &= u;
    }
    return m;
}

// The values a branch's property may take when it is required and fixed
// by const / enum; NULL when it is not.
static const json_t *fixed_values(struct js *j, const json_t *branch, const char *prop, json_t **tmp) {
    *tmp = NULL;
    if (deref(j, branch, &branch) || !json_is_object(branch)) return NULL;
    int req = 0;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(branch, "required"), i, x) req |= json_is_string(x) && !strcmp(json_string_value(x), prop);
    const json_t *p = json_object_get(json_object_get(branch, "properties"), prop);
    if (!req || !p || deref(j, p, &p) || !json_is_object(p)) return NULL;
    if (json_object_get(p, "const")) return *tmp = json_pack("[O]", json_object_get(p, "const"));
    const json_t *e = json_object_get(p, "enum");
    return json_is_array(e) ? e : NULL;
}

static int disjoint_by(struct js *j, const json_t *l, const char *prop) {
    size_t n = json_array_size(l);
    for (size_t a = 0; a < n; a++)
        for (size_t b = a + 1; b < n; b++) {
            json_t *ta, *tb;
            const json_t *va = fixed_values(j, json_array_get(l, a), prop, &ta);
            const json_t *vb = fixed_values(j, json_array_get(l, b), prop, &tb);
            int ok = va && vb;
            size_t i, q;
            json_t *x, *y;
            if (ok) json_array_foreach(va, i, x) json_array_foreach(vb, q, y) if (json_equal(x, y)) ok = 0;
            json_decref(ta);
            json_decref(tb);
            if (!ok) return 0;
        }
    return 1;
}

static int check_oneof(struct js *j, const json_t *l) {
    size_t n = json_array_size(l);
    int seen = 0, overlap = 0;
    for (size_t i = 0; i < n; i++) {
        int k = kinds(j, json_array_get(l, i), 0);
        if (k & T_NUM) k |= T_INT; // a number branch also takes integers
        if (seen & k) overlap = 1;
        seen |= k;
    }
    if (!overlap) return VLLM_OK;
    // all objects: a required property with distinct const / enum values
    const json_t *first;
    if (!deref(j, json_array_get(l, 0), &first) && json_is_object(first)) {
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(first, "properties"), k, v) if (disjoint_by(j, l, k)) return VLLM_OK;
    }
    return js_err(j, "oneOf branches may match the same value (use anyOf, or give each branch a required "
                     "property with a distinct const)");
}

// ---------------------------------------------------------------- strings --

// A count keyword: def when absent. Maxima above `cap` become cap (fewer
// values, all valid); minima above it are an error.
static int get_count(struct js *j, const json_t *s, const char *k, int def, int cap, int *out) {
    const json_t *v = json_object_get(s, k);
    *out = def;
    if (!v) return VLLM_OK;
    double x = json_number_value(v);
    if (!json_is_number(v) || x < 0 || x != floor(x)) return js_err(j, "'%s' must be a non-negative integer", k);
    if (x > cap) {
        if (strncmp(k, "max", 3)) return js_err(j, "'%s' over %d is unsupported", k, cap);
        x = cap;
    }
    *out = (int)x;
    return VLLM_OK;
}

static int string_expr(struct js *j, const json_t *s, struct sg_expr **out) {
    struct sg_ir *ir = j->ir;
    const json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    int min, max;
    TRY(get_count(j, s, "minLength", 0, MAX_LENGTH, &min));
    TRY(get_count(j, s, "maxLength", -1, MAX_LENGTH, &max));
    if (max >= 0 && max < min) return js_err(j, "maxLength is below minLength");
    int limits = min > 0 || max >= 0;
    if ((fmt || pat) && limits) return js_err(j, "minLength / maxLength with pattern or format is unsupported");
    if (fmt && pat) return js_err(j, "pattern with format is unsupported");
    struct sg_expr *body = NULL;
    if (fmt) {
        if (!json_is_string(fmt)) return js_err(j, "'format' must be a string");
        for (size_t i = 0; i < sizeof FORMATS / sizeof *FORMATS; i++)
            if (!strcmp(FORMATS[i][0], json_string_value(fmt))) TRY(sg_regex_expr(ir, FORMATS[i][1], 1, &body));
        if (!body) return js_err(j, "unsupported format '%s'", json_string_value(fmt));
    } else if (pat) {
        if (!json_is_string(pat)) return js_err(j, "'pattern' must be a string");
        int rc = sg_regex_expr(ir, json_string_value(pat), 1, &body);
        if (rc) return js_err(j, "pattern: %s", vllm_last_error());
    } else if (limits) {
        body = sg_rep(ir, json_char(ir), min, max);
    } else {
        *out = string_rule(ir);
        return VLLM_OK;
    }
    *out = sg_seqv(ir, sg_lits(ir, "\""), body, sg_lits(ir, "\""), NULL);
    return VLLM_OK;
}

// ---------------------------------------------------------------- numbers --

static int bound(struct js *j, const json_t *s, const char *k, const char *ex_k, int upper, double *b, int *ex) {
    const json_t *v = json_object_get(s, k), *e = json_object_get(s, ex_k);
    *b = upper ? INFINITY : -INFINITY;
    *ex = 0;
    if (v && !json_is_number(v)) return js_err(j, "'%s' must be a number", k);
    if (v) *b = json_number_value(v);
    if (json_is_boolean(e)) *ex = json_is_true(e); // draft 4
    else if (e) {
        if (!json_is_number(e)) return js_err(j, "'%s' must be a number", ex_k);
        double x = json_number_value(e);
        if (upper ? x <= *b : x >= *b) *b = x, *ex = 1;
    }
    return VLLM_OK;
}

static int number_expr(struct js *j, const json_t *s, int integer, struct sg_expr **out) {
    double lo, hi;
    int elo, ehi;
    TRY(bound(j, s, "minimum", "exclusiveMinimum", 0, &lo, &elo));
    TRY(bound(j, s, "maximum", "exclusiveMaximum", 1, &hi, &ehi));
    if (isinf(lo) && isinf(hi)) {
        *out = number_rule(j->ir, integer);
        return VLLM_OK;
    }
    *out = sg_json_number_range(j->ir, integer, lo, elo, hi, ehi);
    if ((*out)->kind == SG_E_ALT && !(*out)->n) return js_err(j, "no number satisfies the bounds");
    return VLLM_OK;
}

// ---------------------------------------------------------------- objects --

// A JSON string key that is none of the names, as a string of plain
// characters (no escapes: an escape could spell a listed name another way).
// Over the names' code points: at position d, the key may end unless a name
// ends there, continue with a character no name has there and then anything,
// or follow the names that have that character.
static uint32_t *code_points(const char *s, int *n) {
    size_t len = strlen(s);
    uint32_t *cp = xmalloc((len + 1) * sizeof *cp);
    int k = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        int m = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        uint32_t v = m == 1 ? c : m == 2 ? c & 31 : m == 3 ? c & 15 : c & 7;
        for (int q = 1; q < m && i + (size_t)q < len; q++) v = v << 6 | ((unsigned char)s[i + (size_t)q] & 63);
        cp[k++] = v;
        i += (size_t)m;
    }
    *n = k;
    return cp;
}

static int plain_cp(uint32_t c) { return c >= 0x20 && c != '"' && c != '\\'; }

static struct sg_expr *key_rest(struct sg_ir *ir, uint32_t **names, const int *lens, const int *idx, int n, int d) {
    static const uint32_t NOT_PLAIN[6] = {0, 0x1F, '"', '"', '\\', '\\'};
    struct sg_expr *any = sg_rep(ir, sg_class(ir, NOT_PLAIN, 3, 1), 0, -1);
    struct sg_expr *alt = sg_alt(ir);
    uint32_t *ex = xmalloc(((size_t)n + 3) * 2 * sizeof *ex);
    int ne = 0, ends = 0;
    memcpy(ex, NOT_PLAIN, sizeof NOT_PLAIN);
    ne = 3;
    int *sub = xmalloc((size_t)n * sizeof *sub);
    for (int i = 0; i < n; i++) {
        int a = idx[i];
        if (lens[a] == d) {
            ends = 1;
            continue;
        }
        uint32_t c = names[a][d];
        int first = 1;
        for (int q = 0; q < i; q++)
            if (lens[idx[q]] > d && names[idx[q]][d] == c) first = 0;
        if (!first) continue;
        ex[2 * ne] = ex[2 * ne + 1] = c, ne++;
        int m = 0;
        for (int q = 0; q < n; q++)
            if (lens[idx[q]] > d && names[idx[q]][d] == c) sub[m++] = idx[q];
        char u[4];
        int ul = c < 0x80 ? (u[0] = (char)c, 1) : c < 0x800 ? (u[0] = (char)(0xC0 | c >> 6), u[1] = (char)(0x80 | (c & 63)), 2)
               : c < 0x10000 ? (u[0] = (char)(0xE0 | c >> 12), u[1] = (char)(0x80 | ((c >> 6) & 63)), u[2] = (char)(0x80 | (c & 63)), 3)
               : (u[0] = (char)(0xF0 | c >> 18), u[1] = (char)(0x80 | ((c >> 12) & 63)), u[2] = (char)(0x80 | ((c >> 6) & 63)),
                  u[3] = (char)(0x80 | (c & 63)), 4);
        sg_push(alt, sg_seqv(ir, sg_lit(ir, u, (size_t)ul), key_rest(ir, names, lens, sub, m, d + 1), NULL));
    }
    sg_push(alt, sg_seqv(ir, sg_class(ir, ex, ne, 1), any, NULL));
    if (!ends) sg_push(alt, sg_empty(ir));
    free(ex);
    free(sub);
    return alt;
}

static struct sg_expr *key_except(struct sg_ir *ir, const char *const *names, int n) {
    uint32_t **cps = xmalloc((size_t)n * sizeof *cps + 1);
    int *lens = xmalloc((size_t)n * sizeof *lens + 1), *idx = xmalloc((size_t)n * sizeof *idx + 1), m = 0;
    for (int i = 0; i < n; i++) {
        cps[i] = code_points(names[i], &lens[i]);
        int plain = 1;
        for (int q = 0; q < lens[i]; q++) plain &= plain_cp(cps[i][q]);
        if (plain) idx[m++] = i; // a name with an escaped character is never a plain key
    }
    struct sg_expr *e = sg_seqv(ir, sg_lits(ir, "\""), key_rest(ir, cps, lens, idx, m, 0), sg_lits(ir, "\""), NULL);
    for (int i = 0; i < n; i++) free(cps[i]);
    free(cps);
    free(lens);
    free(idx);
    return e;
}

struct prop {
    const char *name;
    const json_t *schema;
    int required;
};

// Members i.. of an object, `e`: a member came before (a comma is due).
// Rules T(i, e) keep the size linear in the number of optional members.
struct obj {
    struct js *j;
    struct prop *p;
    int n;
    struct sg_expr **kv; // [n] member i: "name" ws ":" ws value ws
    struct sg_expr *extra; // an additional member, or NULL
    int rules[2][64];
};

static struct sg_expr *sep(struct sg_ir *ir) { return sg_seqv(ir, sg_lits(ir, ","), sg_json_ws(ir), NULL); }

static struct sg_expr *members(struct obj *o, int i, int e) {
    struct sg_ir *ir = o->j->ir;
    if (i == o->n) {
        if (!o->extra) return sg_empty(ir);
        struct sg_expr *more = sg_rep(ir, sg_seqv(ir, sep(ir), o->extra, NULL), 0, -1);
        return e ? more : sg_opt(ir, sg_seqv(ir, o->extra, more, NULL));
    }
    if (i < 64 && o->rules[e][i] >= 0) return sg_ref(ir, o->rules[e][i]);
    struct sg_expr *take = sg_seqv(ir, e ? sep(ir) : sg_empty(ir), o->kv[i], members(o, i + 1, 1), NULL);
    struct sg_expr *body = o->p[i].required ? take : sg_altv(ir, take, members(o, i + 1, e), NULL);
    if (i >= 64) return body;
    int r = sg_ir_fresh(ir, "object-members");
    sg_ir_define(ir, r, body);
    o->rules[e][i] = r;
    return sg_ref(ir, r);
}

static int object_expr(struct js *j, const json_t *s, struct sg_expr **out) {
    struct sg_ir *ir = j->ir;
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return js_err(j, "'properties' must be an object");
    if (req && !json_is_array(req)) return js_err(j, "'required' must be an array");
    int n = (int)json_object_size(props) + (int)json_array_size(req);
    struct obj o = {j, xcalloc((size_t)n + 1, sizeof *o.p), 0, NULL, NULL, {{0}}};
    memset(o.rules, -1, sizeof o.rules);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)props, k, v) o.p[o.n++] = (struct prop){k, v, 0};
    size_t i;
    json_array_foreach(req, i, v) {
        if (!json_is_string(v)) {
            free(o.p);
            return js_err(j, "'required' must list strings");
        }
        int found = 0;
        for (int q = 0; q < o.n; q++)
            if (!strcmp(o.p[q].name, json_string_value(v))) o.p[q].required = found = 1;
        if (!found) o.p[o.n++] = (struct prop){json_string_value(v), json_true(), 1}; // any value
    }
    o.kv = xcalloc((size_t)o.n + 1, sizeof *o.kv);
    int rc = VLLM_OK;
    for (int q = 0; q < o.n && !rc; q++) {
        size_t mark = path_push(j, "properties", o.p[q].name);
        struct sg_expr *val;
        rc = schema_expr(j, o.p[q].schema, &val);
        path_pop(j, mark);
        if (rc) break;
        json_t *key = json_string(o.p[q].name);
        o.kv[q] = sg_seqv(ir, json_text(ir, key), sg_json_ws(ir), sg_lits(ir, ":"), sg_json_ws(ir), val,
                          sg_json_ws(ir), NULL);
        json_decref(key);
    }
    if (!rc && add && !json_is_false(add)) {
        struct sg_expr *val;
        size_t mark = path_push(j, "additionalProperties", NULL);
        rc = schema_expr(j, add, &val);
        path_pop(j, mark);
        if (!rc) {
            const char **names = xmalloc((size_t)o.n * sizeof *names + 1);
            for (int q = 0; q < o.n; q++) names[q] = o.p[q].name;
            struct sg_expr *key = o.n ? key_except(ir, names, o.n) : string_rule(ir);
            free(names);
            o.extra = sg_seqv(ir, key, sg_json_ws(ir), sg_lits(ir, ":"), sg_json_ws(ir), val, sg_json_ws(ir), NULL);
        }
    }
    if (!rc) *out = sg_seqv(ir, sg_lits(ir, "{"), sg_json_ws(ir), members(&o, 0, 0), sg_lits(ir, "}"), NULL);
    free(o.p);
    free(o.kv);
    return rc;
}

// ----------------------------------------------------------------- arrays --

static int array_expr(struct js *j, const json_t *s, struct sg_expr **out) {
    struct sg_ir *ir = j->ir;
    const json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    const json_t *more = json_object_get(s, "additionalItems");
    if (json_is_array(items)) { // draft 2019 tuples: items [..] + additionalItems
        if (prefix) return js_err(j, "'items' as an array with 'prefixItems'");
        prefix = items;
        items = more;
    } else if (more) {
        return js_err(j, "'additionalItems' without an 'items' array");
    }
    if (prefix && !json_is_array(prefix)) return js_err(j, "'prefixItems' must be an array");
    int min, max;
    TRY(get_count(j, s, "minItems", 0, MAX_ITEMS, &min));
    TRY(get_count(j, s, "maxItems", -1, MAX_ITEMS, &max));
    if (max >= 0 && max < min) return js_err(j, "maxItems is below minItems");
    int k = (int)json_array_size(prefix);
    if (max >= 0 && k > max) k = max;
    // the rest: items schema; absent after prefixItems (strict) or false: none
    int rest = !json_is_false(items) && !(prefix && !items);
    struct sg_expr *r = NULL;
    if (rest) {
        size_t mark = path_push(j, "items", NULL);
        int rc = schema_expr(j, items ? items : json_true(), &r);
        path_pop(j, mark);
        TRY(rc);
        if (min > 2 || max > 2) { // unrolled copies: one call each, not the item's whole automaton
            int rr = sg_ir_fresh(ir, "array-item");
            sg_ir_define(ir, rr, r);
            sg_ir_keep(ir, rr);
            r = sg_ref(ir, rr);
        }
    }
    if (!rest && min > k) return js_err(j, "minItems needs more items than prefixItems allows");
    struct sg_expr **el = xcalloc((size_t)k + 1, sizeof *el);
    for (int i = 0; i < k; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%d", i);
        size_t mark = path_push(j, "prefixItems", idx);
        int rc = schema_expr(j, json_array_get(prefix, (size_t)i), &el[i]);
        path_pop(j, mark);
        if (rc) {
            free(el);
            return rc;
        }
    }
    // tail(i): elements from position i on, i >= 1 elements before
    int rmin = MAX(0, min - k), rmax = !rest ? 0 : max < 0 ? -1 : max - k;
    struct sg_expr *ws = sg_json_ws(ir);
    struct sg_expr *tail = rest && rmax ? sg_rep(ir, sg_seqv(ir, sep(ir), r, ws, NULL), rmin, rmax) : sg_empty(ir);
    for (int i = k - 1; i >= 1; i--) {
        struct sg_expr *t = sg_seqv(ir, sep(ir), el[i], sg_json_ws(ir), tail, NULL);
        tail = i >= min ? sg_opt(ir, t) : t;
    }
    struct sg_expr *body;
    if (k) body = sg_seqv(ir, el[0], sg_json_ws(ir), tail, NULL);
    else if (rest && max != 0)
        body = sg_seqv(ir, r, sg_json_ws(ir),
                       sg_rep(ir, sg_seqv(ir, sep(ir), r, sg_json_ws(ir), NULL), MAX(0, min - 1), max < 0 ? -1 : max - 1),
                       NULL);
    else body = NULL;
    if (body && min == 0) body = sg_opt(ir, body);
    *out = sg_seqv(ir, sg_lits(ir, "["), sg_json_ws(ir), body ? body : sg_empty(ir), sg_lits(ir, "]"), NULL);
    free(el);
    return VLLM_OK;
}

// ------------------------------------------------------------- dispatch --

static int type_expr(struct js *j, int t, const json_t *s, struct sg_expr **out) {
    struct sg_ir *ir = j->ir;
    switch (t) {
    case T_NULL: *out = sg_lits(ir, "null"); return VLLM_OK;
    case T_BOOL: *out = sg_altv(ir, sg_lits(ir, "true"), sg_lits(ir, "false"), NULL); return VLLM_OK;
    case T_INT: return number_expr(j, s, 1, out);
    case T_NUM: return number_expr(j, s, 0, out);
    case T_STR: return string_expr(j, s, out);
    case T_OBJ: return object_expr(j, s, out);
    case T_ARR: return array_expr(j, s, out);
    }
    return js_err(j, "internal: type %d", t);
}

// The types a schema without "type" is restricted to by its keywords
// (strict, as xgrammar: {"properties": ...} means an object).
static int implied_types(const json_t *s) {
    static const char *const OBJ[] = {"properties", "required", "additionalProperties", NULL};
    static const char *const ARR[] = {"items", "prefixItems", "minItems", "maxItems", "additionalItems", NULL};
    static const char *const STR[] = {"minLength", "maxLength", "pattern", "format", NULL};
    static const char *const NUM[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
    const char *const *groups[] = {OBJ, ARR, STR, NUM};
    const int bits[] = {T_OBJ, T_ARR, T_STR, T_NUM};
    int m = 0;
    for (int g = 0; g < 4; g++)
        for (const char *const *k = groups[g]; *k; k++)
            if (json_object_get(s, *k)) m |= bits[g];
    return m;
}

static int enum_expr(struct js *j, const json_t *s, int types, struct sg_expr **out) {
    const json_t *c = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    if (e && !json_is_array(e)) return js_err(j, "'enum' must be an array");
    if (constrains(s, "const enum type nullable")) return js_err(j, "enum / const with other constraints is unsupported");
    struct sg_expr *alt = sg_alt(j->ir);
    json_t *one = c ? json_pack("[O]", c) : NULL;
    size_t i;
    json_t *x;
    json_array_foreach(c ? one : e, i, x) {
        int k = json_is_null(x) ? T_NULL : json_is_boolean(x) ? T_BOOL : json_is_integer(x) ? T_INT | T_NUM
              : json_is_number(x) ? T_NUM : json_is_string(x) ? T_STR : json_is_object(x) ? T_OBJ : T_ARR;
        if (json_is_real(x) && floor(json_real_value(x)) == json_real_value(x)) k |= T_INT;
        if (!(k & types)) continue;
        if (e && c && !json_equal(c, x)) continue;
        sg_push(alt, json_text(j->ir, x));
    }
    json_decref(one);
    if (c && e) { // both: the const, if the enum has it
        int in = 0;
        json_array_foreach(e, i, x) in |= json_equal(x, c);
        if (!in) alt->n = 0;
    }
    if (!alt->n) return js_err(j, "no value satisfies enum / const");
    *out = alt;
    return VLLM_OK;
}

static int schema_body(struct js *j, const json_t *s, struct sg_expr **out) {
    struct sg_ir *ir = j->ir;
    if (json_is_true(s)) {
        *out = value_rule(ir);
        return VLLM_OK;
    }
    if (json_is_false(s)) return js_err(j, "the schema false matches nothing");
    if (!json_is_object(s)) return js_err(j, "a schema must be an object or a boolean");
    TRY(check_keywords(j, s));
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return js_err(j, "'$ref' must be a string");
        if (constrains(s, "$ref")) return js_err(j, "$ref with other constraining keywords is unsupported");
        return ref_expr(j, json_string_value(ref), out);
    }
    TRY(fold_allof(j, s, &s));
    const json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any && one) return js_err(j, "anyOf with oneOf is unsupported");
    if (any || one) {
        const json_t *l = any ? any : one;
        if (!json_is_array(l) || !json_array_size(l)) return js_err(j, "%s must be a non-empty array", any ? "anyOf" : "oneOf");
        if (one) TRY(check_oneof(j, one));
        json_t *rest = json_deep_copy(s); // the siblings apply to every branch
        json_object_del(rest, any ? "anyOf" : "oneOf");
        int siblings = constrains(rest, NULL);
        struct sg_expr *alt = sg_alt(ir);
        size_t i;
        json_t *b;
        int rc = VLLM_OK;
        json_array_foreach(l, i, b) {
            char idx[24];
            snprintf(idx, sizeof idx, "%zu", i);
            size_t mark = path_push(j, any ? "anyOf" : "oneOf", idx);
            const json_t *br = b;
            if (siblings) {
                json_t *m;
                rc = merge(j, rest, b, &m);
                if (!rc) br = keep(j, m);
            }
            struct sg_expr *e;
            if (!rc) rc = schema_expr(j, br, &e);
            path_pop(j, mark);
            if (rc) break;
            sg_push(alt, e);
        }
        json_decref(rest);
        if (!rc) *out = alt;
        return rc;
    }
    int types = type_mask_of(json_object_get(s, "type"));
    if (types < 0) return js_err(j, "bad 'type'");
    if (!json_object_get(s, "type")) types = implied_types(s);
    if (json_object_get(s, "const") || json_object_get(s, "enum"))
        return enum_expr(j, s, types ? types : T_ALL, out);
    if (!json_object_get(s, "type") && !types) {
        *out = value_rule(ir);
        if (json_is_true(json_object_get(s, "nullable"))) *out = sg_altv(ir, *out, sg_lits(ir, "null"), NULL);
        return VLLM_OK;
    }
    if (json_is_true(json_object_get(s, "nullable"))) types |= T_NULL;
    if ((types & T_NUM) && (types & T_INT)) types &= ~T_INT; // a number covers integers
    struct sg_expr *alt = sg_alt(ir);
    for (int b = 0; b < 7; b++) {
        if (!(types & (1 << b))) continue;
        struct sg_expr *e;
        TRY(type_expr(j, 1 << b, s, &e));
        sg_push(alt, e);
    }
    *out = alt->n == 1 ? alt->sub[0] : alt;
    return VLLM_OK;
}

static int schema_expr(struct js *j, const json_t *s, struct sg_expr **out) {
    if (++j->depth > MAX_DEPTH) return js_err(j, "nested more than %d levels", MAX_DEPTH);
    int rc = schema_body(j, s, out);
    j->depth--;
    return rc;
}

int sg_json_schema_expr(struct sg_ir *ir, const json_t *schema, struct sg_expr **out) {
    struct js j = {ir, schema, NULL, NULL, 0, 0, 0, "", json_array()};
    int rc = schema ? schema_expr(&j, schema, out) : vllm_err(VLLM_ERR_INVALID_ARGUMENT, "JSON schema: none given");
    for (int i = 0; i < j.n_refs; i++) free(j.ref_key[i]);
    free(j.ref_key);
    free(j.ref_rule);
    json_decref(j.owned);
    return rc;
}

static int compile_root(struct sg_ir *ir, struct sg_expr *e, struct sg_grammar **out) {
    int root = sg_ir_rule(ir, "root");
    sg_ir_define(ir, root, e);
    int rc = sg_grammar_build(ir, root, out);
    sg_ir_free(ir);
    return rc;
}

int sg_compile_json_schema(const json_t *schema, struct sg_grammar **out) {
    *out = NULL;
    struct sg_ir *ir = sg_ir_create();
    struct sg_expr *e;
    int rc = sg_json_schema_expr(ir, schema, &e);
    if (rc) {
        sg_ir_free(ir);
        return rc;
    }
    return compile_root(ir, e, out);
}

int sg_compile_json_object(struct sg_grammar **out) {
    *out = NULL;
    struct sg_ir *ir = sg_ir_create();
    value_rule(ir);
    return compile_root(ir, sg_ref(ir, sg_ir_rule(ir, "json-object")), out);
}

int sg_compile_choice(const char *const *choices, int n, struct sg_grammar **out) {
    *out = NULL;
    if (n <= 0) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "choice: no choices");
    struct sg_ir *ir = sg_ir_create();
    struct sg_expr *alt = sg_alt(ir);
    for (int i = 0; i < n; i++) {
        if (!choices[i]) {
            sg_ir_free(ir);
            return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "choice %d is not a string", i);
        }
        sg_push(alt, sg_lits(ir, choices[i]));
    }
    return compile_root(ir, alt, out);
}
