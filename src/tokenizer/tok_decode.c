// tok_decode.c - ids -> text: each id's string (added token content or vocab
// entry, special ones dropped on request) goes through the decoder chain, as
// a list of strings that each decoder maps to a new list (HF decode_chain),
// and the final list is concatenated.
#include "core/common.h"
#include "tokenizer/tok_internal.h"

struct toks {
    struct sbuf buf;
    uint32_t *off, *len;
    int n, cap;
};

static void toks_add(struct toks *t, const char *s, size_t n) {
    if (t->n + 1 > t->cap) {
        int c = t->cap ? t->cap * 2 : 16;
        t->off = xrealloc(t->off, (size_t)c * sizeof *t->off);
        t->len = xrealloc(t->len, (size_t)c * sizeof *t->len);
        t->cap = c;
    }
    t->off[t->n] = (uint32_t)t->buf.len;
    t->len[t->n++] = (uint32_t)n;
    sbuf_add(&t->buf, s, n);
}

static void toks_free(struct toks *t) {
    free(t->buf.p);
    free(t->off);
    free(t->len);
}

#define TOK(t, i) ((t)->buf.p + (t)->off[i])

const char *tok_token_str(const struct tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->vocab_size) return NULL;
    if (t->added_by_id[id] >= 0) {
        const struct added_token *a = &t->added[t->added_by_id[id]];
        *len = a->piece_len;
        return a->piece;
    }
    if (id < t->n_ids && t->tok_len[id] != UINT32_MAX) {
        *len = t->tok_len[id];
        return t->arena.p + t->tok_off[id];
    }
    return NULL;
}

// "<0xXX>" -> byte (Rust's u8::from_str_radix(.., 16) on the two chars).
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0, digits = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) {
            if (i == 3 && c == '+') continue;
            return -1;
        }
        v = v * 16 + d;
        digits++;
    }
    return digits ? v : -1;
}

static void flush_bytes(struct toks *o, struct sbuf *bytes) {
    if (!bytes->len) return;
    if (utf8_valid(bytes->p, bytes->len)) toks_add(o, bytes->p, bytes->len);
    else
        for (size_t i = 0; i < bytes->len; i++) toks_add(o, "\xEF\xBF\xBD", 3);
    bytes->len = 0;
}

static int step(const struct decoder *d, const struct toks *in, struct toks *o) {
    struct sbuf tmp = {0};
    switch (d->type) {
    case DEC_BYTELEVEL: { // chars -> bytes (a token with a char outside the alphabet stays as is)
        for (int i = 0; i < in->n; i++) {
            const char *s = TOK(in, i);
            size_t n = in->len[i], mark = tmp.len;
            int ok = 1;
            for (size_t j = 0; j < n && ok;) {
                uint32_t cp;
                j += (size_t)utf8_decode((const uint8_t *)s + j, &cp);
                int b = tok_char_byte(cp);
                if (b < 0) ok = 0;
                else {
                    uint8_t c = (uint8_t)b;
                    sbuf_add(&tmp, &c, 1);
                }
            }
            if (!ok) {
                tmp.len = mark;
                sbuf_add(&tmp, s, n);
            }
        }
        size_t l;
        char *u = utf8_lossy(tmp.p ? tmp.p : "", tmp.len, &l);
        toks_add(o, u, l);
        free(u);
        break;
    }
    case DEC_BYTEFALLBACK:
        for (int i = 0; i < in->n; i++) {
            int b = byte_token(TOK(in, i), in->len[i]);
            if (b >= 0) {
                uint8_t c = (uint8_t)b;
                sbuf_add(&tmp, &c, 1);
            } else {
                flush_bytes(o, &tmp);
                toks_add(o, TOK(in, i), in->len[i]);
            }
        }
        flush_bytes(o, &tmp);
        break;
    case DEC_FUSE:
        for (int i = 0; i < in->n; i++) sbuf_add(&tmp, TOK(in, i), in->len[i]);
        toks_add(o, tmp.p ? tmp.p : "", tmp.len);
        break;
    case DEC_STRIP: { // up to `start` leading and `stop` trailing content chars per token
        size_t cl = strlen(d->content);
        for (int i = 0; i < in->n; i++) {
            const char *s = TOK(in, i);
            size_t a = 0, b = in->len[i];
            for (int k = 0; k < d->start && b - a >= cl && !memcmp(s + a, d->content, cl); k++) a += cl;
            for (int k = 0; k < d->stop && b - a >= cl && !memcmp(s + b - cl, d->content, cl); k++) b -= cl;
            toks_add(o, s + a, b - a);
        }
        break;
    }
    case DEC_REPLACE: {
        size_t pl = strlen(d->pattern), cl = strlen(d->content);
        for (int i = 0; i < in->n; i++) {
            const char *s = TOK(in, i);
            size_t n = in->len[i];
            tmp.len = 0;
            for (size_t j = 0; j < n;) {
                if (pl && j + pl <= n && !memcmp(s + j, d->pattern, pl)) {
                    sbuf_add(&tmp, d->content, cl);
                    j += pl;
                } else {
                    sbuf_add(&tmp, s + j, 1);
                    j++;
                }
            }
            toks_add(o, tmp.p ? tmp.p : "", tmp.len);
        }
        break;
    }
    case DEC_METASPACE: { // replacement -> ' '; dropped in the first token unless "never"
        size_t rl = strlen(d->rep);
        for (int i = 0; i < in->n; i++) {
            const char *s = TOK(in, i);
            size_t n = in->len[i];
            tmp.len = 0;
            for (size_t j = 0; j < n;) {
                if (j + rl <= n && !memcmp(s + j, d->rep, rl)) {
                    if (!(i == 0 && d->scheme != PREPEND_NEVER)) sbuf_add(&tmp, " ", 1);
                    j += rl;
                } else {
                    sbuf_add(&tmp, s + j, 1);
                    j++;
                }
            }
            toks_add(o, tmp.p ? tmp.p : "", tmp.len);
        }
        break;
    }
    case DEC_SEQ: break;
    }
    free(tmp.p);
    return VLLM_OK;
}

static void chain(const struct decoder *d, struct toks *cur) {
    if (d->type == DEC_SEQ) {
        for (int i = 0; i < d->n_sub; i++) chain(d->sub[i], cur);
        return;
    }
    struct toks o = {0};
    step(d, cur, &o);
    toks_free(cur);
    *cur = o;
}

int tok_decode(const struct tokenizer *t, const int32_t *ids, int num_ids, int skip_special,
               char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    struct toks cur = {0};
    for (int i = 0; i < num_ids; i++) {
        size_t n;
        const char *s = tok_token_str(t, ids[i], &n);
        if (!s) {
            toks_free(&cur);
            return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "decode: token id %d is not in the vocabulary (size %d)",
                            (int)ids[i], t->vocab_size);
        }
        if (skip_special && tok_is_special(t, ids[i])) continue;
        toks_add(&cur, s, n);
    }
    struct sbuf out = {0};
    if (t->decoder) {
        chain(t->decoder, &cur);
        for (int i = 0; i < cur.n; i++) sbuf_add(&out, TOK(&cur, i), cur.len[i]);
    } else { // no decoder: HF joins the tokens with spaces
        for (int i = 0; i < cur.n; i++) {
            if (i) sbuf_add(&out, " ", 1);
            sbuf_add(&out, TOK(&cur, i), cur.len[i]);
        }
    }
    toks_free(&cur);
    sbuf_reserve(&out, 1);
    out.p[out.len] = 0;
    *text = out.p;
    if (len) *len = out.len;
    return VLLM_OK;
}
