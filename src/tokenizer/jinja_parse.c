// jinja_parse.c - tokens to a syntax tree, with @huggingface/jinja's grammar
// and precedence (loosest first): x if c else y; or; and; not; comparisons,
// in, not in; + - ~; * / // %; **; is (tests); | (filters); unary + -;
// calls, .member, [index], [a:b:c]; literals and (parentheses).
//
// What each node kind keeps (struct jnode):
//   N_TEXT s            N_OUTPUT a            N_IF a=test l1=body l2=else
//   N_FOR a=target b=iterable c=if-condition l1=body l2=else
//   N_SET a=target b=value (or l1=block body)
//   N_MACRO s=name l1=params l2=body flag=MF_*
//   N_CALLBLOCK a=call l1=caller params l2=body flag=MF_*
//   N_FILTERBLOCK a=filter (N_IDENT or N_CALL) l1=body
//   N_INT i  N_FLOAT f  N_STR s  N_IDENT s  N_ARRAY/N_TUPLE l1  N_OBJECT l1=keys l2=values
//   N_BINARY op a b  N_UNARY op a  N_MEMBER a=object b=property flag=computed
//   N_SLICE a b c (NULL when left out)  N_CALL a=callee l1=args
//   N_FILTER a=operand b=filter  N_TEST a=operand s=name flag=negated l1=args
//   N_TERNARY a=cond b=then c=else  N_SELECT a=value b=cond (x if c)
//   N_KWARG s=name a=value  N_SPREAD a  N_KWSPREAD a
#include <errno.h>
#include <stdarg.h>

#include "tokenizer/jinja_internal.h"

struct jarena_chunk {
    struct jarena_chunk *next;
    size_t used, cap;
    max_align_t data[];
};

void *jarena_alloc(struct jinja_template *t, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct jarena_chunk *c = t->arena;
    if (!c || c->used + n > c->cap) {
        size_t cap = MAX((size_t)65536, n);
        c = xmalloc(sizeof *c + cap);
        c->used = 0;
        c->cap = cap;
        c->next = t->arena;
        t->arena = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void jinja_line_col(const struct jinja_template *t, uint32_t pos, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (uint32_t i = 0; i < pos && i < t->len; i++) {
        if (t->src[i] == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)t->src[i] & 0xc0) != 0x80) (*col)++;
    }
}

struct parser {
    struct jinja_template *t;
    const struct jtok *toks;
    int n, cur, depth;
    int status;
    char msg[512];
    struct jtok eof; // what reading past the last token gives
};

static const struct jtok *tok_at(const struct parser *P, int k) {
    return P->cur + k < P->n ? &P->toks[P->cur + k] : &P->eof;
}
#define TOK(P) tok_at(P, 0)

static void *perr(struct parser *P, int status, const struct jtok *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void *perr(struct parser *P, int status, const struct jtok *at, const char *fmt, ...) {
    if (P->status) return NULL;
    P->status = status;
    int line, col;
    jinja_line_col(P->t, at->pos, &line, &col);
    int k = snprintf(P->msg, sizeof P->msg, "line %d:%d: ", line, col);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P->msg + k, sizeof P->msg - (size_t)k, fmt, ap);
    va_end(ap);
    return NULL;
}

static int is(const struct parser *P, int type) { return TOK(P)->type == type; }
static int tok_is(const struct jtok *k, const char *name) {
    return k->type == T_IDENT && k->len == strlen(name) && !memcmp(k->s, name, k->len);
}
static int is_ident(const struct parser *P, const char *name) { return tok_is(TOK(P), name); }
static int is_stmt(const struct parser *P, const char *name) {
    return TOK(P)->type == T_OPEN_STMT && tok_is(tok_at(P, 1), name);
}

static const char *tok_desc(const struct jtok *k, char *buf, size_t cap) {
    snprintf(buf, cap, "%s'%.*s'", k->type == T_STR ? "string " : "", (int)MIN(k->len, 40), k->s);
    return k->type == T_EOF ? "end of template" : buf;
}

static const struct jtok *expect(struct parser *P, int type, const char *what) {
    const struct jtok *k = TOK(P);
    if (k->type != type) {
        char d[64];
        return perr(P, VLLM_ERR_FORMAT, k, "expected %s, got %s", what, tok_desc(k, d, sizeof d));
    }
    P->cur++;
    return k;
}

