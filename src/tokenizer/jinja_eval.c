// jinja_eval.c - renders a parsed template: statements, expressions, calls
// and macros. Filters, tests and methods are in jinja_builtins.c.
#include <math.h>

#include "tokenizer/jinja_internal.h"

void jinja_render_opts_default(struct jinja_render_opts *o) {
    o->now = 0;
    o->max_output = (size_t)64 << 20;
    o->max_steps = 50 * 1000 * 1000;
    o->max_call_depth = 64;
}

static const char *op_name(int op) {
    static const char *names[] = {"+",  "-",  "~",  "*", "/",  "//", "%",  "**", "==",  "!=",  "<",
                                  ">",  "<=", ">=", "in", "not in", "and", "or", "not", "-", "+"};
    return names[op];
}

static int enter(struct jctx *c, const struct jnode *n) {
    if (c->status || jctx_step(c, n, 1)) return -1;
    if (++c->depth > JINJA_MAX_EVAL_DEPTH) {
        c->depth--;
        jerr(c, VLLM_ERR_TOO_LONG, n, "template evaluation nested deeper than %d", JINJA_MAX_EVAL_DEPTH);
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- operators --

static int is_num(const struct jv *v) { return v->type == JV_INT || v->type == JV_FLOAT; }
static int is_numlike(const struct jv *v) { return is_num(v) || v->type == JV_BOOL; }
static double dval(const struct jv *v) {
    return v->type == JV_FLOAT ? v->u.f : v->type == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t ival(const struct jv *v) { return v->type == JV_INT ? v->u.i : v->u.b; }

static struct jv *int_pow(struct jctx *c, int64_t a, int64_t b, const struct jnode *n) {
    int64_t r = 1;
    for (int64_t i = 0; i < b; i++) {
        if (__builtin_mul_overflow(r, a, &r)) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "integer overflow in **");
        if (r == 0 || r == 1 || (r == -1 && i > 64)) { // the rest cannot change it (or only its sign)
            if (r == -1 && ((b - i - 1) & 1)) r = 1;
            break;
        }
    }
    return jv_int(r);
}

static struct jv *arith(struct jctx *c, const struct jnode *n, const struct jv *l, const struct jv *r) {
    int op = n->op, ints = l->type != JV_FLOAT && r->type != JV_FLOAT;
    double a = dval(l), b = dval(r);
    int64_t x = ints ? ival(l) : 0, y = ints ? ival(r) : 0, z;
    switch (op) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
        if (!ints) return jv_float(op == OP_ADD ? a + b : op == OP_SUB ? a - b : a * b);
        if (op == OP_ADD ? __builtin_add_overflow(x, y, &z)
                         : op == OP_SUB ? __builtin_sub_overflow(x, y, &z) : __builtin_mul_overflow(x, y, &z))
            return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "integer overflow in %s", op_name(op));
        return jv_int(z);
    case OP_DIV:
        if (b == 0) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "division by zero");
        return jv_float(a / b);
    case OP_FLOORDIV:
    case OP_MOD:
        if (b == 0) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "division by zero");
        if (!ints) {
            if (op == OP_FLOORDIV) return jv_float(floor(a / b));
            double m = fmod(a, b);
            if (m != 0 && ((m < 0) != (b < 0))) m += b;
            return jv_float(m);
        }
        if (x == INT64_MIN && y == -1) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "integer overflow in %s", op_name(op));
        if (op == OP_FLOORDIV) return jv_int(x / y - ((x % y != 0) && ((x < 0) != (y < 0))));
        z = x % y;
        return jv_int(z != 0 && ((z < 0) != (y < 0)) ? z + y : z);
    case OP_POW:
        if (a == 0 && b < 0) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "0 cannot be raised to a negative power");
        if (ints && y >= 0) return int_pow(c, x, y, n);
        if (!isfinite(pow(a, b))) return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "** result is not a finite number");
        return jv_float(pow(a, b));
    case OP_LT: return jv_bool(a < b);
    case OP_GT: return jv_bool(a > b);
    case OP_LE: return jv_bool(a <= b);
    case OP_GE: return jv_bool(a >= b);
    }
    return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "'%s' is not defined between numbers", op_name(op));
}

// a ~ b, and + with a string operand: the printed forms, concatenated.
static struct jv *concat(struct jctx *c, const struct jnode *n, struct jv *l, struct jv *r) {
    struct jbuf b = {0};
    for (int i = 0; i < 2; i++) {
        struct jv *v = i ? r : l;
        int rc = v->type == JV_NONE ? jbuf_addz(c, &b, "None") : jv_display(c, &b, v, n);
        if (rc) {
            free(b.p);
            return NULL;
        }
    }
    if (jctx_step(c, n, (int64_t)(b.len >> 6))) {
        free(b.p);
        return NULL;
    }
    return jbuf_to_str(&b);
}

