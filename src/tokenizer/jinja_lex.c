// jinja_lex.c - template source to tokens, as @huggingface/jinja does it:
// the source is first preprocessed (one trailing newline dropped,
// lstrip_blocks, trim_blocks, {% generation %} tags removed), then split
// into text and the tokens inside {% %}, {{ }} and {# #}.
#include <stdarg.h>

#include "tokenizer/jinja_internal.h"

// A byte string with, for every byte, its offset in the original source.
struct pre {
    char *p;
    uint32_t *at;
    size_t n, cap;
};

static void pre_put(struct pre *o, char ch, uint32_t at) {
    if (o->n + 2 > o->cap) {
        o->cap = o->cap ? o->cap * 2 : 256;
        o->p = xrealloc(o->p, o->cap);
        o->at = xrealloc(o->at, o->cap * sizeof *o->at);
    }
    o->p[o->n] = ch;
    o->at[o->n++] = at;
    o->p[o->n] = 0;
}

static void pre_free(struct pre *o) {
    free(o->p);
    free(o->at);
}

// A JavaScript multiline `^` matches after \n, \r, U+2028 and U+2029.
static int line_start(const char *s, size_t i) {
    if (i == 0) return 1;
    char c = s[i - 1];
    if (c == '\n' || c == '\r') return 1;
    return i >= 3 && (unsigned char)s[i - 3] == 0xe2 && (unsigned char)s[i - 2] == 0x80 &&
           ((unsigned char)c == 0xa8 || (unsigned char)c == 0xa9);
}

static int is_tag_mark(char c) { return c == '#' || c == '%' || c == '-'; }

static void preprocess(const struct pre *in, struct pre *out) {
    const char *s = in->p;
    size_t n = in->n;
    if (n && s[n - 1] == '\n') n--;
    // lstrip_blocks: spaces and tabs before a block at the start of a line.
    struct pre a = {0};
    for (size_t i = 0; i < n;) {
        if (line_start(s, i)) {
            size_t j = i;
            while (j < n && (s[j] == ' ' || s[j] == '\t')) j++;
            if (j + 1 < n && s[j] == '{' && is_tag_mark(s[j + 1])) i = j;
        }
        pre_put(&a, s[i], in->at[i]);
        i++;
    }
    // trim_blocks: the newline right after a block.
    struct pre b = {0};
    for (size_t i = 0; i < a.n;) {
        if (i + 2 < a.n && is_tag_mark(a.p[i]) && a.p[i + 1] == '}' && a.p[i + 2] == '\n') {
            pre_put(&b, a.p[i], a.at[i]);
            pre_put(&b, a.p[i + 1], a.at[i + 1]);
            i += 3;
            continue;
        }
        pre_put(&b, a.p[i], a.at[i]);
        i++;
    }
    pre_free(&a);
    // transformers' {% generation %} / {% endgeneration %} tags render as nothing.
    size_t last = 0;
    for (size_t i = 0; i + 1 < b.n; i++) {
        if (b.p[i] != '{' || b.p[i + 1] != '%') continue;
        size_t j = i + 2;
        int lstrip = j < b.n && b.p[j] == '-';
        if (lstrip) j++;
        int w;
        while (j < b.n && (w = jv_ws_len(b.p + j, b.n - j))) j += (size_t)w;
        if (j + 3 <= b.n && !memcmp(b.p + j, "end", 3)) j += 3;
        if (j + 10 > b.n || memcmp(b.p + j, "generation", 10)) continue;
        j += 10;
        while (j < b.n && (w = jv_ws_len(b.p + j, b.n - j))) j += (size_t)w;
        int rstrip = j < b.n && b.p[j] == '-';
        if (rstrip) j++;
        if (j + 2 > b.n || b.p[j] != '%' || b.p[j + 1] != '}') continue;
        j += 2;
        size_t end = i; // text before the tag, less trailing whitespace for {%-
        if (lstrip) {
            size_t keep = last;
            for (size_t k = last; k < i;) {
                int wl = jv_ws_len(b.p + k, i - k);
                k += wl ? (size_t)wl : 1;
                if (!wl) keep = k;
            }
            end = keep;
        }
        for (size_t k = last; k < end; k++) pre_put(out, b.p[k], b.at[k]);
        size_t after = j;
        while (after < b.n && (w = jv_ws_len(b.p + after, b.n - after))) after += (size_t)w;
        if (!rstrip)
            for (size_t k = j; k < after; k++) pre_put(out, b.p[k], b.at[k]);
        last = after;
        i = after - 1;
    }
    for (size_t k = last; k < b.n; k++) pre_put(out, b.p[k], b.at[k]);
    pre_free(&b);
}

