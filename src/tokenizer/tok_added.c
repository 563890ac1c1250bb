// tok_added.c - the leftmost-longest matcher of added tokens (a byte trie;
// the HF crate uses Aho-Corasick with the same LeftmostLongest semantics).
#include "core/common.h"
#include "tokenizer/tok_internal.h"

struct trie_node {
    int32_t child, sibling; // first child, next sibling (-1: none)
    int32_t value;          // -1: no pattern ends here
    uint8_t byte;
};

static int32_t new_node(struct matcher *m, uint8_t byte) {
    xgrow((void **)&m->nodes, &m->cap, m->n_nodes + 1, sizeof *m->nodes);
    m->nodes[m->n_nodes] = (struct trie_node){-1, -1, -1, byte};
    return m->n_nodes++;
}

void matcher_init(struct matcher *m) {
    memset(m, 0, sizeof *m);
    new_node(m, 0); // root
}

void matcher_free(struct matcher *m) {
    free(m->nodes);
    memset(m, 0, sizeof *m);
}

void matcher_add(struct matcher *m, const char *s, size_t n, int32_t value) {
    if (n == 0) return;
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = m->nodes[cur].child;
        while (c >= 0 && m->nodes[c].byte != b) c = m->nodes[c].sibling;
        if (c < 0) {
            c = new_node(m, b);
            m->nodes[c].sibling = m->nodes[cur].child;
            m->nodes[cur].child = c;
        }
        cur = c;
    }
    if (m->nodes[cur].value < 0) m->nodes[cur].value = value; // the first of equal patterns wins
    m->first[(uint8_t)s[0]] = 1;
}

int matcher_find(const struct matcher *m, const char *s, size_t n, size_t from, size_t *ms,
                 size_t *me, int32_t *value) {
    if (!m->nodes || m->nodes[0].child < 0) return 0;
    for (size_t i = from; i < n; i++) {
        if (!m->first[(uint8_t)s[i]]) continue;
        int32_t cur = 0, best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            int32_t c = m->nodes[cur].child;
            while (c >= 0 && m->nodes[c].byte != (uint8_t)s[j]) c = m->nodes[c].sibling;
            if (c < 0) break;
            cur = c;
            if (m->nodes[cur].value >= 0) {
                best = m->nodes[cur].value;
                best_end = j + 1;
            }
        }
        if (best >= 0) {
            *ms = i;
            *me = best_end;
            *value = best;
            return 1;
        }
    }
    return 0;
}
