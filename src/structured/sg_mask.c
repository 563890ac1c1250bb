// sg_mask.c - the per-node token cache behind every mask (the XGrammar idea:
// most tokens are decided by the node alone, whatever the stack below).
//
// For a node n of rule r, with the stack below r unknown, a token is
//   accepted  when a path from n consumes all its bytes without ending r;
//   a candidate (token, k) when a path ends r after k of its bytes (k > 0;
//             ending r before any byte is left to the matcher, which adds
//             the frame below to its state);
//   rejected  otherwise.
// At run time a frame (n, parent) allows cache(n).accepted plus those
// candidates whose remaining bytes the parent stack accepts.
//
// An entry is computed once per (grammar, vocabulary, node), on first use,
// and published with an atomic compare-and-swap: matchers of one grammar on
// many threads share it. It is built by composition: a callee frame that n
// reaches without consuming a byte contributes its own entry (its accepted
// tokens as is, its candidates' remainders walked from the return node); only
// n's own byte edges walk the vocabulary trie. Candidates are kept sorted by
// their remaining bytes, so a walk over them shares common prefixes and
// skips a dead prefix's followers in O(1) each.
#include "core/common.h"
#include "structured/sg_internal.h"

struct sg_entry {
    int n_acc;
    int32_t *acc;   // sorted ids, when sparse
    uint32_t *bits; // CDIV(V, 32) words, when dense
    int n_cand;
    int32_t *cand_tok;
    uint16_t *cand_off, *cand_lcp; // lcp of the remainder with the previous one
    int walked;                    // the trie was walked (stats)
};

struct sg_cache {
    const struct sg_vocab *v;
    _Atomic(struct sg_entry *) *entry; // [n_nodes]
    struct sg_cache *next;
};

static void entry_free(struct sg_entry *e) {
    if (!e) return;
    free(e->acc);
    free(e->bits);
    free(e->cand_tok);
    free(e->cand_off);
    free(e->cand_lcp);
    free(e);
}

void sg_caches_free(struct sg_grammar *g) {
    struct sg_cache *c = atomic_load(&g->caches);
    while (c) {
        struct sg_cache *n = c->next;
        for (int i = 0; i < g->n_nodes; i++) entry_free(atomic_load(&c->entry[i]));
        free(c->entry);
        free(c);
        c = n;
    }
    atomic_store(&g->caches, NULL);
}

struct sg_cache *sg_cache_get(const struct sg_grammar *gc, const struct sg_vocab *v) {
    struct sg_grammar *g = (struct sg_grammar *)gc; // the cache list is the mutable part
    for (;;) {
        struct sg_cache *head = atomic_load(&g->caches);
        for (struct sg_cache *c = head; c; c = c->next)
            if (c->v == v) return c;
        struct sg_cache *c = xcalloc(1, sizeof *c);
        c->v = v;
        c->entry = xcalloc((size_t)MAX(g->n_nodes, 1), sizeof *c->entry);
        c->next = head;
        if (atomic_compare_exchange_strong(&g->caches, &head, c)) return c;
        free(c->entry);
        free(c);
    }
}

// ------------------------------------------------------- remainder walks --

// A list of byte strings (token remainders) sorted, with lcp[i] the common
// prefix of string i and i-1, walked from one start state. Per string it
// reports whether all bytes were consumed, and the depths (< len) at which a
// frame over the base could end (base pops).
struct walker {
    const struct sg_grammar *g;
    struct sg_frames *f;
    struct sg_set *st;  // [max_len + 1] closed states by depth
    uint8_t *pop;       // [max_len + 1]
    struct sg_set raw;
    int cap;
};

static void walker_init(struct walker *w, const struct sg_grammar *g, struct sg_frames *f, int max_len) {
    memset(w, 0, sizeof *w);
    w->g = g;
    w->f = f;
    w->cap = max_len + 1;
    w->st = xcalloc((size_t)w->cap, sizeof *w->st);
    w->pop = xcalloc((size_t)w->cap, 1);
}

static void walker_free(struct walker *w) {
    for (int i = 0; i < w->cap; i++) sg_set_free(&w->st[i]);
    free(w->st);
    free(w->pop);
    sg_set_free(&w->raw);
}

// Steps from depth d by byte b: state d+1; returns 0 when no frame is left.
static int walk_step(struct walker *w, int d, uint8_t b) {
    sg_step(w->g, w->f, &w->st[d], b, &w->raw);
    if (!w->raw.n) {
        w->st[d + 1].n = 0;
        return 0;
    }
    int base = 0;
    sg_close(w->g, w->f, &w->raw, &w->st[d + 1], &base, -1);
    w->pop[d + 1] = (uint8_t)base;
    return 1;
}

