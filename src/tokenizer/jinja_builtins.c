// jinja_builtins.c - filters, tests, the methods of strings and dicts, and
// the global functions (namespace, range, raise_exception, strftime_now, dict).
#include <errno.h>
#include <math.h>
#include <time.h>
#include <utf8proc.h>

#include "tokenizer/jinja_internal.h"

#define IS(name) (!strcmp(fname, name))

static struct jv *type_err(struct jctx *c, const struct jnode *at, const char *what, const struct jv *v) {
    return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "%s cannot be applied to %s", what, jv_type_name(v));
}

static int cost(struct jctx *c, const struct jnode *at, size_t bytes) {
    return jctx_step(c, at, 1 + (int64_t)(bytes >> 6));
}

// An argument by position or keyword, NULL when left out or none.
static struct jv *arg_opt(const struct jargs *a, int i, const char *kw) {
    struct jv *v = jargs_get(a, i, kw);
    return v && v->type != JV_NONE && v->type != JV_UNDEF ? v : NULL;
}

// ------------------------------------------------------------------- strings --

static int in_set(uint32_t cp, const struct jv *chars) {
    uint32_t x;
    for (size_t i = 0; i < chars->u.s.len;) {
        i += (size_t)jv_utf8_next(chars->u.s.p + i, chars->u.s.len - i, &x);
        if (x == cp) return 1;
    }
    return 0;
}

// Byte length of the code point at s if it is to be stripped, else 0.
static int strip_len(const char *s, size_t len, const struct jv *chars) {
    if (!chars) return jv_ws_len(s, len);
    uint32_t cp;
    int n = jv_utf8_next(s, len, &cp);
    return in_set(cp, chars) ? n : 0;
}

static struct jv *str_strip(struct jctx *c, const struct jnode *at, struct jv *s, struct jv *chars, int left,
                            int right) {
    if (chars && chars->type != JV_STR) return type_err(c, at, "strip(chars) with chars", chars);
    if (cost(c, at, s->u.s.len)) return NULL;
    size_t b = 0, e = s->u.s.len;
    int w;
    if (left)
        while (b < e && (w = strip_len(s->u.s.p + b, e - b, chars))) b += (size_t)w;
    if (right) {
        size_t keep = b;
        uint32_t cp;
        for (size_t i = b; i < e;) {
            int n = strip_len(s->u.s.p + i, e - i, chars);
            if (n) i += (size_t)n;
            else {
                i += (size_t)jv_utf8_next(s->u.s.p + i, e - i, &cp);
                keep = i;
            }
        }
        e = keep;
    }
    return jv_str(s->u.s.p + b, e - b);
}

// Unicode's unconditional special casing that is not one code point to one
// (ß -> SS, ligatures, İ -> i̇), on top of utf8proc's simple mapping.
static const char *special_case(uint32_t cp, int upper) {
    if (!upper) return cp == 0x130 ? "i\xcc\x87" : NULL;
    switch (cp) {
    case 0xdf: return "SS";
    case 0x149: return "\xca\xbcN";
    case 0xfb00: return "FF";
    case 0xfb01: return "FI";
    case 0xfb02: return "FL";
    case 0xfb03: return "FFI";
    case 0xfb04: return "FFL";
    case 0xfb05:
    case 0xfb06: return "ST";
    default: return NULL;
    }
}

