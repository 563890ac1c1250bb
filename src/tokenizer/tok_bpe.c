// tok_bpe.c - the BPE model: one pre-token to ids, as the HF crate's
// BPE::merge_word + Word::merge_all do it (same priority queue, same ties).
#include "core/common.h"
#include "tokenizer/tok_internal.h"

const char *const tok_byte_char[256] = {
    "\xC4\x80", "\xC4\x81", "\xC4\x82", "\xC4\x83", "\xC4\x84", "\xC4\x85", "\xC4\x86", "\xC4\x87",
    "\xC4\x88", "\xC4\x89", "\xC4\x8A", "\xC4\x8B", "\xC4\x8C", "\xC4\x8D", "\xC4\x8E", "\xC4\x8F",
    "\xC4\x90", "\xC4\x91", "\xC4\x92", "\xC4\x93", "\xC4\x94", "\xC4\x95", "\xC4\x96", "\xC4\x97",
    "\xC4\x98", "\xC4\x99", "\xC4\x9A", "\xC4\x9B", "\xC4\x9C", "\xC4\x9D", "\xC4\x9E", "\xC4\x9F",
    "\xC4\xA0", "\x21", "\x22", "\x23", "\x24", "\x25", "\x26", "\x27",
    "\x28", "\x29", "\x2A", "\x2B", "\x2C", "\x2D", "\x2E", "\x2F",
    "\x30", "\x31", "\x32", "\x33", "\x34", "\x35", "\x36", "\x37",
    "\x38", "\x39", "\x3A", "\x3B", "\x3C", "\x3D", "\x3E", "\x3F",
    "\x40", "\x41", "\x42", "\x43", "\x44", "\x45", "\x46", "\x47",
    "\x48", "\x49", "\x4A", "\x4B", "\x4C", "\x4D", "\x4E", "\x4F",
    "\x50", "\x51", "\x52", "\x53", "\x54", "\x55", "\x56", "\x57",
    "\x58", "\x59", "\x5A", "\x5B", "\x5C", "\x5D", "\x5E", "\x5F",
    "\x60", "\x61", "\x62", "\x63", "\x64", "\x65", "\x66", "\x67",
    "\x68", "\x69", "\x6A", "\x6B", "\x6C", "\x6D", "\x6E", "\x6F",
    "\x70", "\x71", "\x72", "\x73", "\x74", "\x75", "\x76", "\x77",
    "\x78", "\x79", "\x7A", "\x7B", "\x7C", "\x7D", "\x7E", "\xC4\xA1",
    "\xC4\xA2", "\xC4\xA3", "\xC4\xA4", "\xC4\xA5", "\xC4\xA6", "\xC4\xA7", "\xC4\xA8", "\xC4\xA9",
    "\xC4\xAA", "\xC4\xAB", "\xC4\xAC", "\xC4\xAD", "\xC4\xAE", "\xC4\xAF", "\xC4\xB0", "\xC4\xB1",
    "\xC4\xB2", "\xC4\xB3", "\xC4\xB4", "\xC4\xB5", "\xC4\xB6", "\xC4\xB7", "\xC4\xB8", "\xC4\xB9",
    "\xC4\xBA", "\xC4\xBB", "\xC4\xBC", "\xC4\xBD", "\xC4\xBE", "\xC4\xBF", "\xC5\x80", "\xC5\x81",
    "\xC5\x82", "\xC2\xA1", "\xC2\xA2", "\xC2\xA3", "\xC2\xA4", "\xC2\xA5", "\xC2\xA6", "\xC2\xA7",
    "\xC2\xA8", "\xC2\xA9", "\xC2\xAA", "\xC2\xAB", "\xC2\xAC", "\xC5\x83", "\xC2\xAE", "\xC2\xAF",
    "\xC2\xB0", "\xC2\xB1", "\xC2\xB2", "\xC2\xB3", "\xC2\xB4", "\xC2\xB5", "\xC2\xB6", "\xC2\xB7",
    "\xC2\xB8", "\xC2\xB9", "\xC2\xBA", "\xC2\xBB", "\xC2\xBC", "\xC2\xBD", "\xC2\xBE", "\xC2\xBF",
    "\xC3\x80", "\xC3\x81", "\xC3\x82", "\xC3\x83", "\xC3\x84", "\xC3\x85", "\xC3\x86", "\xC3\x87",
    "\xC3\x88", "\xC3\x89", "\xC3\x8A", "\xC3\x8B", "\xC3\x8C", "\xC3\x8D", "\xC3\x8E", "\xC3\x8F",
    "\xC3\x90", "\xC3\x91", "\xC3\x92", "\xC3\x93", "\xC3\x94", "\xC3\x95", "\xC3\x96", "\xC3\x97",
    "\xC3\x98", "\xC3\x99", "\xC3\x9A", "\xC3\x9B", "\xC3\x9C", "\xC3\x9D", "\xC3\x9E", "\xC3\x9F",
    "\xC3\xA0", "\xC3\xA1", "\xC3\xA2", "\xC3\xA3", "\xC3\xA4", "\xC3\xA5", "\xC3\xA6", "\xC3\xA7",
    "\xC3\xA8", "\xC3\xA9", "\xC3\xAA", "\xC3\xAB", "\xC3\xAC", "\xC3\xAD", "\xC3\xAE", "\xC3\xAF",
    "\xC3\xB0", "\xC3\xB1", "\xC3\xB2", "\xC3\xB3", "\xC3\xB4", "\xC3\xB5", "\xC3\xB6", "\xC3\xB7",
    "\xC3\xB8", "\xC3\xB9", "\xC3\xBA", "\xC3\xBB", "\xC3\xBC", "\xC3\xBD", "\xC3\xBE", "\xC3\xBF",
};