static int expect_ident(struct parser *P, const char *name) {
    if (!is_ident(P, name)) {
        char d[64];
        perr(P, VLLM_ERR_FORMAT, TOK(P), "expected '%s', got %s", name, tok_desc(TOK(P), d, sizeof d));
        return -1;
    }
    P->cur++;
    return 0;
}

static struct jnode *mk(struct parser *P, int type, const struct jtok *at) {
    struct jnode *x = jarena_alloc(P->t, sizeof *x);
    x->type = (uint8_t)type;
    x->pos = at->pos;
    return x;
}

static void lpush(struct parser *P, struct jlist *l, struct jnode *x) {
    if ((l->n & (l->n - 1)) == 0) { // capacity is the next power of two
        struct jnode **v = jarena_alloc(P->t, (size_t)(l->n ? l->n * 2 : 1) * sizeof *v);
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        l->v = v;
    }
    l->v[l->n++] = x;
}

static int enter(struct parser *P) {
    if (++P->depth > JINJA_MAX_PARSE_DEPTH) {
        perr(P, VLLM_ERR_FORMAT, TOK(P), "template nested deeper than %d", JINJA_MAX_PARSE_DEPTH);
        return -1;
    }
    return 0;
}

static struct jnode *parse_expr(struct parser *P);
static struct jnode *parse_primary(struct parser *P);
static struct jnode *parse_any(struct parser *P);
static struct jnode *parse_call(struct parser *P, struct jnode *callee);

// ------------------------------------------------------------ expressions --

static int parse_args(struct parser *P, struct jlist *out, int params) {
    if (!expect(P, T_LPAREN, "'('")) return -1;
    int saw_kw = 0, saw_spread = 0;
    while (!is(P, T_RPAREN)) {
        const struct jtok *k = TOK(P);
        int kwspread = k->type == T_POW, spread = k->type == T_MUL && k->len == 1 && k->s[0] == '*';
        if (params && (kwspread || spread)) {
            perr(P, VLLM_ERR_FORMAT, k, "argument unpacking in a parameter list");
            return -1;
        }
        if (kwspread) {
            P->cur++;
            struct jnode *x = mk(P, N_KWSPREAD, k);
            if (!(x->a = parse_expr(P))) return -1;
            lpush(P, out, x);
            if (is(P, T_COMMA)) P->cur++;
            if (!is(P, T_RPAREN)) {
                perr(P, VLLM_ERR_FORMAT, TOK(P), "'**' must be applied to the last argument");
                return -1;
            }
            break;
        }
        struct jnode *arg;
        if (spread) {
            if (saw_spread) {
                perr(P, VLLM_ERR_FORMAT, k, "only one '*' argument unpacking is allowed");
                return -1;
            }
            saw_spread = 1;
            P->cur++;
            arg = mk(P, N_SPREAD, k);
            if (!(arg->a = parse_expr(P))) return -1;
        } else {
            if (!(arg = parse_expr(P))) return -1;
            if (is(P, T_EQUALS)) {
                P->cur++;
                if (arg->type != N_IDENT) {
                    perr(P, VLLM_ERR_FORMAT, k, "expected a name before '='");
                    return -1;
                }
                struct jnode *kw = mk(P, N_KWARG, k);
                kw->s = arg->s;
                kw->len = arg->len;
                if (!(kw->a = parse_expr(P))) return -1;
                arg = kw;
            }
            if (params) {
                if (arg->type != N_IDENT && arg->type != N_KWARG) {
                    perr(P, VLLM_ERR_FORMAT, k, "expected a parameter name");
                    return -1;
                }
                for (int i = 0; i < out->n; i++)
                    if (out->v[i]->len == arg->len && !memcmp(out->v[i]->s, arg->s, arg->len)) {
                        perr(P, VLLM_ERR_FORMAT, k, "duplicate parameter '%.*s'", (int)arg->len, arg->s);
                        return -1;
                    }
            }
            if (arg->type == N_KWARG) saw_kw = 1;
            else if (saw_kw) {
                perr(P, VLLM_ERR_FORMAT, k,
                     params ? "parameter without a default after one with a default"
                            : "positional argument after a keyword argument");
                return -1;
            } else if (saw_spread) {
                perr(P, VLLM_ERR_FORMAT, k, "positional argument after '*' unpacking");
                return -1;
            }
        }
        lpush(P, out, arg);
        if (is(P, T_COMMA)) P->cur++;
        if (is(P, T_EOF)) {
            perr(P, VLLM_ERR_FORMAT, TOK(P), "unterminated argument list");
            return -1;
        }
    }
    P->cur++; // ')'
    return 0;
}