struct rem {
    const uint8_t *p;
    int len;
    int32_t tok;
    uint16_t off, lcp;
};

// Calls out(ctx, i, accepted, pops, n_pops) for every remainder i.
typedef void (*rem_fn)(void *ctx, int i, int accepted, const int *pops, int n_pops);

static void walk_rems(struct walker *w, const struct rem *r, int n, int want_pops, rem_fn out, void *ctx) {
    int reach = 0;      // st[0..reach] hold the current path's states
    int dead = INT32_MAX; // depth where the current path lost its last frame
    int pops[64];
    for (int i = 0; i < n; i++) {
        int len = r[i].len, l = i ? MIN((int)r[i].lcp, reach) : 0;
        if (dead <= l) { // shares the dead prefix
            reach = MIN(reach, l);
        } else {
            dead = INT32_MAX;
            reach = l;
            for (int d = l; d < len; d++) {
                if (!walk_step(w, d, r[i].p[d])) {
                    dead = d + 1;
                    break;
                }
                reach = d + 1;
            }
        }
        int accepted = dead == INT32_MAX && reach == len;
        int np = 0;
        if (want_pops) {
            int top = MIN(reach, len - 1);
            for (int d = 0; d <= top && np < 64; d++)
                if (w->pop[d]) pops[np++] = d;
        }
        out(ctx, i, accepted, pops, np);
        if (accepted) reach = len;
    }
}

// ----------------------------------------------------------------- build --

struct builder {
    const struct sg_grammar *g;
    const struct sg_vocab *v;
    struct sg_cache *cache;
    const uint64_t *follow; // bytes that may follow the end of the node's rule
    uint32_t *acc; // bitmask being built
    struct rem *cand;
    int n_cand, cap_cand;
    int walked;
};

static void add_cand(struct builder *b, int32_t tok, int off) {
    uint8_t c = (uint8_t)b->v->bytes[tok][off];
    if (!((b->follow[c >> 6] >> (c & 63)) & 1)) return; // no context continues with c
    if (b->n_cand == b->cap_cand) {
        b->cap_cand = b->cap_cand ? b->cap_cand * 2 : 256;
        b->cand = xrealloc(b->cand, (size_t)b->cap_cand * sizeof *b->cand);
    }
    const struct sg_vocab *v = b->v;
    b->cand[b->n_cand++] = (struct rem){(const uint8_t *)v->bytes[tok] + off, v->len[tok] - off, tok,
                                        (uint16_t)off, 0};
}

static inline void set_acc(uint32_t *bits, int32_t tok) { bits[tok >> 5] |= 1u << (tok & 31); }
static inline int has_acc(const uint32_t *bits, int32_t tok) { return (bits[tok >> 5] >> (tok & 31)) & 1; }

// Composition: a callee frame's remainders continue at its return frame.
struct compose_ctx {
    struct builder *b;
    const struct sg_entry *e;
    const struct rem *r;
};

static void compose_out(void *ctx, int i, int accepted, const int *pops, int n_pops) {
    struct compose_ctx *c = ctx;
    const struct rem *r = &c->r[i];
    if (accepted) set_acc(c->b->acc, r->tok);
    for (int k = 0; k < n_pops; k++) add_cand(c->b, r->tok, r->off + pops[k]);
}

static struct rem *entry_rems(const struct sg_vocab *v, const struct sg_entry *e) {
    struct rem *r = xmalloc((size_t)MAX(e->n_cand, 1) * sizeof *r);
    for (int i = 0; i < e->n_cand; i++) {
        int32_t t = e->cand_tok[i];
        int off = e->cand_off[i];
        r[i] = (struct rem){(const uint8_t *)v->bytes[t] + off, v->len[t] - off, t, (uint16_t)off, e->cand_lcp[i]};
    }
    return r;
}