// Bytes of the chars U+0100..U+0143 (those outside printable Latin-1).
static const uint8_t high_byte[68] = {
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 127, 128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142, 143, 144, 145, 146, 147, 148, 149, 150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 160, 173
};

int tok_char_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 0x100 && cp < 0x144) return high_byte[cp - 0x100];
    return -1;
}

// ------------------------------------------------------------------ merges --

static uint64_t pair_key(int32_t a, int32_t b) { return (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1; }

static uint32_t pair_slot(uint64_t k, uint32_t mask) {
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32) & mask;
}

static int merge_get(const struct merge_map *m, int32_t a, int32_t b, int32_t *rank, int32_t *new_id) {
    if (!m->key) return 0;
    uint64_t k = pair_key(a, b);
    for (uint32_t j = pair_slot(k, m->mask);; j = (j + 1) & m->mask) {
        if (m->key[j] == k) {
            *rank = m->rank[j];
            *new_id = m->new_id[j];
            return 1;
        }
        if (!m->key[j]) return 0;
    }
}

static void merge_put(struct merge_map *m, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t k = pair_key(a, b);
    uint32_t j = pair_slot(k, m->mask);
    while (m->key[j] && m->key[j] != k) j = (j + 1) & m->mask;
    m->key[j] = k; // a repeated pair keeps its last rank, as a HashMap collect does
    m->rank[j] = rank;
    m->new_id[j] = new_id;
}

void tok_merges_free(struct merge_map *m) {
    free(m->key);
    free(m->rank);
    free(m->new_id);
    memset(m, 0, sizeof *m);
}

static const char *vocab_key(const void *owner, int32_t id, size_t *len) {
    const struct tokenizer *t = owner;
    *len = t->tok_len[id];
    return t->arena.p + t->tok_off[id];
}

static int32_t vocab_get(const struct tokenizer *t, const char *s, size_t n) {
    return strmap_get(&t->vocab, t, vocab_key, s, n);
}

