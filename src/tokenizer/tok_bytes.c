// tok_bytes.c - the raw bytes one token id adds to a decoded text, for
// constrained decoding (src/structured), whose grammars match bytes. It runs
// the decoder chain on the one token the way tok_decode does inside a longer
// sequence: byte-level chars become their bytes, "<0xXX>" byte-fallback
// pieces become the byte, Metaspace's replacement is always a space (the
// token is never the first of the text: the prompt precedes it), and a Strip
// after a Fuse is left out (it trims the whole text, not one token). Unlike
// tok_decode it keeps invalid UTF-8: a token may hold part of a character.
#include "core/common.h"
#include "tokenizer/tok_internal.h"

static int fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

// Replaces every `from` in b by `to` (to no longer than from: in place).
static void replace_all(struct sbuf *b, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to), o = 0;
    if (!fl || tl > fl) return;
    for (size_t i = 0; i < b->len;) {
        if (i + fl <= b->len && !memcmp(b->p + i, from, fl)) {
            memcpy(b->p + o, to, tl);
            o += tl;
            i += fl;
        } else {
            b->p[o++] = b->p[i++];
        }
    }
    b->len = o;
}

// One decoder on the token's bytes in b; *fused: a Fuse ran earlier.
static void apply(const struct decoder *d, struct sbuf *b, int *fused) {
    switch (d->type) {
    case DEC_SEQ:
        for (int i = 0; i < d->n_sub; i++) apply(d->sub[i], b, fused);
        break;
    case DEC_BYTELEVEL: { // all chars in the byte alphabet, or the token stays as is
        for (size_t j = 0; j < b->len;) {
            uint32_t cp;
            int bad, partial;
            if (!utf8_seq((const uint8_t *)b->p + j, b->len - j, &bad, &partial)) return;
            j += (size_t)utf8_decode((const uint8_t *)b->p + j, &cp);
            if (tok_char_byte(cp) < 0) return;
        }
        size_t o = 0;
        for (size_t j = 0; j < b->len;) {
            uint32_t cp;
            j += (size_t)utf8_decode((const uint8_t *)b->p + j, &cp);
            b->p[o++] = (char)tok_char_byte(cp); // o <= j: every char is 1+ bytes
        }
        b->len = o;
        break;
    }
    case DEC_BYTEFALLBACK: {
        int v = fallback_byte(b->p, b->len);
        if (v >= 0) {
            b->p[0] = (char)v;
            b->len = 1;
        }
        break;
    }
    case DEC_FUSE: *fused = 1; break;
    case DEC_STRIP:
        if (!*fused) { // per token: up to start leading / stop trailing content chars
            size_t cl = strlen(d->content), a = 0, e = b->len;
            for (int k = 0; k < d->start && e - a >= cl && !memcmp(b->p + a, d->content, cl); k++) a += cl;
            for (int k = 0; k < d->stop && e - a >= cl && !memcmp(b->p + e - cl, d->content, cl); k++) e -= cl;
            memmove(b->p, b->p + a, e - a);
            b->len = e - a;
        }
        break;
    case DEC_REPLACE:
        if (strlen(d->content) <= strlen(d->pattern)) replace_all(b, d->pattern, d->content);
        else { // a longer replacement: rebuild
            struct sbuf o = {0};
            size_t pl = strlen(d->pattern);
            for (size_t j = 0; j < b->len;) {
                if (pl && j + pl <= b->len && !memcmp(b->p + j, d->pattern, pl)) {
                    sbuf_add(&o, d->content, strlen(d->content));
                    j += pl;
                } else {
                    sbuf_add(&o, b->p + j++, 1);
                }
            }
            free(b->p);
            *b = o;
        }
        break;
    case DEC_METASPACE: replace_all(b, d->rep, " "); break;
    }
}

int tok_token_bytes(const struct tokenizer *t, int32_t id, char *buf, int cap) {
    size_t n;
    const char *s = tok_token_str(t, id, &n);
    if (!s) return -1;
    struct sbuf b = {0};
    sbuf_add(&b, s, n);
    int fused = 0;
    if (t->decoder) apply(t->decoder, &b, &fused);
    int len = (int)b.len;
    if (cap > 0) memcpy(buf, b.p, (size_t)MIN(len, cap));
    free(b.p);
    return len;
}