// [i], [a:b], [::-1]: an index, or a slice.
static struct jnode *parse_subscript(struct parser *P, const struct jtok *at) {
    struct jnode *slots[4] = {0};
    int n = 0, slice = 0;
    while (!is(P, T_RBRACKET)) {
        if (is(P, T_EOF) || n == 4) break;
        if (is(P, T_COLON)) {
            slots[n++] = NULL;
            P->cur++;
            slice = 1;
        } else {
            if (!(slots[n++] = parse_expr(P))) return NULL;
            if (is(P, T_COLON)) {
                P->cur++;
                slice = 1;
            }
        }
    }
    if (n == 0) return perr(P, VLLM_ERR_FORMAT, at, "empty subscript []");
    if (n > 3 || (n == 4 && !is(P, T_RBRACKET)))
        return perr(P, VLLM_ERR_FORMAT, at, "a slice takes at most 3 parts");
    if (!expect(P, T_RBRACKET, "']'")) return NULL;
    if (!slice) return slots[0];
    struct jnode *s = mk(P, N_SLICE, at);
    s->a = slots[0];
    s->b = slots[1];
    s->c = slots[2];
    return s;
}

static struct jnode *parse_member(struct parser *P, struct jnode *obj) {
    while (obj && (is(P, T_DOT) || is(P, T_LBRACKET))) {
        const struct jtok *op = TOK(P);
        P->cur++;
        struct jnode *m = mk(P, N_MEMBER, op);
        m->a = obj;
        if (op->type == T_LBRACKET) {
            m->flag = 1;
            if (!(m->b = parse_subscript(P, op))) return NULL;
        } else {
            const struct jtok *k = TOK(P);
            if (!(m->b = parse_primary(P))) return NULL;
            if (m->b->type != N_IDENT && m->b->type != N_INT)
                return perr(P, VLLM_ERR_FORMAT, k, "expected a name after '.'");
        }
        obj = m;
    }
    return obj;
}

static struct jnode *parse_call(struct parser *P, struct jnode *callee) {
    while (callee && is(P, T_LPAREN)) {
        struct jnode *c = mk(P, N_CALL, TOK(P));
        c->a = callee;
        if (parse_args(P, &c->l1, 0)) return NULL;
        callee = parse_member(P, c);
    }
    return callee;
}

static struct jnode *parse_unary(struct parser *P) {
    const struct jtok *k = TOK(P);
    if ((k->type == T_UNARY || k->type == T_ADD) && k->len == 1 && (k->s[0] == '-' || k->s[0] == '+')) {
        if (enter(P)) return NULL;
        P->cur++;
        struct jnode *u = mk(P, N_UNARY, k);
        u->op = k->s[0] == '-' ? OP_NEG : OP_POS;
        u->a = parse_unary(P);
        P->depth--;
        return u->a ? u : NULL;
    }
    return parse_call(P, parse_member(P, parse_primary(P)));
}

static struct jnode *parse_filter(struct parser *P) {
    struct jnode *x = parse_unary(P);
    while (x && is(P, T_PIPE)) {
        struct jnode *f = mk(P, N_FILTER, TOK(P));
        P->cur++;
        const struct jtok *k = TOK(P);
        f->a = x;
        if (!(f->b = parse_primary(P))) return NULL;
        if (f->b->type != N_IDENT) return perr(P, VLLM_ERR_FORMAT, k, "expected a filter name after '|'");
        if (is(P, T_LPAREN) && !(f->b = parse_call(P, f->b))) return NULL;
        x = f;
    }
    return x;
}