static void compose(struct builder *b, struct sg_frames *f, struct walker *w, int32_t fr) {
    const struct sg_entry *e = sg_entry_get(b->cache, b->g, f->node[fr]);
    int32_t q = f->parent[fr];
    int words = CDIV(b->v->vocab_size, 32);
    if (e->bits)
        for (int i = 0; i < words; i++) b->acc[i] |= e->bits[i];
    else
        for (int i = 0; i < e->n_acc; i++) set_acc(b->acc, e->acc[i]);
    if (!e->n_cand) return;
    if (q == 0) { // a tail call: ending the callee ends this rule
        for (int i = 0; i < e->n_cand; i++) add_cand(b, e->cand_tok[i], e->cand_off[i]);
        return;
    }
    struct sg_set in = {0};
    sg_set_add(&in, q);
    int base = 0;
    sg_close(b->g, f, &in, &w->st[0], &base, -1);
    w->pop[0] = (uint8_t)base;
    sg_set_free(&in);
    struct rem *r = entry_rems(b->v, e);
    struct compose_ctx cc = {b, e, r};
    walk_rems(w, r, e->n_cand, 1, compose_out, &cc);
    free(r);
}

// Adds every token of trie subtree i (tokens ending at i too when with_end)
// as candidates for the pops on the path; path[d] is the byte at depth d.
// The byte after a pop at depth d is path[d + 1], the same for the whole
// subtree: a byte no context accepts after the rule rules it out at once.
static void subtree_cands(struct builder *b, int i, int with_end, const uint8_t *pop, const uint8_t *path,
                          int depth) {
    const struct sg_vocab *v = b->v;
    for (int d = 1; d <= depth; d++) {
        if (!pop[d]) continue;
        if (d < depth || with_end) { // the next byte is on the path
            uint8_t c = path[d + 1];
            if (!((b->follow[c >> 6] >> (c & 63)) & 1)) continue;
            int lo = v->lo[i] + (with_end ? 0 : v->n_end[i]), hi = v->lo[v->end[i]];
            for (int k = lo; k < hi; k++)
                if (v->len[v->tok[k]] > d) add_cand(b, v->tok[k], d);
        } else { // the pop is at i itself: the next byte is each child's
            for (int c = i + 1; c < v->end[i]; c = v->end[c]) {
                uint8_t x = v->byte[c];
                if (!((b->follow[x >> 6] >> (x & 63)) & 1)) continue;
                for (int k = v->lo[c]; k < v->lo[v->end[c]]; k++) add_cand(b, v->tok[k], d);
            }
        }
    }
}

static int any_edges(const struct sg_grammar *g, const struct sg_frames *f, const struct sg_set *s) {
    for (int i = 0; i < s->n; i++)
        if (g->nodes[f->node[s->v[i]]].n_edges) return 1;
    return 0;
}

// One step of the trie walk, with a shortcut for the common case: one frame
// whose node loops back to itself on b (inside a string the state repeats).
static int trie_step(struct walker *w, int d, uint8_t b) {
    const struct sg_set *s = &w->st[d];
    if (s->n == 1) {
        int32_t n = w->f->node[s->v[0]];
        const struct sg_node *nd = &w->g->nodes[n];
        if (nd->utarget == n && !nd->n_calls && b < 128 && ((nd->uset[b >> 6] >> (b & 63)) & 1)) {
            w->st[d + 1].n = 0;
            sg_set_add(&w->st[d + 1], s->v[0]);
            w->pop[d + 1] = w->pop[d];
            return 1;
        }
    }
    return walk_step(w, d, b);
}

// Whether the strings below trie node i are all made of the characters of
// the uniform node the one frame at depth d is at (or inside a character
// of): ASCII bytes of its set, and valid UTF-8 when it takes all of
// non-ASCII (else none). Then *budget is how many characters below i stay
// alive (more die when *exact).
static int uniform_below(const struct walker *w, const struct sg_vocab *v, int i, int d, uint32_t *budget,
                         int *exact) {
    const struct sg_set *s = &w->st[d];
    if (s->n != 1) return 0;
    const struct sg_grammar *g = w->g;
    const struct sg_node *nd = &g->nodes[w->f->node[s->v[0]]];
    if (nd->n_calls || nd->ubase < 0) return 0;
    int q = nd->ustate;
    nd = &g->nodes[nd->ubase];
    if (v->desc_high[i] && !((nd->flags & SG_N_UNICODE) && ((v->clean[i] >> q) & 1))) return 0;
    if ((v->desc[i][0] & ~nd->uset[0]) || (v->desc[i][1] & ~nd->uset[1])) return 0;
    // inside a character the budget's first one is under way
    *budget = nd->ubudget == UINT32_MAX ? UINT32_MAX : nd->ubudget - (q != 0);
    *exact = (nd->flags & SG_N_UEXACT) != 0;
    return 1;
}