struct lexer {
    struct jinja_template *t;
    const char *s;
    const uint32_t *at;
    size_t n, cur;
    struct jtok *toks;
    int ntoks, cap;
    int curly; // depth of { } inside {{ }}: "}}" there closes a dict, not the tag
    char *msg;
    size_t msgcap;
    uint32_t err_pos;
};

static int lex_err(struct lexer *L, int status, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int lex_err(struct lexer *L, int status, size_t at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->msg, L->msgcap, fmt, ap);
    va_end(ap);
    L->err_pos = L->n == 0 ? 0 : at < L->n ? L->at[at] : L->at[L->n - 1] + 1;
    return status;
}

static int last_type(const struct lexer *L) { return L->ntoks ? L->toks[L->ntoks - 1].type : T_EOF; }

static void push(struct lexer *L, int type, const char *s, size_t len, size_t at) {
    xgrow((void **)&L->toks, &L->cap, L->ntoks + 1, sizeof *L->toks);
    struct jtok *k = &L->toks[L->ntoks++];
    k->type = (uint8_t)type;
    k->s = s;
    k->len = len;
    k->pos = L->n == 0 ? 0 : at < L->n ? L->at[at] : L->at[L->n - 1] + 1;
}

static char *arena_copy(struct jinja_template *t, const char *s, size_t n) {
    char *p = jarena_alloc(t, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

// {%- and {{- : drop the whitespace at the end of the text before.
static void strip_trailing(struct lexer *L) {
    if (!L->ntoks || L->toks[L->ntoks - 1].type != T_TEXT) return;
    struct jtok *k = &L->toks[L->ntoks - 1];
    size_t keep = 0;
    for (size_t i = 0; i < k->len;) {
        int w = jv_ws_len(k->s + i, k->len - i);
        if (w) i += (size_t)w;
        else keep = ++i;
    }
    k->len = keep;
    if (keep == 0) L->ntoks--;
}

static void skip_ws(struct lexer *L) {
    int w;
    while (L->cur < L->n && (w = jv_ws_len(L->s + L->cur, L->n - L->cur))) L->cur += (size_t)w;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_';
}

// Consumes a run of digits; like the oracle, input that ends inside the run is an error.
static int digits(struct lexer *L) {
    while (L->cur < L->n && is_digit(L->s[L->cur]))
        if (++L->cur >= L->n) return lex_err(L, VLLM_ERR_FORMAT, L->cur, "unexpected end of template");
    return 0;
}

static int hexval(char c) {
    return is_digit(c) ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
}

static int lex_string(struct lexer *L, char quote) {
    size_t start = L->cur++;
    char *out = xmalloc(L->n - L->cur + 1);
    size_t k = 0;
    uint32_t pending_hi = 0; // a \uD8xx waiting for its low surrogate
    for (;;) {
        if (L->cur >= L->n) {
            free(out);
            return lex_err(L, VLLM_ERR_FORMAT, start, "unterminated string literal");
        }
        char ch = L->s[L->cur++];
        if (ch == quote) break;
        if (ch != '\\') {
            if (pending_hi) k += jv_utf8_put(out + k, 0xfffd), pending_hi = 0;
            out[k++] = ch;
            continue;
        }
        if (L->cur >= L->n) continue; // reported as unterminated above
        char e = L->s[L->cur++];
        if (e == 'x' || e == 'u') {
            int nh = e == 'x' ? 2 : 4;
            uint32_t v = 0;
            for (int i = 0; i < nh; i++) {
                int h = L->cur + (size_t)i < L->n ? hexval(L->s[L->cur + (size_t)i]) : -1;
                if (h < 0) {
                    free(out);
                    return lex_err(L, VLLM_ERR_FORMAT, L->cur, "invalid \\%c escape in a string literal", e);
                }
                v = v * 16 + (uint32_t)h;
            }
            L->cur += (size_t)nh;
            if (v >= 0xdc00 && v < 0xe000 && pending_hi) {
                v = 0x10000 + ((pending_hi - 0xd800) << 10) + (v - 0xdc00);
                pending_hi = 0;
            } else if (pending_hi) {
                k += jv_utf8_put(out + k, 0xfffd);
                pending_hi = 0;
            }
            if (v >= 0xd800 && v < 0xdc00) pending_hi = v;
            else k += jv_utf8_put(out + k, v >= 0xd800 && v < 0xe000 ? 0xfffd : v);
            continue;
        }
        if (pending_hi) k += jv_utf8_put(out + k, 0xfffd), pending_hi = 0;
        const char *from = "ntrbfv'\"\\", *to = "\n\t\r\b\f\v'\"\\";
        const char *f = e ? strchr(from, e) : NULL;
        if (!f) {
            free(out);
            return lex_err(L, VLLM_ERR_FORMAT, L->cur - 2, "unknown escape \\%c in a string literal", e);
        }
        out[k++] = to[f - from];
    }
    if (pending_hi) k += jv_utf8_put(out + k, 0xfffd);
    push(L, T_STR, arena_copy(L->t, out, k), k, start);
    free(out);
    return 0;
}

static const struct {
    const char *seq;
    int type;
} RULES[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
    {"(", T_LPAREN},     {")", T_RPAREN},      {"{", T_LBRACE},     {"}", T_RBRACE},
    {"[", T_LBRACKET},   {"]", T_RBRACKET},    {",", T_COMMA},      {".", T_DOT},
    {":", T_COLON},      {"|", T_PIPE},        {"<=", T_CMP},       {">=", T_CMP},
    {"==", T_CMP},       {"!=", T_CMP},        {"<", T_CMP},        {">", T_CMP},
    {"+", T_ADD},        {"-", T_ADD},         {"~", T_ADD},        {"**", T_POW},
    {"*", T_MUL},        {"//", T_MUL},        {"/", T_MUL},        {"%", T_MUL},
    {"=", T_EQUALS},
};

static int lex_text_or_comment(struct lexer *L, int *done) {
    *done = 0;
    int lt = last_type(L);
    if (lt == T_EOF || lt == T_CLOSE_STMT || lt == T_CLOSE_EXPR || lt == T_COMMENT) {
        size_t end = L->cur;
        for (;;) {
            const char *b = memchr(L->s + end, '{', L->n - end);
            if (!b) {
                end = L->n;
                break;
            }
            end = (size_t)(b - L->s);
            char nx = end + 1 < L->n ? L->s[end + 1] : 0;
            if (nx == '%' || nx == '{' || nx == '#') break;
            end++;
        }
        if (end > L->cur) {
            push(L, T_TEXT, L->s + L->cur, end - L->cur, L->cur);
            L->cur = end;
            *done = 1;
            return 0;
        }
    }
    if (L->s[L->cur] != '{') return 0;
    char nx = L->cur + 1 < L->n ? L->s[L->cur + 1] : 0;
    if (nx == '#') {
        size_t start = L->cur;
        L->cur += 2;
        int strip_before = L->cur < L->n && L->s[L->cur] == '-';
        if (strip_before) L->cur++;
        const char *e = L->cur + 1 < L->n ? memmem(L->s + L->cur, L->n - L->cur, "#}", 2) : NULL;
        if (!e) return lex_err(L, VLLM_ERR_FORMAT, start, "missing end of comment tag");
        size_t end = (size_t)(e - L->s);
        int strip_after = end > L->cur && L->s[end - 1] == '-';
        if (strip_before) strip_trailing(L);
        push(L, T_COMMENT, "", 0, start);
        L->cur = end + 2;
        if (strip_after) skip_ws(L);
        *done = 1;
        return 0;
    }
    if (L->cur + 2 < L->n && L->s[L->cur + 2] == '-' && (nx == '%' || nx == '{')) {
        strip_trailing(L);
        push(L, nx == '%' ? T_OPEN_STMT : T_OPEN_EXPR, nx == '%' ? "{%" : "{{", 2, L->cur);
        if (nx == '{') L->curly = 0;
        L->cur += 3;
        *done = 1;
    }
    return 0;
}

static int lex_number(struct lexer *L, size_t start, int allow_frac) {
    TRY(digits(L));
    if (allow_frac && L->cur + 1 < L->n && L->s[L->cur] == '.' && is_digit(L->s[L->cur + 1])) {
        L->cur++;
        TRY(digits(L));
    }
    push(L, T_NUM, L->s + start, L->cur - start, start);
    return 0;
}

static int lex_one(struct lexer *L) {
    int done;
    TRY(lex_text_or_comment(L, &done));
    if (done) return 0;
    int w;
    while ((w = jv_ws_len(L->s + L->cur, L->n - L->cur)))
        if ((L->cur += (size_t)w) >= L->n) return lex_err(L, VLLM_ERR_FORMAT, L->cur, "unexpected end of template");
    char ch = L->s[L->cur];
    char c1 = L->cur + 1 < L->n ? L->s[L->cur + 1] : 0, c2 = L->cur + 2 < L->n ? L->s[L->cur + 2] : 0;
    if (ch == '-' && c2 == '}' && (c1 == '%' || c1 == '}')) {
        push(L, c1 == '%' ? T_CLOSE_STMT : T_CLOSE_EXPR, c1 == '%' ? "%}" : "}}", 2, L->cur);
        L->cur += 3;
        skip_ws(L);
        return 0;
    }
    int lt = last_type(L);
    if (ch == '-' || ch == '+') {
        if (lt == T_TEXT || lt == T_EOF) return lex_err(L, VLLM_ERR_FORMAT, L->cur, "unexpected '%c'", ch);
        if (lt != T_IDENT && lt != T_NUM && lt != T_STR && lt != T_RPAREN && lt != T_RBRACKET) {
            // A sign: glued to a number literal when one follows.
            size_t start = L->cur++;
            size_t d = L->cur;
            TRY(digits(L));
            if (L->cur > d) {
                L->cur = d;
                return lex_number(L, start, 1);
            }
            push(L, T_UNARY, ch == '-' ? "-" : "+", 1, start);
            return 0;
        }
    }
    for (size_t r = 0; r < sizeof RULES / sizeof RULES[0]; r++) {
        size_t len = strlen(RULES[r].seq);
        if (RULES[r].seq[0] != ch) continue;
        if (RULES[r].type == T_CLOSE_EXPR && L->curly > 0) continue;
        if (L->cur + len > L->n || memcmp(L->s + L->cur, RULES[r].seq, len)) continue;
        push(L, RULES[r].type, RULES[r].seq, len, L->cur);
        if (RULES[r].type == T_OPEN_EXPR) L->curly = 0;
        else if (RULES[r].type == T_LBRACE) L->curly++;
        else if (RULES[r].type == T_RBRACE) L->curly--;
        L->cur += len;
        return 0;
    }
    if (ch == '\'' || ch == '"') return lex_string(L, ch);
    if (is_digit(ch)) return lex_number(L, L->cur, lt != T_DOT);
    if (is_word(ch)) {
        size_t start = L->cur;
        while (L->cur < L->n && is_word(L->s[L->cur]))
            if (++L->cur >= L->n) return lex_err(L, VLLM_ERR_FORMAT, L->cur, "unexpected end of template");
        push(L, T_IDENT, L->s + start, L->cur - start, start);
        return 0;
    }
    return lex_err(L, VLLM_ERR_FORMAT, L->cur, "unexpected character '%c'", ch);
}

int jinja_lex(struct jinja_template *t, struct jtok **toks, int *ntoks, char *msg, size_t msgcap,
              uint32_t *err_pos) {
    struct pre in = {0}, out = {0};
    for (size_t i = 0; i < t->len; i++) pre_put(&in, t->src[i], (uint32_t)i);
    preprocess(&in, &out);
    pre_free(&in);
    // Text tokens point into the preprocessed source, which the template keeps.
    struct lexer L = {.t = t, .msg = msg, .msgcap = msgcap};
    L.s = out.n ? arena_copy(t, out.p, out.n) : "";
    L.at = out.at;
    L.n = out.n;
    int rc = 0;
    while (L.cur < L.n && !(rc = lex_one(&L))) {}
    *err_pos = L.err_pos;
    free(out.p);
    free(out.at);
    if (rc) {
        free(L.toks);
        return rc;
    }
    *toks = L.toks;
    *ntoks = L.ntoks;
    return 0;
}