static struct jnode *parse_test(struct parser *P) {
    struct jnode *x = parse_filter(P);
    while (x && is_ident(P, "is")) {
        struct jnode *t = mk(P, N_TEST, TOK(P));
        P->cur++;
        if (is_ident(P, "not")) {
            t->flag = 1;
            P->cur++;
        }
        const struct jtok *k = TOK(P);
        struct jnode *name = parse_primary(P);
        if (!name) return NULL;
        if (name->type != N_IDENT) return perr(P, VLLM_ERR_FORMAT, k, "expected a test name after 'is'");
        t->a = x;
        t->s = name->s;
        t->len = name->len;
        int takes_arg = 0;
        jtest_known(t->s, t->len, &takes_arg);
        if (is(P, T_LPAREN)) {
            if (parse_args(P, &t->l1, 0)) return NULL;
        } else if (takes_arg) {
            // Jinja's `x is divisibleby 3`: one argument without parentheses.
            const struct jtok *n = TOK(P);
            if (n->type == T_NUM || n->type == T_STR || n->type == T_LBRACKET || n->type == T_LBRACE ||
                (n->type == T_IDENT && !tok_is(n, "and") && !tok_is(n, "or") && !tok_is(n, "else") &&
                 !tok_is(n, "if") && !tok_is(n, "is") && !tok_is(n, "not") && !tok_is(n, "in"))) {
                struct jnode *arg = parse_unary(P);
                if (!arg) return NULL;
                lpush(P, &t->l1, arg);
            }
        }
        x = t;
    }
    return x;
}

static struct jnode *parse_binary_level(struct parser *P, int level);

static int binop_at(const struct parser *P, int level, int *op, int *ntok) {
    const struct jtok *k = TOK(P);
    *ntok = 1;
    switch (level) {
    case 0: // comparisons and membership
        if (tok_is(k, "not") && tok_is(tok_at(P, 1), "in")) {
            *op = OP_NOTIN;
            *ntok = 2;
            return 1;
        }
        if (tok_is(k, "in")) return *op = OP_IN, 1;
        if (k->type != T_CMP) return 0;
        *op = k->s[0] == '=' ? OP_EQ : k->s[0] == '!' ? OP_NE : k->s[0] == '<' ? (k->len == 2 ? OP_LE : OP_LT)
                                                              : (k->len == 2 ? OP_GE : OP_GT);
        return 1;
    case 1:
        if (k->type != T_ADD) return 0;
        *op = k->s[0] == '+' ? OP_ADD : k->s[0] == '-' ? OP_SUB : OP_CONCAT;
        return 1;
    case 2:
        if (k->type != T_MUL) return 0;
        *op = k->s[0] == '*' ? OP_MUL : k->s[0] == '%' ? OP_MOD : k->len == 2 ? OP_FLOORDIV : OP_DIV;
        return 1;
    default:
        if (k->type != T_POW) return 0;
        *op = OP_POW;
        return 1;
    }
}

// Left-associative levels: 0 comparison, 1 additive, 2 multiplicative, 3 power.
static struct jnode *parse_binary_level(struct parser *P, int level) {
    struct jnode *x = level == 3 ? parse_test(P) : parse_binary_level(P, level + 1);
    int op, ntok;
    while (x && binop_at(P, level, &op, &ntok)) {
        struct jnode *b = mk(P, N_BINARY, TOK(P));
        P->cur += ntok;
        b->op = (uint8_t)op;
        b->a = x;
        if (!(b->b = level == 3 ? parse_test(P) : parse_binary_level(P, level + 1))) return NULL;
        x = b;
    }
    return x;
}

static struct jnode *parse_not(struct parser *P) {
    if (!is_ident(P, "not")) return parse_binary_level(P, 0);
    if (enter(P)) return NULL;
    struct jnode *u = mk(P, N_UNARY, TOK(P));
    P->cur++;
    u->op = OP_NOT;
    u->a = parse_not(P);
    P->depth--;
    return u->a ? u : NULL;
}