// The trie walk from the frames of n's own rule (closed, at depth 0).
static void trie_walk(struct builder *b, struct walker *w) {
    const struct sg_vocab *v = b->v;
    uint16_t *npop = xcalloc((size_t)v->max_len + 2, sizeof *npop); // pops on the path up to depth d
    uint8_t *path = xcalloc((size_t)v->max_len + 2, 1);
    w->pop[0] = 0;
    b->walked = 1;
    for (int i = 1; i < v->n_nodes;) {
        int d = v->depth[i];
        path[d] = v->byte[i];
        if (!trie_step(w, d - 1, v->byte[i])) {
            if (npop[d - 1]) subtree_cands(b, i, 1, w->pop, path, d - 1);
            i = v->end[i];
            continue;
        }
        npop[d] = (uint16_t)(npop[d - 1] + w->pop[d]);
        uint32_t budget;
        int exact;
        if (uniform_below(w, v, i, d, &budget, &exact) && (v->maxc[i] <= budget || exact)) {
            // decided without walking: all of it, or by each token's length
            int lo = v->lo[i], hi = v->lo[v->end[i]];
            if (v->maxc[i] <= budget) {
                for (int k = lo; k < hi; k++) set_acc(b->acc, v->tok[k]);
            } else {
                uint32_t limit = budget + v->pchars[i];
                for (int k = lo; k < hi; k++)
                    if (v->chars[v->tok[k]] <= limit) set_acc(b->acc, v->tok[k]);
            }
            i = v->end[i];
            continue;
        }
        for (int k = 0; k < v->n_end[i]; k++) set_acc(b->acc, v->tok[v->lo[i] + k]);
        if (!any_edges(b->g, w->f, &w->st[d])) { // nothing continues below i
            if (npop[d] && v->end[i] > i + 1) subtree_cands(b, i, 0, w->pop, path, d);
            i = v->end[i];
            continue;
        }
        i++;
    }
    free(npop);
    free(path);
}

