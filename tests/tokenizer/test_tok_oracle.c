// test_tok_oracle.c - one tokenizer against the HF tokenizers oracle's
// fixtures (tools/oracle/tokenizer/oracle.mjs): encode ids, encode with
// special tokens, decode, decode skipping specials, and streaming deltas, for
// every corpus string. Usage: test_tok_oracle NAME
#include "test.h"
#include "tokenizer/tok_fixture.h"

static int ids_eq(const int32_t *a, int na, const json_t *b) {
    if (!json_is_array(b) || (int)json_array_size(b) != na) return 0;
    for (int i = 0; i < na; i++)
        if (json_integer_value(json_array_get(b, (size_t)i)) != a[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *a, int n) {
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", a[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static int json_ids(const json_t *a, int32_t **out) {
    int n = (int)json_array_size(a);
    *out = xmalloc((size_t)(n + 1) * sizeof **out);
    for (int i = 0; i < n; i++) (*out)[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return n;
}

// Streams ids one by one; returns the concatenated deltas (malloc'd).
static char *stream_all(const struct tokenizer *t, const int32_t *ids, int n, int skip, size_t *len) {
    struct text_stream *s = text_stream_create(t, NULL, 0, skip, NULL, 0, 0);
    char *out = NULL;
    *len = 0;
    for (int i = 0; i < n; i++) text_stream_push(s, ids[i], &out, len);
    text_stream_flush(s, &out, len);
    text_stream_free(s);
    if (!out) out = xstrdup("");
    return out;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_tok_oracle NAME\n");
        return 2;
    }
    const char *name = argv[1];
    struct tokenizer *t = NULL;
    double t0 = now_s();
    int rc = tokfx_load(name, &t);
    if (rc == 77) TEST_SKIP("%s: tokenizer files not installed (run scripts/install-deps.sh)", name);
    if (rc) {
        fprintf(stderr, "%s: load failed: %s\n", name, vllm_last_error());
        return 1;
    }
    printf("%s: loaded in %.2fs, vocab %d\n", name, now_s() - t0, tok_vocab_size(t));
    char **corpus, **fx;
    char *cp = tokfx_path("%s/tests/fixtures/tokenizer/%s.jsonl", "corpus");
    char *fp = tokfx_path("%s/tests/fixtures/tokenizer/%s.jsonl", name);
    int nc = tokfx_lines(cp, &corpus), nf = tokfx_lines(fp, &fx);
    CHECKF(nc > 0 && nf > 1, "corpus %d lines, fixture %d lines", nc, nf);
    json_t *meta = nf > 0 ? json_loads(fx[0], 0, NULL) : NULL;
    CHECK(meta != NULL);
    int stride = !strncmp(name, "synth_", 6) ? 4 : 1; // synthetic fixtures cover every 4th string
    CHECKF(nf - 1 == (nc + stride - 1) / stride, "fixture has %d entries for %d corpus strings", nf - 1, nc);

    // Meta: vocab size, the ids around a sequence, added tokens in text.
    int32_t *pre = NULL, *post = NULL, *ids = NULL;
    int npre = json_ids(json_object_get(meta, "pre"), &pre), npost = json_ids(json_object_get(meta, "post"), &post);
    CHECKF(tok_vocab_size(t) == json_integer_value(json_object_get(meta, "vocab_size")), "vocab %d vs %lld",
           tok_vocab_size(t), (long long)json_integer_value(json_object_get(meta, "vocab_size")));
    int n;
    const char *st = json_string_value(json_object_get(meta, "special_text"));
    CHECK(st && tok_encode(t, st, strlen(st), 0, &ids, &n) == 0 && ids_eq(ids, n, json_object_get(meta, "special_ids")));
    free(ids);
    CHECK(tok_encode(t, "", 0, 1, &ids, &n) == 0 && ids_eq(ids, n, json_object_get(meta, "empty_special")));
    free(ids);

    int n_enc = 0, ok_enc = 0, ok_sp = 0, ok_dec = 0, ok_dsk = 0, ok_stream = 0, shown = 0;
    for (int i = 1; i < nf; i++) {
        int ci = (i - 1) * stride;
        if (ci >= nc) break;
        size_t len = 0;
        char *text = tokfx_entry(corpus[ci], &len);
        json_t *e = json_loads(fx[i], JSON_ALLOW_NUL, NULL);
        if (!text || !e) {
            CHECKF(0, "bad line %d", i);
            free(text);
            json_decref(e);
            continue;
        }
        n_enc++;
        const json_t *want = json_object_get(e, "ids");
        rc = tok_encode(t, text, len, 0, &ids, &n);
        int good = rc == 0 && ids_eq(ids, n, want);
        ok_enc += good;
        if (!good && shown++ < 8) {
            fprintf(stderr, "%s: encode mismatch on corpus line %d: %s\n", name, ci + 1, corpus[ci]);
            print_ids("got ", ids, n);
            int32_t *w;
            int nw = json_ids(want, &w);
            print_ids("want", w, nw);
            free(w);
        }
        // With special tokens.
        int32_t *sp;
        int nsp;
        rc = tok_encode(t, text, len, 1, &sp, &nsp);
        const json_t *wsp = json_object_get(e, "sp");
        if (wsp) good = ids_eq(sp, nsp, wsp);
        else good = rc == 0 && nsp == npre + n + npost && !memcmp(sp, pre, (size_t)npre * 4) &&
                    !memcmp(sp + npre, ids, (size_t)n * 4) && !memcmp(sp + npre + n, post, (size_t)npost * 4);
        ok_sp += good;
        free(sp);
        // Decode the oracle's ids.
        int32_t *w;
        int nw = json_ids(want, &w);
        const char *dec_want = json_string_value(json_object_get(e, "dec"));
        size_t dwl = dec_want ? json_string_length(json_object_get(e, "dec")) : 0;
        char *lossy = NULL;
        if (!dec_want) {
            lossy = utf8_lossy(text, len, &dwl);
            dec_want = lossy;
        }
        char *dec;
        size_t dl;
        good = tok_decode(t, w, nw, 0, &dec, &dl) == 0 && dl == dwl && !memcmp(dec, dec_want, dl);
        ok_dec += good;
        if (!good && shown++ < 8) fprintf(stderr, "%s: decode mismatch on line %d:\n  got  %s\n  want %s\n", name, ci + 1, dec, dec_want);
        const char *dsk_want = json_string_value(json_object_get(e, "dsk"));
        size_t dskl = dsk_want ? json_string_length(json_object_get(e, "dsk")) : dwl;
        if (!dsk_want) dsk_want = dec_want;
        char *dsk;
        size_t dsl;
        good = tok_decode(t, w, nw, 1, &dsk, &dsl) == 0 && dsl == dskl && !memcmp(dsk, dsk_want, dsl);
        ok_dsk += good;
        if (!good && shown++ < 8) fprintf(stderr, "%s: skip-special decode mismatch on line %d:\n  got  %s\n  want %s\n", name, ci + 1, dsk, dsk_want);
        // Streaming: deltas concatenate to the full decode, with and without specials.
        size_t sl, sl2;
        char *s1 = stream_all(t, w, nw, 0, &sl), *s2 = stream_all(t, w, nw, 1, &sl2);
        good = sl == dl && !memcmp(s1, dec, dl) && sl2 == dsl && !memcmp(s2, dsk, dsl);
        ok_stream += good;
        if (!good && shown++ < 8) fprintf(stderr, "%s: stream mismatch on line %d:\n  got  %s\n  want %s\n", name, ci + 1, s1, dec);
        free(s1);
        free(s2);
        free(dec);
        free(dsk);
        free(lossy);
        free(w);
        free(ids);
        free(text);
        json_decref(e);
    }
    CHECKF(n_enc > 0, "compared zero strings");
    CHECKF(ok_enc == n_enc, "encode %d/%d", ok_enc, n_enc);
    CHECKF(ok_sp == n_enc, "encode+special %d/%d", ok_sp, n_enc);
    CHECKF(ok_dec == n_enc, "decode %d/%d", ok_dec, n_enc);
    CHECKF(ok_dsk == n_enc, "decode skip-special %d/%d", ok_dsk, n_enc);
    CHECKF(ok_stream == n_enc, "stream %d/%d", ok_stream, n_enc);
    printf("%s: %d strings: encode %d, encode+special %d, decode %d, decode skip-special %d, stream %d identical\n",
           name, n_enc, ok_enc, ok_sp, ok_dec, ok_dsk, ok_stream);
    json_decref(meta);
    free(pre);
    free(post);
    free(cp);
    free(fp);
    tokfx_free_lines(corpus, nc);
    tokfx_free_lines(fx, nf);
    tok_free(t);
    return test_summary(name);
}