static int is_cased(uint32_t cp) {
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static struct jv *str_case(struct jctx *c, const struct jnode *at, struct jv *s, int upper) {
    if (cost(c, at, s->u.s.len)) return NULL;
    char *out = xmalloc(s->u.s.len * 2 + 1); // no mapping here grows a code point by more than 1 byte
    size_t k = 0, len = s->u.s.len;
    uint32_t cp, prev = 0;
    for (size_t i = 0; i < len;) {
        int n = jv_utf8_next(s->u.s.p + i, len - i, &cp);
        const char *sp = special_case(cp, upper);
        if (n == 1 && cp >= 0x80) out[k++] = s->u.s.p[i]; // an invalid byte stays as it is
        else if (sp) {
            memcpy(out + k, sp, strlen(sp));
            k += strlen(sp);
        } else if (!upper && cp == 0x3a3 && is_cased(prev)) { // final sigma: Σ ending a word is ς
            uint32_t next = 0;
            if (i + (size_t)n < len) jv_utf8_next(s->u.s.p + i + n, len - i - (size_t)n, &next);
            k += jv_utf8_put(out + k, is_cased(next) ? 0x3c3 : 0x3c2);
        } else
            k += jv_utf8_put(out + k, (uint32_t)(upper ? utf8proc_toupper((utf8proc_int32_t)cp)
                                                       : utf8proc_tolower((utf8proc_int32_t)cp)));
        prev = cp;
        i += (size_t)n;
    }
    out[k] = 0;
    return jv_str_take(out, k);
}

static int ascii_word(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

// title: an ASCII letter that starts a word is uppercased; capitalize: the
// first character is, the rest stays (both as @huggingface/jinja does).
static struct jv *str_title(struct jctx *c, const struct jnode *at, struct jv *s, int first_only) {
    if (cost(c, at, s->u.s.len)) return NULL;
    if (first_only) {
        if (!s->u.s.len) return jv_retain(s);
        uint32_t cp;
        int n = jv_utf8_next(s->u.s.p, s->u.s.len, &cp);
        if (n == 1 && cp >= 0x80) return jv_retain(s);
        char head[8];
        size_t hl = jv_utf8_put(head, (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp));
        struct jbuf b = {0};
        if (jbuf_add(c, &b, head, hl) || jbuf_add(c, &b, s->u.s.p + n, s->u.s.len - (size_t)n)) {
            free(b.p);
            return NULL;
        }
        return jbuf_to_str(&b);
    }
    struct jv *r = jv_str(s->u.s.p, s->u.s.len);
    for (size_t i = 0; i < r->u.s.len; i++) {
        char ch = r->u.s.p[i];
        if (ch >= 'a' && ch <= 'z' && (i == 0 || !ascii_word(r->u.s.p[i - 1]))) r->u.s.p[i] = (char)(ch - 32);
    }
    return r;
}

static struct jv *str_split(struct jctx *c, const struct jnode *at, struct jv *s, struct jv *sep, struct jv *maxv) {
    if (sep && sep->type != JV_STR) return type_err(c, at, "split(sep) with sep", sep);
    if (maxv && maxv->type != JV_INT) return type_err(c, at, "split(maxsplit) with maxsplit", maxv);
    if (sep && sep->u.s.len == 0) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "split(): empty separator");
    if (cost(c, at, s->u.s.len)) return NULL;
    int64_t maxsplit = maxv ? maxv->u.i : -1;
    const char *p = s->u.s.p;
    size_t len = s->u.s.len, i = 0;
    struct jv **parts = NULL;
    int n = 0, cap = 0;
    int w;
    if (!sep) {
        while (i < len && (w = jv_ws_len(p + i, len - i))) i += (size_t)w;
        while (i < len) {
            size_t start = i, end;
            if (maxsplit >= 0 && n >= maxsplit) end = len;
            else {
                uint32_t cp;
                while (i < len && !jv_ws_len(p + i, len - i)) i += (size_t)jv_utf8_next(p + i, len - i, &cp);
                end = i;
            }
            xgrow((void **)&parts, &cap, n + 1, sizeof *parts);
            parts[n++] = jv_str(p + start, end - start);
            i = end;
            while (i < len && (w = jv_ws_len(p + i, len - i))) i += (size_t)w;
        }
    } else {
        for (;;) {
            const char *hit = maxsplit >= 0 && n >= maxsplit ? NULL : memmem(p + i, len - i, sep->u.s.p, sep->u.s.len);
            size_t end = hit ? (size_t)(hit - p) : len;
            xgrow((void **)&parts, &cap, n + 1, sizeof *parts);
            parts[n++] = jv_str(p + i, end - i);
            if (!hit) break;
            i = end + sep->u.s.len;
        }
    }
    struct jv *a = jv_array_new(n);
    for (int k = 0; k < n; k++) a->u.a.v[k] = parts[k];
    free(parts);
    return a;
}

static struct jv *str_replace(struct jctx *c, const struct jnode *at, struct jv *s, struct jv *old, struct jv *new,
                              struct jv *countv) {
    if (!old || !new || old->type != JV_STR || new->type != JV_STR)
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "replace() needs two string arguments");
    if (countv && countv->type != JV_INT) return type_err(c, at, "replace(count) with count", countv);
    int64_t count = countv && countv->u.i >= 0 ? countv->u.i : INT64_MAX;
    struct jbuf b = {0};
    const char *p = s->u.s.p;
    size_t len = s->u.s.len, i = 0;
    int rc = cost(c, at, len);
    if (old->u.s.len == 0) { // inserts at every code point boundary, as Python does
        uint32_t cp;
        for (; !rc; count--) {
            if (count > 0) rc = jbuf_add(c, &b, new->u.s.p, new->u.s.len);
            if (rc || i >= len) break;
            int n = jv_utf8_next(p + i, len - i, &cp);
            rc = jbuf_add(c, &b, p + i, (size_t)n) || cost(c, at, new->u.s.len);
            i += (size_t)n;
        }
    } else {
        while (!rc && count > 0) {
            const char *hit = memmem(p + i, len - i, old->u.s.p, old->u.s.len);
            if (!hit) break;
            size_t k = (size_t)(hit - p);
            rc = jbuf_add(c, &b, p + i, k - i) || jbuf_add(c, &b, new->u.s.p, new->u.s.len) ||
                 cost(c, at, new->u.s.len);
            i = k + old->u.s.len;
            count--;
        }
        if (!rc) rc = jbuf_add(c, &b, p + i, len - i);
    }
    if (rc) {
        free(b.p);
        return NULL;
    }
    return jbuf_to_str(&b);
}

static int affix(const struct jv *s, const struct jv *x, int end) {
    if (x->u.s.len > s->u.s.len) return 0;
    return !memcmp(s->u.s.p + (end ? s->u.s.len - x->u.s.len : 0), x->u.s.p, x->u.s.len);
}

static struct jv *str_affix(struct jctx *c, const struct jnode *at, struct jv *s, struct jv *x, int end) {
    const char *what = end ? "endswith()" : "startswith()";
    if (!x) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "%s needs an argument", what);
    if (x->type == JV_STR) return jv_bool(affix(s, x, end));
    if (x->type != JV_ARRAY) return type_err(c, at, what, x);
    for (int i = 0; i < x->u.a.n; i++) {
        if (x->u.a.v[i]->type != JV_STR) return type_err(c, at, what, x->u.a.v[i]);
        if (affix(s, x->u.a.v[i], end)) return jv_bool(1);
    }
    return jv_bool(0);
}

