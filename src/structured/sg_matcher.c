// sg_matcher.c - one request's grammar state. The state is a set of frames
// (sg_sim.c) after the last byte, not closed. A mask is the union, over the
// state's frames and the frames below them that can end without a byte, of
// each frame's cache entry (sg_mask.c): its accepted tokens, plus its
// candidates that the stack below accepts. That second part depends only on
// the frame (an interned stack), so it is memoized per frame: inside a JSON
// string the frame repeats and a step costs a few bitmask ORs.
#include "core/common.h"
#include "structured/sg_internal.h"

struct memo { // frame -> its resolved candidates, ids in pool[off, off + n)
    int32_t *key, *off, *n;
    uint32_t mask;
    int count;
    struct sg_set pool;
};

struct sg_matcher {
    const struct sg_grammar *g;
    const struct sg_vocab *v;
    struct sg_cache *cache;
    struct sg_frames f;
    struct sg_set state, tmp, closed, mframes;
    int accepting, done;
    struct memo memo;
};

static void memo_init(struct memo *m) {
    free(m->key), free(m->off), free(m->n);
    sg_set_free(&m->pool);
    m->mask = 255;
    m->count = 0;
    m->key = xmalloc((m->mask + 1) * sizeof *m->key);
    m->off = xmalloc((m->mask + 1) * sizeof *m->off);
    m->n = xmalloc((m->mask + 1) * sizeof *m->n);
    for (uint32_t i = 0; i <= m->mask; i++) m->key[i] = -1;
}

static void memo_free(struct memo *m) {
    free(m->key), free(m->off), free(m->n);
    sg_set_free(&m->pool);
}

static int memo_find(const struct memo *m, int32_t key) {
    uint32_t h = (uint32_t)sg_hash64((uint64_t)key) & m->mask;
    for (; m->key[h] >= 0; h = (h + 1) & m->mask)
        if (m->key[h] == key) return (int)h;
    return -1;
}

static void memo_put(struct memo *m, int32_t key, int off, int n) {
    if ((uint32_t)(m->count + 1) * 2 > m->mask) {
        struct memo old = *m;
        m->mask = m->mask * 2 + 1;
        m->key = xmalloc((m->mask + 1) * sizeof *m->key);
        m->off = xmalloc((m->mask + 1) * sizeof *m->off);
        m->n = xmalloc((m->mask + 1) * sizeof *m->n);
        for (uint32_t i = 0; i <= m->mask; i++) m->key[i] = -1;
        m->count = 0;
        for (uint32_t i = 0; i <= old.mask; i++)
            if (old.key[i] >= 0) memo_put(m, old.key[i], old.off[i], old.n[i]);
        free(old.key), free(old.off), free(old.n);
    }
    uint32_t h = (uint32_t)sg_hash64((uint64_t)key) & m->mask;
    while (m->key[h] >= 0) h = (h + 1) & m->mask;
    m->key[h] = key;
    m->off[h] = off;
    m->n[h] = n;
    m->count++;
}

static void update_accepting(struct sg_matcher *m) {
    int base = 0;
    sg_close(m->g, &m->f, &m->state, &m->closed, &base, -1);
    m->accepting = base;
}

void sg_matcher_reset(struct sg_matcher *m) {
    sg_frames_clear(&m->f);
    memo_init(&m->memo);
    m->state.n = 0;
    sg_set_add(&m->state, sg_frame(&m->f, m->g->rule_start[m->g->root], 0));
    m->done = 0;
    update_accepting(m);
}

struct sg_matcher *sg_matcher_create(const struct sg_grammar *g, const struct sg_vocab *v) {
    struct sg_matcher *m = xcalloc(1, sizeof *m);
    m->g = g;
    m->v = v;
    m->cache = v ? sg_cache_get(g, v) : NULL;
    sg_frames_init(&m->f);
    sg_matcher_reset(m);
    return m;
}

static void copy_set(struct sg_set *d, const struct sg_set *s) {
    d->n = 0;
    for (int i = 0; i < s->n; i++) sg_set_add(d, s->v[i]);
}

struct sg_matcher *sg_matcher_clone(const struct sg_matcher *m) {
    struct sg_matcher *c = xcalloc(1, sizeof *c);
    c->g = m->g;
    c->v = m->v;
    c->cache = m->cache;
    const struct sg_frames *f = &m->f;
    c->f = *f;
    c->f.node = xmalloc((size_t)f->cap * sizeof *f->node);
    c->f.parent = xmalloc((size_t)f->cap * sizeof *f->parent);
    c->f.mark = xcalloc((size_t)f->cap, sizeof *f->mark);
    c->f.slot = xmalloc((f->mask + 1) * sizeof *f->slot);
    c->f.epoch = 0;
    memcpy(c->f.node, f->node, (size_t)f->n * sizeof *f->node);
    memcpy(c->f.parent, f->parent, (size_t)f->n * sizeof *f->parent);
    memcpy(c->f.slot, f->slot, (f->mask + 1) * sizeof *f->slot);
    copy_set(&c->state, &m->state);
    c->accepting = m->accepting;
    c->done = m->done;
    memo_init(&c->memo); // memoized frames stay valid, but a fresh memo is simpler
    return c;
}

