// tok_util.c - UTF-8, Unicode properties, buffers and hash maps of the tokenizer.
#include <utf8proc.h>

#include "core/common.h"
#include "tokenizer/tok_internal.h"

// ------------------------------------------------------------------ UTF-8 --

int utf8_seq(const uint8_t *s, size_t n, int *bad, int *partial) {
    *bad = 1;
    *partial = 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int need;
    uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n) {
            *bad = i;
            *partial = 1;
            return 0;
        }
        uint8_t b = s[i];
        int ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        if (!ok) {
            *bad = i;
            return 0;
        }
    }
    return need + 1;
}

int utf8_decode(const uint8_t *s, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) return *cp = c, 1;
    if (c < 0xE0) return *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F), 2;
    if (c < 0xF0)
        return *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F), 3;
    *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

int utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int utf8_valid(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int bad, partial, k = utf8_seq(u + i, n - i, &bad, &partial);
        if (!k) return 0;
        i += (size_t)k;
    }
    return 1;
}

char *utf8_lossy(const char *s, size_t n, size_t *out_len) {
    const uint8_t *u = (const uint8_t *)s;
    struct sbuf b = {0};
    sbuf_reserve(&b, n + 1);
    for (size_t i = 0; i < n;) {
        int bad, partial, k = u[i] < 0x80 ? 1 : utf8_seq(u + i, n - i, &bad, &partial);
        if (k) {
            sbuf_add(&b, u + i, (size_t)k);
            i += (size_t)k;
        } else {
            sbuf_add(&b, "\xEF\xBF\xBD", 3);
            i += (size_t)bad;
        }
    }
    sbuf_reserve(&b, 1);
    b.p[b.len] = 0;
    *out_len = b.len;
    return b.p;
}

int uni_is_whitespace(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

int uni_is_numeric(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int uni_is_punctuation(uint32_t cp) {
    if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
                          (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

// ------------------------------------------------------------------ sbuf --

void sbuf_reserve(struct sbuf *b, size_t extra) {
    if (b->p && b->len + extra <= b->cap) return; // after any call, p is not NULL
    size_t c = b->cap ? b->cap : 64;
    while (c < b->len + extra) c *= 2;
    b->p = xrealloc(b->p, c);
    b->cap = c;
}

void sbuf_add(struct sbuf *b, const void *s, size_t n) {
    sbuf_reserve(b, n);
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
}

// -------------------------------------------------------------- hash maps --

uint64_t tok_hash(const void *s, size_t n) {
    const uint8_t *p = s;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, p, n);
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    return h | 1; // 0 marks an empty slot
}

void strmap_init(struct strmap *m, int expected) {
    uint32_t cap = 16;
    while (cap < (uint32_t)expected * 2 + 16) cap *= 2;
    m->hash = xcalloc(cap, sizeof *m->hash);
    m->id = xmalloc(cap * sizeof *m->id);
    m->mask = cap - 1;
    m->count = 0;
}

void strmap_free(struct strmap *m) {
    free(m->hash);
    free(m->id);
    memset(m, 0, sizeof *m);
}

static void strmap_grow(struct strmap *m) {
    struct strmap n;
    strmap_init(&n, (int)(m->mask + 1));
    for (uint32_t i = 0; i <= m->mask; i++) {
        if (!m->hash[i]) continue;
        uint32_t j = (uint32_t)m->hash[i] & n.mask;
        while (n.hash[j]) j = (j + 1) & n.mask;
        n.hash[j] = m->hash[i];
        n.id[j] = m->id[i];
    }
    n.count = m->count;
    free(m->hash);
    free(m->id);
    *m = n;
}

int32_t strmap_put(struct strmap *m, const void *owner, strmap_key_fn key, int32_t id) {
    if ((uint32_t)(m->count + 1) * 2 > m->mask + 1) strmap_grow(m);
    size_t n;
    const char *s = key(owner, id, &n);
    uint64_t h = tok_hash(s, n);
    uint32_t j = (uint32_t)h & m->mask;
    while (m->hash[j]) {
        if (m->hash[j] == h) {
            size_t n2;
            const char *s2 = key(owner, m->id[j], &n2);
            if (n2 == n && !memcmp(s, s2, n)) {
                int32_t old = m->id[j];
                m->id[j] = id;
                return old;
            }
        }
        j = (j + 1) & m->mask;
    }
    m->hash[j] = h;
    m->id[j] = id;
    m->count++;
    return -1;
}

int32_t strmap_get(const struct strmap *m, const void *owner, strmap_key_fn key, const char *s,
                   size_t n) {
    if (!m->hash) return -1;
    uint64_t h = tok_hash(s, n);
    uint32_t j = (uint32_t)h & m->mask;
    while (m->hash[j]) {
        if (m->hash[j] == h) {
            size_t n2;
            const char *s2 = key(owner, m->id[j], &n2);
            if (n2 == n && !memcmp(s, s2, n)) return m->id[j];
        }
        j = (j + 1) & m->mask;
    }
    return -1;
}
