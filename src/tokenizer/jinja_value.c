// jinja_value.c - reference-counted values of the Jinja interpreter, their
// conversion from JSON, printing, tojson, equality and ordering; scopes and
// the render context's error and budget helpers.
#include <math.h>
#include <utf8proc.h>

#include "tokenizer/jinja_internal.h"

struct jv jv_undef_v = {.refs = -1, .type = JV_UNDEF};
struct jv jv_none_v = {.refs = -1, .type = JV_NONE};
struct jv jv_true_v = {.refs = -1, .type = JV_BOOL, .u.b = 1};
struct jv jv_false_v = {.refs = -1, .type = JV_BOOL, .u.b = 0};

// Values whose count reached zero wait here, so that freeing a long chain
// (arrays of arrays, namespaces pointing at namespaces) loops instead of
// recursing once per link.
static _Thread_local struct jv *pending_free;
static _Thread_local int draining;

struct jv *jv_retain(struct jv *v) {
    if (v && v->refs >= 0) v->refs++;
    return v;
}

static void ns_unlink(struct jv *v) {
    struct jctx *c = v->u.o.ctx;
    if (!c) return;
    if (v->u.o.reg_prev) v->u.o.reg_prev->u.o.reg_next = v->u.o.reg_next;
    else c->namespaces = v->u.o.reg_next;
    if (v->u.o.reg_next) v->u.o.reg_next->u.o.reg_prev = v->u.o.reg_prev;
}

static void jv_destroy(struct jv *v) {
    switch (v->type) {
    case JV_STR:
        if (v->u.s.p != (char *)(v + 1)) free(v->u.s.p);
        break;
    case JV_ARRAY:
        for (int i = 0; i < v->u.a.n; i++) jv_release(v->u.a.v[i]);
        free(v->u.a.v);
        break;
    case JV_NS:
        ns_unlink(v);
        // fallthrough
    case JV_OBJECT:
        for (int i = 0; i < v->u.o.n; i++) {
            jv_release(v->u.o.kv[i].key);
            jv_release(v->u.o.kv[i].val);
        }
        free(v->u.o.kv);
        break;
    case JV_FUNC:
        jv_release(v->u.fn.self);
        if (v->u.fn.scope) jscope_release(v->u.fn.scope);
        break;
    default: break;
    }
    free(v);
}

void jv_release(struct jv *v) {
    if (!v || v->refs < 0 || --v->refs > 0) return;
    v->next_free = pending_free;
    pending_free = v;
    if (draining) return;
    draining = 1;
    while (pending_free) {
        struct jv *x = pending_free;
        pending_free = x->next_free;
        jv_destroy(x);
    }
    draining = 0;
}

static struct jv *jv_alloc(int type, size_t extra) {
    struct jv *v = xcalloc(1, sizeof *v + extra);
    v->refs = 1;
    v->type = (uint8_t)type;
    return v;
}

struct jv *jv_bool(int b) { return b ? &jv_true_v : &jv_false_v; }

struct jv *jv_int(int64_t i) {
    struct jv *v = jv_alloc(JV_INT, 0);
    v->u.i = i;
    return v;
}

struct jv *jv_float(double f) {
    struct jv *v = jv_alloc(JV_FLOAT, 0);
    v->u.f = f;
    return v;
}

struct jv *jv_str(const char *p, size_t len) {
    struct jv *v = jv_alloc(JV_STR, len + 1);
    v->u.s.p = (char *)(v + 1);
    v->u.s.len = len;
    if (len) memcpy(v->u.s.p, p, len);
    v->u.s.p[len] = 0;
    return v;
}

struct jv *jv_strz(const char *p) { return jv_str(p, strlen(p)); }

struct jv *jv_str_take(char *p, size_t len) {
    struct jv *v = jv_alloc(JV_STR, 0);
    v->u.s.p = p;
    v->u.s.len = len;
    return v;
}

struct jv *jv_array_new(int n) {
    struct jv *v = jv_alloc(JV_ARRAY, 0);
    v->u.a.n = n;
    v->u.a.v = xcalloc(n > 0 ? (size_t)n : 1, sizeof(struct jv *));
    return v;
}

struct jv *jv_object_new(void) { return jv_alloc(JV_OBJECT, 0); }

struct jv *jv_namespace_new(struct jctx *c) {
    struct jv *v = jv_alloc(JV_NS, 0);
    v->u.o.ctx = c;
    v->u.o.reg_next = c->namespaces;
    if (c->namespaces) c->namespaces->u.o.reg_prev = v;
    c->namespaces = v;
    return v;
}