static struct jv *repeat(struct jctx *c, const struct jnode *n, struct jv *seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq->type == JV_STR) {
        struct jbuf b = {0};
        for (int64_t i = 0; i < times; i++)
            if (jbuf_add(c, &b, seq->u.s.p, seq->u.s.len) || jctx_step(c, n, 1 + (int64_t)(seq->u.s.len >> 6))) {
                free(b.p);
                return NULL;
            }
        return jbuf_to_str(&b);
    }
    int64_t total = times * seq->u.a.n;
    if (times && (total / times != seq->u.a.n || total > (1 << 24)))
        return jerr(c, VLLM_ERR_TOO_LONG, n, "list * %lld is too long", (long long)times);
    if (jctx_step(c, n, total)) return NULL;
    struct jv *a = jv_array_new((int)total);
    for (int64_t i = 0; i < total; i++) a->u.a.v[i] = jv_retain(seq->u.a.v[i % seq->u.a.n]);
    return a;
}

static int member_of(const struct jv *x, const struct jv *seq) {
    if (seq->type == JV_STR)
        return x->u.s.len == 0 || memmem(seq->u.s.p, seq->u.s.len, x->u.s.p, x->u.s.len) != NULL;
    if (seq->type == JV_OBJECT) return jv_object_get(seq, x->u.s.p, x->u.s.len) != NULL;
    for (int i = 0; i < seq->u.a.n; i++)
        if (jv_equal(x, seq->u.a.v[i], 0)) return 1;
    return 0;
}

static struct jv *binary(struct jctx *c, const struct jnode *n, struct jv *l, struct jv *r) {
    int op = n->op, in = op == OP_IN || op == OP_NOTIN;
    if (op == OP_EQ || op == OP_NE) return jv_bool(jv_equal(l, r, 0) == (op == OP_EQ));
    if (is_num(l) && is_num(r) && op != OP_CONCAT && !in) return arith(c, n, l, r);
    if (l->type == JV_UNDEF || r->type == JV_UNDEF) {
        if (r->type == JV_UNDEF && in) return jv_bool(op == OP_NOTIN);
        if (op == OP_CONCAT && l->type != JV_NONE && r->type != JV_NONE) return concat(c, n, l, r);
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "'%s' applied to an undefined value", op_name(op));
    }
    if (op == OP_CONCAT) return concat(c, n, l, r);
    if (in && r->type == JV_ARRAY) return jv_bool(member_of(l, r) == (op == OP_IN));
    if (l->type == JV_NONE || r->type == JV_NONE)
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "'%s' applied to none", op_name(op));
    if (is_numlike(l) && is_numlike(r) && !in) return arith(c, n, l, r); // booleans count as 0 / 1
    if (op == OP_ADD && l->type == JV_ARRAY && r->type == JV_ARRAY) {
        int64_t total = (int64_t)l->u.a.n + r->u.a.n;
        if (total > (1 << 24)) return jerr(c, VLLM_ERR_TOO_LONG, n, "list too long");
        if (jctx_step(c, n, total)) return NULL;
        struct jv *a = jv_array_new((int)total);
        for (int i = 0; i < total; i++)
            a->u.a.v[i] = jv_retain(i < l->u.a.n ? l->u.a.v[i] : r->u.a.v[i - l->u.a.n]);
        return a;
    }
    int ls = l->type == JV_STR, rs = r->type == JV_STR;
    if (op == OP_ADD && (ls || rs) && l->type <= JV_STR && r->type <= JV_STR) return concat(c, n, l, r);
    if (in && ls && (rs || r->type == JV_OBJECT)) return jv_bool(member_of(l, r) == (op == OP_IN));
    if (ls && rs && op >= OP_LT && op <= OP_GE) {
        int k = memcmp(l->u.s.p, r->u.s.p, MIN(l->u.s.len, r->u.s.len));
        if (!k) k = (l->u.s.len > r->u.s.len) - (l->u.s.len < r->u.s.len);
        return jv_bool(op == OP_LT ? k < 0 : op == OP_GT ? k > 0 : op == OP_LE ? k <= 0 : k >= 0);
    }
    if (op == OP_MUL && (ls || l->type == JV_ARRAY) && r->type == JV_INT) return repeat(c, n, l, r->u.i);
    if (op == OP_MUL && (rs || r->type == JV_ARRAY) && l->type == JV_INT) return repeat(c, n, r, l->u.i);
    return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "'%s' is not defined between %s and %s", op_name(op),
                jv_type_name(l), jv_type_name(r));
}

static struct jv *eval_binary(struct jctx *c, const struct jnode *n, struct jscope *s) {
    struct jv *l = jeval(c, n->a, s);
    if (!l) return NULL;
    if (n->op == OP_AND || n->op == OP_OR) {
        if (jv_truthy(l) == (n->op == OP_OR)) return l;
        jv_release(l);
        return jeval(c, n->b, s);
    }
    struct jv *r = jeval(c, n->b, s);
    struct jv *v = r ? binary(c, n, l, r) : NULL;
    jv_release(l);
    jv_release(r);
    return v;
}

static struct jv *eval_unary(struct jctx *c, const struct jnode *n, struct jscope *s) {
    struct jv *a = jeval(c, n->a, s), *v = NULL;
    if (!a) return NULL;
    if (n->op == OP_NOT) v = jv_bool(!jv_truthy(a));
    else if (a->type == JV_FLOAT) v = jv_float(n->op == OP_NEG ? -a->u.f : a->u.f);
    else if (a->type == JV_INT || a->type == JV_BOOL) {
        int64_t x = ival(a);
        if (n->op == OP_NEG && x == INT64_MIN) v = jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "integer overflow");
        else v = jv_int(n->op == OP_NEG ? -x : x);
    } else v = jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "unary '%s' applied to %s", op_name(n->op), jv_type_name(a));
    jv_release(a);
    return v;
}

