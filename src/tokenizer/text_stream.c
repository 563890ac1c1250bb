// text_stream.c - streaming detokenizer and stop strings.
//
// Each push decodes a short window of ids twice: [prefix, read) (text already
// shown) and [prefix, n); the new text is the difference. Decoding the same
// leading token both times cancels what decoders do to a first token (Strip,
// Metaspace). Text is held back while it ends in U+FFFD (a byte sequence that
// later tokens may complete) and, with ByteFallback, while the last token is a
// byte token (its group is decoded as a whole). flush() checks the result
// against one full decode and emits the exact remainder.
#include "core/common.h"
#include "tokenizer/tok_internal.h"

#define CONTEXT_IDS 6 // prompt ids decoded as context before the first output token

struct text_stream {
    const struct tokenizer *t;
    int skip_special, include_stop, stopped, byte_fallback;
    int32_t *ids;
    int n, cap, n_ctx;
    int prefix_off, read_off;
    char *prefix_text;
    size_t prefix_len;
    struct sbuf text; // all text produced (held back or emitted)
    size_t emitted;
    char **stop;
    size_t *stop_len, max_stop;
    int n_stop;
    int stop_hit; // the stop string that matched; -1: none
};

static int has_byte_fallback(const struct decoder *d) {
    if (!d) return 0;
    if (d->type == DEC_BYTEFALLBACK) return 1;
    for (int i = 0; i < d->n_sub; i++)
        if (has_byte_fallback(d->sub[i])) return 1;
    return 0;
}

static char *decode_range(const struct text_stream *s, int from, int to, size_t *len) {
    char *out = NULL;
    if (tok_decode(s->t, s->ids + from, to - from, s->skip_special, &out, len)) {
        // Ids were checked at push; a failure here is a bug, not bad input.
        *len = 0;
        return xstrdup("");
    }
    return out;
}