static struct jnode *parse_logic(struct parser *P, int is_or) {
    struct jnode *x = is_or ? parse_logic(P, 0) : parse_not(P);
    while (x && is_ident(P, is_or ? "or" : "and")) {
        struct jnode *b = mk(P, N_BINARY, TOK(P));
        P->cur++;
        b->op = is_or ? OP_OR : OP_AND;
        b->a = x;
        if (!(b->b = is_or ? parse_logic(P, 0) : parse_not(P))) return NULL;
        x = b;
    }
    return x;
}

static struct jnode *parse_expr(struct parser *P) {
    if (enter(P)) return NULL;
    struct jnode *x = parse_logic(P, 1);
    if (x && is_ident(P, "if")) {
        const struct jtok *k = TOK(P);
        P->cur++;
        struct jnode *cond = parse_logic(P, 1);
        if (!cond) return NULL;
        if (is_ident(P, "else")) {
            P->cur++;
            struct jnode *t = mk(P, N_TERNARY, k);
            t->a = cond;
            t->b = x;
            if (!(t->c = parse_expr(P))) return NULL;
            x = t;
        } else {
            struct jnode *s = mk(P, N_SELECT, k);
            s->a = x;
            s->b = cond;
            x = s;
        }
    }
    P->depth--;
    return x;
}

// a, b, c (a tuple) or a single expression; primaries only for loop targets.
static struct jnode *parse_sequence(struct parser *P, int primary) {
    const struct jtok *at = TOK(P);
    struct jnode *x = primary ? parse_primary(P) : parse_expr(P);
    if (!x || !is(P, T_COMMA)) return x;
    struct jnode *t = mk(P, N_TUPLE, at);
    lpush(P, &t->l1, x);
    while (is(P, T_COMMA)) {
        P->cur++;
        if (!(x = primary ? parse_primary(P) : parse_expr(P))) return NULL;
        lpush(P, &t->l1, x);
    }
    return t;
}

static struct jnode *parse_number(struct parser *P, const struct jtok *k) {
    char buf[64];
    if (k->len >= sizeof buf) return perr(P, VLLM_ERR_UNSUPPORTED, k, "number literal too long");
    memcpy(buf, k->s, k->len);
    buf[k->len] = 0;
    if (memchr(buf, '.', k->len)) {
        struct jnode *x = mk(P, N_FLOAT, k);
        x->f = strtod(buf, NULL);
        return x;
    }
    errno = 0;
    struct jnode *x = mk(P, N_INT, k);
    x->i = strtoll(buf, NULL, 10);
    if (errno == ERANGE) return perr(P, VLLM_ERR_UNSUPPORTED, k, "integer literal %s out of range", buf);
    return x;
}

static struct jnode *parse_collection(struct parser *P, const struct jtok *k) {
    int dict = k->type == T_LBRACE;
    struct jnode *x = mk(P, dict ? N_OBJECT : N_ARRAY, k);
    while (!is(P, dict ? T_RBRACE : T_RBRACKET)) {
        if (is(P, T_EOF)) return perr(P, VLLM_ERR_FORMAT, k, "unterminated %s literal", dict ? "dict" : "list");
        struct jnode *e = parse_expr(P);
        if (!e) return NULL;
        lpush(P, &x->l1, e);
        if (dict) {
            if (!expect(P, T_COLON, "':' in a dict literal")) return NULL;
            if (!(e = parse_expr(P))) return NULL;
            lpush(P, &x->l2, e);
        }
        if (is(P, T_COMMA)) P->cur++;
    }
    P->cur++;
    return x;
}

static struct jnode *parse_primary(struct parser *P) {
    const struct jtok *k = TOK(P);
    char d[64];
    if (k->type == T_EOF) return perr(P, VLLM_ERR_FORMAT, k, "unexpected end of template");
    P->cur++;
    switch (k->type) {
    case T_NUM: return parse_number(P, k);
    case T_STR: {
        struct jnode *x = mk(P, N_STR, k);
        size_t len = k->len;
        int last = P->cur;
        while (is(P, T_STR)) len += TOK(P)->len, P->cur++;
        char *s = jarena_alloc(P->t, len + 1);
        size_t off = 0;
        for (int i = last - 1; i < P->cur; i++) {
            memcpy(s + off, P->toks[i].s, P->toks[i].len);
            off += P->toks[i].len;
        }
        x->s = s;
        x->len = len;
        return x;
    }
    case T_IDENT: {
        struct jnode *x = mk(P, N_IDENT, k);
        x->s = k->s;
        x->len = k->len;
        return x;
    }
    case T_LPAREN: {
        struct jnode *x = parse_sequence(P, 0);
        if (!x || !expect(P, T_RPAREN, "')'")) return NULL;
        return x;
    }
    case T_LBRACKET:
    case T_LBRACE: return parse_collection(P, k);
    default: return perr(P, VLLM_ERR_FORMAT, k, "unexpected %s", tok_desc(k, d, sizeof d));
    }
}

