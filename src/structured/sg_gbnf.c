// sg_gbnf.c - GBNF (llama.cpp's grammar syntax) -> IR. A rule ends at the
// end of its line, except after `::=` or `|`, inside parentheses, or where
// the next line starts with `|`. Errors name the line and column.
#include "core/common.h"
#include "structured/sg_internal.h"

struct gp {
    struct sg_ir *ir;
    const char *src, *p;
    int depth;
};

static int gp_err(const struct gp *g, const char *what) {
    int line = 1, col = 1;
    for (const char *q = g->src; q < g->p && *q; q++) {
        if (*q == '\n') line++, col = 1;
        else col++;
    }
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "GBNF %d:%d: %s", line, col, what);
}

// Skips blanks and comments; newlines too when nl.
static void space(struct gp *g, int nl) {
    for (;;) {
        char c = *g->p;
        if (c == ' ' || c == '\t' || (c == '\r' && g->p[1] == '\n') || (nl && (c == '\n' || c == '\r'))) g->p++;
        else if (c == '#')
            while (*g->p && *g->p != '\n') g->p++;
        else break;
    }
}

static int name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int utf8_len_at(const unsigned char *s, uint32_t *cp) {
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n) return 0;
    uint32_t v = n == 1 ? c : n == 2 ? c & 31 : n == 3 ? c & 15 : c & 7;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 63);
    }
    *cp = v;
    return n;
}

// One character of a literal or class (escapes decoded) -> code point.
static int gp_char(struct gp *g, uint32_t *cp) {
    if (*g->p == '\\') {
        char e = g->p[1];
        int nhex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (nhex) {
            uint32_t v = 0;
            for (int i = 0; i < nhex; i++) {
                int h = hexval(g->p[2 + i]);
                if (h < 0) return gp_err(g, "bad hex escape");
                v = v * 16 + (uint32_t)h;
            }
            g->p += 2 + nhex;
            if (v > 0x10FFFF) return gp_err(g, "escape beyond U+10FFFF");
            *cp = v;
            return VLLM_OK;
        }
        if (!e || e == '\n') return gp_err(g, "unfinished escape");
        *cp = e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : (uint32_t)(unsigned char)e;
        g->p += 2;
        return VLLM_OK;
    }
    int n = utf8_len_at((const unsigned char *)g->p, cp);
    if (!n) return gp_err(g, "invalid UTF-8");
    g->p += n;
    return VLLM_OK;
}

static int encode(uint32_t c, char *o) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | c >> 6); o[1] = (char)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12); o[1] = (char)(0x80 | ((c >> 6) & 63)); o[2] = (char)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18); o[1] = (char)(0x80 | ((c >> 12) & 63));
    o[2] = (char)(0x80 | ((c >> 6) & 63)); o[3] = (char)(0x80 | (c & 63));
    return 4;
}

static int alternates(struct gp *g, struct sg_expr **out);

static int literal(struct gp *g, struct sg_expr **out) {
    g->p++; // "
    struct sg_buf b = {0};
    int rc = VLLM_OK;
    while (!rc && *g->p != '"') {
        if (!*g->p || *g->p == '\n') {
            rc = gp_err(g, "unterminated string");
            break;
        }
        uint32_t cp;
        rc = gp_char(g, &cp);
        char u[4];
        if (!rc) sg_buf_add(&b, u, (size_t)encode(cp, u));
    }
    if (!rc) {
        g->p++;
        *out = sg_lit(g->ir, b.p ? b.p : "", b.len);
    }
    free(b.p);
    return rc;
}

static int char_class(struct gp *g, struct sg_expr **out) {
    g->p++; // [
    int neg = 0;
    if (*g->p == '^') neg = 1, g->p++;
    uint32_t *r = NULL;
    int n = 0, cap = 0, rc = VLLM_OK;
    while (!rc && *g->p != ']') {
        if (!*g->p) {
            rc = gp_err(g, "unterminated character class");
            break;
        }
        uint32_t lo, hi;
        rc = gp_char(g, &lo);
        hi = lo;
        if (!rc && g->p[0] == '-' && g->p[1] && g->p[1] != ']') {
            g->p++;
            rc = gp_char(g, &hi);
            if (!rc && hi < lo) rc = gp_err(g, "character range out of order");
        }
        if (rc) break;
        xgrow((void **)&r, &cap, 2 * n + 2, sizeof *r);
        r[2 * n] = lo;
        r[2 * n + 1] = hi;
        n++;
    }
    if (!rc) {
        g->p++;
        *out = sg_class(g->ir, r, n, neg);
    }
    free(r);
    return rc;
}

static int number(struct gp *g, int *v) {
    if (*g->p < '0' || *g->p > '9') return 0;
    long x = 0;
    while (*g->p >= '0' && *g->p <= '9') {
        x = x * 10 + (*g->p++ - '0');
        if (x > 100000) x = 100001;
    }
    *v = (int)x;
    return 1;
}

