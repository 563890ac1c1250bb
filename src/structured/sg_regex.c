// sg_regex.c - regular expressions (the PCRE2 / ECMAScript subset JSON
// Schema patterns use) -> IR. The whole text must match: ^ and $ are
// allowed at the two ends only, and a lazy quantifier matches the same
// strings as a greedy one. Everything else that is not a plain regular
// construct (backreferences, lookaround, \b, \p{...}, inline flags, POSIX
// classes, possessive quantifiers) is an error naming it.
//
// With json_string the pattern describes a JSON string's value while the
// grammar matches its JSON text: each character becomes its encodings in a
// JSON string (sg_json_class), and `.` excludes line terminators (as in
// ECMAScript and PCRE2 both: \n \r U+2028 U+2029).
#include "core/common.h"
#include "structured/sg_internal.h"

struct rp {
    struct sg_ir *ir;
    const char *src, *p;
    int json;
    int depth;
};

static int rp_err(const struct rp *r, const char *what) {
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "regex at offset %d: %s", (int)(r->p - r->src), what);
}

struct ranges {
    uint32_t *v; // pairs
    int n, cap;
};

static void radd(struct ranges *r, uint32_t lo, uint32_t hi) {
    xgrow((void **)&r->v, &r->cap, 2 * r->n + 2, sizeof *r->v);
    r->v[2 * r->n] = lo;
    r->v[2 * r->n + 1] = hi;
    r->n++;
}