struct text_stream *text_stream_create(const struct tokenizer *t, const int32_t *prompt_ids,
                                       int num_prompt, int skip_special,
                                       const char *const *stop, int num_stop, int include_stop) {
    struct text_stream *s = xcalloc(1, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    s->include_stop = include_stop;
    s->stop_hit = -1;
    s->byte_fallback = has_byte_fallback(t->decoder);
    xgrow((void **)&s->ids, &s->cap, 16, sizeof *s->ids);
    int k = MIN(MAX(num_prompt, 0), CONTEXT_IDS);
    for (int i = num_prompt - k; i < num_prompt; i++) {
        if (prompt_ids[i] < 0 || prompt_ids[i] >= t->vocab_size) continue;
        xgrow((void **)&s->ids, &s->cap, s->n + 1, sizeof *s->ids);
        s->ids[s->n++] = prompt_ids[i];
    }
    s->n_ctx = s->read_off = s->n;
    s->prefix_text = decode_range(s, 0, s->n, &s->prefix_len);
    if (num_stop > 0) {
        s->stop = xcalloc((size_t)num_stop, sizeof *s->stop);
        s->stop_len = xcalloc((size_t)num_stop, sizeof *s->stop_len);
        for (int i = 0; i < num_stop; i++) {
            if (!stop[i] || !*stop[i]) continue; // an empty stop string never matches
            s->stop[s->n_stop] = xstrdup(stop[i]);
            s->stop_len[s->n_stop] = strlen(stop[i]);
            s->max_stop = MAX(s->max_stop, s->stop_len[s->n_stop]);
            s->n_stop++;
        }
    }
    sbuf_reserve(&s->text, 1);
    return s;
}

void text_stream_free(struct text_stream *s) {
    if (!s) return;
    for (int i = 0; i < s->n_stop; i++) free(s->stop[i]);
    free(s->stop);
    free(s->stop_len);
    free(s->ids);
    free(s->prefix_text);
    free(s->text.p);
    free(s);
}

static void out_add(char **out, size_t *out_len, const char *p, size_t n) {
    if (!n) return;
    *out = xrealloc(*out, *out_len + n + 1);
    memcpy(*out + *out_len, p, n);
    *out_len += n;
    (*out)[*out_len] = 0;
}

// Appends new text, looks for stop strings in what they could now end in,
// and emits what can no longer be part of one. Returns 1 on a stop.
static int add_text(struct text_stream *s, const char *p, size_t n, int final, char **out, size_t *out_len) {
    size_t old = s->text.len;
    sbuf_add(&s->text, p, n);
    const char *tx = s->text.p;
    size_t len = s->text.len;
    size_t from = old >= s->max_stop ? old - s->max_stop + 1 : 0;
    from = MAX(from, s->emitted);
    size_t best = SIZE_MAX, best_len = 0;
    for (int i = 0; i < s->n_stop; i++) {
        if (len - from < s->stop_len[i]) continue;
        const char *f = memmem(tx + from, len - from, s->stop[i], s->stop_len[i]);
        if (f && (size_t)(f - tx) < best) {
            best = (size_t)(f - tx);
            best_len = s->stop_len[i];
            s->stop_hit = i;
        }
    }
    if (best != SIZE_MAX) {
        size_t end = best + (s->include_stop ? best_len : 0);
        if (end > s->emitted) out_add(out, out_len, tx + s->emitted, end - s->emitted);
        s->emitted = MAX(s->emitted, end);
        s->stopped = 1;
        return 1;
    }
    size_t hold = 0;
    if (!final)
        for (int i = 0; i < s->n_stop; i++)
            for (size_t k = MIN(s->stop_len[i] - 1, len - s->emitted); k > hold; k--)
                if (!memcmp(tx + len - k, s->stop[i], k)) {
                    hold = k;
                    break;
                }
    if (len - hold > s->emitted) out_add(out, out_len, tx + s->emitted, len - hold - s->emitted);
    s->emitted = MAX(s->emitted, len - hold);
    return 0;
}

static int ends_incomplete(const char *p, size_t n) {
    return n >= 3 && !memcmp(p + n - 3, "\xEF\xBF\xBD", 3);
}

static int is_byte_token(const struct text_stream *s, int32_t id) {
    size_t n;
    const char *p = tok_token_str(s->t, id, &n);
    return p && n == 6 && !memcmp(p, "<0x", 3) && p[5] == '>';
}

int text_stream_push(struct text_stream *s, int32_t id, char **out, size_t *out_len) {
    if (s->stopped) return 1;
    if (id < 0 || id >= s->t->vocab_size) return 0; // the engine never samples these
    xgrow((void **)&s->ids, &s->cap, s->n + 1, sizeof *s->ids);
    s->ids[s->n++] = id;
    if (s->byte_fallback && is_byte_token(s, id)) return 0;
    size_t nl;
    char *nt = decode_range(s, s->prefix_off, s->n, &nl);
    int rc = 0;
    if (nl > s->prefix_len && !memcmp(nt, s->prefix_text, s->prefix_len) && !ends_incomplete(nt, nl)) {
        rc = add_text(s, nt + s->prefix_len, nl - s->prefix_len, 0, out, out_len);
        free(s->prefix_text);
        s->prefix_off = s->read_off;
        s->read_off = s->n;
        s->prefix_text = decode_range(s, s->prefix_off, s->read_off, &s->prefix_len);
    }
    free(nt);
    return rc;
}

void text_stream_flush(struct text_stream *s, char **out, size_t *out_len) {
    if (s->stopped) return;
    size_t cl, fl;
    char *ctx = decode_range(s, 0, s->n_ctx, &cl);
    char *full = decode_range(s, 0, s->n, &fl);
    const char *want = full + cl;
    size_t wl = fl - cl;
    char *own = NULL;
    if (fl < cl || memcmp(full, ctx, cl)) { // the context's text changed: output alone
        own = decode_range(s, s->n_ctx, s->n, &wl);
        want = own;
    }
    if (wl >= s->text.len && !memcmp(want, s->text.p, s->text.len)) {
        add_text(s, want + s->text.len, wl - s->text.len, 1, out, out_len);
    } else {
        if (diag_on("tokenizer")) diag_printf("text_stream: streamed text is not a prefix of the full decode\n");
        add_text(s, "", 0, 1, out, out_len);
    }
    free(ctx);
    free(full);
    free(own);
}

const char *text_stream_stop(const struct text_stream *s) {
    return s->stopped && s->stop_hit >= 0 ? s->stop[s->stop_hit] : NULL;
}