struct jv *jv_object_get(const struct jv *o, const char *key, size_t len) {
    for (int i = 0; i < o->u.o.n; i++) {
        const struct jv *k = o->u.o.kv[i].key;
        if (k->u.s.len == len && !memcmp(k->u.s.p, key, len)) return o->u.o.kv[i].val;
    }
    return NULL;
}

void jv_object_put(struct jv *o, struct jv *key, struct jv *val) {
    for (int i = 0; i < o->u.o.n; i++) {
        struct jv *k = o->u.o.kv[i].key;
        if (k->u.s.len == key->u.s.len && !memcmp(k->u.s.p, key->u.s.p, k->u.s.len)) {
            jv_release(key);
            jv_release(o->u.o.kv[i].val);
            o->u.o.kv[i].val = val;
            return;
        }
    }
    xgrow((void **)&o->u.o.kv, &o->u.o.cap, o->u.o.n + 1, sizeof(struct jv_kv));
    o->u.o.kv[o->u.o.n].key = key;
    o->u.o.kv[o->u.o.n].val = val;
    o->u.o.n++;
}

struct jv *jv_func_builtin(int id) {
    struct jv *v = jv_alloc(JV_FUNC, 0);
    v->u.fn.kind = JF_BUILTIN;
    v->u.fn.id = id;
    return v;
}

struct jv *jv_method(struct jv *self, const char *name) {
    struct jv *v = jv_alloc(JV_FUNC, 0);
    v->u.fn.kind = JF_METHOD;
    v->u.fn.self = jv_retain(self);
    v->u.fn.name = name;
    return v;
}

int jv_truthy(const struct jv *v) {
    switch (v->type) {
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0;
    case JV_STR: return v->u.s.len > 0;
    case JV_ARRAY: return v->u.a.n > 0;
    case JV_OBJECT: return v->u.o.n > 0;
    case JV_NS:
    case JV_FUNC: return 1;
    default: return 0;
    }
}

const char *jv_type_name(const struct jv *v) {
    static const char *names[] = {"undefined", "none",   "boolean",   "integer", "float",
                                  "string",    "list",   "dict",      "namespace", "function"};
    return names[v->type];
}

// ----------------------------------------------------------------- UTF-8 --

int jv_utf8_next(const char *s, size_t len, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    int n = u[0] < 0x80 ? 1 : u[0] < 0xc2 ? 0 : u[0] < 0xe0 ? 2 : u[0] < 0xf0 ? 3 : u[0] < 0xf5 ? 4 : 0;
    if (n == 0 || (size_t)n > len) {
        *cp = u[0];
        return 1;
    }
    uint32_t c = n == 1 ? u[0] : n == 2 ? (u[0] & 0x1fu) : n == 3 ? (u[0] & 0x0fu) : (u[0] & 0x07u);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xc0) != 0x80) {
            *cp = u[0];
            return 1;
        }
        c = (c << 6) | (u[i] & 0x3fu);
    }
    if ((n == 3 && (c < 0x800 || (c >= 0xd800 && c < 0xe000))) || (n == 4 && (c < 0x10000 || c > 0x10ffff))) {
        *cp = u[0];
        return 1;
    }
    *cp = c;
    return n;
}

size_t jv_utf8_count(const char *s, size_t len) {
    size_t n = 0;
    uint32_t cp;
    for (size_t i = 0; i < len; n++) i += (size_t)jv_utf8_next(s + i, len - i, &cp);
    return n;
}

size_t jv_utf8_put(char *o, uint32_t c) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xc0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xe0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        o[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3f));
    o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

// Python's str.isspace(): what strip(), split() and {%- -%} remove.
int jv_ws_len(const char *s, size_t len) {
    unsigned char b = (unsigned char)s[0];
    if (b < 0x80) return (b == ' ' || (b >= 9 && b <= 13) || (b >= 0x1c && b <= 0x1f)) ? 1 : 0;
    uint32_t c;
    int n = jv_utf8_next(s, len, &c);
    if (n == 1) return 0;
    int ws = c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 ||
             c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
    return ws ? n : 0;
}

// ---------------------------------------------------------------- floats --