void sg_matcher_free(struct sg_matcher *m) {
    if (!m) return;
    sg_frames_free(&m->f);
    sg_set_free(&m->state);
    sg_set_free(&m->tmp);
    sg_set_free(&m->closed);
    sg_set_free(&m->mframes);
    memo_free(&m->memo);
    free(m);
}

int sg_matcher_accept_bytes(struct sg_matcher *m, const char *s, size_t n) {
    if (m->done) return 0;
    struct sg_set cur = {0};
    for (int i = 0; i < m->state.n; i++) sg_set_add(&cur, m->state.v[i]);
    int base = 0;
    for (size_t i = 0; i < n; i++) {
        sg_close(m->g, &m->f, &cur, &m->closed, &base, -1);
        sg_step(m->g, &m->f, &m->closed, (uint8_t)s[i], &cur);
        if (!cur.n) {
            sg_set_free(&cur);
            return 0;
        }
    }
    sg_set_free(&m->state);
    m->state = cur;
    update_accepting(m);
    return 1;
}

int sg_matcher_accept(struct sg_matcher *m, int32_t id) {
    if (m->done) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar: token %d after the end of output", (int)id);
    if (id < 0 || id >= m->v->vocab_size)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar: token %d is outside the vocabulary", (int)id);
    for (int k = 0; k < m->v->n_eos; k++)
        if (m->v->eos[k] == id) {
            if (!m->accepting) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar: EOS before the output is complete");
            m->done = 1;
            return VLLM_OK;
        }
    const char *b = m->v->bytes[id];
    if (!b || !sg_matcher_accept_bytes(m, b, m->v->len[id]))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "grammar: token %d is not allowed here", (int)id);
    return VLLM_OK;
}

// The frames whose entries make the mask: the state, and below each frame
// the frames its rule returns to when it can end without consuming a byte.
static void mask_frames(struct sg_matcher *m) {
    struct sg_set *s = &m->mframes;
    s->n = 0;
    m->f.epoch++;
    for (int i = 0; i < m->state.n; i++) {
        int32_t fr = m->state.v[i];
        while (fr > 0 && m->f.mark[fr] != m->f.epoch) {
            m->f.mark[fr] = m->f.epoch;
            sg_set_add(s, fr);
            if (!(m->g->nodes[m->f.node[fr]].flags & SG_N_EPS_ACCEPT)) break;
            fr = m->f.parent[fr];
        }
    }
}

void sg_matcher_fill_mask(struct sg_matcher *m, uint32_t *bits) {
    int words = CDIV(m->v->vocab_size, 32);
    memset(bits, 0, (size_t)words * sizeof *bits);
    if (m->done) return;
    mask_frames(m);
    for (int i = 0; i < m->mframes.n; i++) {
        int32_t fr = m->mframes.v[i];
        int32_t node = m->f.node[fr];
        const struct sg_node *nd = &m->g->nodes[node];
        if (!nd->n_edges && !nd->n_calls) continue;
        const struct sg_entry *e = sg_entry_get(m->cache, m->g, node);
        sg_entry_or(e, bits, words);
        if (!sg_entry_has_cands(e)) continue;
        int h = memo_find(&m->memo, fr);
        int off, n;
        if (h >= 0) {
            off = m->memo.off[h];
            n = m->memo.n[h];
        } else {
            off = m->memo.pool.n;
            sg_entry_resolve(e, m->g, m->v, &m->f, m->f.parent[fr], &m->memo.pool);
            n = m->memo.pool.n - off;
            memo_put(&m->memo, fr, off, n);
        }
        for (int k = 0; k < n; k++) {
            int32_t t = m->memo.pool.v[off + k];
            bits[t >> 5] |= 1u << (t & 31);
        }
    }
    if (m->accepting)
        for (int k = 0; k < m->v->n_eos; k++) bits[m->v->eos[k] >> 5] |= 1u << (m->v->eos[k] & 31);
}

int sg_matcher_is_accepting(const struct sg_matcher *m) { return m->done || m->accepting; }
int sg_matcher_is_done(const struct sg_matcher *m) { return m->done; }

uint64_t sg_matcher_min_remaining(const struct sg_matcher *m) {
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < m->state.n; i++) {
        uint64_t sum = 0;
        for (int32_t fr = m->state.v[i]; fr > 0; fr = m->f.parent[fr]) sum += m->g->nodes[m->f.node[fr]].mincomp;
        best = MIN(best, sum);
    }
    return best;
}

void sg_matcher_cache_stats(const struct sg_matcher *m, struct sg_cache_stats *st) {
    sg_cache_stats(m->cache, m->g, st);
}