// ------------------------------------------------------- members, slices --

// Byte offsets of the code points of s: off[i] is where code point i starts.
static size_t *cp_offsets(const struct jv *s, int64_t *count) {
    size_t *off = xmalloc((s->u.s.len + 1) * sizeof *off);
    int64_t k = 0;
    uint32_t cp;
    for (size_t i = 0; i < s->u.s.len; k++) {
        off[k] = i;
        i += (size_t)jv_utf8_next(s->u.s.p + i, s->u.s.len - i, &cp);
    }
    off[k] = s->u.s.len;
    *count = k;
    return off;
}

static struct jv *index_seq(struct jctx *c, const struct jnode *at, struct jv *obj, int64_t i) {
    if (obj->type == JV_ARRAY) {
        if (i < 0) i += obj->u.a.n;
        return i >= 0 && i < obj->u.a.n ? jv_retain(obj->u.a.v[i]) : JV_UNDEFINED;
    }
    int64_t n;
    if (jctx_step(c, at, (int64_t)(obj->u.s.len >> 6))) return NULL;
    size_t *off = cp_offsets(obj, &n);
    if (i < 0) i += n;
    struct jv *v = i >= 0 && i < n ? jv_str(obj->u.s.p + off[i], off[i + 1] - off[i]) : JV_UNDEFINED;
    free(off);
    return v;
}

struct jv *jmember_get(struct jctx *c, struct jv *obj, struct jv *prop, const struct jnode *n) {
    if (obj->type == JV_OBJECT || obj->type == JV_NS) {
        if (prop->type != JV_STR)
            return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "a %s key must be a string, not %s", jv_type_name(obj),
                        jv_type_name(prop));
        struct jv *v = jv_object_get(obj, prop->u.s.p, prop->u.s.len);
        if (v) return jv_retain(v);
        const char *m = obj->type == JV_OBJECT ? jmethod_lookup(obj, prop->u.s.p, prop->u.s.len) : NULL;
        return m ? jv_method(obj, m) : JV_UNDEFINED;
    }
    if (obj->type == JV_ARRAY || obj->type == JV_STR) {
        if (prop->type == JV_INT) return index_seq(c, n, obj, prop->u.i);
        if (prop->type != JV_STR)
            return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "a %s index must be an integer, not %s", jv_type_name(obj),
                        jv_type_name(prop));
        if (prop->u.s.len == 6 && !memcmp(prop->u.s.p, "length", 6)) {
            if (obj->type == JV_STR && jctx_step(c, n, (int64_t)(obj->u.s.len >> 6))) return NULL;
            return jv_int(obj->type == JV_ARRAY ? obj->u.a.n : (int64_t)jv_utf8_count(obj->u.s.p, obj->u.s.len));
        }
        const char *m = jmethod_lookup(obj, prop->u.s.p, prop->u.s.len);
        return m ? jv_method(obj, m) : JV_UNDEFINED;
    }
    if (prop->type != JV_STR && prop->type != JV_INT)
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "cannot index %s with %s", jv_type_name(obj), jv_type_name(prop));
    return JV_UNDEFINED; // like @huggingface/jinja: none.x and undefined.x are undefined
}

// Python's slice rules on len items; writes the chosen indices' count and first/step.
static int64_t slice_plan(int64_t len, const struct jv *a, const struct jv *b, int64_t step, int64_t *start) {
    int64_t lo, hi;
    if (step > 0) {
        lo = a ? (a->u.i < 0 ? MAX(len + MAX(a->u.i, -len), 0) : MIN(a->u.i, len)) : 0;
        hi = b ? (b->u.i < 0 ? MAX(len + MAX(b->u.i, -len), 0) : MIN(b->u.i, len)) : len;
        *start = lo;
        return hi > lo ? (hi - lo + step - 1) / step : 0;
    }
    lo = a ? (a->u.i < 0 ? MAX(len + MAX(a->u.i, -len - 1), -1) : MIN(a->u.i, len - 1)) : len - 1;
    hi = b ? (b->u.i < 0 ? MAX(len + MAX(b->u.i, -len - 1), -1) : MIN(b->u.i, len - 1)) : -1;
    *start = lo;
    return lo > hi ? (lo - hi + (-step) - 1) / (-step) : 0;
}