static struct jv *str_indent(struct jctx *c, const struct jnode *at, struct jv *s, struct jargs *a) {
    struct jv *w = arg_opt(a, 0, "width"), *first = arg_opt(a, 1, "first"), *blank = arg_opt(a, 2, "blank");
    if (w && w->type != JV_INT && w->type != JV_STR) return type_err(c, at, "indent(width) with width", w);
    struct jbuf pad = {0}, b = {0};
    int rc = 0;
    if (w && w->type == JV_STR) rc = jbuf_add(c, &pad, w->u.s.p, w->u.s.len);
    else
        for (int64_t i = 0; i < (w ? w->u.i : 4) && !rc; i++) rc = jbuf_add(c, &pad, " ", 1);
    size_t i = 0;
    for (int line = 0; !rc; line++) {
        const char *nl = memchr(s->u.s.p + i, '\n', s->u.s.len - i);
        size_t end = nl ? (size_t)(nl - s->u.s.p) : s->u.s.len;
        int skip = (line == 0 && !(first && jv_truthy(first))) || (end == i && !(blank && jv_truthy(blank)));
        if (!skip) rc = jbuf_add(c, &b, pad.p, pad.len) || cost(c, at, pad.len);
        if (!rc) rc = jbuf_add(c, &b, s->u.s.p + i, end - i);
        if (!nl || rc) break;
        rc = jbuf_add(c, &b, "\n", 1);
        i = end + 1;
    }
    free(pad.p);
    if (rc) {
        free(b.p);
        return NULL;
    }
    return jbuf_to_str(&b);
}

static struct jv *str_join(struct jctx *c, const struct jnode *at, struct jv *sep, struct jv *items,
                           struct jv *attr) {
    struct jbuf b = {0};
    int rc = 0;
    for (int i = 0; i < items->u.a.n && !rc; i++) {
        struct jv *x = items->u.a.v[i];
        if (attr) x = jattr_path(x, attr->u.s.p, attr->u.s.len);
        if (i) rc = jbuf_add(c, &b, sep->u.s.p, sep->u.s.len);
        if (!rc) rc = jv_display(c, &b, x, at) || cost(c, at, 0);
    }
    if (rc) {
        free(b.p);
        return NULL;
    }
    return jbuf_to_str(&b);
}

// A string's characters as a list of one-character strings.
static struct jv *str_chars(struct jv *s) {
    struct jv *a = jv_array_new((int)jv_utf8_count(s->u.s.p, s->u.s.len));
    uint32_t cp;
    for (size_t i = 0, k = 0; i < s->u.s.len; k++) {
        int n = jv_utf8_next(s->u.s.p + i, s->u.s.len - i, &cp);
        a->u.a.v[k] = jv_str(s->u.s.p + i, (size_t)n);
        i += (size_t)n;
    }
    return a;
}

// -------------------------------------------------------------- sorting --

struct sorter {
    struct jctx *c;
    const struct jnode *at;
    int cs, rev;
    const struct jv *attr; // sort by this (dotted) attribute
    int pair_index;        // dictsort: 0 key, 1 value; -1 otherwise
};

static int sort_cmp(struct sorter *s, struct jv *a, struct jv *b) {
    if (s->pair_index >= 0) {
        a = a->u.a.v[s->pair_index];
        b = b->u.a.v[s->pair_index];
    } else if (s->attr) {
        a = jattr_path(a, s->attr->u.s.p, s->attr->u.s.len);
        b = jattr_path(b, s->attr->u.s.p, s->attr->u.s.len);
    }
    if (jctx_step(s->c, s->at, 1)) return 0;
    int r = jv_compare(s->c, a, b, s->cs, s->at);
    return r == -2 ? 0 : s->rev ? -r : r;
}

// Stable merge sort (Python's and JavaScript's sorts are stable).
static void merge_sort(struct sorter *s, struct jv **v, struct jv **tmp, int n) {
    if (n < 2 || s->c->status) return;
    int h = n / 2;
    merge_sort(s, v, tmp, h);
    merge_sort(s, v + h, tmp, n - h);
    int i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = sort_cmp(s, v[j], v[i]) < 0 ? v[j++] : v[i++];
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, (size_t)n * sizeof *v);
}

static struct jv *sorted(struct sorter *s, struct jv *arr) {
    int n = arr->u.a.n;
    struct jv *r = jv_array_new(n);
    for (int i = 0; i < n; i++) r->u.a.v[i] = jv_retain(arr->u.a.v[i]);
    struct jv **tmp = xmalloc((size_t)(n + 1) * sizeof *tmp);
    merge_sort(s, r->u.a.v, tmp, n);
    free(tmp);
    if (s->c->status) {
        jv_release(r);
        return NULL;
    }
    return r;
}

static struct jv *dict_items(struct jv *o) {
    struct jv *a = jv_array_new(o->u.o.n);
    for (int i = 0; i < o->u.o.n; i++) {
        struct jv *p = jv_array_new(2);
        p->u.a.v[0] = jv_retain(o->u.o.kv[i].key);
        p->u.a.v[1] = jv_retain(o->u.o.kv[i].val);
        a->u.a.v[i] = p;
    }
    return a;
}

static struct jv *bool_arg(struct jctx *c, const struct jnode *at, struct jv *v, const char *what, int *out) {
    if (v && v->type != JV_BOOL) return type_err(c, at, what, v);
    *out = v ? v->u.b : 0;
    return JV_UNDEFINED;
}

static struct jv *dictsort(struct jctx *c, const struct jnode *at, struct jv *o, struct jargs *a) {
    struct sorter s = {.c = c, .at = at, .pair_index = 0};
    struct jv *by = arg_opt(a, 1, "by");
    if (!bool_arg(c, at, arg_opt(a, 0, "case_sensitive"), "dictsort(case_sensitive)", &s.cs) ||
        !bool_arg(c, at, arg_opt(a, 2, "reverse"), "dictsort(reverse)", &s.rev))
        return NULL;
    if (by && (by->type != JV_STR || (strcmp(by->u.s.p, "key") && strcmp(by->u.s.p, "value"))))
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "dictsort(by) must be 'key' or 'value'");
    s.pair_index = by && !strcmp(by->u.s.p, "value");
    struct jv *items = dict_items(o), *r = sorted(&s, items);
    jv_release(items);
    return r;
}

// ------------------------------------------------------------------ methods --

static const char *STR_METHODS[] = {"upper", "lower", "strip", "lstrip", "rstrip", "title", "capitalize",
                                    "startswith", "endswith", "split", "replace", "join", NULL};
