// tok_regex.c - tokenizer.json regexes (Oniguruma syntax, as the HF crate
// compiles them) on PCRE2 with JIT, in UTF + UCP mode.
//
// The one difference that matters for real patterns is \s: Oniguruma's is
// Unicode White_Space (it includes U+0085), PCRE2's is not. We rewrite \s and
// \S into explicit classes. Constructs whose meaning differs and that we do not
// translate (Oniguruma's class intersection "&&", \S inside a class) are
// refused with VLLM_ERR_UNSUPPORTED rather than approximated.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/common.h"
#include "tokenizer/tok_internal.h"

struct tok_regex {
    pcre2_code *code; // NULL for a literal
    int jit;
    char *lit;
    size_t lit_len;
};

#define WS_CLASS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static int translate(const char *p, size_t n, struct sbuf *o) {
    int in_class = 0; // inside [...]; position right after '[' or '[^' matters for ']'
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[++i];
            if (e == 's') {
                if (in_class) sbuf_add(o, WS_CLASS, strlen(WS_CLASS));
                else sbuf_add(o, "[" WS_CLASS "]", strlen(WS_CLASS) + 2);
            } else if (e == 'S') {
                if (in_class) return vllm_err(VLLM_ERR_UNSUPPORTED, "regex: \\S inside a character class");
                sbuf_add(o, "[^" WS_CLASS "]", strlen(WS_CLASS) + 3);
            } else if (e == 'h' || e == 'H') { // Oniguruma: hex digit
                const char *h = e == 'h' ? "0-9a-fA-F" : "^0-9a-fA-F";
                if (in_class) {
                    if (e == 'H') return vllm_err(VLLM_ERR_UNSUPPORTED, "regex: \\H inside a character class");
                    sbuf_add(o, h, strlen(h));
                } else {
                    sbuf_add(o, "[", 1);
                    sbuf_add(o, h, strlen(h));
                    sbuf_add(o, "]", 1);
                }
            } else {
                char b[2] = {'\\', e};
                sbuf_add(o, b, 2);
            }
            continue;
        }
        if (in_class) {
            if (c == '[') {
                if (i + 1 < n && p[i + 1] == ':') { // POSIX [:alpha:] passes through
                    const char *end = memchr(p + i + 2, ']', n - i - 2);
                    if (!end) return vllm_err(VLLM_ERR_FORMAT, "regex: unterminated POSIX class");
                    sbuf_add(o, p + i, (size_t)(end - (p + i)) + 1);
                    i = (size_t)(end - p);
                    continue;
                }
                return vllm_err(VLLM_ERR_UNSUPPORTED, "regex: nested character class");
            }
            if (c == '&' && i + 1 < n && p[i + 1] == '&')
                return vllm_err(VLLM_ERR_UNSUPPORTED, "regex: character class intersection &&");
            if (c == ']') in_class = 0;
            sbuf_add(o, &c, 1);
            continue;
        }
        sbuf_add(o, &c, 1);
        if (c == '[') {
            in_class = 1;
            // A ']' right after '[' or '[^' is a literal in both dialects.
            if (i + 1 < n && p[i + 1] == '^') sbuf_add(o, &p[++i], 1);
            if (i + 1 < n && p[i + 1] == ']') sbuf_add(o, &p[++i], 1);
        }
    }
    if (in_class) return vllm_err(VLLM_ERR_FORMAT, "regex: unterminated character class");
    return VLLM_OK;
}

int tok_regex_compile(const char *pattern, size_t len, int literal, struct tok_regex **out) {
    struct tok_regex *re = xcalloc(1, sizeof *re);
    if (literal) {
        if (len == 0) {
            free(re);
            return vllm_err(VLLM_ERR_FORMAT, "empty split pattern");
        }
        re->lit = xmalloc(len + 1);
        memcpy(re->lit, pattern, len);
        re->lit[len] = 0;
        re->lit_len = len;
        *out = re;
        return VLLM_OK;
    }
    struct sbuf t = {0};
    int rc = translate(pattern, len, &t);
    if (rc) {
        free(t.p);
        free(re);
        return vllm_err_prefix(rc, "pattern '%.*s'", (int)MIN(len, 200), pattern);
    }
    int err;
    PCRE2_SIZE off;
    re->code = pcre2_compile((PCRE2_SPTR)(t.p ? t.p : ""), t.len, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    free(t.p);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        free(re);
        return vllm_err(VLLM_ERR_UNSUPPORTED, "regex '%.*s': %s at offset %zu", (int)MIN(len, 200),
                        pattern, (char *)msg, (size_t)off);
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    *out = re;
    return VLLM_OK;
}

void tok_regex_free(struct tok_regex *re) {
    if (!re) return;
    if (re->code) pcre2_code_free(re->code);
    free(re->lit);
    free(re);
}

static void push_match(int **m, int *num, int *cap, size_t s, size_t e) {
    xgrow((void **)m, cap, *num * 2 + 2, sizeof **m);
    (*m)[*num * 2] = (int)s;
    (*m)[*num * 2 + 1] = (int)e;
    (*num)++;
}

static size_t next_char(const char *s, size_t n, size_t i) {
    i++;
    while (i < n && ((uint8_t)s[i] & 0xC0) == 0x80) i++;
    return i;
}

int tok_regex_find_all(const struct tok_regex *re, const char *s, size_t n, int **m, int *num,
                       int *cap) {
    if (re->lit) {
        for (size_t i = 0; i + re->lit_len <= n;) {
            const char *f = memmem(s + i, n - i, re->lit, re->lit_len);
            if (!f) break;
            size_t at = (size_t)(f - s);
            push_match(m, num, cap, at, at + re->lit_len);
            i = at + re->lit_len;
        }
        return VLLM_OK;
    }
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    pcre2_match_context *mc = NULL;
    pcre2_jit_stack *js = NULL;
    size_t pos = 0, last_end = (size_t)-1;
    int rc = VLLM_OK;
    while (pos <= n) {
        int r = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mc)
                        : -999;
        if (r == PCRE2_ERROR_JIT_STACKLIMIT && !mc) { // the default 32 KiB: retry with up to 64 MiB
            js = pcre2_jit_stack_create(1 << 16, 1 << 26, NULL);
            mc = pcre2_match_context_create(NULL);
            pcre2_jit_stack_assign(mc, NULL, js);
            continue;
        }
        if (r < 0 && r != PCRE2_ERROR_NOMATCH) // no JIT, or its stack ran out anyway
            r = pcre2_match(re->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (r == PCRE2_ERROR_NOMATCH) break;
        if (r < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(r, msg, sizeof msg);
            rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT, "regex match failed: %s", (char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && ms == last_end) { // no empty match right after a match
            if (pos >= n) break;
            pos = next_char(s, n, pos);
            continue;
        }
        push_match(m, num, cap, ms, me);
        last_end = me;
        pos = me;
    }
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    if (js) pcre2_jit_stack_free(js);
    return rc;
}