void jv_fmt_float(double f, char *buf, size_t cap) {
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f > 0 ? "inf" : "-inf");
        return;
    }
    if (f == 0) {
        snprintf(buf, cap, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    // Shortest digits that read back as f, then Python's layout rules.
    char tmp[48];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    const char *q = tmp;
    int neg = *q == '-';
    if (neg) q++;
    char dig[24];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    int e = atoi(q + 1);
    char out[64];
    size_t k = 0;
    if (neg) out[k++] = '-';
    if (e >= -4 && e < 16) {
        if (e < 0) {
            out[k++] = '0';
            out[k++] = '.';
            for (int i = 0; i < -e - 1; i++) out[k++] = '0';
            for (int i = 0; i < nd; i++) out[k++] = dig[i];
        } else {
            for (int i = 0; i <= e; i++) out[k++] = i < nd ? dig[i] : '0';
            out[k++] = '.';
            if (nd > e + 1)
                for (int i = e + 1; i < nd; i++) out[k++] = dig[i];
            else out[k++] = '0';
        }
        out[k] = 0;
    } else {
        out[k++] = dig[0];
        if (nd > 1) {
            out[k++] = '.';
            for (int i = 1; i < nd; i++) out[k++] = dig[i];
        }
        snprintf(out + k, sizeof out - k, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    snprintf(buf, cap, "%s", out);
}

// -------------------------------------------------------- render context --

void *jerr(struct jctx *c, int status, const struct jnode *at, const char *fmt, ...) {
    if (c->status) return NULL;
    c->status = status;
    int n = 0;
    if (at && c->t) {
        int line, col;
        jinja_line_col(c->t, at->pos, &line, &col);
        n = snprintf(c->msg, sizeof c->msg, "line %d:%d: ", line, col);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg + n, sizeof c->msg - (size_t)n, fmt, ap);
    va_end(ap);
    return NULL;
}

int jctx_step(struct jctx *c, const struct jnode *at, int64_t n) {
    if (c->status) return -1;
    c->steps += n;
    if (c->steps > c->opts.max_steps) {
        jerr(c, VLLM_ERR_TOO_LONG, at, "template exceeded %lld evaluation steps",
             (long long)c->opts.max_steps);
        return -1;
    }
    return 0;
}

int jbuf_add(struct jctx *c, struct jbuf *b, const char *s, size_t n) {
    if (c->status) return -1;
    if (n > c->opts.max_output || b->len > c->opts.max_output - n) {
        jerr(c, VLLM_ERR_TOO_LONG, NULL, "template output (or a string in it) exceeds %zu bytes",
             c->opts.max_output);
        return -1;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int jbuf_addz(struct jctx *c, struct jbuf *b, const char *s) { return jbuf_add(c, b, s, strlen(s)); }

struct jv *jbuf_to_str(struct jbuf *b) {
    if (!b->p) return jv_str("", 0);
    struct jv *v = jv_str_take(b->p, b->len);
    b->p = NULL;
    b->len = b->cap = 0;
    return v;
}

// ------------------------------------------------------------- from JSON --

struct jv *jv_from_json(struct jctx *c, const json_t *j, int depth) {
    if (depth > JINJA_MAX_NEST)
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, NULL, "request JSON nested deeper than %d", JINJA_MAX_NEST);
    if (!j) return JV_UNDEFINED;
    switch (json_typeof(j)) {
    case JSON_NULL: return JV_NONEV;
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    case JSON_INTEGER: return jv_int(json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_STRING: return jv_str(json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        struct jv *a = jv_array_new((int)n);
        for (size_t i = 0; i < n; i++) {
            a->u.a.v[i] = jv_from_json(c, json_array_get(j, i), depth + 1);
            if (!a->u.a.v[i]) {
                a->u.a.n = (int)i;
                jv_release(a);
                return NULL;
            }
        }
        return a;
    }
    case JSON_OBJECT: {
        struct jv *o = jv_object_new();
        for (void *it = json_object_iter((json_t *)j); it; it = json_object_iter_next((json_t *)j, it)) {
            struct jv *val = jv_from_json(c, json_object_iter_value(it), depth + 1);
            if (!val) {
                jv_release(o);
                return NULL;
            }
            jv_object_put(o, jv_str(json_object_iter_key(it), json_object_iter_key_len(it)), val);
        }
        return o;
    }
    }
    return JV_UNDEFINED;
}

// -------------------------------------------------------- printing, JSON --

static int jstr_json(struct jctx *c, struct jbuf *b, const char *s, size_t len, int ascii) {
    if (jbuf_add(c, b, "\"", 1)) return -1;
    size_t run = 0; // start of the pending run of bytes copied as they are
    for (size_t i = 0; i < len;) {
        unsigned char ch = (unsigned char)s[i];
        char esc[16];
        size_t el = 0;
        int step = 1;
        if (ch == '"' || ch == '\\') el = (size_t)snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch == '\n') el = 2, memcpy(esc, "\\n", 2);
        else if (ch == '\r') el = 2, memcpy(esc, "\\r", 2);
        else if (ch == '\t') el = 2, memcpy(esc, "\\t", 2);
        else if (ch == '\b') el = 2, memcpy(esc, "\\b", 2);
        else if (ch == '\f') el = 2, memcpy(esc, "\\f", 2);
        else if (ch < 0x20) el = (size_t)snprintf(esc, sizeof esc, "\\u%04x", ch);
        else if (ascii && ch >= 0x7f) {
            uint32_t cp;
            step = jv_utf8_next(s + i, len - i, &cp);
            if (step == 1 && ch >= 0x80) cp = 0xfffd;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                el = (size_t)snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            } else el = (size_t)snprintf(esc, sizeof esc, "\\u%04x", cp);
        }
        if (el) {
            if (jbuf_add(c, b, s + run, i - run) || jbuf_add(c, b, esc, el)) return -1;
            run = i + (size_t)step;
        }
        i += (size_t)step;
    }
    if (jbuf_add(c, b, s + run, len - run)) return -1;
    return jbuf_add(c, b, "\"", 1);
}

static int json_pad(struct jctx *c, struct jbuf *b, const struct jv_json_opts *o, int depth) {
    if (jbuf_add(c, b, "\n", 1)) return -1;
    for (int i = 0; i < depth * o->indent; i++)
        if (jbuf_add(c, b, " ", 1)) return -1;
    return 0;
}

static int key_cmp(const void *x, const void *y) {
    const struct jv *a = ((const struct jv_kv *)x)->key, *b = ((const struct jv_kv *)y)->key;
    size_t n = MIN(a->u.s.len, b->u.s.len);
    int r = memcmp(a->u.s.p, b->u.s.p, n);
    return r ? r : (a->u.s.len > b->u.s.len) - (a->u.s.len < b->u.s.len);
}

static int jobj_json(struct jctx *c, struct jbuf *b, const struct jv *v, const struct jv_json_opts *o,
                       int depth, const struct jnode *at) {
    int pretty = o->indent >= 0, n = v->u.o.n;
    const char *isep = o->item_sep ? o->item_sep : pretty ? "," : ", ";
    const char *ksep = o->key_sep ? o->key_sep : ": ";
    struct jv_kv *kv = v->u.o.kv, *sorted = NULL;
    if (o->sort_keys && n > 1) {
        sorted = xmalloc((size_t)n * sizeof *sorted);
        memcpy(sorted, kv, (size_t)n * sizeof *sorted);
        qsort(sorted, (size_t)n, sizeof *sorted, key_cmp);
        kv = sorted;
    }
    int rc = jbuf_add(c, b, "{", 1);
    for (int i = 0; i < n && !rc; i++) {
        if (i) rc = jbuf_addz(c, b, isep);
        if (!rc && pretty) rc = json_pad(c, b, o, depth + 1);
        if (!rc) rc = jstr_json(c, b, kv[i].key->u.s.p, kv[i].key->u.s.len, o->ensure_ascii);
        if (!rc) rc = jbuf_addz(c, b, ksep);
        if (!rc) rc = jv_tojson(c, b, kv[i].val, o, depth + 1, at);
    }
    if (!rc && pretty && n) rc = json_pad(c, b, o, depth);
    if (!rc) rc = jbuf_add(c, b, "}", 1);
    free(sorted);
    return rc;
}

int jv_tojson(struct jctx *c, struct jbuf *b, const struct jv *v, const struct jv_json_opts *o,
              int depth, const struct jnode *at) {
    char num[64];
    if (depth > JINJA_MAX_NEST) {
        jerr(c, VLLM_ERR_TOO_LONG, at, "value nested deeper than %d (or containing itself)", JINJA_MAX_NEST);
        return -1;
    }
    if (jctx_step(c, at, 1)) return -1;
    switch (v->type) {
    case JV_UNDEF: return jbuf_addz(c, b, o->undefined_null ? "null" : "undefined");
    case JV_NONE: return jbuf_addz(c, b, "null");
    case JV_BOOL: return jbuf_addz(c, b, v->u.b ? "true" : "false");
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v->u.i);
        return jbuf_addz(c, b, num);
    case JV_FLOAT:
        if (isnan(v->u.f)) return jbuf_addz(c, b, "NaN");
        if (isinf(v->u.f)) return jbuf_addz(c, b, v->u.f > 0 ? "Infinity" : "-Infinity");
        jv_fmt_float(v->u.f, num, sizeof num);
        return jbuf_addz(c, b, num);
    case JV_STR: return jstr_json(c, b, v->u.s.p, v->u.s.len, o->ensure_ascii);
    case JV_ARRAY: {
        int pretty = o->indent >= 0;
        const char *isep = o->item_sep ? o->item_sep : pretty ? "," : ", ";
        if (jbuf_add(c, b, "[", 1)) return -1;
        for (int i = 0; i < v->u.a.n; i++) {
            if (i && jbuf_addz(c, b, isep)) return -1;
            if (pretty && json_pad(c, b, o, depth + 1)) return -1;
            if (jv_tojson(c, b, v->u.a.v[i], o, depth + 1, at)) return -1;
        }
        if (pretty && v->u.a.n && json_pad(c, b, o, depth)) return -1;
        return jbuf_add(c, b, "]", 1);
    }
    case JV_OBJECT:
    case JV_NS: return jobj_json(c, b, v, o, depth, at);
    default:
        jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "a function cannot be converted to JSON or printed");
        return -1;
    }
}

int jv_display(struct jctx *c, struct jbuf *b, const struct jv *v, const struct jnode *at) {
    char num[64];
    switch (v->type) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return jbuf_addz(c, b, v->u.b ? "true" : "false");
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v->u.i);
        return jbuf_addz(c, b, num);
    case JV_FLOAT:
        jv_fmt_float(v->u.f, num, sizeof num);
        return jbuf_addz(c, b, num);
    case JV_STR: return jbuf_add(c, b, v->u.s.p, v->u.s.len);
    default: {
        // Containers print as JSON, as in @huggingface/jinja.
        struct jv_json_opts o = {.indent = -1};
        return jv_tojson(c, b, v, &o, 0, at);
    }
    }
}

