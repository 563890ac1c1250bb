// sg_compile.c - IR -> byte automata. Each rule becomes a Thompson NFA over
// bytes (classes as UTF-8 byte-range sequences, rule references as call
// edges), then a DFA by subset construction (symbols: byte ranges and called
// rules) unless that grows past a bound, where the epsilon-free NFA is kept
// (the matcher runs sets of stacks either way). Then, over the whole grammar:
// which rules can match "" (nullable), which nodes can still reach the end of
// their rule (productive: the others are pruned, so that every state a
// matcher reaches can complete and a token is allowed exactly when its bytes
// keep the text a viable prefix), left recursion (rejected: the matcher could
// push forever without consuming a byte), and each node's fewest bytes to
// the end of its rule.
#include "core/common.h"
#include "structured/sg_internal.h"

#define NFA_MAX_STATES (1 << 19) // per rule
#define DFA_MAX_STATES 60000     // per rule; beyond: epsilon-free NFA
// Subset construction's work (NFA states visited, summed over DFA states and
// byte intervals) per rule; beyond: epsilon-free NFA. A bounded repetition of
// a class overlapping what precedes it ("t+[a-z]{243}") makes DFA states of
// hundreds of NFA states each; unbounded, one request's regex held a server
// thread for seconds.
#define DFA_MAX_WORK (1 << 20) // 27 ms at -O2 for the fuzz cases; none of the 300 test schemas reach it
// The epsilon-free NFA's edges per rule; beyond, the rule is refused. A
// nullable repetition ("(x|y?){5000}") closes over every later copy, so its
// edges grow with the square of the count, and so does the matcher's work
// per byte: a state holds every copy, each with edges to all later ones.
// At 1M edges "}({?){998}" (500k) took 19 s of a fuzz input under ASan; the
// fallback's other users (a DFA blown up by a count overlapping what precedes
// it, "t+[a-z]{243}": 247 edges) are linear, and none of the 300 test schemas
// reaches the fallback at all.
#define EPS_MAX_EDGES (1 << 16)
// ... and its closures' states, summed: the same rule refused before its
// first edges are even written ("}(x|{?){4999}" closes over 15k states each)
#define EPS_MAX_WORK (1 << 18)

// ------------------------------------------------------------------- NFA --

enum { K_BYTE, K_EPS, K_CALL };
struct nedge {
    int32_t from, to;
    int32_t a, b; // K_BYTE: byte range; K_CALL: a = rule
    int kind;
};

struct nfa {
    int n;
    struct nedge *e;
    int ne, cap;
    int accept;
    int too_big;
    // CSR by source, built after construction
    int32_t *off;
};

static int nstate(struct nfa *f) {
    if (f->n >= NFA_MAX_STATES) f->too_big = 1;
    return f->n++;
}

static void nedge(struct nfa *f, int from, int to, int kind, int a, int b) {
    if (f->ne == f->cap) {
        f->cap = f->cap ? f->cap * 2 : 256;
        f->e = xrealloc(f->e, (size_t)f->cap * sizeof *f->e);
    }
    f->e[f->ne++] = (struct nedge){from, to, a, b, kind};
}

// UTF-8 encodings of the code points [lo, hi] as sequences of byte ranges:
// emits each sequence (len ranges) through cb.
typedef void (*seq_fn)(void *ctx, const uint8_t *lo, const uint8_t *hi, int len);

static int enc(uint32_t c, uint8_t *o) {
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = (uint8_t)(0xC0 | c >> 6); o[1] = (uint8_t)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12); o[1] = (uint8_t)(0x80 | ((c >> 6) & 63));
        o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18); o[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 63)); o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

static void utf8_seqs(uint32_t lo, uint32_t hi, seq_fn cb, void *ctx) {
    if (lo > hi) return;
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bounds[i] && hi > bounds[i]) {
            utf8_seqs(lo, bounds[i], cb, ctx);
            utf8_seqs(bounds[i] + 1, hi, cb, ctx);
            return;
        }
    uint8_t a[4], b[4];
    int n = enc(lo, a);
    enc(hi, b);
    // Split until every byte position ranges independently: the low 6*i bits
    // of lo are all 0 and of hi all 1 wherever the higher bytes differ.
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_seqs(lo, lo | m, cb, ctx);
                utf8_seqs((lo | m) + 1, hi, cb, ctx);
                return;
            }
            if ((hi & m) != m) {
                utf8_seqs(lo, (hi & ~m) - 1, cb, ctx);
                utf8_seqs(hi & ~m, hi, cb, ctx);
                return;
            }
        }
    }
    cb(ctx, a, b, n);
}

struct class_ctx {
    struct nfa *f;
    int from, to;
};

static void class_seq(void *ctx, const uint8_t *lo, const uint8_t *hi, int len) {
    struct class_ctx *c = ctx;
    int cur = c->from;
    for (int i = 0; i < len; i++) {
        int nx = i == len - 1 ? c->to : nstate(c->f);
        nedge(c->f, cur, nx, K_BYTE, lo[i], hi[i]);
        cur = nx;
    }
}

static void class_edges(struct nfa *f, int from, int to, const uint32_t *r, int n) {
    struct class_ctx c = {f, from, to};
    for (int i = 0; i < n; i++) utf8_seqs(r[2 * i], r[2 * i + 1], class_seq, &c);
}

// Text containing none of the ASCII strings: an Aho-Corasick automaton whose
// states are the strings' proper prefixes; every state may end the text.
static int excl_build(struct nfa *f, const struct sg_expr *x, int s) {
    int cap = 1;
    for (int i = 0; i < x->n; i++) cap += (int)strlen(x->strs[i]);
    int32_t(*go)[128] = xmalloc((size_t)cap * sizeof *go);
    int32_t *fail = xmalloc((size_t)cap * sizeof *fail), *queue = xmalloc((size_t)cap * sizeof *queue);
    uint8_t *bad = xcalloc((size_t)cap, 1);
    int n = 1;
    for (int c = 0; c < 128; c++) go[0][c] = -1;
    for (int i = 0; i < x->n; i++) {
        int q = 0;
        for (const unsigned char *p = (const unsigned char *)x->strs[i]; *p; p++) {
            int c = *p & 127;
            if (go[q][c] < 0) {
                for (int k = 0; k < 128; k++) go[n][k] = -1;
                go[q][c] = n++;
            }
            q = go[q][c];
        }
        bad[q] = 1;
    }
    int qh = 0, qt = 0;
    fail[0] = 0;
    for (int c = 0; c < 128; c++) {
        if (go[0][c] < 0) go[0][c] = 0;
        else {
            fail[go[0][c]] = 0;
            queue[qt++] = go[0][c];
        }
    }
    while (qh < qt) { // BFS: complete the transition table through fail links
        int q = queue[qh++];
        bad[q] |= bad[fail[q]];
        for (int c = 0; c < 128; c++) {
            int t = go[q][c];
            if (t < 0) go[q][c] = go[fail[q]][c];
            else {
                fail[t] = go[fail[q]][c];
                queue[qt++] = t;
            }
        }
    }
    int32_t *st = xmalloc((size_t)n * sizeof *st);
    for (int q = 0; q < n; q++) st[q] = bad[q] ? -1 : nstate(f);
    int e = nstate(f);
    if (st[0] >= 0) nedge(f, s, st[0], K_EPS, 0, 0); // else (an empty string) nothing matches
    static const uint32_t non_ascii[] = {0x80, 0xD7FF, 0xE000, 0x10FFFF};
    for (int q = 0; q < n; q++) {
        if (st[q] < 0) continue;
        nedge(f, st[q], e, K_EPS, 0, 0);
        for (int c = 0; c < 128;) { // runs of bytes going to one state
            int t = go[q][c], c2 = c;
            while (c2 + 1 < 128 && go[q][c2 + 1] == t) c2++;
            if (st[t] >= 0) nedge(f, st[q], st[t], K_BYTE, c, c2);
            c = c2 + 1;
        }
        class_edges(f, st[q], st[0], non_ascii, 2); // a non-ASCII character matches no prefix
    }
    free(go);
    free(fail);
    free(queue);
    free(bad);
    free(st);
    return e;
}