static const char *DICT_METHODS[] = {"get", "items", "keys", "values", "dictsort", NULL};

const char *jmethod_lookup(const struct jv *self, const char *name, size_t len) {
    const char **m = self->type == JV_STR ? STR_METHODS : self->type == JV_OBJECT ? DICT_METHODS : NULL;
    for (; m && *m; m++)
        if (strlen(*m) == len && !memcmp(*m, name, len)) return *m;
    return NULL;
}

static struct jv *dict_method(struct jctx *c, struct jv *o, const char *fname, struct jargs *a,
                              const struct jnode *at) {
    if (IS("items")) return dict_items(o);
    if (IS("keys") || IS("values")) {
        struct jv *r = jv_array_new(o->u.o.n);
        for (int i = 0; i < o->u.o.n; i++) r->u.a.v[i] = jv_retain(IS("keys") ? o->u.o.kv[i].key : o->u.o.kv[i].val);
        return r;
    }
    if (IS("dictsort")) return dictsort(c, at, o, a);
    struct jv *key = jargs_get(a, 0, "key"), *def = jargs_get(a, 1, "default");
    if (!key || key->type != JV_STR) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "get() needs a string key");
    struct jv *v = jv_object_get(o, key->u.s.p, key->u.s.len);
    return jv_retain(v ? v : def ? def : JV_NONEV);
}

struct jv *jmethod_call(struct jctx *c, struct jv *s, const char *fname, struct jargs *a, const struct jnode *at) {
    if (s->type == JV_OBJECT) return dict_method(c, s, fname, a, at);
    if (IS("upper") || IS("lower")) return str_case(c, at, s, IS("upper"));
    if (IS("strip") || IS("lstrip") || IS("rstrip"))
        return str_strip(c, at, s, arg_opt(a, 0, "chars"), !IS("rstrip"), !IS("lstrip"));
    if (IS("title") || IS("capitalize")) return str_title(c, at, s, IS("capitalize"));
    if (IS("startswith") || IS("endswith")) return str_affix(c, at, s, jargs_get(a, 0, NULL), IS("endswith"));
    if (IS("split")) return str_split(c, at, s, arg_opt(a, 0, "sep"), arg_opt(a, 1, "maxsplit"));
    if (IS("replace")) return str_replace(c, at, s, jargs_get(a, 0, NULL), jargs_get(a, 1, NULL), arg_opt(a, 2, "count"));
    struct jv *items = jargs_get(a, 0, NULL); // join: sep.join(list)
    if (!items || (items->type != JV_ARRAY && items->type != JV_STR)) return type_err(c, at, "join()", items ? items : s);
    if (items->type == JV_STR) {
        struct jv *chars = str_chars(items), *r = str_join(c, at, s, chars, NULL);
        jv_release(chars);
        return r;
    }
    return str_join(c, at, s, items, NULL);
}

// -------------------------------------------------------------------- tests --

static const struct {
    const char *name;
    int takes_arg;
} TESTS[] = {
    {"boolean", 0}, {"callable", 0}, {"odd", 0},   {"even", 0},    {"false", 0},   {"true", 0},
    {"none", 0},    {"string", 0},   {"number", 0}, {"integer", 0}, {"float", 0},   {"iterable", 0},
    {"mapping", 0}, {"sequence", 0}, {"lower", 0},  {"upper", 0},   {"defined", 0}, {"undefined", 0},
    {"equalto", 1}, {"eq", 1},       {"ne", 1},     {"sameas", 1},  {"in", 1},      {"divisibleby", 1},
    {"gt", 1},      {"ge", 1},       {"lt", 1},     {"le", 1},      {"greaterthan", 1}, {"lessthan", 1},
};

int jtest_known(const char *name, size_t len, int *takes_arg) {
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (strlen(TESTS[i].name) == len && !memcmp(TESTS[i].name, name, len)) {
            *takes_arg = TESTS[i].takes_arg;
            return 1;
        }
    return 0;
}

static int order(struct jctx *c, const struct jnode *at, struct jv *a, struct jv *b) {
    if (a->type == JV_STR && b->type == JV_STR) {
        int k = memcmp(a->u.s.p, b->u.s.p, MIN(a->u.s.len, b->u.s.len));
        return k ? (k < 0 ? -1 : 1) : (a->u.s.len > b->u.s.len) - (a->u.s.len < b->u.s.len);
    }
    return jv_compare(c, a, b, 1, at);
}