struct jv *jv_display_str(struct jctx *c, struct jv *v, const struct jnode *at) {
    if (v->type == JV_STR) return jv_retain(v);
    struct jbuf b = {0};
    if (jv_display(c, &b, v, at)) {
        free(b.p);
        return NULL;
    }
    return jbuf_to_str(&b);
}

// ------------------------------------------------- equality and ordering --

static int numeric(const struct jv *v) { return v->type == JV_INT || v->type == JV_FLOAT || v->type == JV_BOOL; }
static double num_of(const struct jv *v) {
    return v->type == JV_FLOAT ? v->u.f : v->type == JV_INT ? (double)v->u.i : (double)v->u.b;
}

int jv_equal(const struct jv *a, const struct jv *b, int depth) {
    if (a == b) return 1;
    if (depth > JINJA_MAX_NEST) return 0;
    if (numeric(a) && numeric(b)) {
        if (a->type != JV_FLOAT && b->type != JV_FLOAT) {
            int64_t x = a->type == JV_INT ? a->u.i : a->u.b, y = b->type == JV_INT ? b->u.i : b->u.b;
            return x == y;
        }
        return num_of(a) == num_of(b);
    }
    if (a->type != b->type) return 0;
    switch (a->type) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a->u.s.len == b->u.s.len && !memcmp(a->u.s.p, b->u.s.p, a->u.s.len);
    case JV_ARRAY:
        if (a->u.a.n != b->u.a.n) return 0;
        for (int i = 0; i < a->u.a.n; i++)
            if (!jv_equal(a->u.a.v[i], b->u.a.v[i], depth + 1)) return 0;
        return 1;
    case JV_OBJECT:
        if (a->u.o.n != b->u.o.n) return 0;
        for (int i = 0; i < a->u.o.n; i++) {
            const struct jv *k = a->u.o.kv[i].key;
            const struct jv *o = jv_object_get(b, k->u.s.p, k->u.s.len);
            if (!o || !jv_equal(a->u.o.kv[i].val, o, depth + 1)) return 0;
        }
        return 1;
    default: return 0; // namespaces and functions: identity only
    }
}