// ------------------------------------------------------------- statements --

static int parse_until(struct parser *P, struct jlist *body, const char *a, const char *b, const char *c,
                       const struct jtok *open) {
    while (!is_stmt(P, a) && !(b && is_stmt(P, b)) && !(c && is_stmt(P, c))) {
        if (is(P, T_EOF)) {
            perr(P, VLLM_ERR_FORMAT, open, "missing {%% %s %%}", a);
            return -1;
        }
        struct jnode *x = parse_any(P);
        if (!x) return -1;
        lpush(P, body, x);
    }
    return 0;
}

static int parse_end(struct parser *P, const char *name) {
    if (!expect(P, T_OPEN_STMT, "'{%'") || expect_ident(P, name) || !expect(P, T_CLOSE_STMT, "'%}'")) return -1;
    return 0;
}

static struct jnode *parse_if(struct parser *P, const struct jtok *at) {
    struct jnode *x = mk(P, N_IF, at);
    if (!(x->a = parse_expr(P)) || !expect(P, T_CLOSE_STMT, "'%}'")) return NULL;
    if (parse_until(P, &x->l1, "endif", "elif", "else", at)) return NULL;
    if (is_stmt(P, "elif")) {
        if (enter(P)) return NULL;
        const struct jtok *k = tok_at(P, 1);
        P->cur += 2;
        struct jnode *e = parse_if(P, k);
        P->depth--;
        if (!e) return NULL;
        lpush(P, &x->l2, e);
    } else if (is_stmt(P, "else")) {
        P->cur += 2;
        if (!expect(P, T_CLOSE_STMT, "'%}'") || parse_until(P, &x->l2, "endif", NULL, NULL, at)) return NULL;
    }
    return x;
}

static struct jnode *parse_for(struct parser *P, const struct jtok *at) {
    struct jnode *x = mk(P, N_FOR, at);
    const struct jtok *k = TOK(P);
    if (!(x->a = parse_sequence(P, 1))) return NULL;
    if (x->a->type != N_IDENT && x->a->type != N_TUPLE)
        return perr(P, VLLM_ERR_FORMAT, k, "expected a name or names after 'for'");
    if (expect_ident(P, "in")) return NULL;
    struct jnode *it = parse_expr(P);
    if (!it || !expect(P, T_CLOSE_STMT, "'%}'")) return NULL;
    if (it->type == N_SELECT) { // for x in xs if cond
        x->b = it->a;
        x->c = it->b;
    } else x->b = it;
    if (parse_until(P, &x->l1, "endfor", "else", NULL, at)) return NULL;
    if (is_stmt(P, "else")) {
        P->cur += 2;
        if (!expect(P, T_CLOSE_STMT, "'%}'") || parse_until(P, &x->l2, "endfor", NULL, NULL, at)) return NULL;
    }
    if (parse_end(P, "endfor")) return NULL;
    return x;
}

static struct jnode *parse_set(struct parser *P, const struct jtok *at) {
    struct jnode *x = mk(P, N_SET, at);
    if (!(x->a = parse_sequence(P, 0))) return NULL;
    if (is(P, T_EQUALS)) {
        P->cur++;
        if (!(x->b = parse_sequence(P, 0))) return NULL;
    } else {
        if (!expect(P, T_CLOSE_STMT, "'=' or '%}'") || parse_until(P, &x->l1, "endset", NULL, NULL, at))
            return NULL;
        P->cur++;
        if (expect_ident(P, "endset")) return NULL;
    }
    if (!expect(P, T_CLOSE_STMT, "'%}'")) return NULL;
    return x;
}