static const uint32_t DIGIT[] = {'0', '9'};
static const uint32_t WORD[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
// ECMAScript's \s (JSON Schema patterns are ECMA-262; Python's is the same set)
static const uint32_t SPACE[] = {'\t', '\r', ' ', ' ', 0xA0, 0xA0, 0x1680, 0x1680, 0x2000, 0x200A,
                                 0x2028, 0x2029, 0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
static const uint32_t DOT_NOT[] = {'\n', '\n', '\r', '\r', 0x2028, 0x2029};

// Adds the ranges of set (n pairs), or their complement.
static void radd_set(struct ranges *r, const uint32_t *set, int n, int negate) {
    if (!negate) {
        for (int i = 0; i < n; i++) radd(r, set[2 * i], set[2 * i + 1]);
        return;
    }
    uint32_t next = 0;
    for (int i = 0; i < n; i++) {
        if (set[2 * i] > next) radd(r, next, set[2 * i] - 1);
        next = set[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF) radd(r, next, 0x10FFFF);
}

// The expression matching one code point of ranges: a class, or in JSON
// mode the class's characters as JSON string content.
static struct sg_expr *char_expr(struct rp *r, const uint32_t *v, int n, int negate) {
    if (!r->json) return sg_class(r->ir, v, n, negate);
    struct sg_expr *c = sg_class(r->ir, v, n, negate); // normalized (sorted, complemented)
    return sg_json_class(r->ir, c->ranges, c->n);
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int utf8_at(struct rp *r, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)r->p;
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n) return rp_err(r, "invalid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? c & 31 : n == 3 ? c & 15 : c & 7;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return rp_err(r, "invalid UTF-8");
        v = v << 6 | (s[i] & 63);
    }
    r->p += n;
    *cp = v;
    return VLLM_OK;
}

// An escape after '\\': either one code point (*cp, *set NULL) or a class
// (*set, *nset, *neg).
static int escape(struct rp *r, int in_class, uint32_t *cp, const uint32_t **set, int *nset, int *neg) {
    char e = *r->p;
    *set = NULL;
    *neg = 0;
    switch (e) {
    case 'd': case 'D': *set = DIGIT, *nset = 1, *neg = e == 'D', r->p++; return VLLM_OK;
    case 'w': case 'W': *set = WORD, *nset = 4, *neg = e == 'W', r->p++; return VLLM_OK;
    case 's': case 'S': *set = SPACE, *nset = 10, *neg = e == 'S', r->p++; return VLLM_OK;
    case 't': *cp = '\t', r->p++; return VLLM_OK;
    case 'n': *cp = '\n', r->p++; return VLLM_OK;
    case 'r': *cp = '\r', r->p++; return VLLM_OK;
    case 'f': *cp = '\f', r->p++; return VLLM_OK;
    case 'v': *cp = '\v', r->p++; return VLLM_OK;
    case '0': *cp = 0, r->p++; return VLLM_OK;
    case 'x': case 'u': {
        r->p++;
        uint32_t v = 0;
        if (*r->p == '{') {
            r->p++;
            int k = 0;
            for (; hexval(*r->p) >= 0 && k < 7; k++) v = v * 16 + (uint32_t)hexval(*r->p++);
            if (!k || *r->p != '}') return rp_err(r, "bad \\x{...} escape");
            r->p++;
        } else {
            int need = e == 'x' ? 2 : 4;
            for (int k = 0; k < need; k++) {
                int h = hexval(*r->p);
                if (h < 0) return rp_err(r, e == 'x' ? "bad \\xHH escape" : "bad \\uHHHH escape");
                v = v * 16 + (uint32_t)h;
                r->p++;
            }
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return rp_err(r, "escape is not a Unicode scalar value");
        *cp = v;
        return VLLM_OK;
    }
    case 'b':
        if (in_class) { *cp = '\b', r->p++; return VLLM_OK; }
        return rp_err(r, "unsupported: \\b (word boundary)");
    case 'B': return rp_err(r, "unsupported: \\B (word boundary)");
    case 'p': case 'P': return rp_err(r, "unsupported: \\p{...} (Unicode property)");
    case 'k': return rp_err(r, "unsupported: \\k<name> (backreference)");
    case 'A': case 'z': case 'Z': case 'G': return rp_err(r, "unsupported: \\A \\z \\Z \\G (anchors)");
    case 'c': return rp_err(r, "unsupported: \\cX (control escape)");
    case 0: return rp_err(r, "pattern ends with '\\'");
    default:
        if (e >= '1' && e <= '9') return rp_err(r, "unsupported: backreference");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
            char msg[64];
            snprintf(msg, sizeof msg, "unsupported escape \\%c", e);
            return rp_err(r, msg);
        }
        return utf8_at(r, cp); // an escaped punctuation or other character: itself
    }
}

static int class_atom(struct rp *r, struct ranges *out, uint32_t *single, int *is_single) {
    *is_single = 0;
    if (*r->p == '[' && r->p[1] == ':') return rp_err(r, "unsupported: POSIX class [:name:]");
    if (*r->p == '\\') {
        r->p++;
        const uint32_t *set;
        int nset, neg;
        TRY(escape(r, 1, single, &set, &nset, &neg));
        if (set) radd_set(out, set, nset, neg);
        else *is_single = 1;
        return VLLM_OK;
    }
    TRY(utf8_at(r, single));
    *is_single = 1;
    return VLLM_OK;
}

static int char_class(struct rp *r, struct sg_expr **out) {
    r->p++; // [
    int neg = 0;
    if (*r->p == '^') neg = 1, r->p++;
    struct ranges rs = {0};
    int first = 1, rc = VLLM_OK;
    while (!rc && (*r->p != ']' || first)) {
        if (!*r->p) {
            rc = rp_err(r, "unterminated character class");
            break;
        }
        first = 0;
        uint32_t lo, hi;
        int single;
        if ((rc = class_atom(r, &rs, &lo, &single))) break;
        if (!single) continue;
        if (r->p[0] == '-' && r->p[1] && r->p[1] != ']') {
            r->p++;
            if ((rc = class_atom(r, &rs, &hi, &single))) break;
            if (!single) {
                rc = rp_err(r, "a class escape cannot end a range");
                break;
            }
            if (hi < lo) {
                rc = rp_err(r, "character range out of order");
                break;
            }
            radd(&rs, lo, hi);
        } else {
            radd(&rs, lo, lo);
        }
    }
    if (!rc) {
        r->p++;
        *out = char_expr(r, rs.v, rs.n, neg);
    }
    free(rs.v);
    return rc;
}

static int alternation(struct rp *r, struct sg_expr **out);

static int group(struct rp *r, struct sg_expr **out) {
    r->p++; // (
    if (*r->p == '?') {
        const char *q = r->p + 1;
        if (*q == ':') r->p += 2;
        else if ((*q == '<' && q[1] != '=' && q[1] != '!') || (*q == 'P' && q[1] == '<')) { // named group
            const char *e = strchr(q, '>');
            if (!e) return rp_err(r, "unterminated group name");
            r->p = e + 1;
        } else if (*q == '=' || *q == '!' || *q == '<') return rp_err(r, "unsupported: lookaround");
        else if (*q == '>') return rp_err(r, "unsupported: atomic group");
        else return rp_err(r, "unsupported: inline flags or (?...) construct");
    }
    if (++r->depth > 200) return rp_err(r, "nesting too deep");
    TRY(alternation(r, out));
    if (*r->p != ')') return rp_err(r, "missing ')'");
    r->p++;
    r->depth--;
    return VLLM_OK;
}

static int number(struct rp *r, int *v) {
    if (*r->p < '0' || *r->p > '9') return 0;
    long x = 0;
    while (*r->p >= '0' && *r->p <= '9') {
        x = x * 10 + (*r->p++ - '0');
        if (x > 100000) x = 100001;
    }
    *v = (int)x;
    return 1;
}

// A quantifier at r->p, or none (*min = -1). A '{' that does not start a
// valid quantifier is a literal, as in PCRE2 and ECMAScript.
static int quantifier(struct rp *r, int *min, int *max) {
    *min = -1;
    char c = *r->p;
    if (c == '*') *min = 0, *max = -1, r->p++;
    else if (c == '+') *min = 1, *max = -1, r->p++;
    else if (c == '?') *min = 0, *max = 1, r->p++;
    else if (c == '{') {
        const char *save = r->p++;
        int a, b = -1;
        if (!number(r, &a)) {
            r->p = save;
            return VLLM_OK;
        }
        if (*r->p == ',') {
            r->p++;
            if (!number(r, &b)) b = -1;
        } else {
            b = a;
        }
        if (*r->p != '}') {
            r->p = save;
            return VLLM_OK;
        }
        r->p++;
        if (a > 100000 || b > 100000) return rp_err(r, "repetition count over 100000");
        if (b >= 0 && b < a) return rp_err(r, "repetition {m,n} with n < m");
        *min = a, *max = b;
    } else {
        return VLLM_OK;
    }
    if (*r->p == '?') r->p++; // lazy: the same strings
    else if (*r->p == '+') return rp_err(r, "unsupported: possessive quantifier");
    return VLLM_OK;
}

static int atom(struct rp *r, struct sg_expr **out) {
    char c = *r->p;
    if (c == '(') return group(r, out);
    if (c == '[') return char_class(r, out);
    if (c == '.') {
        r->p++;
        *out = char_expr(r, DOT_NOT, 3, 1);
        return VLLM_OK;
    }
    if (c == '^' || c == '$') return rp_err(r, "unsupported: an anchor inside the pattern (only ^ first and $ last)");
    if (c == '*' || c == '+' || c == '?') return rp_err(r, "quantifier without a target");
    uint32_t cp;
    if (c == '\\') {
        r->p++;
        const uint32_t *set;
        int nset, neg;
        TRY(escape(r, 0, &cp, &set, &nset, &neg));
        if (set) {
            *out = char_expr(r, set, nset, neg);
            return VLLM_OK;
        }
    } else {
        TRY(utf8_at(r, &cp));
    }
    uint32_t one[2] = {cp, cp};
    if (!r->json) {
        char u[4];
        int n = cp < 0x80 ? (u[0] = (char)cp, 1) : 0;
        if (n) {
            *out = sg_lit(r->ir, u, 1);
            return VLLM_OK;
        }
    }
    *out = char_expr(r, one, 1, 0);
    return VLLM_OK;
}

static int sequence(struct rp *r, struct sg_expr **out) {
    struct sg_expr *seq = sg_seq(r->ir);
    while (*r->p && *r->p != '|' && *r->p != ')') {
        if (*r->p == '$' && r->p[1] == 0 && r->depth == 0) break; // the end anchor
        struct sg_expr *a;
        TRY(atom(r, &a));
        int min, max;
        TRY(quantifier(r, &min, &max));
        if (min >= 0) a = sg_rep(r->ir, a, min, max);
        int min2;
        if (min >= 0 && (*r->p == '*' || *r->p == '+' || *r->p == '?' || *r->p == '{')) {
            TRY(quantifier(r, &min2, &max));
            if (min2 >= 0) return rp_err(r, "a quantifier after a quantifier");
        }
        sg_push(seq, a);
    }
    *out = seq->n == 1 ? seq->sub[0] : seq;
    return VLLM_OK;
}

static int alternation(struct rp *r, struct sg_expr **out) {
    struct sg_expr *alt = sg_alt(r->ir), *s;
    TRY(sequence(r, &s));
    sg_push(alt, s);
    while (*r->p == '|') {
        r->p++;
        TRY(sequence(r, &s));
        sg_push(alt, s);
    }
    *out = alt->n == 1 ? alt->sub[0] : alt;
    return VLLM_OK;
}

int sg_regex_expr(struct sg_ir *ir, const char *re, int json_string, struct sg_expr **out) {
    struct rp r = {ir, re, re, json_string, 0};
    if (*r.p == '^') r.p++;
    TRY(alternation(&r, out));
    if (*r.p == '$' && !r.p[1]) r.p++;
    if (*r.p == ')') return rp_err(&r, "unmatched ')'");
    if (*r.p) return rp_err(&r, "unsupported: an anchor inside the pattern (only ^ first and $ last)");
    return VLLM_OK;
}

int sg_compile_regex(const char *re, struct sg_grammar **out) {
    *out = NULL;
    if (!re) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "regex: no pattern");
    struct sg_ir *ir = sg_ir_create();
    struct sg_expr *e;
    int rc = sg_regex_expr(ir, re, 0, &e);
    if (!rc) {
        int root = sg_ir_rule(ir, "root");
        sg_ir_define(ir, root, e);
        rc = sg_grammar_build(ir, root, out);
    }
    sg_ir_free(ir);
    return rc;
}