static struct jv *eval_slice(struct jctx *c, const struct jnode *n, struct jv *obj, struct jscope *s) {
    if (obj->type != JV_ARRAY && obj->type != JV_STR)
        return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "cannot slice %s", jv_type_name(obj));
    struct jv *part[3] = {0};
    const struct jnode *src[3] = {n->a, n->b, n->c};
    struct jv *res = NULL;
    for (int i = 0; i < 3; i++) {
        if (!src[i]) continue;
        if (!(part[i] = jeval(c, src[i], s))) goto done;
        if (part[i]->type == JV_UNDEF || part[i]->type == JV_NONE) {
            jv_release(part[i]);
            part[i] = NULL;
        } else if (part[i]->type != JV_INT) {
            jerr(c, VLLM_ERR_INVALID_ARGUMENT, src[i], "slice bounds must be integers, not %s", jv_type_name(part[i]));
            goto done;
        }
    }
    int64_t step = part[2] ? part[2]->u.i : 1, start, len, count;
    size_t *off = NULL;
    if (obj->type == JV_STR) {
        if (jctx_step(c, n, (int64_t)(obj->u.s.len >> 6))) goto done;
        off = cp_offsets(obj, &len);
    } else len = obj->u.a.n;
    if (step > len + 1) step = len + 1; // same items, and no overflow below
    if (step < -(len + 1)) step = -(len + 1);
    count = step == 0 ? 0 : slice_plan(len, part[0], part[1], step, &start);
    if (jctx_step(c, n, count)) {
        free(off);
        goto done;
    }
    if (obj->type == JV_ARRAY) {
        res = jv_array_new((int)count);
        for (int64_t i = 0; i < count; i++) res->u.a.v[i] = jv_retain(obj->u.a.v[start + i * step]);
    } else {
        char *p = xmalloc(obj->u.s.len + 1);
        size_t k = 0;
        for (int64_t i = 0; i < count; i++) {
            int64_t j = start + i * step;
            memcpy(p + k, obj->u.s.p + off[j], off[j + 1] - off[j]);
            k += off[j + 1] - off[j];
        }
        p[k] = 0;
        res = jv_str_take(p, k);
    }
    free(off);
done:
    for (int i = 0; i < 3; i++) jv_release(part[i]);
    return res;
}

static struct jv *eval_member(struct jctx *c, const struct jnode *n, struct jscope *s) {
    struct jv *obj = jeval(c, n->a, s), *v = NULL;
    if (!obj) return NULL;
    if (n->b->type == N_SLICE) v = eval_slice(c, n->b, obj, s);
    else {
        struct jv *prop = n->flag ? jeval(c, n->b, s)
                                  : n->b->type == N_INT ? jv_int(n->b->i) : jv_str(n->b->s, n->b->len);
        if (prop) v = jmember_get(c, obj, prop, n);
        jv_release(prop);
    }
    jv_release(obj);
    return v;
}

// ------------------------------------------------------------------- calls --

void jargs_free(struct jargs *a) {
    for (int i = 0; i < a->npos; i++) jv_release(a->pos[i]);
    free(a->pos);
    jv_release(a->kw);
    memset(a, 0, sizeof *a);
}

struct jv *jargs_get(const struct jargs *a, int i, const char *kw) {
    if (i >= 0 && i < a->npos) return a->pos[i];
    return kw && a->kw ? jv_object_get(a->kw, kw, strlen(kw)) : NULL;
}

static void args_push(struct jargs *a, int *cap, struct jv *v) {
    xgrow((void **)&a->pos, cap, a->npos + 1, sizeof *a->pos);
    a->pos[a->npos++] = v;
}

static int kw_put(struct jctx *c, struct jargs *a, const char *k, size_t len, struct jv *v, const struct jnode *at) {
    if (!a->kw) a->kw = jv_object_new();
    if (jv_object_get(a->kw, k, len)) {
        jv_release(v);
        jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "multiple values for keyword argument '%.*s'", (int)len, k);
        return -1;
    }
    jv_object_put(a->kw, jv_str(k, len), v);
    return 0;
}

int jeval_args(struct jctx *c, const struct jlist *args, struct jscope *s, struct jargs *out) {
    memset(out, 0, sizeof *out);
    int cap = 0;
    for (int pass = 0; pass < 2; pass++) // positional arguments first, as Python evaluates them
        for (int i = 0; i < args->n; i++) {
            const struct jnode *x = args->v[i];
            int kw = x->type == N_KWARG || x->type == N_KWSPREAD;
            if (kw != pass) continue;
            struct jv *v = jeval(c, x->type == N_KWARG || x->type == N_SPREAD || x->type == N_KWSPREAD ? x->a : x, s);
            if (!v) goto fail;
            if (x->type == N_KWARG) {
                if (kw_put(c, out, x->s, x->len, v, x)) goto fail;
            } else if (x->type == N_SPREAD) {
                if (v->type != JV_ARRAY) {
                    jerr(c, VLLM_ERR_INVALID_ARGUMENT, x, "cannot unpack %s with *", jv_type_name(v));
                    jv_release(v);
                    goto fail;
                }
                for (int k = 0; k < v->u.a.n; k++) args_push(out, &cap, jv_retain(v->u.a.v[k]));
                jv_release(v);
            } else if (x->type == N_KWSPREAD) {
                if (v->type != JV_OBJECT) {
                    jerr(c, VLLM_ERR_INVALID_ARGUMENT, x, "cannot unpack %s with **", jv_type_name(v));
                    jv_release(v);
                    goto fail;
                }
                for (int k = 0; k < v->u.o.n; k++) {
                    struct jv *key = v->u.o.kv[k].key;
                    if (kw_put(c, out, key->u.s.p, key->u.s.len, jv_retain(v->u.o.kv[k].val), x)) {
                        jv_release(v);
                        goto fail;
                    }
                }
                jv_release(v);
            } else args_push(out, &cap, v);
        }
    return 0;
fail:
    jargs_free(out);
    return -1;
}