int jtest_apply(struct jctx *c, const char *fname, struct jv *v, struct jargs *a, const struct jnode *at) {
    int takes_arg = 0;
    if (!jtest_known(fname, strlen(fname), &takes_arg)) {
        jerr(c, VLLM_ERR_UNSUPPORTED, at, "unknown test '%s'", fname);
        return -1;
    }
    struct jv *x = jargs_get(a, 0, NULL);
    if (takes_arg && !x) {
        jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "test '%s' needs an argument", fname);
        return -1;
    }
    int t = v->type;
    if (IS("boolean")) return t == JV_BOOL;
    if (IS("callable")) return t == JV_FUNC;
    if (IS("odd") || IS("even") || IS("divisibleby")) {
        if (t != JV_INT || (x && x->type != JV_INT)) {
            type_err(c, at, "test 'odd', 'even' or 'divisibleby'", t != JV_INT ? v : x);
            return -1;
        }
        if (IS("divisibleby")) return x->u.i != 0 && v->u.i % x->u.i == 0;
        return (v->u.i % 2 != 0) == IS("odd");
    }
    if (IS("false") || IS("true")) return t == JV_BOOL && v->u.b == IS("true");
    if (IS("none")) return t == JV_NONE;
    if (IS("string")) return t == JV_STR;
    if (IS("number")) return t == JV_INT || t == JV_FLOAT;
    if (IS("integer")) return t == JV_INT;
    if (IS("float")) return t == JV_FLOAT;
    if (IS("iterable")) return t == JV_ARRAY || t == JV_STR;
    if (IS("mapping")) return t == JV_OBJECT;
    if (IS("sequence")) return t == JV_ARRAY || t == JV_OBJECT || t == JV_STR;
    if (IS("lower") || IS("upper")) {
        if (t != JV_STR) return 0;
        struct jv *m = str_case(c, at, v, IS("upper"));
        if (!m) return -1;
        int same = jv_equal(m, v, 0);
        jv_release(m);
        return same;
    }
    if (IS("defined")) return t != JV_UNDEF;
    if (IS("undefined")) return t == JV_UNDEF;
    if (IS("equalto") || IS("eq")) return jv_equal(v, x, 0);
    if (IS("ne")) return !jv_equal(v, x, 0);
    if (IS("sameas")) return v == x || (t == x->type && t <= JV_BOOL && jv_equal(v, x, 0));
    if (IS("in")) {
        if (x->type == JV_ARRAY) {
            for (int i = 0; i < x->u.a.n; i++)
                if (jv_equal(v, x->u.a.v[i], 0)) return 1;
            return 0;
        }
        if (t == JV_STR && x->type == JV_STR)
            return v->u.s.len == 0 || memmem(x->u.s.p, x->u.s.len, v->u.s.p, v->u.s.len) != NULL;
        if (t == JV_STR && x->type == JV_OBJECT) return jv_object_get(x, v->u.s.p, v->u.s.len) != NULL;
        type_err(c, at, "test 'in'", x);
        return -1;
    }
    int k = order(c, at, v, x);
    if (k == -2) return -1;
    if (IS("gt") || IS("greaterthan")) return k > 0;
    if (IS("ge")) return k >= 0;
    if (IS("lt") || IS("lessthan")) return k < 0;
    return k <= 0;
}

// ------------------------------------------------------------------ filters --

struct jv *jattr_path(struct jv *item, const char *path, size_t len) {
    for (size_t i = 0; i <= len;) {
        const char *dot = memchr(path + i, '.', len - i);
        size_t end = dot ? (size_t)(dot - path) : len;
        if (item->type == JV_OBJECT || item->type == JV_NS) {
            item = jv_object_get(item, path + i, end - i);
            if (!item) return JV_UNDEFINED;
        } else if (item->type == JV_ARRAY) {
            int64_t k = 0;
            if (end == i || end - i > 9) return JV_UNDEFINED;
            for (size_t j = i; j < end; j++) {
                if (path[j] < '0' || path[j] > '9') return JV_UNDEFINED;
                k = k * 10 + (path[j] - '0');
            }
            if (k >= item->u.a.n) return JV_UNDEFINED;
            item = item->u.a.v[k];
        } else return JV_UNDEFINED;
        i = end + 1;
    }
    return item;
}

static struct jv *tojson_filter(struct jctx *c, const struct jnode *at, struct jv *v, struct jargs *a) {
    struct jv_json_opts o = {.indent = -1, .undefined_null = 1};
    struct jv *ind = arg_opt(a, -1, "indent"), *sep = arg_opt(a, -1, "separators");
    if (ind && ind->type != JV_INT) return type_err(c, at, "tojson(indent) with indent", ind);
    if (ind) o.indent = (int)MAX(MIN(ind->u.i, 64), 0);
    if (!bool_arg(c, at, arg_opt(a, -1, "ensure_ascii"), "tojson(ensure_ascii)", &o.ensure_ascii) ||
        !bool_arg(c, at, arg_opt(a, -1, "sort_keys"), "tojson(sort_keys)", &o.sort_keys))
        return NULL;
    if (sep) {
        if (sep->type != JV_ARRAY || sep->u.a.n != 2 || sep->u.a.v[0]->type != JV_STR || sep->u.a.v[1]->type != JV_STR)
            return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "tojson(separators) must be two strings");
        o.item_sep = sep->u.a.v[0]->u.s.p;
        o.key_sep = sep->u.a.v[1]->u.s.p;
    }
    struct jbuf b = {0};
    if (jv_tojson(c, &b, v, &o, 0, at)) {
        free(b.p);
        return NULL;
    }
    return jbuf_to_str(&b);
}

// int / float: Jinja's parsing of strings (whole string, else the default).
static struct jv *number_filter(struct jctx *c, const struct jnode *at, struct jv *v, struct jargs *a, int is_int) {
    struct jv *def = jargs_get(a, 0, "default");
    double d = 0;
    int ok = 1;
    if (v->type == JV_INT || v->type == JV_BOOL) d = (double)(v->type == JV_INT ? v->u.i : v->u.b);
    else if (v->type == JV_FLOAT) d = v->u.f;
    else if (v->type == JV_STR) {
        struct jv *t = str_strip(c, at, v, NULL, 1, 1);
        if (!t) return NULL;
        char *end;
        errno = 0;
        long long ll = is_int ? strtoll(t->u.s.p, &end, 10) : 0;
        if (is_int && t->u.s.len && *end == 0 && errno == 0) {
            jv_release(t);
            return jv_int(ll);
        }
        d = strtod(t->u.s.p, &end);
        ok = t->u.s.len > 0 && *end == 0 && !strchr(t->u.s.p, 'x') && !strchr(t->u.s.p, 'X');
        jv_release(t);
    } else ok = 0;
    if (ok && is_int && (!isfinite(d) || fabs(d) >= 9.2e18)) ok = 0;
    if (!ok) return def ? jv_retain(def) : is_int ? jv_int(0) : jv_float(0);
    if (is_int && v->type == JV_INT) return jv_retain(v);
    return is_int ? jv_int((int64_t)d) : jv_float(d);
}