int jv_compare(struct jctx *c, const struct jv *a, const struct jv *b, int cs, const struct jnode *at) {
    if ((a->type == JV_NONE && b->type == JV_NONE) || (a->type == JV_UNDEF && b->type == JV_UNDEF)) return 0;
    if (numeric(a) && numeric(b)) {
        double x = num_of(a), y = num_of(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->type != JV_STR || b->type != JV_STR) {
        jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "cannot compare %s with %s", jv_type_name(a), jv_type_name(b));
        return -2;
    }
    size_t i = 0, j = 0;
    while (i < a->u.s.len && j < b->u.s.len) {
        uint32_t x, y;
        i += (size_t)jv_utf8_next(a->u.s.p + i, a->u.s.len - i, &x);
        j += (size_t)jv_utf8_next(b->u.s.p + j, b->u.s.len - j, &y);
        if (!cs) {
            x = (uint32_t)utf8proc_tolower((utf8proc_int32_t)x);
            y = (uint32_t)utf8proc_tolower((utf8proc_int32_t)y);
        }
        if (x != y) return x < y ? -1 : 1;
    }
    return (i < a->u.s.len) - (j < b->u.s.len);
}

// ---------------------------------------------------------------- scopes --

struct jscope *jscope_new(struct jctx *c, struct jscope *parent) {
    struct jscope *s = xcalloc(1, sizeof *s);
    s->refs = 1;
    s->parent = jscope_retain(parent);
    s->ctx = c;
    s->reg_next = c->scopes;
    if (c->scopes) c->scopes->reg_prev = s;
    c->scopes = s;
    return s;
}