// Which of caller / kwargs / varargs a macro body reads (its parameters aside).
static int special_names(const struct jnode *x, int depth) {
    if (!x || depth > JINJA_MAX_PARSE_DEPTH * 4) return 0;
    int f = 0;
    if (x->type == N_IDENT) {
        if (x->len == 6 && !memcmp(x->s, "caller", 6)) f |= MF_CALLER;
        if (x->len == 6 && !memcmp(x->s, "kwargs", 6)) f |= MF_KWARGS;
        if (x->len == 7 && !memcmp(x->s, "varargs", 7)) f |= MF_VARARGS;
        return f;
    }
    if (x->type == N_FILTER && x->b->type == N_IDENT) return special_names(x->a, depth + 1);
    if (x->type == N_MEMBER && !x->flag) return special_names(x->a, depth + 1);
    f |= special_names(x->a, depth + 1) | special_names(x->b, depth + 1) | special_names(x->c, depth + 1);
    for (int i = 0; i < x->l1.n; i++) f |= special_names(x->l1.v[i], depth + 1);
    for (int i = 0; i < x->l2.n; i++) f |= special_names(x->l2.v[i], depth + 1);
    return f;
}

static int macro_flags(const struct jlist *params, const struct jlist *body) {
    int f = 0;
    for (int i = 0; i < body->n; i++) f |= special_names(body->v[i], 0);
    for (int i = 0; i < params->n; i++) { // a parameter of that name is not the special one
        struct jnode id = {.type = N_IDENT, .s = params->v[i]->s, .len = params->v[i]->len};
        f &= ~special_names(&id, 0);
    }
    return f;
}

static struct jnode *parse_macro(struct parser *P, const struct jtok *at) {
    struct jnode *x = mk(P, N_MACRO, at);
    const struct jtok *k = TOK(P);
    struct jnode *name = parse_primary(P);
    if (!name) return NULL;
    if (name->type != N_IDENT) return perr(P, VLLM_ERR_FORMAT, k, "expected a macro name");
    x->s = name->s;
    x->len = name->len;
    if (parse_args(P, &x->l1, 1) || !expect(P, T_CLOSE_STMT, "'%}'")) return NULL;
    if (parse_until(P, &x->l2, "endmacro", NULL, NULL, at) || parse_end(P, "endmacro")) return NULL;
    x->flag = (uint8_t)macro_flags(&x->l1, &x->l2);
    return x;
}

static struct jnode *parse_call_block(struct parser *P, const struct jtok *at) {
    struct jnode *x = mk(P, N_CALLBLOCK, at);
    if (is(P, T_LPAREN) && parse_args(P, &x->l1, 1)) return NULL;
    const struct jtok *k = TOK(P);
    struct jnode *callee = parse_primary(P);
    if (!callee) return NULL;
    if (callee->type != N_IDENT) return perr(P, VLLM_ERR_FORMAT, k, "expected a macro name after 'call'");
    x->a = mk(P, N_CALL, k);
    x->a->a = callee;
    if (parse_args(P, &x->a->l1, 0) || !expect(P, T_CLOSE_STMT, "'%}'")) return NULL;
    if (parse_until(P, &x->l2, "endcall", NULL, NULL, at) || parse_end(P, "endcall")) return NULL;
    x->flag = (uint8_t)macro_flags(&x->l1, &x->l2);
    return x;
}

static struct jnode *parse_filter_block(struct parser *P, const struct jtok *at) {
    struct jnode *x = mk(P, N_FILTERBLOCK, at);
    const struct jtok *k = TOK(P);
    if (!(x->a = parse_primary(P))) return NULL;
    if (x->a->type != N_IDENT) return perr(P, VLLM_ERR_FORMAT, k, "expected a filter name");
    if (is(P, T_LPAREN) && !(x->a = parse_call(P, x->a))) return NULL;
    if (!expect(P, T_CLOSE_STMT, "'%}'")) return NULL;
    if (parse_until(P, &x->l1, "endfilter", NULL, NULL, at) || parse_end(P, "endfilter")) return NULL;
    return x;
}