// {m}, {m,}, {m,n}, {,n}
static int braces(struct gp *g, int *min, int *max) {
    g->p++;
    space(g, 0);
    int a = 0, b = -1, have_a = number(g, &a);
    space(g, 0);
    if (*g->p == ',') {
        g->p++;
        space(g, 0);
        if (!number(g, &b)) b = -1;
    } else {
        if (!have_a) return gp_err(g, "expected a repetition count");
        b = a;
    }
    space(g, 0);
    if (*g->p != '}') return gp_err(g, "expected '}'");
    g->p++;
    if (a > 100000 || b > 100000) return gp_err(g, "repetition count over 100000");
    if (b >= 0 && b < a) return gp_err(g, "repetition {m,n} with n < m");
    *min = a;
    *max = b;
    return VLLM_OK;
}

static int element(struct gp *g, struct sg_expr **out) {
    char c = *g->p;
    struct sg_expr *e = NULL;
    if (c == '"') TRY(literal(g, &e));
    else if (c == '[') TRY(char_class(g, &e));
    else if (c == '.') {
        g->p++;
        uint32_t all[2] = {0, 0x10FFFF};
        e = sg_class(g->ir, all, 1, 0);
    } else if (c == '(') {
        g->p++;
        if (++g->depth > 200) return gp_err(g, "nesting too deep");
        space(g, 1);
        TRY(alternates(g, &e));
        space(g, 1);
        if (*g->p != ')') return gp_err(g, "expected ')'");
        g->p++;
        g->depth--;
    } else if (name_char(c)) {
        const char *s = g->p;
        while (name_char(*g->p)) g->p++;
        char name[256];
        if (g->p - s >= (long)sizeof name) return gp_err(g, "rule name too long");
        memcpy(name, s, (size_t)(g->p - s));
        name[g->p - s] = 0;
        e = sg_ref(g->ir, sg_ir_rule(g->ir, name));
    } else {
        return gp_err(g, "expected an element");
    }
    for (;;) { // postfix repetition
        c = *g->p;
        int min = 0, max = 0;
        if (c == '*') min = 0, max = -1, g->p++;
        else if (c == '+') min = 1, max = -1, g->p++;
        else if (c == '?') min = 0, max = 1, g->p++;
        else if (c == '{') TRY(braces(g, &min, &max));
        else break;
        e = sg_rep(g->ir, e, min, max);
    }
    *out = e;
    return VLLM_OK;
}

static int sequence(struct gp *g, struct sg_expr **out) {
    struct sg_expr *seq = sg_seq(g->ir);
    for (;;) {
        space(g, g->depth > 0);
        char c = *g->p;
        if (!c || c == '|' || c == ')' || c == '\n' || c == '\r') break;
        struct sg_expr *e;
        TRY(element(g, &e));
        sg_push(seq, e);
    }
    *out = seq->n == 1 ? seq->sub[0] : seq;
    return VLLM_OK;
}

// At the top level: a newline followed by a line starting with '|' continues.
static int continues(struct gp *g) {
    const char *save = g->p;
    space(g, 1);
    if (*g->p == '|') return 1;
    g->p = save;
    return 0;
}

static int alternates(struct gp *g, struct sg_expr **out) {
    struct sg_expr *alt = sg_alt(g->ir), *s;
    TRY(sequence(g, &s));
    sg_push(alt, s);
    while (*g->p == '|' || (!g->depth && (*g->p == '\n' || *g->p == '\r') && continues(g))) {
        g->p++;
        space(g, 1);
        TRY(sequence(g, &s));
        sg_push(alt, s);
    }
    *out = alt->n == 1 ? alt->sub[0] : alt;
    return VLLM_OK;
}

static int rule(struct gp *g) {
    const char *s = g->p;
    while (name_char(*g->p)) g->p++;
    if (g->p == s) return gp_err(g, "expected a rule name");
    char name[256];
    if (g->p - s >= (long)sizeof name) return gp_err(g, "rule name too long");
    memcpy(name, s, (size_t)(g->p - s));
    name[g->p - s] = 0;
    space(g, 0);
    if (strncmp(g->p, "::=", 3)) return gp_err(g, "expected '::='");
    g->p += 3;
    space(g, 1);
    int r = sg_ir_rule(g->ir, name);
    if (g->ir->body[r]) {
        char msg[300];
        snprintf(msg, sizeof msg, "rule '%s' is defined twice", name);
        return gp_err(g, msg);
    }
    struct sg_expr *body;
    TRY(alternates(g, &body));
    sg_ir_define(g->ir, r, body);
    space(g, 0);
    if (*g->p && *g->p != '\n' && *g->p != '\r') return gp_err(g, "unexpected character");
    return VLLM_OK;
}

int sg_gbnf_ir(struct sg_ir *ir, const char *src) {
    struct gp g = {ir, src, src, 0};
    int rc = VLLM_OK;
    for (;;) {
        space(&g, 1);
        if (!*g.p) break;
        if ((rc = rule(&g))) break;
    }
    return rc;
}

int sg_compile_gbnf(const char *src, struct sg_grammar **out) {
    *out = NULL;
    if (!src) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "GBNF: no grammar");
    struct sg_ir *ir = sg_ir_create();
    int rc = sg_gbnf_ir(ir, src);
    if (!rc) {
        int root = -1;
        for (int i = 0; i < ir->n_rules; i++)
            if (!strcmp(ir->names[i], "root")) root = i;
        if (root < 0 || !ir->body[root]) rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT, "GBNF: no 'root' rule");
        else rc = sg_grammar_build(ir, root, out);
    }
    sg_ir_free(ir);
    return rc;
}
