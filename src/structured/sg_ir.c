// sg_ir.c - the grammar IR: rules of expression trees, allocated from one
// arena that sg_ir_free releases at once.
#include <stdarg.h>

#include "core/common.h"
#include "structured/sg_internal.h"

struct sg_arena {
    struct sg_arena *next;
    size_t used, cap;
    _Alignas(16) char data[];
};

static void *arena_alloc(struct sg_ir *ir, size_t n) {
    n = (n + 15) & ~(size_t)15;
    struct sg_arena *a = ir->arena;
    if (!a || a->used + n > a->cap) {
        size_t cap = MAX(n, (size_t)64 << 10);
        struct sg_arena *b = xmalloc(sizeof *b + cap);
        b->next = a;
        b->used = 0;
        b->cap = cap;
        ir->arena = a = b;
    }
    void *p = a->data + a->used;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *sg_arena_strdup(struct sg_ir *ir, const char *s, size_t n) {
    char *p = arena_alloc(ir, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

struct sg_ir *sg_ir_create(void) { return xcalloc(1, sizeof(struct sg_ir)); }

void sg_ir_free(struct sg_ir *ir) {
    if (!ir) return;
    for (struct sg_arena *a = ir->arena, *n; a; a = n) {
        n = a->next;
        free(a);
    }
    for (int i = 0; i < ir->n_rules; i++) free(ir->names[i]);
    free(ir->names);
    free(ir->body);
    free(ir->keep);
    free(ir);
}

int sg_ir_rule(struct sg_ir *ir, const char *name) {
    for (int i = 0; i < ir->n_rules; i++)
        if (!strcmp(ir->names[i], name)) return i;
    if (ir->n_rules == ir->cap) {
        ir->cap = ir->cap ? ir->cap * 2 : 16;
        ir->names = xrealloc(ir->names, (size_t)ir->cap * sizeof *ir->names);
        ir->body = xrealloc(ir->body, (size_t)ir->cap * sizeof *ir->body);
        ir->keep = xrealloc(ir->keep, (size_t)ir->cap);
    }
    ir->keep[ir->n_rules] = 0;
    ir->names[ir->n_rules] = xstrdup(name);
    ir->body[ir->n_rules] = NULL;
    return ir->n_rules++;
}

int sg_ir_fresh(struct sg_ir *ir, const char *base) {
    char name[256];
    snprintf(name, sizeof name, "%.200s-%d", base, ir->n_rules);
    return sg_ir_rule(ir, name);
}

void sg_ir_define(struct sg_ir *ir, int rule, struct sg_expr *body) { ir->body[rule] = body; }
void sg_ir_keep(struct sg_ir *ir, int rule) { ir->keep[rule] = 1; }

static struct sg_expr *node(struct sg_ir *ir, enum sg_ek kind) {
    struct sg_expr *e = arena_alloc(ir, sizeof *e);
    e->kind = kind;
    e->ir = ir;
    return e;
}

struct sg_expr *sg_empty(struct sg_ir *ir) { return node(ir, SG_E_EMPTY); }

struct sg_expr *sg_lit(struct sg_ir *ir, const char *s, size_t n) {
    if (!n) return sg_empty(ir);
    struct sg_expr *e = node(ir, SG_E_BYTES);
    e->bytes = sg_arena_strdup(ir, s, n);
    e->len = (int)n;
    return e;
}

struct sg_expr *sg_lits(struct sg_ir *ir, const char *s) { return sg_lit(ir, s, strlen(s)); }

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

struct sg_expr *sg_class(struct sg_ir *ir, const uint32_t *ranges, int n, int negate) {
    // Sort, clip to U+10FFFF, merge, cut out the surrogates, then complement.
    uint32_t *r = xmalloc((size_t)(n + 1) * 2 * sizeof *r);
    int m = 0;
    for (int i = 0; i < n; i++) {
        uint32_t lo = ranges[2 * i], hi = MIN(ranges[2 * i + 1], 0x10FFFFu);
        if (lo > hi) continue;
        r[2 * m] = lo;
        r[2 * m + 1] = hi;
        m++;
    }
    qsort(r, (size_t)m, 2 * sizeof *r, cmp_range);
    int k = 0;
    for (int i = 0; i < m; i++) {
        if (k && r[2 * i] <= r[2 * k - 1] + 1) r[2 * k - 1] = MAX(r[2 * k - 1], r[2 * i + 1]);
        else {
            r[2 * k] = r[2 * i];
            r[2 * k + 1] = r[2 * i + 1];
            k++;
        }
    }
    if (negate) {
        uint32_t *c = xmalloc((size_t)(k + 1) * 2 * sizeof *c);
        int j = 0;
        uint32_t next = 0;
        for (int i = 0; i < k; i++) {
            if (r[2 * i] > next) {
                c[2 * j] = next;
                c[2 * j + 1] = r[2 * i] - 1;
                j++;
            }
            next = r[2 * i + 1] + 1;
        }
        if (next <= 0x10FFFF) {
            c[2 * j] = next;
            c[2 * j + 1] = 0x10FFFF;
            j++;
        }
        free(r);
        r = c;
        k = j;
    }
    // Surrogates: split any range across D800-DFFF (at most one more range).
    struct sg_expr *e = node(ir, SG_E_CLASS);
    e->ranges = arena_alloc(ir, (size_t)(k + 1) * 2 * sizeof *e->ranges);
    int o = 0;
    for (int i = 0; i < k; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        if (lo < 0xD800 && hi >= 0xD800) {
            e->ranges[2 * o] = lo;
            e->ranges[2 * o + 1] = 0xD7FF;
            o++;
            lo = 0xE000;
        } else if (lo >= 0xD800 && lo <= 0xDFFF) {
            lo = 0xE000;
        }
        if (lo > hi) continue;
        e->ranges[2 * o] = lo;
        e->ranges[2 * o + 1] = hi;
        o++;
    }
    e->n = o;
    free(r);
    return e;
}

struct sg_expr *sg_ref(struct sg_ir *ir, int rule) {
    struct sg_expr *e = node(ir, SG_E_REF);
    e->rule = rule;
    return e;
}

struct sg_expr *sg_seq(struct sg_ir *ir) { return node(ir, SG_E_SEQ); }
struct sg_expr *sg_alt(struct sg_ir *ir) { return node(ir, SG_E_ALT); }

struct sg_expr *sg_push(struct sg_expr *list, struct sg_expr *item) {
    if (list->n == list->cap) { // arrays come from the arena too; the old one stays there
        int cap = list->cap ? list->cap * 2 : 4;
        struct sg_expr **s = arena_alloc(list->ir, (size_t)cap * sizeof *s);
        if (list->n) memcpy(s, list->sub, (size_t)list->n * sizeof *s);
        list->sub = s;
        list->cap = cap;
    }
    list->sub[list->n++] = item;
    return list;
}

struct sg_expr *sg_rep(struct sg_ir *ir, struct sg_expr *e, int min, int max) {
    struct sg_expr *r = node(ir, SG_E_REP);
    r->sub = arena_alloc(ir, sizeof *r->sub);
    r->sub[0] = e;
    r->n = r->cap = 1;
    r->min = min;
    r->max = max;
    return r;
}

struct sg_expr *sg_opt(struct sg_ir *ir, struct sg_expr *e) { return sg_rep(ir, e, 0, 1); }

struct sg_expr *sg_excl(struct sg_ir *ir, const char *const *strs, int n) {
    struct sg_expr *e = node(ir, SG_E_EXCL);
    e->strs = arena_alloc(ir, (size_t)n * sizeof *e->strs);
    for (int i = 0; i < n; i++) e->strs[i] = sg_arena_strdup(ir, strs[i], strlen(strs[i]));
    e->n = e->cap = n;
    return e;
}

static struct sg_expr *listv(struct sg_expr *l, va_list ap) {
    struct sg_expr *x;
    while ((x = va_arg(ap, struct sg_expr *))) sg_push(l, x);
    return l;
}

struct sg_expr *sg_seqv(struct sg_ir *ir, ...) {
    va_list ap;
    va_start(ap, ir);
    struct sg_expr *l = listv(sg_seq(ir), ap);
    va_end(ap);
    return l;
}

struct sg_expr *sg_altv(struct sg_ir *ir, ...) {
    va_list ap;
    va_start(ap, ir);
    struct sg_expr *l = listv(sg_alt(ir), ap);
    va_end(ap);
    return l;
}

// ------------------------------------------------------------------- misc --

uint64_t sg_hash64(uint64_t x) { // splitmix64's finalizer
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void sg_buf_add(struct sg_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = MAX(b->cap * 2, b->len + n + 64);
        b->p = xrealloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void sg_buf_addc(struct sg_buf *b, char c) { sg_buf_add(b, &c, 1); }

void sg_buf_addf(struct sg_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < (int)sizeof tmp) {
        sg_buf_add(b, tmp, (size_t)n);
        return;
    }
    char *big = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sg_buf_add(b, big, (size_t)n);
    free(big);
}

char *sg_buf_take(struct sg_buf *b) {
    char *p = b->p ? b->p : xstrdup("");
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}