// Without -mpopcnt (the x86-64 baseline) __builtin_popcount is a libgcc call.
static inline int popcount32(uint32_t x) {
    x = x - ((x >> 1) & 0x55555555u);
    x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
    return (int)((((x + (x >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24);
}

static int cmp_rem(const void *a, const void *b) {
    const struct rem *x = a, *y = b;
    int n = MIN(x->len, y->len), c = memcmp(x->p, y->p, (size_t)n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    if (x->tok != y->tok) return x->tok < y->tok ? -1 : 1;
    return 0;
}

static struct sg_entry *finish(struct builder *b) {
    const struct sg_vocab *v = b->v;
    struct sg_entry *e = xcalloc(1, sizeof *e);
    int V = v->vocab_size, words = CDIV(V, 32);
    // candidates: drop the accepted ones and duplicates, sort by remainder
    int n = 0;
    for (int i = 0; i < b->n_cand; i++)
        if (!has_acc(b->acc, b->cand[i].tok)) b->cand[n++] = b->cand[i];
    if (n) qsort(b->cand, (size_t)n, sizeof *b->cand, cmp_rem);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!m || b->cand[m - 1].tok != b->cand[i].tok || b->cand[m - 1].off != b->cand[i].off) b->cand[m++] = b->cand[i];
    e->n_cand = m;
    if (m) {
        e->cand_tok = xmalloc((size_t)m * sizeof *e->cand_tok);
        e->cand_off = xmalloc((size_t)m * sizeof *e->cand_off);
        e->cand_lcp = xmalloc((size_t)m * sizeof *e->cand_lcp);
        for (int i = 0; i < m; i++) {
            const struct rem *r = &b->cand[i];
            int l = 0;
            if (i) {
                const struct rem *q = &b->cand[i - 1];
                int k = MIN(q->len, r->len);
                while (l < k && q->p[l] == r->p[l]) l++;
            }
            e->cand_tok[i] = r->tok;
            e->cand_off[i] = r->off;
            e->cand_lcp[i] = (uint16_t)l;
        }
    }
    int cnt = 0;
    for (int i = 0; i < words; i++) cnt += popcount32(b->acc[i]);
    e->n_acc = cnt;
    if (cnt <= words) { // sparse: a list no longer than the bitmask
        e->acc = xmalloc((size_t)MAX(cnt, 1) * sizeof *e->acc);
        int k = 0;
        for (int i = 0; i < words; i++)
            for (uint32_t x = b->acc[i]; x; x &= x - 1) e->acc[k++] = i * 32 + __builtin_ctz(x);
        free(b->acc);
    } else {
        e->bits = b->acc;
    }
    b->acc = NULL;
    e->walked = b->walked;
    free(b->cand);
    return e;
}

static struct sg_entry *build_entry(struct sg_cache *c, const struct sg_grammar *g, int32_t node) {
    const struct sg_vocab *v = c->v;
    struct builder b = {g, v, c, g->follow[g->nodes[node].rule],
                        xcalloc((size_t)CDIV(v->vocab_size, 32), sizeof(uint32_t)), NULL, 0, 0, 0};
    struct sg_frames f;
    sg_frames_init(&f);
    struct walker w;
    walker_init(&w, g, &f, v->max_len);
    struct sg_set in = {0}, x = {0}, own = {0};
    sg_set_add(&in, sg_frame(&f, node, 0));
    int base = 0, rule = g->nodes[node].rule;
    sg_close(g, &f, &in, &x, &base, rule);
    for (int i = 0; i < x.n; i++) {
        int32_t fr = x.v[i];
        const struct sg_node *nd = &g->nodes[f.node[fr]];
        if (nd->rule != rule) {
            if (nd->n_edges || nd->n_calls) compose(&b, &f, &w, fr);
        } else if (nd->n_edges) {
            sg_set_add(&own, fr);
        }
    }
    if (own.n) {
        w.st[0].n = 0;
        for (int i = 0; i < own.n; i++) sg_set_add(&w.st[0], own.v[i]);
        trie_walk(&b, &w);
    }
    sg_set_free(&in);
    sg_set_free(&x);
    sg_set_free(&own);
    walker_free(&w);
    sg_frames_free(&f);
    return finish(&b);
}

struct sg_entry *sg_entry_get(struct sg_cache *c, const struct sg_grammar *g, int32_t node) {
    struct sg_entry *e = atomic_load_explicit(&c->entry[node], memory_order_acquire);
    if (e) return e;
    struct sg_entry *mine = build_entry(c, g, node), *expect = NULL;
    if (atomic_compare_exchange_strong(&c->entry[node], &expect, mine)) return mine;
    entry_free(mine); // another thread published first
    return expect;
}

// --------------------------------------------------------------- run time --

// The run-time side, used by sg_matcher.c: ORs the entry's accepted tokens
// into bits, and returns its candidates that the stack under frame fr
// accepts (appended to out).
struct resolve_ctx {
    const struct rem *r;
    struct sg_set *out;
};

static void resolve_out(void *ctx, int i, int accepted, const int *pops, int n_pops) {
    (void)pops, (void)n_pops;
    struct resolve_ctx *c = ctx;
    if (accepted) sg_set_add(c->out, c->r[i].tok);
}

void sg_entry_or(const struct sg_entry *e, uint32_t *bits, int words) {
    if (e->bits)
        for (int i = 0; i < words; i++) bits[i] |= e->bits[i];
    else
        for (int i = 0; i < e->n_acc; i++) set_acc(bits, e->acc[i]);
}

int sg_entry_has_cands(const struct sg_entry *e) { return e->n_cand > 0; }

void sg_entry_resolve(const struct sg_entry *e, const struct sg_grammar *g, const struct sg_vocab *v,
                      struct sg_frames *f, int32_t parent, struct sg_set *out) {
    if (parent == 0) return; // ending the start rule leaves no place for more bytes
    struct walker w;
    walker_init(&w, g, f, v->max_len);
    struct sg_set in = {0};
    sg_set_add(&in, parent);
    int base = 0;
    sg_close(g, f, &in, &w.st[0], &base, -1);
    sg_set_free(&in);
    struct rem *r = entry_rems(v, e);
    struct resolve_ctx rc = {r, out};
    walk_rems(&w, r, e->n_cand, 0, resolve_out, &rc);
    free(r);
    walker_free(&w);
}

void sg_cache_stats(struct sg_cache *c, const struct sg_grammar *g, struct sg_cache_stats *st) {
    memset(st, 0, sizeof *st);
    for (int i = 0; i < g->n_nodes; i++) {
        struct sg_entry *e = atomic_load(&c->entry[i]);
        if (!e) continue;
        st->entries++;
        st->walked += e->walked;
        st->candidates += e->n_cand;
    }
}

void sg_grammar_warm(const struct sg_grammar *g, const struct sg_vocab *v) {
    struct sg_cache *c = sg_cache_get(g, v);
    for (int n = 0; n < g->n_nodes; n++)
        if (g->nodes[n].n_edges || g->nodes[n].n_calls) sg_entry_get(c, g, n);
}
