// tok_encode.c - text -> ids, in the HF crate's order: added tokens are cut
// out of the raw text, the rest is normalized, normalized added tokens are cut
// out of that, the rest is pre-tokenized, BPE runs on each pre-token, and the
// post-processor adds the special tokens around the sequence.
#include <utf8proc.h>

#include "core/common.h"
#include "tokenizer/tok_internal.h"

struct enc {
    const struct tokenizer *t;
    struct sbuf text; // pre-tokenizer work buffer
    struct splits a, b;
    struct bpe_scratch *bpe;
    int32_t *ids;
    int num, cap;
};

static void push_id(struct enc *e, int32_t id) {
    xgrow((void **)&e->ids, &e->cap, e->num + 1, sizeof *e->ids);
    e->ids[e->num++] = id;
}

static int is_word_char(uint32_t cp) { // Rust char::is_alphanumeric
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static size_t char_start_before(const char *s, size_t i) {
    do i--;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80);
    return i;
}

static int ends_with_word(const char *s, size_t end) {
    if (end == 0) return 0;
    uint32_t cp;
    utf8_decode((const uint8_t *)s + char_start_before(s, end), &cp);
    return is_word_char(cp);
}

static int starts_with_word(const char *s, size_t at, size_t n) {
    if (at >= n) return 0;
    uint32_t cp;
    utf8_decode((const uint8_t *)s + at, &cp);
    return is_word_char(cp);
}

// Where a run of whitespace ending at `end` starts (HF space_leftmost_at_end).
static size_t space_left(const char *s, size_t end) {
    size_t left = end;
    while (left > 0) {
        size_t p = char_start_before(s, left);
        uint32_t cp;
        utf8_decode((const uint8_t *)s + p, &cp);
        if (!uni_is_whitespace(cp)) break;
        left = p;
    }
    return left;
}

static size_t space_right(const char *s, size_t at, size_t n) {
    while (at < n) {
        uint32_t cp;
        int k = utf8_decode((const uint8_t *)s + at, &cp);
        if (!uni_is_whitespace(cp)) break;
        at += (size_t)k;
    }
    return at;
}

// A piece of text between added tokens.
typedef int (*piece_fn)(struct enc *e, const char *s, size_t n, int first);

// HF AddedVocabulary::find_matches: cuts s into added tokens (honouring
// single_word, lstrip and rstrip) and the text between them.
static int split_added(struct enc *e, const struct matcher *m, const char *s, size_t n, int first,
                       piece_fn piece) {
    size_t from = 0, done = 0, ms, me;
    int32_t v;
    while (matcher_find(m, s, n, from, &ms, &me, &v)) {
        const struct added_token *at = &e->t->added[v];
        from = me;
        if (at->single_word && (ends_with_word(s, ms) || starts_with_word(s, me, n))) continue;
        size_t start = ms, stop = me;
        if (at->lstrip) start = MAX(space_left(s, ms), done);
        if (at->rstrip) stop = space_right(s, me, n);
        if (done < start) TRY(piece(e, s + done, start - done, first && done == 0));
        push_id(e, at->id);
        done = stop;
    }
    if (done < n) TRY(piece(e, s + done, n - done, first && done == 0));
    return VLLM_OK;
}

// Pre-tokenizes and runs the model on a piece of normalized text.
static int model_piece(struct enc *e, const char *s, size_t n, int first) {
    const struct tokenizer *t = e->t;
    e->text.len = 0;
    sbuf_add(&e->text, s, n);
    e->a.n = 0;
    splits_push(&e->a, 0, (uint32_t)n, first);
    if (t->pretok) TRY(tok_pretokenize(t->pretok, &e->text, &e->a, &e->b));
    for (int i = 0; i < e->a.n; i++)
        TRY(tok_bpe_word(t, e->bpe, e->text.p + e->a.v[i].off, e->a.v[i].len, &e->ids, &e->num, &e->cap));
    return VLLM_OK;
}

static int normalized_piece(struct enc *e, const char *s, size_t n, int first) {
    const struct tokenizer *t = e->t;
    if (!t->normalizer) return split_added(e, &t->match_norm, s, n, first, model_piece);
    char *ns;
    size_t nl;
    int lead_cut = 0;
    TRY(tok_normalize(t->normalizer, s, n, &ns, &nl, &lead_cut));
    int rc = split_added(e, &t->match_norm, ns, nl, first && !lead_cut, model_piece);
    free(ns);
    return rc;
}

int tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_special,
               int32_t **ids, int *num_ids) {
    *ids = NULL;
    *num_ids = 0;
    if (len > INT32_MAX / 4) return vllm_err(VLLM_ERR_TOO_LONG, "tokenize: text of %zu bytes", len);
    char *clean = NULL;
    if (!utf8_valid(text, len)) { // as HF callers see it: from_utf8_lossy
        clean = utf8_lossy(text, len, &len);
        text = clean;
    }
    struct enc e = {.t = t, .bpe = bpe_scratch_new()};
    if (add_special)
        for (int i = 0; i < t->n_pre; i++) push_id(&e, t->pre_ids[i]);
    int rc = split_added(&e, &t->match_raw, text ? text : "", len, 1, normalized_piece);
    if (add_special)
        for (int i = 0; i < t->n_post; i++) push_id(&e, t->post_ids[i]);
    free(clean);
    free(e.text.p);
    free(e.a.v);
    free(e.b.v);
    bpe_scratch_free(e.bpe);
    if (rc) {
        free(e.ids);
        return rc;
    }
    if (!e.ids) e.ids = xmalloc(sizeof *e.ids);
    *ids = e.ids;
    *num_ids = e.num;
    return VLLM_OK;
}

int tok_vocab_size(const struct tokenizer *t) { return t->vocab_size; }

const char *tok_id_to_piece(const struct tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->vocab_size) return NULL;
    if (t->added_by_id[id] >= 0) return t->added[t->added_by_id[id]].piece;
    if (id < t->n_ids && t->tok_len[id] != UINT32_MAX) return t->arena.p + t->tok_off[id];
    return NULL;
}

int tok_is_special(const struct tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->vocab_size || t->added_by_id[id] < 0) return 0;
    return t->added[t->added_by_id[id]].special;
}