// Builds x from state s; returns the end state.
static int build(struct nfa *f, const struct sg_expr *x, int s) {
    if (f->too_big) return s;
    switch (x->kind) {
    case SG_E_EMPTY: return s;
    case SG_E_BYTES: {
        int cur = s;
        for (int i = 0; i < x->len; i++) {
            int t = nstate(f);
            uint8_t b = (uint8_t)x->bytes[i];
            nedge(f, cur, t, K_BYTE, b, b);
            cur = t;
        }
        return cur;
    }
    case SG_E_CLASS: {
        int e = nstate(f);
        class_edges(f, s, e, x->ranges, x->n);
        return e;
    }
    case SG_E_REF: {
        int e = nstate(f);
        nedge(f, s, e, K_CALL, x->rule, 0);
        return e;
    }
    case SG_E_SEQ: {
        int cur = s;
        for (int i = 0; i < x->n; i++) cur = build(f, x->sub[i], cur);
        return cur;
    }
    case SG_E_ALT: {
        int e = nstate(f);
        for (int i = 0; i < x->n; i++) {
            int a = nstate(f);
            nedge(f, s, a, K_EPS, 0, 0);
            nedge(f, build(f, x->sub[i], a), e, K_EPS, 0, 0);
        }
        return e; // with no alternatives nothing reaches e: it matches nothing
    }
    case SG_E_REP: {
        int cur = s;
        for (int i = 0; i < x->min && !f->too_big; i++) {
            int a = nstate(f);
            nedge(f, cur, a, K_EPS, 0, 0);
            cur = build(f, x->sub[0], a);
        }
        if (x->max < 0) {
            int head = nstate(f), e = nstate(f);
            nedge(f, cur, head, K_EPS, 0, 0);
            int a = nstate(f);
            nedge(f, head, a, K_EPS, 0, 0);
            nedge(f, build(f, x->sub[0], a), head, K_EPS, 0, 0);
            nedge(f, head, e, K_EPS, 0, 0);
            return e;
        }
        int e = nstate(f);
        for (int i = x->min; i < x->max && !f->too_big; i++) {
            nedge(f, cur, e, K_EPS, 0, 0);
            int a = nstate(f);
            nedge(f, cur, a, K_EPS, 0, 0);
            cur = build(f, x->sub[0], a);
        }
        nedge(f, cur, e, K_EPS, 0, 0);
        return e;
    }
    case SG_E_EXCL: return excl_build(f, x, s);
    }
    return s;
}

static int cmp_edge_from(const void *a, const void *b) {
    const struct nedge *x = a, *y = b;
    return x->from < y->from ? -1 : x->from > y->from;
}

static void nfa_index(struct nfa *f) {
    if (f->ne) qsort(f->e, (size_t)f->ne, sizeof *f->e, cmp_edge_from);
    f->off = xcalloc((size_t)f->n + 1, sizeof *f->off);
    for (int i = 0; i < f->ne; i++) f->off[f->e[i].from + 1]++;
    for (int i = 0; i < f->n; i++) f->off[i + 1] += f->off[i];
}

// ------------------------------------------------------ subset construction --

struct ivec {
    int32_t *v;
    int n, cap;
};

static void ipush(struct ivec *v, int32_t x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 16;
        v->v = xrealloc(v->v, (size_t)v->cap * sizeof *v->v);
    }
    v->v[v->n++] = x;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

struct dstates { // sets of NFA states, interned
    struct ivec pool; // concatenated sorted sets
    int32_t *start, *len;
    int n, cap;
    int32_t *slot;
    uint32_t mask;
};

static uint64_t set_hash(const int32_t *s, int n) {
    uint64_t h = (uint64_t)n;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)s[i]) * 0x100000001B3ull + (h >> 29);
    return sg_hash64(h);
}

static void ds_grow(struct dstates *d) {
    uint32_t cap = d->mask ? (d->mask + 1) * 2 : 256;
    int32_t *slot = xmalloc(cap * sizeof *slot);
    for (uint32_t i = 0; i < cap; i++) slot[i] = -1;
    for (int i = 0; i < d->n; i++) {
        uint32_t h = (uint32_t)set_hash(d->pool.v + d->start[i], d->len[i]) & (cap - 1);
        while (slot[h] >= 0) h = (h + 1) & (cap - 1);
        slot[h] = i;
    }
    free(d->slot);
    d->slot = slot;
    d->mask = cap - 1;
}

// Returns the id of set s (sorted, unique), adding it when new (*added = 1).
static int ds_get(struct dstates *d, const int32_t *s, int n, int *added) {
    if ((uint32_t)(d->n + 1) * 2 > d->mask) ds_grow(d);
    uint32_t h = (uint32_t)set_hash(s, n) & d->mask;
    for (; d->slot[h] >= 0; h = (h + 1) & d->mask) {
        int i = d->slot[h];
        if (d->len[i] == n && !memcmp(d->pool.v + d->start[i], s, (size_t)n * sizeof *s)) {
            *added = 0;
            return i;
        }
    }
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 64;
        d->start = xrealloc(d->start, (size_t)d->cap * sizeof *d->start);
        d->len = xrealloc(d->len, (size_t)d->cap * sizeof *d->len);
    }
    d->start[d->n] = d->pool.n;
    d->len[d->n] = n;
    if (d->pool.n + n > d->pool.cap) {
        d->pool.cap = MAX(d->pool.cap * 2, d->pool.n + n + 64);
        d->pool.v = xrealloc(d->pool.v, (size_t)d->pool.cap * sizeof *d->pool.v);
    }
    memcpy(d->pool.v + d->pool.n, s, (size_t)n * sizeof *s);
    d->pool.n += n;
    d->slot[h] = d->n;
    *added = 1;
    return d->n++;
}