static struct jv *round_filter(struct jctx *c, const struct jnode *at, struct jv *v, struct jargs *a) {
    struct jv *p = arg_opt(a, 0, "precision"), *m = arg_opt(a, 1, "method");
    if (v->type != JV_INT && v->type != JV_FLOAT) return type_err(c, at, "filter 'round'", v);
    if (p && p->type != JV_INT) return type_err(c, at, "round(precision) with precision", p);
    const char *method = m && m->type == JV_STR ? m->u.s.p : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "round(method) must be common, ceil or floor");
    int64_t prec = p ? MAX(MIN(p->u.i, 300), -300) : 0;
    if (v->type == JV_INT && !strcmp(method, "common") && prec >= 0) return jv_retain(v);
    double x = v->type == JV_INT ? (double)v->u.i : v->u.f, scale = pow(10, (double)prec), y = x * scale;
    y = !strcmp(method, "ceil") ? ceil(y) : !strcmp(method, "floor") ? floor(y) : nearbyint(y);
    return jv_float(isfinite(y) ? y / scale : x);
}

static struct jv *select_filter(struct jctx *c, const struct jnode *at, struct jv *arr, struct jargs *a,
                                const char *fname) {
    int by_attr = IS("selectattr") || IS("rejectattr"), keep_true = IS("selectattr") || IS("select");
    struct jv *attr = by_attr ? jargs_get(a, 0, NULL) : NULL, *test = jargs_get(a, by_attr, NULL);
    if (by_attr && (!attr || attr->type != JV_STR))
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "%s needs an attribute name", fname);
    if (test && test->type != JV_STR) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "%s: the test must be a name", fname);
    struct jargs targs = {0};
    if (a->npos > by_attr + 1) {
        targs.pos = a->pos + by_attr + 1;
        targs.npos = a->npos - by_attr - 1;
    }
    struct jv *r = jv_array_new(arr->u.a.n);
    int k = 0;
    for (int i = 0; i < arr->u.a.n; i++) {
        struct jv *item = arr->u.a.v[i], *x = item;
        if (by_attr) {
            if (item->type != JV_OBJECT && item->type != JV_NS) {
                type_err(c, at, fname, item);
                break;
            }
            x = jattr_path(item, attr->u.s.p, attr->u.s.len);
        }
        // An item without the attribute never passes, as in @huggingface/jinja.
        int t = by_attr && x->type == JV_UNDEF ? 0 : test ? jtest_apply(c, test->u.s.p, x, &targs, at) : jv_truthy(x);
        if (t < 0 || jctx_step(c, at, 1)) break;
        if (t == keep_true) r->u.a.v[k++] = jv_retain(item);
    }
    r->u.a.n = k;
    if (c->status) {
        jv_release(r);
        return NULL;
    }
    return r;
}

static struct jv *map_filter(struct jctx *c, const struct jnode *at, struct jv *arr, struct jargs *a) {
    struct jv *attr = jargs_get(a, -1, "attribute"), *def = jargs_get(a, -1, "default");
    struct jv *fname = jargs_get(a, 0, NULL);
    if (!attr && (!fname || fname->type != JV_STR))
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "map needs attribute= or a filter name");
    if (attr && attr->type != JV_STR) return type_err(c, at, "map(attribute)", attr);
    struct jargs fargs = {0};
    if (!attr && a->npos > 1) {
        fargs.pos = a->pos + 1;
        fargs.npos = a->npos - 1;
    }
    struct jv *r = jv_array_new(arr->u.a.n);
    for (int i = 0; i < arr->u.a.n; i++) {
        struct jv *x;
        if (attr) {
            x = jattr_path(arr->u.a.v[i], attr->u.s.p, attr->u.s.len);
            x = jv_retain(x->type == JV_UNDEF && def ? def : x);
        } else x = jfilter_apply(c, arr->u.a.v[i], fname->u.s.p, &fargs, at);
        if (!x || jctx_step(c, at, 1)) {
            jv_release(x);
            r->u.a.n = i;
            jv_release(r);
            return NULL;
        }
        r->u.a.v[i] = x;
    }
    return r;
}

static struct jv *unique(struct jctx *c, const struct jnode *at, struct jv *arr) {
    struct jv *r = jv_array_new(arr->u.a.n);
    int k = 0;
    for (int i = 0; i < arr->u.a.n; i++) {
        int seen = 0;
        if (jctx_step(c, at, k + 1)) {
            r->u.a.n = k;
            jv_release(r);
            return NULL;
        }
        for (int j = 0; j < k && !seen; j++) seen = jv_equal(r->u.a.v[j], arr->u.a.v[i], 0);
        if (!seen) r->u.a.v[k++] = jv_retain(arr->u.a.v[i]);
    }
    r->u.a.n = k;
    return r;
}

static struct jv *array_filter(struct jctx *c, struct jv *v, const char *fname, struct jargs *a, const struct jnode *at) {
    int n = v->u.a.n;
    if (IS("list")) return jv_retain(v);
    if (IS("first") || IS("last")) return n ? jv_retain(v->u.a.v[IS("first") ? 0 : n - 1]) : JV_UNDEFINED;
    if (IS("reverse")) {
        struct jv *r = jv_array_new(n);
        for (int i = 0; i < n; i++) r->u.a.v[i] = jv_retain(v->u.a.v[n - 1 - i]);
        return r;
    }
    if (IS("sort")) {
        struct sorter s = {.c = c, .at = at, .pair_index = -1};
        s.attr = arg_opt(a, 2, "attribute");
        if (s.attr && s.attr->type != JV_STR) return type_err(c, at, "sort(attribute)", s.attr);
        if (!bool_arg(c, at, arg_opt(a, 0, "reverse"), "sort(reverse)", &s.rev) ||
            !bool_arg(c, at, arg_opt(a, 1, "case_sensitive"), "sort(case_sensitive)", &s.cs))
            return NULL;
        return sorted(&s, v);
    }
    if (IS("join")) {
        struct jv *sep = arg_opt(a, 0, "d"), *attr = arg_opt(a, -1, "attribute");
        if (!sep) sep = arg_opt(a, -1, "separator");
        if ((sep && sep->type != JV_STR) || (attr && attr->type != JV_STR))
            return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "join: the separator and attribute must be strings");
        struct jv empty = {.refs = -1, .type = JV_STR, .u.s = {0, ""}};
        return str_join(c, at, sep ? sep : &empty, v, attr);
    }
    if (IS("unique")) return unique(c, at, v);
    if (IS("selectattr") || IS("rejectattr") || IS("select") || IS("reject")) return select_filter(c, at, v, a, fname);
    if (IS("map")) return map_filter(c, at, v, a);
    return NULL;
}