// Binds a macro's (or call block's) parameters in scope ms.
static int bind_params(struct jctx *c, const struct jnode *def, const struct jlist *params, int flags,
                       struct jargs *args, struct jscope *ms, const struct jnode *at) {
    int nkw = args->kw ? args->kw->u.o.n : 0;
    char *used = xcalloc((size_t)nkw + 1, 1);
    int rc = -1;
    for (int i = 0; i < params->n; i++) {
        const struct jnode *p = params->v[i];
        struct jv *v = i < args->npos ? jv_retain(args->pos[i]) : NULL;
        for (int k = 0; !v && k < nkw; k++) {
            struct jv *key = args->kw->u.o.kv[k].key;
            if (key->u.s.len == p->len && !memcmp(key->u.s.p, p->s, p->len)) {
                v = jv_retain(args->kw->u.o.kv[k].val);
                used[k] = 1;
            }
        }
        jscope_set(ms, p->s, p->len, v ? v : JV_UNDEFINED);
    }
    const char *name = def->type == N_MACRO ? def->s : "caller";
    int nlen = def->type == N_MACRO ? (int)def->len : 6;
    if (flags & MF_KWARGS) {
        struct jv *rest = jv_object_new();
        for (int k = 0; k < nkw; k++)
            if (!used[k]) jv_object_put(rest, jv_retain(args->kw->u.o.kv[k].key), jv_retain(args->kw->u.o.kv[k].val));
        jscope_set(ms, "kwargs", 6, rest);
    } else
        for (int k = 0; k < nkw; k++)
            if (!used[k]) {
                struct jv *key = args->kw->u.o.kv[k].key;
                jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "macro '%.*s' takes no keyword argument '%s'", nlen, name,
                     key->u.s.p);
                goto out;
            }
    if (flags & MF_VARARGS) {
        int extra = MAX(args->npos - params->n, 0);
        struct jv *va = jv_array_new(extra);
        for (int i = 0; i < extra; i++) va->u.a.v[i] = jv_retain(args->pos[params->n + i]);
        jscope_set(ms, "varargs", 7, va);
    } else if (args->npos > params->n) {
        jerr(c, VLLM_ERR_INVALID_ARGUMENT, at, "macro '%.*s' takes at most %d argument(s), got %d", nlen, name,
             params->n, args->npos);
        goto out;
    }
    // Defaults are evaluated after every parameter is bound, in the macro's scope.
    for (int i = 0; i < params->n; i++) {
        const struct jnode *p = params->v[i];
        if (p->type != N_KWARG || jscope_lookup(ms, p->s, p->len)->type != JV_UNDEF) continue;
        int given = i < args->npos;
        for (int k = 0; !given && k < nkw; k++)
            given = used[k] && args->kw->u.o.kv[k].key->u.s.len == p->len &&
                    !memcmp(args->kw->u.o.kv[k].key->u.s.p, p->s, p->len);
        if (given) continue;
        struct jv *d = jeval(c, p->a, ms);
        if (!d) goto out;
        jscope_set(ms, p->s, p->len, d);
    }
    rc = 0;
out:
    free(used);
    return rc;
}

static struct jv *call_macro(struct jctx *c, struct jv *fn, struct jargs *args, struct jv *caller,
                             const struct jnode *at) {
    const struct jnode *def = fn->u.fn.node;
    int is_caller = fn->u.fn.kind == JF_CALLER;
    if (c->call_depth >= c->opts.max_call_depth)
        return jerr(c, VLLM_ERR_TOO_LONG, at, "macro calls nested deeper than %d", c->opts.max_call_depth);
    struct jscope *parent = jscope_retain(fn->u.fn.scope);
    if (!is_caller && (def->flag & MF_CALLER)) {
        struct jscope *mid = jscope_new(c, parent);
        jscope_set(mid, "caller", 6, caller ? jv_retain(caller) : JV_UNDEFINED);
        jscope_release(parent);
        parent = mid;
    }
    struct jscope *ms = jscope_new(c, parent);
    jscope_release(parent);
    struct jv *res = NULL;
    c->call_depth++;
    if (!bind_params(c, def, &def->l1, def->flag, args, ms, at)) {
        int saved_loops = c->loop_depth;
        c->loop_depth = 0;
        struct jbuf out = {0};
        if (!jrender_list(c, &def->l2, ms, &out)) res = jbuf_to_str(&out);
        free(out.p);
        c->loop_depth = saved_loops;
    }
    c->call_depth--;
    jscope_release(ms);
    return res;
}

struct jv *jcall(struct jctx *c, struct jv *fn, struct jargs *args, struct jv *caller, const struct jnode *at) {
    switch (fn->u.fn.kind) {
    case JF_BUILTIN: return jbuiltin_call(c, fn->u.fn.id, args, at);
    case JF_METHOD: return jmethod_call(c, fn->u.fn.self, fn->u.fn.name, args, at);
    default: return call_macro(c, fn, args, caller, at);
    }
}