// Epsilon closure of the states in v (in place: sorted, unique).
static void eclose(const struct nfa *f, struct ivec *v, uint32_t *mark, uint32_t epoch) {
    for (int i = 0; i < v->n; i++) mark[v->v[i]] = epoch;
    for (int i = 0; i < v->n; i++) {
        int s = v->v[i];
        for (int k = f->off[s]; k < f->off[s + 1]; k++)
            if (f->e[k].kind == K_EPS && mark[f->e[k].to] != epoch) {
                mark[f->e[k].to] = epoch;
                ipush(v, f->e[k].to);
            }
    }
    qsort(v->v, (size_t)v->n, sizeof *v->v, cmp_i32);
}

// The automaton of one rule being assembled: local node ids from 0 (start).
struct rule_fsm {
    struct ivec eb;     // edges: (node, lo, hi, to) 4 ints each
    struct ivec cl;     // calls: (node, rule, to) 3 ints each
    struct ivec accept; // node ids
    int n;
};

static int cmp_i32x4(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    for (int i = 0; i < 2; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

// Subset construction; 0 when it passed DFA_MAX_STATES or DFA_MAX_WORK.
static int determinize(const struct nfa *f, int start, struct rule_fsm *out) {
    struct dstates d = {0};
    uint32_t *mark = xcalloc((size_t)f->n, sizeof *mark);
    uint32_t epoch = 0;
    struct ivec v = {0}, bounds = {0}, work = {0};
    ipush(&v, start);
    eclose(f, &v, mark, ++epoch);
    int added, ok = 1;
    int64_t spent = 0;
    ds_get(&d, v.v, v.n, &added);
    for (int cur = 0; cur < d.n && ok; cur++) {
        // byte edges of the set's states: elementary intervals between bounds
        bounds.n = 0;
        int s0 = d.start[cur], sn = d.len[cur];
        int acc = 0;
        for (int i = 0; i < sn; i++) {
            int s = d.pool.v[s0 + i];
            if (s == f->accept) acc = 1;
            for (int k = f->off[s]; k < f->off[s + 1]; k++)
                if (f->e[k].kind == K_BYTE) {
                    ipush(&bounds, f->e[k].a);
                    ipush(&bounds, f->e[k].b + 1);
                }
        }
        if (acc) ipush(&out->accept, cur);
        if (bounds.n) qsort(bounds.v, (size_t)bounds.n, sizeof *bounds.v, cmp_i32);
        int nb = 0;
        for (int i = 0; i < bounds.n; i++)
            if (!nb || bounds.v[nb - 1] != bounds.v[i]) bounds.v[nb++] = bounds.v[i];
        int prev_to = -1, prev_lo = 0, prev_hi = -2;
        spent += (int64_t)sn * (nb + 1);
        if (spent > DFA_MAX_WORK) ok = 0;
        for (int j = 0; j + 1 < nb && ok; j++) {
            int lo = bounds.v[j], hi = bounds.v[j + 1] - 1;
            v.n = 0;
            for (int i = 0; i < sn; i++) {
                int s = d.pool.v[d.start[cur] + i];
                for (int k = f->off[s]; k < f->off[s + 1]; k++)
                    if (f->e[k].kind == K_BYTE && f->e[k].a <= lo && f->e[k].b >= hi) ipush(&v, f->e[k].to);
            }
            int to = -1;
            if (v.n) {
                eclose(f, &v, mark, ++epoch);
                to = ds_get(&d, v.v, v.n, &added);
                if (d.n > DFA_MAX_STATES) ok = 0;
            }
            if (to == prev_to && lo == prev_hi + 1) {
                prev_hi = hi;
                continue;
            }
            if (prev_to >= 0) {
                int32_t e4[4] = {cur, prev_lo, prev_hi, prev_to};
                for (int q = 0; q < 4; q++) ipush(&out->eb, e4[q]);
            }
            prev_to = to, prev_lo = lo, prev_hi = hi;
        }
        if (prev_to >= 0) {
            int32_t e4[4] = {cur, prev_lo, prev_hi, prev_to};
            for (int q = 0; q < 4; q++) ipush(&out->eb, e4[q]);
        }
        // calls, grouped by rule
        work.n = 0;
        for (int i = 0; i < sn; i++) {
            int s = d.pool.v[d.start[cur] + i];
            for (int k = f->off[s]; k < f->off[s + 1]; k++)
                if (f->e[k].kind == K_CALL) {
                    ipush(&work, f->e[k].a);
                    ipush(&work, f->e[k].to);
                }
        }
        if (work.n) qsort(work.v, (size_t)work.n / 2, 2 * sizeof *work.v, cmp_i32);
        for (int i = 0; i < work.n;) {
            int rule = work.v[i], j = i;
            v.n = 0;
            for (; j < work.n && work.v[j] == rule; j += 2) ipush(&v, work.v[j + 1]);
            eclose(f, &v, mark, ++epoch);
            int to = ds_get(&d, v.v, v.n, &added);
            ipush(&out->cl, cur);
            ipush(&out->cl, rule);
            ipush(&out->cl, to);
            i = j;
        }
    }
    out->n = d.n;
    free(d.pool.v);
    free(d.start);
    free(d.len);
    free(d.slot);
    free(mark);
    free(v.v);
    free(bounds.v);
    free(work.v);
    return ok;
}

// Fallback: one node per state that starts the rule or ends a non-epsilon
// edge; its edges are those of its epsilon closure.
// Epsilon-free NFA; 0 when it passed EPS_MAX_EDGES or EPS_MAX_WORK.
static int eps_free(const struct nfa *f, int start, struct rule_fsm *out) {
    int32_t *id = xmalloc((size_t)f->n * sizeof *id);
    for (int i = 0; i < f->n; i++) id[i] = -1;
    struct ivec order = {0}, v = {0};
    id[start] = 0;
    ipush(&order, start);
    for (int i = 0; i < f->ne; i++)
        if (f->e[i].kind != K_EPS && id[f->e[i].to] < 0) {
            id[f->e[i].to] = order.n;
            ipush(&order, f->e[i].to);
        }
    uint32_t *mark = xcalloc((size_t)f->n, sizeof *mark);
    int ok = 1;
    int64_t spent = 0;
    for (int q = 0; q < order.n && ok; q++) {
        v.n = 0;
        ipush(&v, order.v[q]);
        eclose(f, &v, mark, (uint32_t)q + 1);
        int acc = 0;
        for (int i = 0; i < v.n; i++) {
            int s = v.v[i];
            if (s == f->accept) acc = 1;
            for (int k = f->off[s]; k < f->off[s + 1]; k++) {
                const struct nedge *e = &f->e[k];
                if (e->kind == K_BYTE) {
                    int32_t e4[4] = {q, e->a, e->b, id[e->to]};
                    for (int r = 0; r < 4; r++) ipush(&out->eb, e4[r]);
                } else if (e->kind == K_CALL) {
                    ipush(&out->cl, q);
                    ipush(&out->cl, e->a);
                    ipush(&out->cl, id[e->to]);
                }
            }
        }
        if (acc) ipush(&out->accept, q);
        spent += v.n;
        ok = out->eb.n / 4 + out->cl.n / 3 <= EPS_MAX_EDGES && spent <= EPS_MAX_WORK;
    }
    out->n = order.n;
    free(id);
    free(order.v);
    free(v.v);
    free(mark);
    return ok;
}

// ----------------------------------------------------------------- grammar --

static int refs_check(const struct sg_ir *ir, const struct sg_expr *x, uint8_t *used, struct ivec *todo) {
    switch (x->kind) {
    case SG_E_REF:
        if (x->rule < 0 || x->rule >= ir->n_rules || !ir->body[x->rule])
            return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar: rule '%s' is not defined",
                            x->rule >= 0 && x->rule < ir->n_rules ? ir->names[x->rule] : "?");
        if (!used[x->rule]) {
            used[x->rule] = 1;
            ipush(todo, x->rule);
        }
        return VLLM_OK;
    case SG_E_SEQ:
    case SG_E_ALT:
    case SG_E_REP:
        for (int i = 0; i < x->n; i++) TRY(refs_check(ir, x->sub[i], used, todo));
        return VLLM_OK;
    default: return VLLM_OK;
    }
}

// ------------------------------------------------------------------ inlining --

// Rules that are not recursive and either small or used once are replaced by
// their bodies. Fewer rule boundaries means fewer tokens whose fate depends on
// the stack (a small optional rule such as whitespace ends after nearly every
// token that starts with it) and fewer pushes at run time.
#define INLINE_SIZE 12
// A rule used once is inlined only up to this expanded size: a long bounded
// string ("maxLength": 400) inlined into an object multiplies its automaton
// by the object's states (15,710 DFA states, 0.13 s, for a three-property
// answer schema); called, it is one chain.
#define INLINE_ONCE_SIZE 2048

struct inliner {
    struct sg_ir *ir;
    int *refs;         // uses of each rule
    uint8_t *inl;      // replace its references by its body
    struct ivec *out;  // rules each rule references
};

static void collect_refs(const struct sg_expr *x, int r, struct inliner *in) {
    if (x->kind == SG_E_REF) {
        in->refs[x->rule]++;
        ipush(&in->out[r], x->rule);
    } else if (x->kind == SG_E_SEQ || x->kind == SG_E_ALT || x->kind == SG_E_REP) {
        for (int i = 0; i < x->n; i++) collect_refs(x->sub[i], r, in);
    }
}

static int expr_size(const struct sg_expr *x, int cap) {
    int n = 1;
    if (x->kind == SG_E_SEQ || x->kind == SG_E_ALT || x->kind == SG_E_REP)
        for (int i = 0; i < x->n && n <= cap; i++) n += expr_size(x->sub[i], cap - n);
    if (x->kind == SG_E_CLASS) n += x->n / 4;
    return n;
}

// The automaton size x expands to, roughly (counted repetitions unrolled),
// up to cap.
static int64_t expanded_size(const struct sg_expr *x, int64_t cap) {
    int64_t n = 1;
    switch (x->kind) {
    case SG_E_SEQ:
    case SG_E_ALT:
        for (int i = 0; i < x->n && n <= cap; i++) n += expanded_size(x->sub[i], cap - n);
        break;
    case SG_E_REP: n += expanded_size(x->sub[0], cap) * MAX(1, MAX(x->min, x->max)); break;
    case SG_E_CLASS: n += x->n / 4; break;
    case SG_E_BYTES: n += x->len; break;
    case SG_E_EMPTY:
    case SG_E_REF:
    case SG_E_EXCL: break;
    }
    return MIN(n, cap + 1);
}

static struct sg_expr *inline_expr(struct inliner *in, struct sg_expr *x) {
    struct sg_ir *ir = in->ir;
    switch (x->kind) {
    case SG_E_REF: return in->inl[x->rule] ? ir->body[x->rule] : x; // bodies are inlined first
    case SG_E_SEQ:
    case SG_E_ALT: {
        int changed = 0;
        struct sg_expr **sub = xmalloc((size_t)MAX(x->n, 1) * sizeof *sub);
        for (int i = 0; i < x->n; i++) changed |= (sub[i] = inline_expr(in, x->sub[i])) != x->sub[i];
        if (changed) {
            struct sg_expr *y = x->kind == SG_E_SEQ ? sg_seq(ir) : sg_alt(ir);
            for (int i = 0; i < x->n; i++) sg_push(y, sub[i]);
            x = y;
        }
        free(sub);
        return x;
    }
    case SG_E_REP: {
        struct sg_expr *s = inline_expr(in, x->sub[0]);
        return s == x->sub[0] ? x : sg_rep(ir, s, x->min, x->max);
    }
    default: return x;
    }
}

// Tarjan's strongly connected components over the rule graph, iteratively:
// a rule is recursive when its component has two rules or it calls itself.
// order receives the rules callees first.
static void rule_sccs(const struct inliner *in, int nr, int root, uint8_t *rec, struct ivec *order) {
    int *idx = xmalloc((size_t)nr * sizeof *idx), *low = xmalloc((size_t)nr * sizeof *low);
    int *pos = xcalloc((size_t)nr, sizeof *pos);
    uint8_t *on = xcalloc((size_t)nr, 1);
    for (int i = 0; i < nr; i++) idx[i] = -1;
    struct ivec st = {0}, call = {0};
    int next = 0;
    ipush(&call, root);
    idx[root] = low[root] = next++;
    ipush(&st, root);
    on[root] = 1;
    while (call.n) {
        int r = call.v[call.n - 1];
        if (pos[r] < in->out[r].n) {
            int s = in->out[r].v[pos[r]++];
            if (s == r) rec[r] = 1;
            if (idx[s] < 0) {
                idx[s] = low[s] = next++;
                ipush(&st, s);
                on[s] = 1;
                ipush(&call, s);
            } else if (on[s]) {
                low[r] = MIN(low[r], idx[s]);
            }
            continue;
        }
        call.n--;
        if (call.n) low[call.v[call.n - 1]] = MIN(low[call.v[call.n - 1]], low[r]);
        if (low[r] == idx[r]) {
            int k = st.n;
            while (st.v[--k] != r) {}
            for (int j = k; j < st.n; j++) {
                on[st.v[j]] = 0;
                if (st.n - k > 1) rec[st.v[j]] = 1;
                ipush(order, st.v[j]);
            }
            st.n = k;
        }
    }
    free(idx), free(low), free(pos), free(on), free(st.v), free(call.v);
}

static void inline_rules(struct sg_ir *ir, int root, const struct ivec *reach) {
    int nr = ir->n_rules;
    struct inliner in = {ir, xcalloc((size_t)nr, sizeof(int)), xcalloc((size_t)nr, 1),
                         xcalloc((size_t)nr, sizeof(struct ivec))};
    for (int i = 0; i < reach->n; i++) collect_refs(ir->body[reach->v[i]], reach->v[i], &in);
    uint8_t *rec = xcalloc((size_t)nr, 1);
    struct ivec order = {0};
    rule_sccs(&in, nr, root, rec, &order);
    for (int i = 0; i < order.n; i++) { // callees first: their bodies are final
        int r = order.v[i];
        ir->body[r] = inline_expr(&in, ir->body[r]);
        if (r != root && !rec[r] && !(ir->keep && ir->keep[r]) &&
            ((in.refs[r] == 1 && expanded_size(ir->body[r], INLINE_ONCE_SIZE) <= INLINE_ONCE_SIZE) ||
             expr_size(ir->body[r], INLINE_SIZE + 1) <= INLINE_SIZE))
            in.inl[r] = 1;
    }
    for (int r = 0; r < nr; r++) free(in.out[r].v);
    free(in.out), free(in.refs), free(in.inl), free(rec), free(order.v);
}

static int cmp_edges(const void *a, const void *b) {
    const struct sg_edge *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void append_rule(struct sg_grammar *g, int rule, struct rule_fsm *r, int *cap_n, int *cap_e,
                        int *cap_c) {
    int base = g->n_nodes;
    g->rule_start[rule] = base;
    if (g->n_nodes + r->n > *cap_n) {
        *cap_n = MAX(*cap_n * 2, g->n_nodes + r->n);
        g->nodes = xrealloc(g->nodes, (size_t)*cap_n * sizeof *g->nodes);
    }
    for (int i = 0; i < r->n; i++)
        g->nodes[base + i] = (struct sg_node){0, 0, 0, 0, rule, 0, 0, {0, 0}, -1, -1, 0, 0};
    for (int i = 0; i < r->accept.n; i++) g->nodes[base + r->accept.v[i]].flags |= SG_N_ACCEPT;
    g->n_nodes += r->n;
    // edges: sort by (node, lo) then lay out per node
    int ne = r->eb.n / 4;
    if (ne) qsort(r->eb.v, (size_t)ne, 4 * sizeof(int32_t), cmp_i32x4);
    if (g->n_edges + ne > *cap_e) {
        *cap_e = MAX(*cap_e * 2, g->n_edges + ne);
        g->edges = xrealloc(g->edges, (size_t)*cap_e * sizeof *g->edges);
    }
    for (int i = 0; i < ne; i++) {
        int32_t *e = r->eb.v + 4 * i;
        struct sg_node *nd = &g->nodes[base + e[0]];
        if (!nd->n_edges) nd->edge0 = g->n_edges;
        nd->n_edges++;
        g->edges[g->n_edges++] = (struct sg_edge){(uint8_t)e[1], (uint8_t)e[2], base + e[3]};
    }
    int nc = r->cl.n / 3;
    if (g->n_calls + nc > *cap_c) {
        *cap_c = MAX(*cap_c * 2, g->n_calls + nc);
        g->calls = xrealloc(g->calls, (size_t)*cap_c * sizeof *g->calls);
    }
    // calls are already grouped by node in construction order
    for (int i = 0; i < nc; i++) {
        int32_t *c = r->cl.v + 3 * i;
        struct sg_node *nd = &g->nodes[base + c[0]];
        if (!nd->n_calls) nd->call0 = g->n_calls;
        nd->n_calls++;
        g->calls[g->n_calls++] = (struct sg_call){c[1], base + c[2]};
    }
}

// Merges equivalent DFA nodes, so that each distinct grammar position has
// one cache entry (a loop unrolled by the subset construction would be walked
// twice): from every node its own class, each pass merges nodes of the same
// acceptance whose byte ranges and calls go to the same classes. Each pass is
// sound; it stops when a pass merges nothing. Not always minimal (two loops
// equal only as a whole stay apart), but linear per pass, where Moore's
// refinement needs as many passes as the longest counted chain.
static int cmp_i32x3(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    for (int i = 0; i < 2; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

// Node n's signature under the classes cls: its acceptance, then its edges
// with targets as classes (adjacent ranges into one class merged), then its
// calls.
static void signature(const struct rule_fsm *r, const int32_t *eoff, const int32_t *coff, const int32_t *cls,
                      const uint8_t *acc, int n, struct ivec *sig) {
    sig->n = 0;
    ipush(sig, acc[n]);
    int plo = -1, phi = -2, pto = -1;
    for (int k = eoff[n]; k < eoff[n + 1]; k++) {
        const int32_t *e = r->eb.v + 4 * k;
        int to = cls[e[3]];
        if (to == pto && e[1] == phi + 1) {
            phi = e[2];
            continue;
        }
        if (pto >= 0) ipush(sig, plo), ipush(sig, phi), ipush(sig, pto);
        plo = e[1], phi = e[2], pto = to;
    }
    if (pto >= 0) ipush(sig, plo), ipush(sig, phi), ipush(sig, pto);
    ipush(sig, -1);
    for (int k = coff[n]; k < coff[n + 1]; k++) {
        const int32_t *c = r->cl.v + 3 * k;
        ipush(sig, c[1]);
        ipush(sig, cls[c[2]]);
    }
}

static void minimize(struct rule_fsm *r) {
    int n = r->n, ne = r->eb.n / 4, nc = r->cl.n / 3;
    if (ne) qsort(r->eb.v, (size_t)ne, 4 * sizeof(int32_t), cmp_i32x4);
    if (nc) qsort(r->cl.v, (size_t)nc, 3 * sizeof(int32_t), cmp_i32x3);
    int32_t *eoff = xcalloc((size_t)n + 1, sizeof *eoff), *coff = xcalloc((size_t)n + 1, sizeof *coff);
    for (int k = 0; k < ne; k++) eoff[r->eb.v[4 * k] + 1]++;
    for (int k = 0; k < nc; k++) coff[r->cl.v[3 * k] + 1]++;
    for (int i = 0; i < n; i++) eoff[i + 1] += eoff[i], coff[i + 1] += coff[i];
    int32_t *cls = xmalloc((size_t)n * sizeof *cls), *nxt = xmalloc((size_t)n * sizeof *nxt);
    uint8_t *acc = xcalloc((size_t)n, 1);
    for (int i = 0; i < r->accept.n; i++) acc[r->accept.v[i]] = 1;
    struct ivec sig = {0};
    // First pass from the last node back: nodes number their targets mostly
    // later (breadth-first), so one pass merges whole acyclic tails; a target
    // not yet seen counts as itself (a negative id, apart from classes).
    for (int i = 0; i < n; i++) cls[i] = -(i + 1);
    struct dstates d0 = {0};
    for (int i = n - 1; i >= 0; i--) {
        int added;
        signature(r, eoff, coff, cls, acc, i, &sig);
        cls[i] = ds_get(&d0, sig.v, sig.n, &added);
    }
    int ncls = d0.n;
    free(d0.pool.v), free(d0.start), free(d0.len), free(d0.slot);
    for (int pass = 0; pass < 64; pass++) { // then whole passes, for loops
        struct dstates d = {0};
        for (int i = 0; i < n; i++) {
            int added;
            signature(r, eoff, coff, cls, acc, i, &sig);
            nxt[i] = ds_get(&d, sig.v, sig.n, &added);
        }
        int m = d.n;
        free(d.pool.v), free(d.start), free(d.len), free(d.slot);
        memcpy(cls, nxt, (size_t)n * sizeof *cls);
        if (m == ncls) break;
        ncls = m;
    }
    free(acc);
    // classes in first-seen order from node 0, so that the start stays 0
    int32_t *id = xmalloc((size_t)ncls * sizeof *id), *rep = xmalloc((size_t)ncls * sizeof *rep);
    for (int c = 0; c < ncls; c++) id[c] = -1;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (id[cls[i]] < 0) rep[k] = i, id[cls[i]] = k++;
    struct rule_fsm o = {0};
    o.n = k;
    for (int c = 0; c < k; c++) {
        int i = rep[c];
        int plo = -1, phi = -2, pto = -1;
        for (int q = eoff[i]; q <= eoff[i + 1]; q++) {
            int32_t *e = q < eoff[i + 1] ? r->eb.v + 4 * q : NULL;
            int to = e ? id[cls[e[3]]] : -1;
            if (e && to == pto && e[1] == phi + 1) {
                phi = e[2];
                continue;
            }
            if (pto >= 0) {
                int32_t e4[4] = {c, plo, phi, pto};
                for (int t = 0; t < 4; t++) ipush(&o.eb, e4[t]);
            }
            if (e) plo = e[1], phi = e[2], pto = to;
        }
        for (int q = coff[i]; q < coff[i + 1]; q++) {
            ipush(&o.cl, c);
            ipush(&o.cl, r->cl.v[3 * q + 1]);
            ipush(&o.cl, id[cls[r->cl.v[3 * q + 2]]]);
        }
    }
    for (int i = 0; i < r->accept.n; i++) {
        int c = id[cls[r->accept.v[i]]];
        if (rep[c] == r->accept.v[i]) ipush(&o.accept, c);
    }
    free(r->eb.v), free(r->cl.v), free(r->accept.v);
    *r = o;
    free(eoff), free(coff), free(cls), free(nxt), free(id), free(rep), free(sig.v);
}

static int compile_rule(const struct sg_ir *ir, int rule, struct rule_fsm *out) {
    struct nfa f = {0};
    int s = nstate(&f);
    f.accept = build(&f, ir->body[rule], s);
    int rc = VLLM_OK;
    if (f.too_big) {
        rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT,
                      "grammar: rule '%s' is too big (over %d automaton states: repetition counts too large?)",
                      ir->names[rule], NFA_MAX_STATES);
    } else {
        nfa_index(&f);
        if (determinize(&f, s, out)) {
            minimize(out);
        } else {
            free(out->eb.v), free(out->cl.v), free(out->accept.v);
            memset(out, 0, sizeof *out);
            if (!eps_free(&f, s, out))
                rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT,
                              "grammar: rule '%s' is too complex (over %d automaton edges: nested optional repetition?)",
                              ir->names[rule], EPS_MAX_EDGES);
        }
    }
    free(f.e);
    free(f.off);
    return rc;
}

// Grammar-wide analyses on the assembled nodes.
static void set_nullable(struct sg_grammar *g) {
    for (int changed = 1; changed;) {
        changed = 0;
        for (int n = g->n_nodes - 1; n >= 0; n--) { // successors mostly follow: one sweep for a chain
            struct sg_node *nd = &g->nodes[n];
            if (nd->flags & SG_N_EPS_ACCEPT) continue;
            int e = (nd->flags & SG_N_ACCEPT) != 0;
            for (int k = 0; k < nd->n_calls && !e; k++) {
                const struct sg_call *c = &g->calls[nd->call0 + k];
                e = (g->nodes[g->rule_start[c->rule]].flags & SG_N_EPS_ACCEPT) &&
                    (g->nodes[c->to].flags & SG_N_EPS_ACCEPT);
            }
            if (e) {
                nd->flags |= SG_N_EPS_ACCEPT;
                changed = 1;
            }
        }
    }
}

// Drops edges and calls into nodes that can never end their rule.
static int prune(struct sg_grammar *g) {
    uint8_t *prod = xcalloc((size_t)g->n_nodes, 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int n = g->n_nodes - 1; n >= 0; n--) { // as set_nullable: a chain in one sweep, not one a node
            if (prod[n]) continue;
            const struct sg_node *nd = &g->nodes[n];
            int p = (nd->flags & SG_N_ACCEPT) != 0;
            for (int k = 0; k < nd->n_edges && !p; k++) p = prod[g->edges[nd->edge0 + k].to];
            for (int k = 0; k < nd->n_calls && !p; k++) {
                const struct sg_call *c = &g->calls[nd->call0 + k];
                p = prod[g->rule_start[c->rule]] && prod[c->to];
            }
            if (p) prod[n] = changed = 1;
        }
    }
    int ok = prod[g->rule_start[g->root]];
    int ne = 0, nc = 0;
    for (int n = 0; n < g->n_nodes; n++) {
        struct sg_node *nd = &g->nodes[n];
        int e0 = ne, c0 = nc;
        for (int k = 0; k < nd->n_edges; k++) {
            struct sg_edge e = g->edges[nd->edge0 + k];
            if (prod[n] && prod[e.to]) g->edges[ne++] = e;
        }
        for (int k = 0; k < nd->n_calls; k++) {
            struct sg_call c = g->calls[nd->call0 + k];
            if (prod[n] && prod[c.to] && prod[g->rule_start[c.rule]]) g->calls[nc++] = c;
        }
        nd->edge0 = e0, nd->n_edges = ne - e0;
        nd->call0 = c0, nd->n_calls = nc - c0;
        if ((nd->flags & SG_N_ACCEPT) && !nd->n_edges && !nd->n_calls) nd->flags |= SG_N_FINAL;
    }
    g->n_edges = ne;
    g->n_calls = nc;
    free(prod);
    return ok;
}

// Left recursion: rule R calls S before consuming a byte (through nullable
// calls), and S leads back to R the same way.
static int left_recursion(const struct sg_grammar *g, int *bad_rule) {
    int nr = g->n_rules;
    struct ivec *lc = xcalloc((size_t)nr, sizeof *lc);
    uint8_t *seen = xcalloc((size_t)g->n_nodes, 1);
    struct ivec stack = {0};
    for (int r = 0; r < nr; r++) {
        if (g->rule_start[r] < 0) continue;
        stack.n = 0;
        ipush(&stack, g->rule_start[r]);
        struct ivec visited = {0};
        seen[g->rule_start[r]] = 1;
        ipush(&visited, g->rule_start[r]);
        while (stack.n) {
            int n = stack.v[--stack.n];
            const struct sg_node *nd = &g->nodes[n];
            for (int k = 0; k < nd->n_calls; k++) {
                const struct sg_call *c = &g->calls[nd->call0 + k];
                ipush(&lc[r], c->rule);
                if ((g->nodes[g->rule_start[c->rule]].flags & SG_N_EPS_ACCEPT) && !seen[c->to]) {
                    seen[c->to] = 1;
                    ipush(&visited, c->to);
                    ipush(&stack, c->to);
                }
            }
        }
        for (int i = 0; i < visited.n; i++) seen[visited.v[i]] = 0;
        free(visited.v);
    }
    // cycle search: colors 0 white, 1 on the path, 2 done
    uint8_t *color = xcalloc((size_t)nr, 1);
    int found = 0;
    struct ivec path = {0}, idx = {0};
    for (int r0 = 0; r0 < nr && !found; r0++) {
        if (color[r0]) continue;
        path.n = idx.n = 0;
        ipush(&path, r0);
        ipush(&idx, 0);
        color[r0] = 1;
        while (path.n && !found) {
            int r = path.v[path.n - 1];
            if (idx.v[idx.n - 1] < lc[r].n) {
                int s = lc[r].v[idx.v[idx.n - 1]++];
                if (color[s] == 1) {
                    found = 1;
                    *bad_rule = s;
                } else if (!color[s]) {
                    color[s] = 1;
                    ipush(&path, s);
                    ipush(&idx, 0);
                }
            } else {
                color[r] = 2;
                path.n--;
                idx.n--;
            }
        }
    }
    for (int r = 0; r < nr; r++) free(lc[r].v);
    free(lc);
    free(seen);
    free(stack.v);
    free(color);
    free(path.v);
    free(idx.v);
    return found;
}

static void set_mincomp(struct sg_grammar *g) {
    for (int n = 0; n < g->n_nodes; n++)
        g->nodes[n].mincomp = (g->nodes[n].flags & SG_N_ACCEPT) ? 0 : UINT32_MAX;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int n = g->n_nodes - 1; n >= 0; n--) {
            struct sg_node *nd = &g->nodes[n];
            uint64_t best = nd->mincomp;
            for (int k = 0; k < nd->n_edges; k++) best = MIN(best, 1ull + g->nodes[g->edges[nd->edge0 + k].to].mincomp);
            for (int k = 0; k < nd->n_calls; k++) {
                const struct sg_call *c = &g->calls[nd->call0 + k];
                best = MIN(best, (uint64_t)g->nodes[g->rule_start[c->rule]].mincomp + g->nodes[c->to].mincomp);
            }
            if (best < nd->mincomp) {
                nd->mincomp = (uint32_t)best;
                changed = 1;
            }
        }
    }
}