static struct jnode *parse_statement(struct parser *P) {
    P->cur++; // {%
    const struct jtok *k = TOK(P);
    char d[64];
    if (k->type != T_IDENT) return perr(P, VLLM_ERR_FORMAT, k, "expected a statement, got %s", tok_desc(k, d, sizeof d));
    P->cur++;
    if (tok_is(k, "set")) return parse_set(P, k);
    if (tok_is(k, "for")) return parse_for(P, k);
    if (tok_is(k, "macro")) return parse_macro(P, k);
    if (tok_is(k, "call")) return parse_call_block(P, k);
    if (tok_is(k, "filter")) return parse_filter_block(P, k);
    if (tok_is(k, "if")) {
        struct jnode *x = parse_if(P, k);
        return x && !parse_end(P, "endif") ? x : NULL;
    }
    if (tok_is(k, "break") || tok_is(k, "continue")) {
        struct jnode *x = mk(P, tok_is(k, "break") ? N_BREAK : N_CONTINUE, k);
        return expect(P, T_CLOSE_STMT, "'%}'") ? x : NULL;
    }
    static const char *known[] = {"raw", "include", "import", "from", "extends", "block", "with", "do",
                                  "autoescape", "trans", "pluralize", NULL};
    for (int i = 0; known[i]; i++)
        if (tok_is(k, known[i]))
            return perr(P, VLLM_ERR_UNSUPPORTED, k, "unsupported statement {%% %s %%}", known[i]);
    return perr(P, VLLM_ERR_FORMAT, k, "unknown or misplaced statement {%% %.*s %%}", (int)MIN(k->len, 40), k->s);
}

static struct jnode *parse_any(struct parser *P) {
    const struct jtok *k = TOK(P);
    if (enter(P)) return NULL;
    struct jnode *x = NULL;
    switch (k->type) {
    case T_COMMENT:
        P->cur++;
        x = mk(P, N_TEXT, k);
        x->s = "";
        break;
    case T_TEXT:
        P->cur++;
        x = mk(P, N_TEXT, k);
        x->s = k->s;
        x->len = k->len;
        break;
    case T_OPEN_STMT: x = parse_statement(P); break;
    case T_OPEN_EXPR:
        P->cur++;
        x = mk(P, N_OUTPUT, k);
        if (!(x->a = parse_expr(P)) || !expect(P, T_CLOSE_EXPR, "'}}'")) x = NULL;
        break;
    default: {
        char d[64];
        x = perr(P, VLLM_ERR_FORMAT, k, "unexpected %s", tok_desc(k, d, sizeof d));
    }
    }
    P->depth--;
    return x;
}

int jinja_parse(const char *src, size_t len, struct jinja_template **out) {
    *out = NULL;
    if (len > JINJA_MAX_SOURCE)
        return vllm_err(VLLM_ERR_TOO_LONG, "template of %zu bytes is over the %u byte limit", len, JINJA_MAX_SOURCE);
    struct jinja_template *t = xcalloc(1, sizeof *t);
    t->src = xmalloc(len + 1);
    if (len) memcpy(t->src, src, len);
    t->src[len] = 0;
    t->len = len;
    struct parser P = {.t = t};
    struct jtok *toks = NULL;
    uint32_t err_pos = 0;
    int rc = jinja_lex(t, &toks, &P.n, P.msg, sizeof P.msg, &err_pos);
    if (rc) {
        int line, col;
        jinja_line_col(t, err_pos, &line, &col);
        vllm_err(rc, "template line %d:%d: %s", line, col, P.msg);
        jinja_free(t);
        return rc;
    }
    P.toks = toks;
    P.eof = (struct jtok){.type = T_EOF, .s = "end of template", .len = 15, .pos = (uint32_t)len};
    while (P.cur < P.n) {
        struct jnode *x = parse_any(&P);
        if (!x) break;
        lpush(&P, &t->body, x);
    }
    free(toks);
    if (P.status) {
        vllm_err(P.status, "template %s", P.msg);
        jinja_free(t);
        return P.status;
    }
    *out = t;
    return VLLM_OK;
}

void jinja_free(struct jinja_template *t) {
    if (!t) return;
    while (t->arena) {
        struct jarena_chunk *c = t->arena;
        t->arena = c->next;
        free(c);
    }
    free(t->src);
    free(t);
}