int tok_merges_build(struct tokenizer *t, const json_t *merges) {
    size_t n = json_array_size(merges);
    uint32_t cap = 16;
    while (cap < n * 2 + 16) cap *= 2;
    struct merge_map *m = &t->merges;
    m->key = xcalloc(cap, sizeof *m->key);
    m->rank = xmalloc(cap * sizeof *m->rank);
    m->new_id = xmalloc(cap * sizeof *m->new_id);
    m->mask = cap - 1;
    size_t pl = t->cont_prefix ? strlen(t->cont_prefix) : 0;
    struct sbuf cat = {0};
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        char *sp = NULL;
        int rc = VLLM_OK;
        if (json_is_string(e)) {
            a = json_string_value(e);
            size_t l = json_string_length(e);
            sp = memchr(a, ' ', l);
            if (!sp || memchr(sp + 1, ' ', l - (size_t)(sp + 1 - a))) {
                free(cat.p);
                return vllm_err(VLLM_ERR_FORMAT, "model.merges[%zu]: '%.80s' is not two tokens", i, a);
            }
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = l - al - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            al = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bl = json_string_length(json_array_get(e, 1));
        } else {
            free(cat.p);
            return vllm_err(VLLM_ERR_FORMAT, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", i);
        }
        int32_t ia = vocab_get(t, a, al), ib = vocab_get(t, b, bl);
        if (ia < 0 || ib < 0)
            rc = vllm_err(VLLM_ERR_FORMAT, "model.merges[%zu]: token '%.*s' is not in the vocab", i,
                          (int)MIN(ia < 0 ? al : bl, 80), ia < 0 ? a : b);
        else if (bl < pl) rc = vllm_err(VLLM_ERR_FORMAT, "model.merges[%zu]: token shorter than the prefix", i);
        if (rc) {
            free(cat.p);
            return rc;
        }
        cat.len = 0;
        sbuf_add(&cat, a, al);
        sbuf_add(&cat, b + pl, bl - pl);
        int32_t nid = vocab_get(t, cat.p, cat.len);
        if (nid < 0) {
            free(cat.p);
            return vllm_err(VLLM_ERR_FORMAT, "model.merges[%zu]: merged token '%.*s' is not in the vocab",
                            i, (int)MIN(cat.len, 80), cat.p);
        }
        merge_put(m, ia, ib, (int32_t)i, nid);
    }
    free(cat.p);
    return VLLM_OK;
}

// -------------------------------------------------------------------- word --

struct sym {
    int32_t id, prev, next;
    uint32_t len;
};
struct hent {
    int32_t rank, pos, new_id;
};
struct bpe_scratch {
    struct sym *sym;
    int n_sym, cap_sym;
    struct hent *heap;
    int n_heap, cap_heap;
    struct sbuf s;
};

struct bpe_scratch *bpe_scratch_new(void) { return xcalloc(1, sizeof(struct bpe_scratch)); }

void bpe_scratch_free(struct bpe_scratch *s) {
    if (!s) return;
    free(s->sym);
    free(s->heap);
    free(s->s.p);
    free(s);
}

static int hless(const struct hent *a, const struct hent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct bpe_scratch *s, struct hent e) {
    xgrow((void **)&s->heap, &s->cap_heap, s->n_heap + 1, sizeof *s->heap);
    int i = s->n_heap++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!hless(&e, &s->heap[p])) break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = e;
}

static struct hent heap_pop(struct bpe_scratch *s) {
    struct hent top = s->heap[0], last = s->heap[--s->n_heap];
    int i = 0, n = s->n_heap;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && hless(&s->heap[c + 1], &s->heap[c])) c++;
        if (!hless(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n) s->heap[i] = last;
    return top;
}

static void sym_add(struct bpe_scratch *s, int32_t id, uint32_t len) {
    xgrow((void **)&s->sym, &s->cap_sym, s->n_sym + 1, sizeof *s->sym);
    int i = s->n_sym++;
    s->sym[i] = (struct sym){id, i - 1, -1, len};
    if (i > 0) s->sym[i - 1].next = i;
}