// Uniform character positions (SG_N_UNIFORM): node n, without calls, sends
// a set of ASCII bytes (uset) to one node (utarget), and with SG_N_UNICODE
// every non-ASCII code point there too, through call-free nodes inside the
// character (those get ubase = n and the UTF-8 decoder state there). Then
// every valid UTF-8 string of at most ubudget characters (a cut last one
// counts) over those characters stays alive from n (UINT32_MAX: no bound,
// utarget == n, as inside a JSON string); with SG_N_UEXACT any longer one
// dies. A trie walk decides such subtrees without walking them (sg_mask.c).
struct uni_ctx {
    struct sg_grammar *g;
    int32_t n, target; // target: where characters lead (-1: not known yet)
    int ok, mark;      // mark: record the nodes inside characters
};

static int utf8_state(int q, uint8_t b) { // as sg_vocab.c's decoder, for the lower bytes of ranges
    if (q == 0) return b < 0x80 ? 0 : b <= 0xDF ? 1 : b == 0xE0 ? 3 : b == 0xED ? 4 : b <= 0xEF ? 2 : b == 0xF0 ? 6 : b <= 0xF3 ? 5 : 7;
    return q == 1 ? 0 : q <= 4 ? 1 : 2;
}

static void uni_seq(void *ctx, const uint8_t *lo, const uint8_t *hi, int len) {
    struct uni_ctx *c = ctx;
    int32_t cur = c->n;
    int q = 0;
    for (int i = 0; i < len && c->ok; i++) {
        struct sg_node *nd = &c->g->nodes[cur];
        if (c->mark && i) {
            if (nd->ubase == -1 && !(nd->flags & SG_N_UNIFORM)) nd->ubase = c->n, nd->ustate = (uint8_t)q;
            else if (nd->ubase != c->n || nd->ustate != q) nd->ubase = -2; // ambiguous: no shortcut
        }
        if (nd->n_calls) c->ok = 0;
        int b = lo[i], to = -1;
        for (int k = 0; k < nd->n_edges && c->ok && b <= hi[i]; k++) {
            const struct sg_edge *e = &c->g->edges[nd->edge0 + k];
            if (e->hi < b) continue;
            if (e->lo > b || (to >= 0 && e->to != to)) c->ok = 0;
            to = e->to;
            b = e->hi + 1;
        }
        if (b <= hi[i]) c->ok = 0;
        q = utf8_state(q, lo[i]);
        cur = to;
    }
    if (c->ok && c->target < 0) c->target = cur;
    if (cur != c->target) c->ok = 0;
}