struct jscope *jscope_retain(struct jscope *s) {
    if (s) s->refs++;
    return s;
}

static void scope_clear(struct jscope *s) {
    for (int i = 0; i < s->n; i++) {
        jv_release(s->vars[i].key);
        jv_release(s->vars[i].val);
    }
    s->n = 0;
    jv_release(s->caller);
    s->caller = NULL;
}

void jscope_release(struct jscope *s) {
    // Walks up the parent chain iteratively: each scope holds its parent.
    while (s && --s->refs == 0) {
        struct jscope *parent = s->parent;
        if (s->reg_prev) s->reg_prev->reg_next = s->reg_next;
        else s->ctx->scopes = s->reg_next;
        if (s->reg_next) s->reg_next->reg_prev = s->reg_prev;
        scope_clear(s);
        free(s->vars);
        free(s);
        s = parent;
    }
}

struct jv *jscope_lookup(const struct jscope *s, const char *name, size_t len) {
    for (; s; s = s->parent)
        for (int i = 0; i < s->n; i++) {
            const struct jv *k = s->vars[i].key;
            if (k->u.s.len == len && !memcmp(k->u.s.p, name, len)) return s->vars[i].val;
        }
    return NULL;
}

void jscope_set(struct jscope *s, const char *name, size_t len, struct jv *v) {
    for (int i = 0; i < s->n; i++) {
        struct jv *k = s->vars[i].key;
        if (k->u.s.len == len && !memcmp(k->u.s.p, name, len)) {
            jv_release(s->vars[i].val);
            s->vars[i].val = v;
            return;
        }
    }
    xgrow((void **)&s->vars, &s->cap, s->n + 1, sizeof(struct jv_kv));
    s->vars[s->n].key = jv_str(name, len);
    s->vars[s->n].val = v;
    s->n++;
}

void jctx_collect(struct jctx *c) {
    int ns = 0, nn = 0;
    for (struct jscope *s = c->scopes; s; s = s->reg_next) ns++;
    for (struct jv *v = c->namespaces; v; v = v->u.o.reg_next) nn++;
    struct jscope **sv = xmalloc((size_t)(ns + 1) * sizeof *sv);
    struct jv **nv = xmalloc((size_t)(nn + 1) * sizeof *nv);
    int i = 0;
    for (struct jscope *s = c->scopes; s; s = s->reg_next) sv[i++] = jscope_retain(s);
    i = 0;
    for (struct jv *v = c->namespaces; v; v = v->u.o.reg_next) nv[i++] = jv_retain(v);
    // Pinned, so clearing one cannot free another under our feet.
    for (i = 0; i < ns; i++) scope_clear(sv[i]);
    for (i = 0; i < nn; i++) {
        struct jv *v = nv[i];
        for (int k = 0; k < v->u.o.n; k++) {
            jv_release(v->u.o.kv[k].key);
            jv_release(v->u.o.kv[k].val);
        }
        v->u.o.n = 0;
    }
    for (i = 0; i < ns; i++) jscope_release(sv[i]);
    for (i = 0; i < nn; i++) jv_release(nv[i]);
    free(sv);
    free(nv);
}