static void merge_all(const struct tokenizer *t, struct bpe_scratch *s) {
    s->n_heap = 0;
    int32_t rank, nid;
    for (int i = 0; i + 1 < s->n_sym; i++)
        if (merge_get(&t->merges, s->sym[i].id, s->sym[i + 1].id, &rank, &nid))
            heap_push(s, (struct hent){rank, i, nid});
    while (s->n_heap) {
        struct hent top = heap_pop(s);
        struct sym *cur = &s->sym[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        struct sym right = s->sym[cur->next];
        if (!merge_get(&t->merges, cur->id, right.id, &rank, &nid) || nid != top.new_id) continue;
        s->sym[cur->next].len = 0;
        cur->id = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        if (right.next >= 0) s->sym[right.next].prev = top.pos;
        if (cur->prev >= 0 && merge_get(&t->merges, s->sym[cur->prev].id, cur->id, &rank, &nid))
            heap_push(s, (struct hent){rank, cur->prev, nid});
        if (cur->next >= 0 && merge_get(&t->merges, cur->id, s->sym[cur->next].id, &rank, &nid))
            heap_push(s, (struct hent){rank, top.pos, nid});
    }
}

static void push_id(int32_t **ids, int *num, int *cap, int32_t id) {
    xgrow((void **)ids, cap, *num + 1, sizeof **ids);
    (*ids)[(*num)++] = id;
}

// The id of one char of the word (with the continuing prefix / end suffix the
// HF crate adds), or -1.
static int32_t char_lookup(const struct tokenizer *t, struct bpe_scratch *s, const char *c, size_t k,
                           int first, int last) {
    if (t->char_id) {
        uint32_t cp;
        utf8_decode((const uint8_t *)c, &cp);
        if (cp < 0x10000) return t->char_id[cp];
        return vocab_get(t, c, k);
    }
    s->s.len = 0;
    if (!first && t->cont_prefix) sbuf_add(&s->s, t->cont_prefix, strlen(t->cont_prefix));
    sbuf_add(&s->s, c, k);
    if (last && t->eow_suffix) sbuf_add(&s->s, t->eow_suffix, strlen(t->eow_suffix));
    return vocab_get(t, s->s.p, s->s.len);
}

int tok_bpe_word(const struct tokenizer *t, struct bpe_scratch *s, const char *w, size_t n,
                 int32_t **ids, int *num, int *cap) {
    if (n == 0) return VLLM_OK;
    if (t->ignore_merges) {
        int32_t id = vocab_get(t, w, n);
        if (id >= 0) {
            push_id(ids, num, cap, id);
            return VLLM_OK;
        }
    }
    s->n_sym = 0;
    int32_t unk_pending = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = (size_t)utf8_decode((const uint8_t *)w + i, &cp);
        int32_t id = char_lookup(t, s, w + i, k, i == 0, i + k == n);
        if (id >= 0) {
            if (unk_pending >= 0) {
                sym_add(s, unk_pending, unk_len);
                unk_pending = -1;
            }
            sym_add(s, id, (uint32_t)k);
        } else {
            int done = 0;
            if (t->byte_fallback) { // every byte of the char (with prefix/suffix) as <0xXX>
                const char *b = t->char_id ? w + i : s->s.p;
                size_t bl = t->char_id ? k : s->s.len;
                done = 1;
                for (size_t j = 0; j < bl; j++) done &= t->byte_id[(uint8_t)b[j]] >= 0;
                if (done) // like the HF crate, a pending unk is not flushed first
                    for (size_t j = 0; j < bl; j++) sym_add(s, t->byte_id[(uint8_t)b[j]], 1);
            }
            if (!done && t->unk_id >= 0) {
                if (unk_pending >= 0 && t->fuse_unk) {
                    unk_len += (uint32_t)k;
                } else {
                    if (unk_pending >= 0) sym_add(s, unk_pending, unk_len);
                    unk_pending = t->unk_id;
                    unk_len = (uint32_t)k;
                }
            }
        }
        i += k;
    }
    if (unk_pending >= 0) sym_add(s, unk_pending, unk_len);
    merge_all(t, s);
    for (int i = 0; i < s->n_sym; i++)
        if (s->sym[i].len) push_id(ids, num, cap, s->sym[i].id);
    return VLLM_OK;
}