static void unicode_walk(struct uni_ctx *c) {
    utf8_seqs(0x80, 0xD7FF, uni_seq, c);
    utf8_seqs(0xE000, 0x10FFFF, uni_seq, c);
}

// Whether node t has no edge on a byte of n's characters.
static int takes_none(const struct sg_grammar *g, const struct sg_node *t, const struct sg_node *n) {
    if (t->n_calls) return 0;
    for (int k = 0; k < t->n_edges; k++) {
        const struct sg_edge *e = &g->edges[t->edge0 + k];
        if (e->hi >= 0x80 && (n->flags & SG_N_UNICODE)) return 0;
        for (int b = e->lo; b <= e->hi && b < 128; b++)
            if ((n->uset[b >> 6] >> (b & 63)) & 1) return 0;
    }
    return 1;
}

static void set_uniform(struct sg_grammar *g) {
    for (int n = 0; n < g->n_nodes; n++) {
        struct sg_node *nd = &g->nodes[n];
        // over 256 edges: an NFA node (overlapping ranges); the count below is quadratic
        if (nd->n_calls || !nd->n_edges || nd->n_edges > 256) continue;
        int32_t best = -1;
        int best_n = 0;
        for (int k = 0; k < nd->n_edges; k++) { // the target most ASCII bytes go to
            const struct sg_edge *e = &g->edges[nd->edge0 + k];
            int cnt = 0;
            for (int q = 0; q < nd->n_edges; q++) {
                const struct sg_edge *f = &g->edges[nd->edge0 + q];
                if (f->to == e->to && f->lo < 128) cnt += MIN(f->hi, 127) - f->lo + 1;
            }
            if (cnt > best_n) best_n = cnt, best = e->to;
        }
        struct uni_ctx c = {g, n, best, 1, 0};
        if (g->edges[nd->edge0 + nd->n_edges - 1].hi >= 0x80) unicode_walk(&c);
        else c.ok = 0;
        if (c.ok) nd->flags |= SG_N_UNICODE;
        nd->utarget = c.ok ? c.target : best;
        if (nd->utarget < 0) continue;
        for (int k = 0; k < nd->n_edges; k++) {
            const struct sg_edge *e = &g->edges[nd->edge0 + k];
            if (e->to != nd->utarget) continue;
            for (int b = e->lo; b <= e->hi && b < 128; b++) nd->uset[b >> 6] |= 1ull << (b & 63);
        }
        nd->flags |= SG_N_UNIFORM;
    }
    for (int n = 0; n < g->n_nodes; n++) {
        struct sg_node *nd = &g->nodes[n];
        if (!(nd->flags & SG_N_UNICODE)) continue;
        struct uni_ctx c = {g, n, nd->utarget, 1, 1};
        unicode_walk(&c);
    }
    for (int n = 0; n < g->n_nodes; n++) {
        struct sg_node *nd = &g->nodes[n];
        if (nd->flags & SG_N_UNIFORM) nd->ubase = n, nd->ustate = 0;
        else if (nd->ubase == -2) nd->ubase = -1;
        nd->ubudget = nd->utarget == n ? UINT32_MAX : 1;
    }
    // budgets along chains (a counted repetition): each pass in reverse order
    // settles chains numbered forward; the values only grow, and any value
    // reached is a valid bound. Exact: a longer string of the characters dies
    // (the chain ends at a node that takes none of them).
    for (int pass = 0, ch = 1; ch && pass < 64; pass++) {
        ch = 0;
        for (int n = g->n_nodes - 1; n >= 0; n--) {
            struct sg_node *nd = &g->nodes[n];
            if (!(nd->flags & SG_N_UNIFORM) || nd->ubudget == UINT32_MAX) continue;
            const struct sg_node *t = &g->nodes[nd->utarget];
            int compat = (t->flags & SG_N_UNIFORM) && !(nd->uset[0] & ~t->uset[0]) && !(nd->uset[1] & ~t->uset[1]) &&
                         (!(nd->flags & SG_N_UNICODE) || (t->flags & SG_N_UNICODE));
            uint32_t b = !compat ? 1 : t->ubudget >= (1u << 30) ? UINT32_MAX : t->ubudget + 1;
            int exact = compat ? (t->flags & SG_N_UEXACT) != 0 : takes_none(g, t, nd);
            if (b > nd->ubudget || exact != !!(nd->flags & SG_N_UEXACT)) {
                nd->ubudget = MAX(nd->ubudget, b);
                nd->flags = exact ? nd->flags | SG_N_UEXACT : nd->flags & ~(uint32_t)SG_N_UEXACT;
                ch = 1;
            }
        }
    }
}

