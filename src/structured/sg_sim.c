// sg_sim.c - running the pushdown automaton: stacks are interned frames
// (node, parent frame), so a stack is one int and equal stacks are equal ids;
// a state is a set of frames. Frame 0 is the base under the start rule.
#include "core/common.h"
#include "structured/sg_internal.h"

static uint32_t frame_hash(int32_t node, int32_t parent) {
    return (uint32_t)sg_hash64(((uint64_t)(uint32_t)node << 32) | (uint32_t)parent);
}

static void frames_rehash(struct sg_frames *f, uint32_t cap) {
    free(f->slot);
    f->slot = xmalloc(cap * sizeof *f->slot);
    for (uint32_t i = 0; i < cap; i++) f->slot[i] = -1;
    f->mask = cap - 1;
    for (int i = 1; i < f->n; i++) {
        uint32_t h = frame_hash(f->node[i], f->parent[i]) & f->mask;
        while (f->slot[h] >= 0) h = (h + 1) & f->mask;
        f->slot[h] = i;
    }
}

void sg_frames_init(struct sg_frames *f) {
    memset(f, 0, sizeof *f);
    f->cap = 64;
    f->node = xmalloc((size_t)f->cap * sizeof *f->node);
    f->parent = xmalloc((size_t)f->cap * sizeof *f->parent);
    f->mark = xcalloc((size_t)f->cap, sizeof *f->mark);
    f->node[0] = f->parent[0] = -1;
    f->n = 1;
    frames_rehash(f, 128);
}

void sg_frames_clear(struct sg_frames *f) {
    f->n = 1;
    for (uint32_t i = 0; i <= f->mask; i++) f->slot[i] = -1;
}

void sg_frames_free(struct sg_frames *f) {
    free(f->node);
    free(f->parent);
    free(f->slot);
    free(f->mark);
    memset(f, 0, sizeof *f);
}

int32_t sg_frame(struct sg_frames *f, int32_t node, int32_t parent) {
    uint32_t h = frame_hash(node, parent) & f->mask;
    for (int32_t i; (i = f->slot[h]) >= 0; h = (h + 1) & f->mask)
        if (f->node[i] == node && f->parent[i] == parent) return i;
    if (f->n == f->cap) {
        int cap = f->cap * 2;
        f->node = xrealloc(f->node, (size_t)cap * sizeof *f->node);
        f->parent = xrealloc(f->parent, (size_t)cap * sizeof *f->parent);
        f->mark = xrealloc(f->mark, (size_t)cap * sizeof *f->mark);
        memset(f->mark + f->cap, 0, (size_t)(cap - f->cap) * sizeof *f->mark);
        f->cap = cap;
    }
    int32_t id = f->n++;
    f->node[id] = node;
    f->parent[id] = parent;
    if ((uint32_t)f->n * 2 > f->mask) frames_rehash(f, (f->mask + 1) * 2);
    else f->slot[h] = id;
    return id;
}

void sg_set_add(struct sg_set *s, int32_t x) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->v = xrealloc(s->v, (size_t)s->cap * sizeof *s->v);
    }
    s->v[s->n++] = x;
}

void sg_set_free(struct sg_set *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

static inline void add_new(struct sg_frames *f, struct sg_set *out, int32_t x) {
    if (f->mark[x] == f->epoch) return;
    f->mark[x] = f->epoch;
    sg_set_add(out, x);
}

void sg_close(const struct sg_grammar *g, struct sg_frames *f, const struct sg_set *in,
              struct sg_set *out, int *base, int stop_rule) {
    out->n = 0;
    f->epoch++;
    for (int i = 0; i < in->n; i++) add_new(f, out, in->v[i]);
    for (int i = 0; i < out->n; i++) {
        int32_t fr = out->v[i], n = f->node[fr], p = f->parent[fr];
        const struct sg_node *nd = &g->nodes[n];
        if (stop_rule >= 0 && nd->rule != stop_rule) { // covered by its own cache entry
            if (nd->flags & SG_N_EPS_ACCEPT) {
                if (p == 0) *base = 1;
                else add_new(f, out, p);
            }
            continue;
        }
        for (int k = 0; k < nd->n_calls; k++) {
            const struct sg_call *c = &g->calls[nd->call0 + k];
            // a call whose return node can only end its rule returns straight to p
            int32_t ret = sg_node_final(g, c->to) ? p : sg_frame(f, c->to, p);
            add_new(f, out, sg_frame(f, g->rule_start[c->rule], ret));
        }
        if (nd->flags & SG_N_ACCEPT) {
            if (p == 0) *base = 1;
            else add_new(f, out, p);
        }
    }
}

void sg_step(const struct sg_grammar *g, struct sg_frames *f, const struct sg_set *in, uint8_t b,
             struct sg_set *out) {
    out->n = 0;
    f->epoch++;
    for (int i = 0; i < in->n; i++) {
        int32_t fr = in->v[i];
        const struct sg_node *nd = &g->nodes[f->node[fr]];
        const struct sg_edge *e = g->edges + nd->edge0, *end = e + nd->n_edges;
        for (; e < end && e->lo <= b; e++)
            if (b <= e->hi) add_new(f, out, sg_frame(f, e->to, f->parent[fr]));
    }
}

int sg_grammar_viable(const struct sg_grammar *g, const char *s, size_t n, int *accepting) {
    struct sg_frames f;
    sg_frames_init(&f);
    struct sg_set cur = {0}, closed = {0};
    sg_set_add(&cur, sg_frame(&f, g->rule_start[g->root], 0));
    int base = 0, ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        sg_close(g, &f, &cur, &closed, &base, -1);
        sg_step(g, &f, &closed, (uint8_t)s[i], &cur);
        ok = cur.n > 0;
    }
    base = 0;
    if (ok) sg_close(g, &f, &cur, &closed, &base, -1);
    if (accepting) *accepting = ok && base;
    sg_set_free(&cur);
    sg_set_free(&closed);
    sg_frames_free(&f);
    return ok;
}

struct sg_grammar *sg_grammar_ref(struct sg_grammar *g) {
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void sg_grammar_free(struct sg_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1) return;
    sg_caches_free(g);
    free(g->nodes);
    free(g->edges);
    free(g->calls);
    free(g->rule_start);
    free(g->follow);
    if (g->rule_names)
        for (int i = 0; i < g->n_rules; i++) free(g->rule_names[i]);
    free(g->rule_names);
    free(g);
}