static struct jv *eval_call(struct jctx *c, const struct jnode *n, struct jscope *s, struct jv *caller) {
    struct jv *fn = jeval(c, n->a, s);
    if (!fn) return NULL;
    if (fn->type != JV_FUNC) {
        const struct jnode *f = n->a;
        if (fn->type == JV_UNDEF && f->type == N_IDENT)
            jerr(c, VLLM_ERR_UNSUPPORTED, n, "unknown function '%.*s'", (int)f->len, f->s);
        else if (fn->type == JV_UNDEF && f->type == N_MEMBER && !f->flag && f->b->type == N_IDENT)
            jerr(c, VLLM_ERR_UNSUPPORTED, n, "unknown method '%.*s'", (int)f->b->len, f->b->s);
        else jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "%s is not callable", jv_type_name(fn));
        jv_release(fn);
        return NULL;
    }
    struct jargs args;
    struct jv *v = NULL;
    if (!jeval_args(c, &n->l1, s, &args)) {
        v = jcall(c, fn, &args, caller, n);
        jargs_free(&args);
    }
    jv_release(fn);
    return v;
}

static struct jv *make_func(struct jctx *c, int kind, const struct jnode *def, struct jscope *s) {
    (void)c;
    struct jv *f = jv_func_builtin(0);
    f->u.fn.kind = (uint8_t)kind;
    f->u.fn.node = def;
    f->u.fn.scope = jscope_retain(s);
    return f;
}

// A filter node: a name, or a call whose callee is the name.
static struct jv *apply_filter_node(struct jctx *c, struct jv *v, const struct jnode *f, struct jscope *s) {
    const struct jnode *id = f->type == N_CALL ? f->a : f;
    if (id->type != N_IDENT) return jerr(c, VLLM_ERR_UNSUPPORTED, f, "unsupported filter expression");
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)MIN(id->len, sizeof name - 1), id->s);
    struct jargs args = {0};
    if (f->type == N_CALL && jeval_args(c, &f->l1, s, &args)) return NULL;
    struct jv *r = jfilter_apply(c, v, name, &args, f);
    jargs_free(&args);
    return r;
}

static struct jv *eval_collection(struct jctx *c, const struct jnode *n, struct jscope *s) {
    if (n->type != N_OBJECT) {
        struct jv *a = jv_array_new(n->l1.n);
        for (int i = 0; i < n->l1.n; i++)
            if (!(a->u.a.v[i] = jeval(c, n->l1.v[i], s))) {
                a->u.a.n = i;
                jv_release(a);
                return NULL;
            }
        return a;
    }
    struct jv *o = jv_object_new();
    for (int i = 0; i < n->l1.n; i++) {
        struct jv *k = jeval(c, n->l1.v[i], s), *v = k ? jeval(c, n->l2.v[i], s) : NULL;
        if (k && v && k->type != JV_STR)
            jerr(c, VLLM_ERR_INVALID_ARGUMENT, n->l1.v[i], "dict keys must be strings, not %s", jv_type_name(k));
        if (!v || k->type != JV_STR) {
            jv_release(k);
            jv_release(v);
            jv_release(o);
            return NULL;
        }
        jv_object_put(o, k, v);
    }
    return o;
}

static struct jv *eval_test(struct jctx *c, const struct jnode *n, struct jscope *s) {
    struct jv *v = jeval(c, n->a, s);
    if (!v) return NULL;
    struct jargs args;
    int r = -1;
    if (!jeval_args(c, &n->l1, s, &args)) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)MIN(n->len, sizeof name - 1), n->s);
        r = jtest_apply(c, name, v, &args, n);
        jargs_free(&args);
    }
    jv_release(v);
    return r < 0 ? NULL : jv_bool(r != n->flag);
}

static struct jv *eval_node(struct jctx *c, const struct jnode *n, struct jscope *s) {
    struct jv *v, *r;
    int t;
    switch (n->type) {
    case N_INT: return jv_int(n->i);
    case N_FLOAT: return jv_float(n->f);
    case N_STR: return jv_str(n->s, n->len);
    case N_IDENT: v = jscope_lookup(s, n->s, n->len); return v ? jv_retain(v) : JV_UNDEFINED;
    case N_ARRAY:
    case N_TUPLE:
    case N_OBJECT: return eval_collection(c, n, s);
    case N_BINARY: return eval_binary(c, n, s);
    case N_UNARY: return eval_unary(c, n, s);
    case N_MEMBER: return eval_member(c, n, s);
    case N_CALL: return eval_call(c, n, s, NULL);
    case N_FILTER:
        if (!(v = jeval(c, n->a, s))) return NULL;
        r = apply_filter_node(c, v, n->b, s);
        jv_release(v);
        return r;
    case N_TEST: return eval_test(c, n, s);
    case N_TERNARY:
    case N_SELECT: // x if c else y; x if c (undefined when c is false)
        if (!(v = jeval(c, n->type == N_TERNARY ? n->a : n->b, s))) return NULL;
        t = jv_truthy(v);
        jv_release(v);
        if (n->type == N_TERNARY) return jeval(c, t ? n->b : n->c, s);
        return t ? jeval(c, n->a, s) : JV_UNDEFINED;
    default: return jerr(c, VLLM_ERR_FORMAT, n, "this construct is not an expression here");
    }
}

struct jv *jeval(struct jctx *c, const struct jnode *n, struct jscope *s) {
    if (enter(c, n)) return NULL;
    struct jv *v = eval_node(c, n, s);
    c->depth--;
    if (c->status && v) { // an error after a value was made (cannot happen, but never leak it)
        jv_release(v);
        v = NULL;
    }
    return v;
}

// -------------------------------------------------------------- statements --