// first(n): bytes that can be consumed first from n without ending its rule;
// follow(R): bytes that can come right after R ends, in any context.
static int or4(uint64_t *d, const uint64_t *s) {
    int ch = 0;
    for (int i = 0; i < 4; i++) {
        uint64_t x = d[i] | s[i];
        ch |= x != d[i];
        d[i] = x;
    }
    return ch;
}

static void set_follow(struct sg_grammar *g) {
    uint64_t(*first)[4] = xcalloc((size_t)MAX(g->n_nodes, 1), sizeof *first);
    for (int n = 0; n < g->n_nodes; n++) {
        const struct sg_node *nd = &g->nodes[n];
        for (int k = 0; k < nd->n_edges; k++)
            for (int b = g->edges[nd->edge0 + k].lo; b <= g->edges[nd->edge0 + k].hi; b++)
                first[n][b >> 6] |= 1ull << (b & 63);
    }
    for (int ch = 1; ch;) {
        ch = 0;
        for (int n = 0; n < g->n_nodes; n++) {
            const struct sg_node *nd = &g->nodes[n];
            for (int k = 0; k < nd->n_calls; k++) {
                const struct sg_call *c = &g->calls[nd->call0 + k];
                int s = g->rule_start[c->rule];
                ch |= or4(first[n], first[s]);
                if (g->nodes[s].flags & SG_N_EPS_ACCEPT) ch |= or4(first[n], first[c->to]);
            }
        }
    }
    g->follow = xcalloc((size_t)g->n_rules, sizeof *g->follow);
    for (int ch = 1; ch;) {
        ch = 0;
        for (int n = 0; n < g->n_nodes; n++) {
            const struct sg_node *nd = &g->nodes[n];
            for (int k = 0; k < nd->n_calls; k++) {
                const struct sg_call *c = &g->calls[nd->call0 + k];
                ch |= or4(g->follow[c->rule], first[c->to]);
                if (g->nodes[c->to].flags & SG_N_EPS_ACCEPT) ch |= or4(g->follow[c->rule], g->follow[nd->rule]);
            }
        }
    }
    free(first);
}

