// sg_vocab.c - the vocabulary as a byte trie, built once per tokenizer: every
// token's bytes (tok_token_bytes), sorted, laid out in preorder so that a
// walk is a loop over arrays and a subtree is a range (see sg_internal.h).
#include "core/common.h"
#include "structured/sg_internal.h"
#include "tokenizer/tokenizer.h"

struct tok_ref {
    const uint8_t *p;
    int len;
    int32_t id;
};

static int cmp_tok(const void *a, const void *b) {
    const struct tok_ref *x = a, *y = b;
    int n = MIN(x->len, y->len), c = memcmp(x->p, y->p, (size_t)n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

// A UTF-8 decoder: state 0 between characters; 1-7 inside one (1: one
// continuation byte left; 2: two; 3 after E0, 4 after ED, 5 after F1-F3,
// 6 after F0, 7 after F4: the second byte's range is narrower). -1: invalid.
static int utf8_next(int q, uint8_t b) {
    switch (q) {
    case 0:
        if (b < 0x80) return 0;
        if (b >= 0xC2 && b <= 0xDF) return 1;
        if (b == 0xE0) return 3;
        if (b == 0xED) return 4;
        if (b >= 0xE1 && b <= 0xEF) return 2;
        if (b == 0xF0) return 6;
        if (b >= 0xF1 && b <= 0xF3) return 5;
        if (b == 0xF4) return 7;
        return -1;
    case 1: return b >= 0x80 && b <= 0xBF ? 0 : -1;
    case 2: return b >= 0x80 && b <= 0xBF ? 1 : -1;
    case 3: return b >= 0xA0 && b <= 0xBF ? 1 : -1;
    case 4: return b >= 0x80 && b <= 0x9F ? 1 : -1;
    case 5: return b >= 0x80 && b <= 0xBF ? 2 : -1;
    case 6: return b >= 0x90 && b <= 0xBF ? 2 : -1;
    case 7: return b >= 0x80 && b <= 0x8F ? 2 : -1;
    }
    return -1;
}

// Ends node path[d] at preorder index nn; its bytes join its parent's.
static void close_node(struct sg_vocab *v, const int32_t *path, int d, int nn) {
    int32_t i = path[d], p = path[d - 1];
    v->end[i] = nn;
    uint8_t b = v->byte[i];
    uint8_t ok = 0; // decoder states from which byte b and everything below stay valid
    for (int q = 0; q < 8; q++) {
        int t = utf8_next(q, b);
        if (t >= 0 && ((v->clean[i] >> t) & 1)) ok |= (uint8_t)(1u << q);
    }
    v->clean[p] &= ok;
    // maxc holds the most characters of a token through the node until the
    // node closes; then it becomes the count below it
    v->maxc[p] = (uint16_t)MAX(v->maxc[p], v->maxc[i]);
    v->maxc[i] = (uint16_t)(v->maxc[i] - v->pchars[i]);
    if (b < 128) v->desc[p][b >> 6] |= 1ull << (b & 63);
    else v->desc_high[p] = 1;
    v->desc[p][0] |= v->desc[i][0];
    v->desc[p][1] |= v->desc[i][1];
    v->desc_high[p] |= v->desc_high[i];
}

struct sg_vocab *sg_vocab_create(const struct tokenizer *t, const int32_t *eos_ids, int num_eos) {
    struct sg_vocab *v = xcalloc(1, sizeof *v);
    int V = tok_vocab_size(t);
    v->vocab_size = V;
    v->bytes = xcalloc((size_t)V, sizeof *v->bytes);
    v->len = xcalloc((size_t)V, sizeof *v->len);
    v->chars = xcalloc((size_t)V, sizeof *v->chars);
    v->eos = xmalloc((size_t)MAX(num_eos, 1) * sizeof *v->eos);
    for (int i = 0; i < num_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < V) v->eos[v->n_eos++] = eos_ids[i];
    struct tok_ref *refs = xmalloc((size_t)V * sizeof *refs);
    int n = 0;
    char buf[1024];
    for (int32_t id = 0; id < V; id++) {
        int is_eos = 0;
        for (int k = 0; k < v->n_eos; k++) is_eos |= v->eos[k] == id;
        if (is_eos || tok_is_special(t, id)) continue;
        int len = tok_token_bytes(t, id, buf, (int)sizeof buf);
        // Tokens of no bytes cannot move a matcher; longer than a uint16 never happen
        if (len <= 0 || len > 65535) continue;
        char *p = xmalloc((size_t)len);
        if (len <= (int)sizeof buf) memcpy(p, buf, (size_t)len);
        else tok_token_bytes(t, id, p, len);
        v->bytes[id] = p;
        v->len[id] = (uint16_t)len;
        v->max_len = MAX(v->max_len, len);
        refs[n++] = (struct tok_ref){(const uint8_t *)p, len, id};
    }
    qsort(refs, (size_t)n, sizeof *refs, cmp_tok);
    v->n_tok = n;
    v->tok = xmalloc((size_t)MAX(n, 1) * sizeof *v->tok);
    // Preorder layout: each token adds the nodes below its common prefix with
    // the previous token; path[d] is the node at depth d on the current path.
    int cap = 1024;
    v->byte = xmalloc((size_t)cap);
    v->depth = xmalloc((size_t)cap * sizeof *v->depth);
    v->end = xmalloc((size_t)cap * sizeof *v->end);
    v->lo = xmalloc((size_t)(cap + 1) * sizeof *v->lo);
    v->n_end = xmalloc((size_t)cap * sizeof *v->n_end);
    v->desc = xmalloc((size_t)cap * sizeof *v->desc);
    v->desc_high = xmalloc((size_t)cap);
    v->clean = xmalloc((size_t)cap);
    v->maxc = xmalloc((size_t)cap * sizeof *v->maxc);
    v->pchars = xmalloc((size_t)cap * sizeof *v->pchars);
    int32_t *path = xmalloc((size_t)(v->max_len + 1) * sizeof *path);
    int nn = 1, plen = 0;
    v->byte[0] = 0, v->depth[0] = 0, v->lo[0] = 0, v->n_end[0] = 0;
    v->desc[0][0] = v->desc[0][1] = 0, v->desc_high[0] = 0, v->clean[0] = 0xFF, v->maxc[0] = 0, v->pchars[0] = 0;
    path[0] = 0;
    for (int k = 0; k < n; k++) {
        const struct tok_ref *r = &refs[k];
        v->tok[k] = r->id;
        int l = 0;
        if (k) {
            const struct tok_ref *q = &refs[k - 1];
            int m = MIN(q->len, r->len);
            while (l < m && q->p[l] == r->p[l]) l++;
        }
        for (int d = plen; d > l; d--) close_node(v, path, d, nn); // the old path below l
        for (int d = l + 1; d <= r->len; d++) {
            if (nn + 1 >= cap) {
                cap *= 2;
                v->byte = xrealloc(v->byte, (size_t)cap);
                v->depth = xrealloc(v->depth, (size_t)cap * sizeof *v->depth);
                v->end = xrealloc(v->end, (size_t)cap * sizeof *v->end);
                v->lo = xrealloc(v->lo, (size_t)(cap + 1) * sizeof *v->lo);
                v->n_end = xrealloc(v->n_end, (size_t)cap * sizeof *v->n_end);
                v->desc = xrealloc(v->desc, (size_t)cap * sizeof *v->desc);
                v->desc_high = xrealloc(v->desc_high, (size_t)cap);
                v->clean = xrealloc(v->clean, (size_t)cap);
                v->maxc = xrealloc(v->maxc, (size_t)cap * sizeof *v->maxc);
                v->pchars = xrealloc(v->pchars, (size_t)cap * sizeof *v->pchars);
            }
            v->byte[nn] = r->p[d - 1];
            v->depth[nn] = (uint16_t)d;
            v->lo[nn] = k;
            v->n_end[nn] = 0;
            v->desc[nn][0] = v->desc[nn][1] = 0;
            v->desc_high[nn] = 0;
            v->clean[nn] = 0xFF;
            v->pchars[nn] = (uint16_t)(v->pchars[path[d - 1]] + ((r->p[d - 1] & 0xC0) != 0x80));
            v->maxc[nn] = v->pchars[nn];
            path[d] = nn++;
        }
        plen = r->len;
        v->n_end[path[r->len]]++;
        v->chars[r->id] = v->pchars[path[r->len]];
    }
    for (int d = plen; d > 0; d--) close_node(v, path, d, nn);
    v->end[0] = nn;
    v->maxc[0] = (uint16_t)(v->maxc[0] - v->pchars[0]);
    v->lo[nn] = n;
    v->n_nodes = nn;
    free(path);
    free(refs);
    return v;
}

void sg_vocab_free(struct sg_vocab *v) {
    if (!v) return;
    for (int i = 0; i < v->vocab_size; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->len);
    free(v->eos);
    free(v->byte);
    free(v->depth);
    free(v->end);
    free(v->lo);
    free(v->n_end);
    free(v->desc);
    free(v->desc_high);
    free(v->clean);
    free(v->maxc);
    free(v->pchars);
    free(v->chars);
    free(v->tok);
    free(v);
}

int sg_vocab_size(const struct sg_vocab *v) { return v->vocab_size; }