static int assign(struct jctx *c, const struct jnode *target, struct jv *v, struct jscope *s) {
    if (target->type == N_IDENT) {
        jscope_set(s, target->s, target->len, v);
        return 0;
    }
    if (target->type == N_TUPLE) {
        int ok = v->type == JV_ARRAY && v->u.a.n == target->l1.n;
        if (!ok) jerr(c, VLLM_ERR_INVALID_ARGUMENT, target, "cannot unpack %s into %d names", jv_type_name(v), target->l1.n);
        for (int i = 0; ok && i < target->l1.n; i++) {
            const struct jnode *t = target->l1.v[i];
            if (t->type != N_IDENT) {
                jerr(c, VLLM_ERR_FORMAT, t, "can only unpack into names");
                ok = 0;
            } else jscope_set(s, t->s, t->len, jv_retain(v->u.a.v[i]));
        }
        jv_release(v);
        return ok ? 0 : -1;
    }
    if (target->type == N_MEMBER && !target->flag && target->b->type == N_IDENT) {
        struct jv *ns = jeval(c, target->a, s);
        if (ns && ns->type != JV_NS)
            jerr(c, VLLM_ERR_INVALID_ARGUMENT, target, "cannot set an attribute of %s (only of a namespace)",
                 jv_type_name(ns));
        if (!ns || ns->type != JV_NS) {
            jv_release(ns);
            jv_release(v);
            return -1;
        }
        jv_object_put(ns, jv_str(target->b->s, target->b->len), v);
        jv_release(ns);
        return 0;
    }
    jv_release(v);
    jerr(c, VLLM_ERR_FORMAT, target, "cannot assign to this expression");
    return -1;
}

static int exec_set(struct jctx *c, const struct jnode *n, struct jscope *s) {
    struct jv *v;
    if (n->b) v = jeval(c, n->b, s);
    else {
        struct jbuf b = {0};
        v = jrender_list(c, &n->l1, s, &b) ? NULL : jbuf_to_str(&b);
        free(b.p);
    }
    return v ? assign(c, n->a, v, s) : -1;
}

// The items a for loop walks: a list, a dict's keys, a string's characters.
static struct jv *loop_items(struct jctx *c, const struct jnode *n, struct jv *it) {
    if (it->type == JV_ARRAY) return jv_retain(it);
    if (it->type == JV_UNDEF) return jv_array_new(0);
    if (it->type == JV_OBJECT) {
        struct jv *a = jv_array_new(it->u.o.n);
        for (int i = 0; i < it->u.o.n; i++) a->u.a.v[i] = jv_retain(it->u.o.kv[i].key);
        return a;
    }
    if (it->type == JV_STR) {
        struct jv *a = jv_array_new((int)jv_utf8_count(it->u.s.p, it->u.s.len));
        uint32_t cp;
        for (size_t i = 0, k = 0; i < it->u.s.len; k++) {
            int len = jv_utf8_next(it->u.s.p + i, it->u.s.len - i, &cp);
            a->u.a.v[k] = jv_str(it->u.s.p + i, (size_t)len);
            i += (size_t)len;
        }
        return a;
    }
    return jerr(c, VLLM_ERR_INVALID_ARGUMENT, n, "cannot iterate over %s", jv_type_name(it));
}