int sg_grammar_build(struct sg_ir *ir, int root, struct sg_grammar **out) {
    *out = NULL;
    if (root < 0 || root >= ir->n_rules || !ir->body[root])
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar: no start rule");
    uint8_t *used = xcalloc((size_t)ir->n_rules, 1);
    struct ivec todo = {0};
    used[root] = 1;
    ipush(&todo, root);
    int rc = VLLM_OK;
    for (int i = 0; i < todo.n && !rc; i++) rc = refs_check(ir, ir->body[todo.v[i]], used, &todo);
    if (!rc) { // inline, then find the rules still referenced
        inline_rules(ir, root, &todo);
        memset(used, 0, (size_t)ir->n_rules);
        todo.n = 0;
        used[root] = 1;
        ipush(&todo, root);
        for (int i = 0; i < todo.n && !rc; i++) rc = refs_check(ir, ir->body[todo.v[i]], used, &todo);
    }
    struct sg_grammar *g = xcalloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    g->n_rules = ir->n_rules;
    g->root = root;
    g->rule_start = xmalloc((size_t)ir->n_rules * sizeof *g->rule_start);
    g->rule_names = xcalloc((size_t)ir->n_rules, sizeof *g->rule_names);
    for (int r = 0; r < ir->n_rules; r++) {
        g->rule_start[r] = -1;
        g->rule_names[r] = xstrdup(ir->names[r]);
    }
    int cap_n = 0, cap_e = 0, cap_c = 0;
    for (int i = 0; i < todo.n && !rc; i++) {
        struct rule_fsm r = {0};
        rc = compile_rule(ir, todo.v[i], &r);
        if (!rc) append_rule(g, todo.v[i], &r, &cap_n, &cap_e, &cap_c);
        free(r.eb.v), free(r.cl.v), free(r.accept.v);
    }
    free(used);
    free(todo.v);
    if (!rc) {
        set_nullable(g);
        int bad = -1;
        if (!prune(g)) rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar: rule '%s' matches no string", ir->names[root]);
        else if (left_recursion(g, &bad))
            rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar: rule '%s' is left-recursive", ir->names[bad]);
    }
    if (rc) {
        sg_grammar_free(g);
        return rc;
    }
    for (int n = 0; n < g->n_nodes; n++) {
        struct sg_node *nd = &g->nodes[n];
        if (nd->n_edges > 1) qsort(g->edges + nd->edge0, (size_t)nd->n_edges, sizeof *g->edges, cmp_edges);
    }
    set_mincomp(g);
    set_uniform(g);
    set_follow(g);
    *out = g;
    return VLLM_OK;
}