static struct jv *string_filter(struct jctx *c, struct jv *v, const char *fname, struct jargs *a, const struct jnode *at) {
    if (IS("upper") || IS("lower")) return str_case(c, at, v, IS("upper"));
    if (IS("title") || IS("capitalize")) return str_title(c, at, v, IS("capitalize"));
    if (IS("trim")) return str_strip(c, at, v, arg_opt(a, 0, "chars"), 1, 1);
    if (IS("indent")) return str_indent(c, at, v, a);
    if (IS("replace")) return str_replace(c, at, v, jargs_get(a, 0, NULL), jargs_get(a, 1, NULL), arg_opt(a, 2, "count"));
    if (IS("list") || IS("first") || IS("last") || IS("reverse") || IS("join") || IS("unique") || IS("sort")) {
        struct jv *chars = str_chars(v), *r = NULL;
        if (IS("first") || IS("last")) r = chars->u.a.n ? jv_retain(chars->u.a.v[IS("first") ? 0 : chars->u.a.n - 1]) : JV_UNDEFINED;
        else if (IS("list")) r = jv_retain(chars);
        else {
            struct jv *x = array_filter(c, chars, fname, a, at);
            if (x && !IS("join")) { // reverse, unique, sort of a string give a string
                struct jv empty = {.refs = -1, .type = JV_STR, .u.s = {0, ""}};
                r = str_join(c, at, &empty, x, NULL);
                jv_release(x);
            } else r = x;
        }
        jv_release(chars);
        return r;
    }
    return NULL;
}

static const char *KNOWN_FILTERS[] = {
    "safe", "tojson", "default", "d", "int", "float", "length", "count", "string", "items", "keys", "values",
    "get", "dictsort", "bool", "abs", "round", "list", "first", "last", "reverse", "sort", "join", "unique",
    "selectattr", "rejectattr", "select", "reject", "map", "upper", "lower", "title", "capitalize", "trim",
    "indent", "replace", NULL};

struct jv *jfilter_apply(struct jctx *c, struct jv *v, const char *fname, struct jargs *a, const struct jnode *at) {
    int known = 0;
    for (int i = 0; KNOWN_FILTERS[i] && !known; i++) known = IS(KNOWN_FILTERS[i]);
    if (!known) return jerr(c, VLLM_ERR_UNSUPPORTED, at, "unknown filter '%s'", fname);
    int t = v->type;
    if (IS("safe")) return jv_retain(v);
    if (IS("tojson")) return tojson_filter(c, at, v, a);
    if (IS("default") || IS("d")) {
        struct jv *def = jargs_get(a, 0, "default_value");
        int boolean = 0;
        if (!bool_arg(c, at, jargs_get(a, 1, "boolean"), "default(boolean)", &boolean)) return NULL;
        if (t == JV_UNDEF || (boolean && !jv_truthy(v))) return def ? jv_retain(def) : jv_str("", 0);
        return jv_retain(v);
    }
    if (IS("int") || IS("float")) return number_filter(c, at, v, a, IS("int"));
    if (IS("bool")) return jv_bool(jv_truthy(v));
    if (IS("length") || IS("count")) {
        if (t == JV_ARRAY) return jv_int(v->u.a.n);
        if (t == JV_OBJECT) return jv_int(v->u.o.n);
        if (t == JV_UNDEF) return jv_int(0);
        if (t == JV_STR) return cost(c, at, v->u.s.len) ? NULL : jv_int((int64_t)jv_utf8_count(v->u.s.p, v->u.s.len));
        return type_err(c, at, "filter 'length'", v);
    }
    if (IS("string")) {
        if (t == JV_NONE) return jv_strz("None");
        if (t == JV_UNDEF) return jv_str("", 0);
        return jv_display_str(c, v, at);
    }
    if (IS("abs")) {
        if (t == JV_FLOAT) return jv_float(fabs(v->u.f));
        if (t == JV_INT && v->u.i != INT64_MIN) return jv_int(v->u.i < 0 ? -v->u.i : v->u.i);
        return type_err(c, at, "filter 'abs'", v);
    }
    if (IS("round")) return round_filter(c, at, v, a);
    if (IS("items") && t == JV_UNDEF) return jv_array_new(0);
    if (t == JV_OBJECT && (IS("items") || IS("keys") || IS("values") || IS("get") || IS("dictsort") || IS("list")))
        return dict_method(c, v, IS("list") ? "keys" : fname, a, at);
    struct jv *r = NULL;
    if (t == JV_ARRAY) r = array_filter(c, v, fname, a, at);
    else if (t == JV_STR) r = string_filter(c, v, fname, a, at);
    if (r || c->status) return r;
    return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "filter '%s' cannot be applied to %s", fname, jv_type_name(v));
}

// ------------------------------------------------------------ global functions --