static struct jv *loop_object(int i, int n, struct jv *items) {
    struct jv *o = jv_object_new();
    static const char *k[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem"};
    struct jv *v[9] = {jv_int(i + 1), jv_int(i), jv_int(n - i), jv_int(n - i - 1), jv_bool(i == 0),
                       jv_bool(i == n - 1), jv_int(n),
                       i > 0 ? jv_retain(items->u.a.v[i - 1]) : JV_UNDEFINED,
                       i < n - 1 ? jv_retain(items->u.a.v[i + 1]) : JV_UNDEFINED};
    for (int j = 0; j < 9; j++) jv_object_put(o, jv_strz(k[j]), v[j]);
    return o;
}

// Keeps the items that fit the target (unpacking) and pass `for ... if cond`.
static struct jv *select_items(struct jctx *c, const struct jnode *n, struct jv *all, struct jscope *scope) {
    struct jv *keep = jv_array_new(all->u.a.n);
    int k = 0;
    for (int i = 0; i < all->u.a.n; i++) {
        struct jv *x = all->u.a.v[i];
        if (n->a->type == N_TUPLE && (x->type != JV_ARRAY || x->u.a.n != n->a->l1.n)) {
            jerr(c, VLLM_ERR_INVALID_ARGUMENT, n->a, "cannot unpack %s into %d names", jv_type_name(x), n->a->l1.n);
            break;
        }
        int pass = 1;
        if (n->c) {
            struct jscope *ts = jscope_new(c, scope);
            struct jv *cond = assign(c, n->a, jv_retain(x), ts) ? NULL : jeval(c, n->c, ts);
            jscope_release(ts);
            if (!cond) break;
            pass = jv_truthy(cond);
            jv_release(cond);
        }
        if (pass) keep->u.a.v[k++] = jv_retain(x);
    }
    for (int i = k; i < keep->u.a.n; i++) keep->u.a.v[i] = NULL;
    keep->u.a.n = k;
    if (c->status) {
        jv_release(keep);
        return NULL;
    }
    return keep;
}

static int render_for(struct jctx *c, const struct jnode *n, struct jscope *s, struct jbuf *out) {
    struct jscope *scope = jscope_new(c, s);
    struct jv *it = jeval(c, n->b, scope), *all = it ? loop_items(c, n->b, it) : NULL;
    struct jv *items = all ? select_items(c, n, all, scope) : NULL;
    jv_release(it);
    jv_release(all);
    int rc = -1;
    if (items) {
        int len = items->u.a.n;
        c->loop_depth++;
        for (int i = 0; i < len && !c->status; i++) {
            if (jctx_step(c, n, 1)) break;
            jscope_set(scope, "loop", 4, loop_object(i, len, items));
            if (assign(c, n->a, jv_retain(items->u.a.v[i]), scope)) break;
            jrender_list(c, &n->l1, scope, out);
            int ctl = c->ctl;
            c->ctl = CTL_NONE;
            if (ctl == CTL_BREAK) break;
        }
        c->loop_depth--;
        if (len == 0 && !c->status) jrender_list(c, &n->l2, scope, out);
        rc = c->status ? -1 : 0;
    }
    jv_release(items);
    jscope_release(scope);
    return rc;
}

static int print_value(struct jctx *c, struct jv *v, struct jbuf *out, const struct jnode *n) {
    if (!v) return -1;
    int rc = jv_display(c, out, v, n);
    jv_release(v);
    return rc;
}

static int render_node(struct jctx *c, const struct jnode *n, struct jscope *s, struct jbuf *out) {
    struct jv *v;
    int t;
    switch (n->type) {
    case N_TEXT: return jbuf_add(c, out, n->s, n->len);
    case N_OUTPUT: return print_value(c, jeval(c, n->a, s), out, n);
    case N_IF:
        if (!(v = jeval(c, n->a, s))) return -1;
        t = jv_truthy(v);
        jv_release(v);
        return jrender_list(c, t ? &n->l1 : &n->l2, s, out);
    case N_FOR: return render_for(c, n, s, out);
    case N_SET: return exec_set(c, n, s);
    case N_MACRO: jscope_set(s, n->s, n->len, make_func(c, JF_MACRO, n, s)); return 0;
    case N_CALLBLOCK: {
        struct jv *caller = make_func(c, JF_CALLER, n, s);
        v = eval_call(c, n->a, s, caller);
        jv_release(caller);
        return print_value(c, v, out, n);
    }
    case N_FILTERBLOCK: {
        struct jbuf b = {0};
        v = jrender_list(c, &n->l1, s, &b) ? NULL : jbuf_to_str(&b);
        free(b.p);
        if (!v) return -1;
        struct jv *r = apply_filter_node(c, v, n->a, s);
        jv_release(v);
        return print_value(c, r, out, n);
    }
    case N_BREAK:
    case N_CONTINUE:
        if (!c->loop_depth) {
            jerr(c, VLLM_ERR_FORMAT, n, "{%% %s %%} outside a for loop", n->type == N_BREAK ? "break" : "continue");
            return -1;
        }
        c->ctl = n->type == N_BREAK ? CTL_BREAK : CTL_CONTINUE;
        return 0;
    default: return print_value(c, jeval(c, n, s), out, n);
    }
}

int jrender_list(struct jctx *c, const struct jlist *l, struct jscope *s, struct jbuf *out) {
    for (int i = 0; i < l->n && !c->ctl; i++) {
        if (enter(c, l->v[i])) return -1;
        int rc = render_node(c, l->v[i], s, out);
        c->depth--;
        if (rc || c->status) return -1;
    }
    return 0;
}

// ------------------------------------------------------------------ render --

static void set_globals(struct jscope *g) {
    static const struct {
        const char *name;
        int id;
    } fns[] = {{"namespace", JB_NAMESPACE}, {"range", JB_RANGE}, {"raise_exception", JB_RAISE},
               {"strftime_now", JB_STRFTIME}, {"dict", JB_DICT}};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        jscope_set(g, fns[i].name, strlen(fns[i].name), jv_func_builtin(fns[i].id));
    static const char *consts[] = {"true", "True", "false", "False", "none", "None"};
    for (int i = 0; i < 6; i++)
        jscope_set(g, consts[i], strlen(consts[i]), i < 2 ? jv_bool(1) : i < 4 ? jv_bool(0) : JV_NONEV);
}

int jinja_render(const struct jinja_template *t, const json_t *vars, const struct jinja_render_opts *opts,
                 char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (vars && !json_is_object(vars)) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "template variables must be a JSON object");
    struct jctx c = {.t = t};
    if (opts) c.opts = *opts;
    else jinja_render_opts_default(&c.opts);
    struct jscope *g = jscope_new(&c, NULL);
    set_globals(g);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vars, key, val) {
        struct jv *v = jv_from_json(&c, val, 0);
        if (!v) break;
        jscope_set(g, key, strlen(key), v);
    }
    struct jbuf b = {0};
    if (!c.status) jrender_list(&c, &t->body, g, &b);
    jscope_release(g);
    jctx_collect(&c);
    if (c.status) {
        free(b.p);
        return vllm_err(c.status, "template %s", c.msg);
    }
    if (!b.p) b.p = xstrdup("");
    *out = b.p;
    if (out_len) *out_len = b.len;
    return VLLM_OK;
}
