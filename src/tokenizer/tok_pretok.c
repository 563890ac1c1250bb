// tok_pretok.c - pre-tokenizers: ByteLevel, Split, Digits, Metaspace,
// Punctuation, Whitespace, WhitespaceSplit, Sequence.
//
// A pre-tokenizer turns each split (a range of the text buffer) into smaller
// splits. Like HF's NormalizedString::split, a pattern first yields pieces
// covering the split, each marked match or not; the behavior then merges or
// drops pieces, and empty pieces are dropped.
#include "core/common.h"
#include "tokenizer/tok_internal.h"

void splits_push(struct splits *s, uint32_t off, uint32_t len, int first) {
    xgrow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v);
    s->v[s->n++] = (struct split){off, len, first};
}

struct piece {
    uint32_t s, e;
    int match;
};
struct pieces {
    struct piece *v;
    int n, cap;
};

static void piece_push(struct pieces *p, uint32_t s, uint32_t e, int match) {
    xgrow((void **)&p->v, &p->cap, p->n + 1, sizeof *p->v);
    p->v[p->n++] = (struct piece){s, e, match};
}

// Applies HF's SplitDelimiterBehavior to pieces covering sp, appending the
// resulting non-empty splits to out. r is scratch.
static void emit(const struct split *sp, const struct pieces *pc, enum split_behavior b,
                 struct pieces *r, struct splits *out) {
    r->n = 0;
    int prev = 0;
    if (b == SPLIT_MERGED_NEXT) { // HF folds right to left
        for (int i = pc->n - 1; i >= 0; i--) {
            struct piece p = pc->v[i];
            if (p.match && !prev && r->n > 0) r->v[r->n - 1].s = p.s;
            else piece_push(r, p.s, p.e, 0);
            prev = p.match;
        }
        for (int i = r->n - 1; i >= 0; i--) {
            struct piece p = r->v[i];
            if (p.e > p.s) splits_push(out, sp->off + p.s, p.e - p.s, sp->first && p.s == 0);
        }
        return;
    }
    for (int i = 0; i < pc->n; i++) {
        struct piece p = pc->v[i];
        switch (b) {
        case SPLIT_REMOVED: piece_push(r, p.s, p.e, p.match); break;
        case SPLIT_CONTIGUOUS:
            if (p.match == prev && r->n > 0) r->v[r->n - 1].e = p.e;
            else piece_push(r, p.s, p.e, 0);
            break;
        case SPLIT_MERGED_PREV:
            if (p.match && !prev && r->n > 0) r->v[r->n - 1].e = p.e;
            else piece_push(r, p.s, p.e, 0);
            break;
        default: piece_push(r, p.s, p.e, 0); break; // Isolated
        }
        prev = p.match;
    }
    for (int i = 0; i < r->n; i++) {
        struct piece p = r->v[i];
        if (p.match || p.e == p.s) continue; // match here means "removed"
        splits_push(out, sp->off + p.s, p.e - p.s, sp->first && p.s == 0);
    }
}

// Pieces from regex matches (HF's Pattern impl for regexes).
static int regex_pieces(const struct tok_regex *re, const char *s, uint32_t n, int invert,
                        struct pieces *pc, int **m, int *mcap) {
    pc->n = 0;
    int num = 0;
    TRY(tok_regex_find_all(re, s, n, m, &num, mcap));
    uint32_t prev = 0;
    for (int i = 0; i < num; i++) {
        uint32_t a = (uint32_t)(*m)[2 * i], b = (uint32_t)(*m)[2 * i + 1];
        if (prev != a) piece_push(pc, prev, a, invert);
        piece_push(pc, a, b, !invert);
        prev = b;
    }
    if (prev != n) piece_push(pc, prev, n, invert);
    return VLLM_OK;
}

// Pieces from a char predicate: each matching char is its own piece.
static void char_pieces(const char *s, uint32_t n, int (*pred)(uint32_t), struct pieces *pc) {
    pc->n = 0;
    uint32_t last = 0;
    for (uint32_t i = 0; i < n;) {
        uint32_t cp;
        uint32_t k = (uint32_t)utf8_decode((const uint8_t *)s + i, &cp);
        if (pred(cp)) {
            if (last < i) piece_push(pc, last, i, 0);
            piece_push(pc, i, i + k, 1);
            last = i + k;
        }
        i += k;
    }
    if (last < n) piece_push(pc, last, n, 0);
}

static const char *const GPT2_RE =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// Oniguruma's Unicode \w (alphabetic, marks, decimal digits, connectors).
static const char *const WS_RE = "[\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}]+|[^\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\s]+";
const char *tok_gpt2_regex(void) { return GPT2_RE; }
const char *tok_ws_regex(void) { return WS_RE; }

struct pt_scratch {
    struct pieces pc, r;
    int *m, mcap;
    struct sbuf tmp;
};

// Appends a copy of text[off..off+len) transformed by the byte-level map.
static uint32_t bytelevel_map(struct sbuf *text, uint32_t off, uint32_t len, struct sbuf *tmp) {
    tmp->len = 0;
    for (uint32_t i = 0; i < len; i++) {
        const char *c = tok_byte_char[(uint8_t)text->p[off + i]];
        sbuf_add(tmp, c, strlen(c));
    }
    uint32_t at = (uint32_t)text->len;
    sbuf_add(text, tmp->p, tmp->len);
    return at;
}