static struct jv *fn_namespace(struct jctx *c, struct jargs *a, const struct jnode *at) {
    if (a->npos > 1) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "namespace() takes at most one positional argument");
    struct jv *ns = jv_namespace_new(c), *src = a->npos ? a->pos[0] : NULL;
    if (src && src->type == JV_OBJECT)
        for (int i = 0; i < src->u.o.n; i++) jv_object_put(ns, jv_retain(src->u.o.kv[i].key), jv_retain(src->u.o.kv[i].val));
    else if (src && src->type == JV_ARRAY)
        for (int i = 0; i < src->u.a.n; i++) {
            struct jv *p = src->u.a.v[i];
            if (p->type != JV_ARRAY || p->u.a.n != 2 || p->u.a.v[0]->type != JV_STR) {
                jv_release(ns);
                return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "namespace() expects [key, value] pairs with string keys");
            }
            jv_object_put(ns, jv_retain(p->u.a.v[0]), jv_retain(p->u.a.v[1]));
        }
    else if (src) {
        jv_release(ns);
        return type_err(c, at, "namespace()", src);
    }
    for (int i = 0; a->kw && i < a->kw->u.o.n; i++)
        jv_object_put(ns, jv_retain(a->kw->u.o.kv[i].key), jv_retain(a->kw->u.o.kv[i].val));
    return ns;
}

static struct jv *fn_range(struct jctx *c, struct jargs *a, const struct jnode *at) {
    int64_t v[3] = {0, 0, 1};
    if (a->npos < 1 || a->npos > 3) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "range() takes 1 to 3 arguments");
    for (int i = 0; i < a->npos; i++) {
        if (a->pos[i]->type != JV_INT && a->pos[i]->type != JV_BOOL) return type_err(c, at, "range()", a->pos[i]);
        v[a->npos == 1 ? 1 : i] = a->pos[i]->type == JV_INT ? a->pos[i]->u.i : a->pos[i]->u.b;
    }
    if (v[2] == 0) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "range() step must not be zero");
    double span = ((double)v[1] - (double)v[0]) / (double)v[2];
    int64_t n = span <= 0 ? 0 : (int64_t)ceil(span);
    if (n > (1 << 24)) return jerr(c, VLLM_ERR_TOO_LONG, at, "range() of %lld items is too long", (long long)n);
    if (jctx_step(c, at, n)) return NULL;
    struct jv *r = jv_array_new((int)n);
    for (int64_t i = 0; i < n; i++) r->u.a.v[i] = jv_int(v[0] + i * v[2]);
    return r;
}

static struct jv *fn_strftime(struct jctx *c, struct jargs *a, const struct jnode *at) {
    struct jv *f = jargs_get(a, 0, NULL);
    if (!f || f->type != JV_STR) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "strftime_now() needs a format string");
    time_t now = c->opts.now ? (time_t)c->opts.now : time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    static const char *mon[] = {"January", "February", "March",     "April",   "May",      "June",
                                "July",    "August",   "September", "October", "November", "December"};
    static const char *day[] = {"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};
    struct jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < f->u.s.len && !rc; i++) {
        char t[32];
        char k = i + 1 < f->u.s.len && f->u.s.p[i] == '%' ? f->u.s.p[i + 1] : 0;
        switch (k) {
        case 'Y': snprintf(t, sizeof t, "%d", tm.tm_year + 1900); break;
        case 'y': snprintf(t, sizeof t, "%02d", tm.tm_year % 100); break;
        case 'm': snprintf(t, sizeof t, "%02d", tm.tm_mon + 1); break;
        case 'd': snprintf(t, sizeof t, "%02d", tm.tm_mday); break;
        case 'H': snprintf(t, sizeof t, "%02d", tm.tm_hour); break;
        case 'I': snprintf(t, sizeof t, "%02d", tm.tm_hour % 12 ? tm.tm_hour % 12 : 12); break;
        case 'M': snprintf(t, sizeof t, "%02d", tm.tm_min); break;
        case 'S': snprintf(t, sizeof t, "%02d", tm.tm_sec); break;
        case 'j': snprintf(t, sizeof t, "%03d", tm.tm_yday + 1); break;
        case 'p': snprintf(t, sizeof t, "%s", tm.tm_hour < 12 ? "AM" : "PM"); break;
        case 'b': snprintf(t, sizeof t, "%.3s", mon[tm.tm_mon]); break;
        case 'B': snprintf(t, sizeof t, "%s", mon[tm.tm_mon]); break;
        case 'a': snprintf(t, sizeof t, "%.3s", day[tm.tm_wday]); break;
        case 'A': snprintf(t, sizeof t, "%s", day[tm.tm_wday]); break;
        case '%': snprintf(t, sizeof t, "%%"); break;
        default: k = 0;
        }
        if (k) {
            rc = jbuf_addz(c, &b, t);
            i++;
        } else rc = jbuf_add(c, &b, f->u.s.p + i, 1);
    }
    if (rc) {
        free(b.p);
        return NULL;
    }
    return jbuf_to_str(&b);
}

struct jv *jbuiltin_call(struct jctx *c, int id, struct jargs *a, const struct jnode *at) {
    switch (id) {
    case JB_NAMESPACE: return fn_namespace(c, a, at);
    case JB_RANGE: return fn_range(c, a, at);
    case JB_STRFTIME: return fn_strftime(c, a, at);
    case JB_RAISE: {
        struct jv *m = jargs_get(a, 0, "message"), *s = m ? jv_display_str(c, m, at) : jv_strz("");
        if (s) jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "raise_exception: %s", s->u.s.p);
        jv_release(s);
        return NULL;
    }
    default: { // dict(**kwargs)
        struct jv *o = jv_object_new();
        for (int i = 0; a->kw && i < a->kw->u.o.n; i++)
            jv_object_put(o, jv_retain(a->kw->u.o.kv[i].key), jv_retain(a->kw->u.o.kv[i].val));
        return o;
    }
    }
}
