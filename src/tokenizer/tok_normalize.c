// tok_normalize.c - normalizers: NFC/NFKC/NFD/NFKD (utf8proc), Lowercase,
// Strip, Prepend, Replace, Sequence. Each maps a valid UTF-8 string to another.
#include <utf8proc.h>

#include "core/common.h"
#include "tokenizer/tok_internal.h"

static int unicode_form(const char *s, size_t n, int flags, struct sbuf *o) {
    size_t i = 0;
    while (i < n && (uint8_t)s[i] < 0x80) i++;
    if (i == n) { // ASCII is already in every normal form
        sbuf_add(o, s, n);
        return VLLM_OK;
    }
    utf8proc_uint8_t *r = NULL;
    utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &r,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | flags));
    if (k < 0) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "normalizer: %s", utf8proc_errmsg(k));
    sbuf_add(o, r, (size_t)k);
    free(r);
    return VLLM_OK;
}

// Rust's char::to_lowercase, char by char: the simple mapping, plus the one
// unconditional multi-char lowercase mapping (U+0130 -> "i\u0307").
static void lowercase(const char *s, size_t n, struct sbuf *o) {
    sbuf_reserve(o, n + 8);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)utf8_decode((const uint8_t *)s + i, &cp);
        char b[8];
        int k;
        if (cp == 0x130) {
            memcpy(b, "i\xCC\x87", 3);
            k = 3;
        } else {
            k = utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), b);
        }
        sbuf_add(o, b, (size_t)k);
    }
}

static void strip(const char *s, size_t n, int left, int right, struct sbuf *o, int *lead_cut) {
    size_t a = 0, b = n;
    if (left) {
        while (a < b) {
            uint32_t cp;
            int k = utf8_decode((const uint8_t *)s + a, &cp);
            if (!uni_is_whitespace(cp)) break;
            a += (size_t)k;
        }
        if (a > 0) *lead_cut = 1;
    }
    if (right) {
        while (b > a) {
            size_t p = b - 1;
            while (p > a && ((uint8_t)s[p] & 0xC0) == 0x80) p--;
            uint32_t cp;
            utf8_decode((const uint8_t *)s + p, &cp);
            if (!uni_is_whitespace(cp)) break;
            b = p;
        }
    }
    sbuf_add(o, s + a, b - a);
}

static int replace(const struct normalizer *nz, const char *s, size_t n, struct sbuf *o) {
    int *m = NULL, num = 0, cap = 0;
    int rc = tok_regex_find_all(nz->re, s, n, &m, &num, &cap);
    if (rc) {
        free(m);
        return rc;
    }
    size_t prev = 0, cl = strlen(nz->str);
    for (int i = 0; i < num; i++) {
        sbuf_add(o, s + prev, (size_t)m[2 * i] - prev);
        sbuf_add(o, nz->str, cl);
        prev = (size_t)m[2 * i + 1];
    }
    sbuf_add(o, s + prev, n - prev);
    free(m);
    return VLLM_OK;
}

static int apply(const struct normalizer *nz, const char *s, size_t n, struct sbuf *o, int *lead_cut) {
    switch (nz->type) {
    case NORM_NFC: return unicode_form(s, n, UTF8PROC_COMPOSE, o);
    case NORM_NFKC: return unicode_form(s, n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, o);
    case NORM_NFD: return unicode_form(s, n, UTF8PROC_DECOMPOSE, o);
    case NORM_NFKD: return unicode_form(s, n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, o);
    case NORM_LOWER: lowercase(s, n, o); return VLLM_OK;
    case NORM_STRIP: strip(s, n, nz->left, nz->right, o, lead_cut); return VLLM_OK;
    case NORM_PREPEND:
        if (n) sbuf_add(o, nz->str, strlen(nz->str)); // HF prepends to non-empty text only
        sbuf_add(o, s, n);
        return VLLM_OK;
    case NORM_REPLACE: return replace(nz, s, n, o);
    case NORM_SEQ: {
        struct sbuf cur = {0}, nxt = {0};
        sbuf_add(&cur, s, n);
        for (int i = 0; i < nz->n_sub; i++) {
            nxt.len = 0;
            int rc = apply(nz->sub[i], cur.p ? cur.p : "", cur.len, &nxt, lead_cut);
            if (rc) {
                free(cur.p);
                free(nxt.p);
                return rc;
            }
            struct sbuf t = cur;
            cur = nxt;
            nxt = t;
        }
        sbuf_add(o, cur.p, cur.len);
        free(cur.p);
        free(nxt.p);
        return VLLM_OK;
    }
    }
    return vllm_err(VLLM_ERR_INTERNAL, "normalizer type %d", (int)nz->type);
}

int tok_normalize(const struct normalizer *nz, const char *s, size_t len, char **out,
                  size_t *out_len, int *lead_cut) {
    struct sbuf o = {0};
    int rc = apply(nz, s, len, &o, lead_cut);
    if (rc) {
        free(o.p);
        return rc;
    }
    sbuf_reserve(&o, 1);
    o.p[o.len] = 0;
    *out = o.p;
    *out_len = o.len;
    return VLLM_OK;
}