static int run(const struct pretok *p, struct sbuf *text, struct splits *in, struct splits *out,
               struct pt_scratch *sc) {
    out->n = 0;
    for (int i = 0; i < in->n; i++) {
        struct split sp = in->v[i];
        switch (p->type) {
        case PT_SPLIT:
        case PT_WHITESPACE:
            TRY(regex_pieces(p->re, text->p + sp.off, sp.len, p->type == PT_WHITESPACE || p->invert,
                             &sc->pc, &sc->m, &sc->mcap));
            emit(&sp, &sc->pc, p->type == PT_WHITESPACE ? SPLIT_REMOVED : p->behavior, &sc->r, out);
            break;
        case PT_DIGITS:
            char_pieces(text->p + sp.off, sp.len, uni_is_numeric, &sc->pc);
            emit(&sp, &sc->pc, p->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, &sc->r, out);
            break;
        case PT_PUNCT:
            char_pieces(text->p + sp.off, sp.len, uni_is_punctuation, &sc->pc);
            emit(&sp, &sc->pc, p->behavior, &sc->r, out);
            break;
        case PT_WHITESPACE_SPLIT:
            char_pieces(text->p + sp.off, sp.len, uni_is_whitespace, &sc->pc);
            emit(&sp, &sc->pc, SPLIT_REMOVED, &sc->r, out);
            break;
        case PT_BYTELEVEL: {
            if (p->add_prefix_space && (sp.len == 0 || text->p[sp.off] != ' ')) {
                sc->tmp.len = 0;
                sbuf_add(&sc->tmp, " ", 1);
                sbuf_add(&sc->tmp, text->p + sp.off, sp.len);
                sp.off = (uint32_t)text->len;
                sp.len = (uint32_t)sc->tmp.len;
                sbuf_add(text, sc->tmp.p, sc->tmp.len);
            }
            int first = out->n;
            if (p->use_regex) {
                TRY(regex_pieces(p->re, text->p + sp.off, sp.len, 0, &sc->pc, &sc->m, &sc->mcap));
                emit(&sp, &sc->pc, SPLIT_ISOLATED, &sc->r, out);
            } else if (sp.len) {
                splits_push(out, sp.off, sp.len, sp.first);
            }
            for (int j = first; j < out->n; j++) {
                uint32_t len = out->v[j].len;
                uint32_t at = bytelevel_map(text, out->v[j].off, len, &sc->tmp);
                out->v[j].off = at;
                out->v[j].len = (uint32_t)text->len - at;
            }
            break;
        }
        case PT_METASPACE: {
            // Spaces become the replacement, then the prefix per prepend_scheme.
            struct sbuf *t = &sc->tmp;
            t->len = 0;
            size_t rl = strlen(p->rep);
            const char *s = text->p + sp.off;
            int starts_rep = 0;
            for (uint32_t k = 0; k < sp.len; k++) {
                if (s[k] == ' ') sbuf_add(t, p->rep, rl);
                else sbuf_add(t, s + k, 1);
            }
            starts_rep = t->len >= rl && !memcmp(t->p, p->rep, rl);
            int prepend = !starts_rep && (p->scheme == PREPEND_ALWAYS ||
                                          (p->scheme == PREPEND_FIRST && sp.first));
            uint32_t at = (uint32_t)text->len;
            if (prepend) sbuf_add(text, p->rep, rl);
            sbuf_add(text, t->p, t->len);
            struct split ns = {at, (uint32_t)text->len - at, sp.first};
            if (!p->split) {
                if (ns.len) splits_push(out, ns.off, ns.len, ns.first);
                break;
            }
            // Split on the replacement char, MergedWithNext.
            struct pieces *pc = &sc->pc;
            pc->n = 0;
            uint32_t last = 0;
            const char *q = text->p + ns.off;
            for (uint32_t k = 0; k + rl <= ns.len;) {
                if (!memcmp(q + k, p->rep, rl)) {
                    if (last < k) piece_push(pc, last, k, 0);
                    piece_push(pc, k, k + (uint32_t)rl, 1);
                    k += (uint32_t)rl;
                    last = k;
                } else {
                    k++;
                }
            }
            if (last < ns.len) piece_push(pc, last, ns.len, 0);
            emit(&ns, pc, SPLIT_MERGED_NEXT, &sc->r, out);
            break;
        }
        case PT_SEQ: break;
        }
    }
    return VLLM_OK;
}

static int pretok_rec(const struct pretok *p, struct sbuf *text, struct splits *cur,
                      struct splits *tmp, struct pt_scratch *sc) {
    if (p->type == PT_SEQ) {
        for (int i = 0; i < p->n_sub; i++) TRY(pretok_rec(p->sub[i], text, cur, tmp, sc));
        return VLLM_OK;
    }
    TRY(run(p, text, cur, tmp, sc));
    struct splits t = *cur;
    *cur = *tmp;
    *tmp = t;
    return VLLM_OK;
}

int tok_pretokenize(const struct pretok *p, struct sbuf *text, struct splits *in, struct splits *tmp) {
    struct pt_scratch sc = {0};
    int rc = pretok_rec(p, text, in, tmp, &sc);
    free(sc.pc.v);
    free(sc.r.v);
    free(sc.m);
    free(sc.tmp.p);
    return rc;
}
