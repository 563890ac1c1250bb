// test_tok_unit.c - streaming detokenizer, stop strings, load errors and bad
// input, on small hand-written tokenizers and on real ones (llama2: byte
// fallback; qwen3: byte-level).
#include "test.h"
#include "tokenizer/tok_fixture.h"

// ------------------------------------------------------------ load errors --

static const char *TINY =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"<unk>\": 3, \" \": 4},"
    " \"merges\": [\"a b\"], \"unk_token\": \"<unk>\"}, %s}";

static int load_tiny(const char *extra, struct tokenizer **t) {
    char buf[2048];
    snprintf(buf, sizeof buf, TINY, extra);
    return tok_load_buffer(buf, strlen(buf), t);
}

static void expect_error(const char *extra, int status, const char *needle) {
    struct tokenizer *t = NULL;
    int rc = load_tiny(extra, &t);
    CHECKF(rc == status && strstr(vllm_last_error(), needle), "%s: rc %d, error '%s'", extra, rc, vllm_last_error());
    tok_free(t);
}

static void test_load_errors(void) {
    struct tokenizer *t = NULL;
    CHECK(load_tiny("\"added_tokens\": []", &t) == 0);
    int32_t *ids;
    int n;
    CHECK(t && tok_encode(t, "abba?", 5, 0, &ids, &n) == 0 && n == 4 && ids[0] == 2 && ids[1] == 1 && ids[2] == 0 && ids[3] == 3);
    free(ids);
    char *s;
    CHECK(tok_decode(t, (int32_t[]){2, 7}, 2, 0, &s, NULL) == VLLM_ERR_INVALID_ARGUMENT);
    CHECK(tok_decode(t, (int32_t[]){-1}, 1, 0, &s, NULL) == VLLM_ERR_INVALID_ARGUMENT);
    CHECK(tok_id_to_piece(t, 99) == NULL && tok_id_to_piece(t, -5) == NULL);
    tok_free(t);

    expect_error("\"normalizer\": {\"type\": \"Precompiled\"}", VLLM_ERR_UNSUPPORTED, "Precompiled");
    expect_error("\"pre_tokenizer\": {\"type\": \"UnicodeScripts\"}", VLLM_ERR_UNSUPPORTED, "UnicodeScripts");
    expect_error("\"decoder\": {\"type\": \"WordPiece\"}", VLLM_ERR_UNSUPPORTED, "WordPiece");
    expect_error("\"post_processor\": {\"type\": \"Magic\"}", VLLM_ERR_UNSUPPORTED, "Magic");
    expect_error("\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[a&&b]\"}, \"behavior\": \"Isolated\"}",
                 VLLM_ERR_UNSUPPORTED, "&&");
    expect_error("\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}",
                 VLLM_ERR_UNSUPPORTED, "regex");
    expect_error("\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}",
                 VLLM_ERR_FORMAT, "Sideways");
    expect_error("\"decoder\": {\"type\": \"Strip\", \"content\": \"ab\", \"start\": 1, \"stop\": 0}", VLLM_ERR_FORMAT, "one char");
    expect_error("\"added_tokens\": 5", VLLM_ERR_FORMAT, "added_tokens");

    const char *bad[][3] = {
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "4", "WordPiece"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "4", "Unigram"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}}", "3", "not in the vocab"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a a\"]}}", "3", "two tokens"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}", "3", "bad id"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1}}", "4", "dropout"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"unk_token\": \"?\"}}", "3", "unk_token"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"post_processor\": {\"type\": \"TemplateProcessing\", "
         "\"single\": [{\"SpecialToken\": {\"id\": \"X\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}}", "3", "X"},
        {"{\"model\": 7}", "3", "model"},
        {"[1, 2", "3", "invalid JSON"},
        {"", "3", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = NULL;
        int rc = tok_load_buffer(bad[i][0], strlen(bad[i][0]), &t);
        CHECKF(rc == atoi(bad[i][1]) && strstr(vllm_last_error(), bad[i][2]) && !t, "case %zu: rc %d '%s'", i, rc,
               vllm_last_error());
        tok_free(t);
    }
    CHECK(tok_load("/nonexistent/dir", &t) == VLLM_ERR_IO && t == NULL);
}

// -------------------------------------------------------------- streaming --

struct run {
    char *out;
    size_t len;
    int stopped_at; // index of the push that returned 1, or -1
    int bad_utf8;   // a delta that was not whole UTF-8
};

static struct run stream(const struct tokenizer *t, const int32_t *prompt, int np, const int32_t *ids, int n,
                         const char *const *stop, int nstop, int include) {
    struct run r = {NULL, 0, -1, 0};
    struct text_stream *s = text_stream_create(t, prompt, np, 0, stop, nstop, include);
    for (int i = 0; i < n; i++) {
        char *d = NULL;
        size_t dl = 0;
        int hit = text_stream_push(s, ids[i], &d, &dl);
        if (d && !utf8_valid(d, dl)) r.bad_utf8 = 1;
        if (dl) {
            r.out = xrealloc(r.out, r.len + dl + 1);
            memcpy(r.out + r.len, d, dl);
            r.len += dl;
        }
        free(d);
        if (hit && r.stopped_at < 0) r.stopped_at = i;
    }
    if (r.stopped_at < 0) {
        char *d = NULL;
        size_t dl = 0;
        text_stream_flush(s, &d, &dl);
        if (dl) {
            r.out = xrealloc(r.out, r.len + dl + 1);
            memcpy(r.out + r.len, d, dl);
            r.len += dl;
        }
        free(d);
    }
    text_stream_free(s);
    if (!r.out) r.out = xstrdup("");
    r.out[r.len] = 0;
    return r;
}

static int find_stop_token(const struct tokenizer *t, const int32_t *ids, int n, const char *text, const char *stop) {
    // The first k such that decode(ids[0..k]) contains stop.
    for (int k = 1; k <= n; k++) {
        char *d;
        tok_decode(t, ids, k, 0, &d, NULL);
        int has = strstr(d, stop) != NULL;
        free(d);
        if (has) return k - 1;
    }
    (void)text;
    return -1;
}

static void test_stream(const char *name) {
    struct tokenizer *t;
    int rc = tokfx_load(name, &t);
    if (rc == 77) TEST_SKIP("%s not installed", name);
    CHECKF(rc == 0, "%s: %s", name, vllm_last_error());
    if (rc) return;
    const char *text = "Hello world, this is a test of stop strings 你好😀 across tokens.";
    int32_t *ids;
    int n;
    CHECK(tok_encode(t, text, strlen(text), 0, &ids, &n) == 0 && n > 10);
    char *full;
    tok_decode(t, ids, n, 0, &full, NULL);

    // No stop: the deltas are the full decode, and each is whole UTF-8.
    struct run r = stream(t, NULL, 0, ids, n, NULL, 0, 0);
    CHECKF(!strcmp(r.out, full) && !r.bad_utf8 && r.stopped_at < 0, "%s: '%s' vs '%s'", name, r.out, full);
    free(r.out);

    // A stop string across token boundaries; excluded, then included.
    const char *stops[] = {"", "is a te", "never there"};
    r = stream(t, NULL, 0, ids, n, stops, 3, 0);
    int want_at = find_stop_token(t, ids, n, text, "is a te");
    CHECKF(!strcmp(r.out, "Hello world, this ") && r.stopped_at == want_at, "%s: stop: '%s' at %d (want %d)", name,
           r.out, r.stopped_at, want_at);
    free(r.out);
    r = stream(t, NULL, 0, ids, n, stops, 3, 1);
    CHECKF(!strcmp(r.out, "Hello world, this is a te"), "%s: include_stop: '%s'", name, r.out);
    free(r.out);

    // The earliest of several stop strings wins; one inside multi-byte text.
    const char *stops2[] = {"tokens", "😀", "stop strings 你"};
    r = stream(t, NULL, 0, ids, n, stops2, 3, 0);
    CHECKF(!strcmp(r.out, "Hello world, this is a test of "), "%s: earliest stop: '%s'", name, r.out);
    free(r.out);
    const char *stops3[] = {"😀"};
    r = stream(t, NULL, 0, ids, n, stops3, 1, 1);
    CHECKF(!strcmp(r.out, "Hello world, this is a test of stop strings 你好😀") && !r.bad_utf8, "%s: emoji stop: '%s'",
           name, r.out);
    free(r.out);

    // A held-back prefix of a stop string that never completes is flushed.
    const char *stops4[] = {"tokens!"};
    r = stream(t, NULL, 0, ids, n, stops4, 1, 0);
    CHECKF(!strcmp(r.out, full) && r.stopped_at < 0, "%s: unfinished stop: '%s'", name, r.out);
    free(r.out);

    // After a stop, pushes emit nothing and keep returning 1.
    struct text_stream *s = text_stream_create(t, NULL, 0, 0, stops, 3, 0);
    char *d = NULL;
    size_t dl = 0;
    int hits = 0;
    for (int i = 0; i < n; i++) hits += text_stream_push(s, ids[i], &d, &dl);
    CHECKF(hits == n - want_at && dl == strlen("Hello world, this "), "%s: hits %d, %zu bytes", name, hits, dl);
    text_stream_flush(s, &d, &dl);
    CHECK(dl == strlen("Hello world, this "));
    free(d);
    text_stream_free(s);

    // With the prompt as context, a continuation keeps its leading space.
    int32_t *p, *c;
    int np, nc;
    tok_encode(t, "Hello", 5, 1, &p, &np);
    tok_encode(t, "Hello world", 11, 1, &c, &nc);
    CHECK(nc > np && !memcmp(c, p, (size_t)np * sizeof *p));
    r = stream(t, p, np, c + np, nc - np, NULL, 0, 0);
    CHECKF(!strcmp(r.out, " world"), "%s: continuation '%s'", name, r.out);
    free(r.out);
    free(p);
    free(c);

    // Byte-by-byte emoji: nothing partial comes out, everything comes out.
    const char *emo = "😀👍🏽👨‍👩‍👧 ok";
    int32_t *e;
    int ne;
    tok_encode(t, emo, strlen(emo), 0, &e, &ne);
    r = stream(t, NULL, 0, e, ne, NULL, 0, 0);
    CHECKF(!strcmp(r.out, emo) && !r.bad_utf8, "%s: emoji '%s'", name, r.out);
    free(r.out);
    free(e);
    // Out-of-range ids are ignored by the stream (the engine never samples them).
    s = text_stream_create(t, NULL, 0, 0, NULL, 0, 0);
    d = NULL;
    dl = 0;
    CHECK(text_stream_push(s, -1, &d, &dl) == 0 && text_stream_push(s, 1 << 30, &d, &dl) == 0 && dl == 0);
    text_stream_free(s);

    // Invalid UTF-8 input: encoded as its U+FFFD replacement (from_utf8_lossy).
    const char raw[] = "a\xff" "b\xe4\xbd" "c\xf0\x9f\x98";
    size_t ll;
    char *lossy = utf8_lossy(raw, sizeof raw - 1, &ll);
    CHECK(!strcmp(lossy, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD"));
    int32_t *a, *b;
    int na, nb;
    CHECK(tok_encode(t, raw, sizeof raw - 1, 0, &a, &na) == 0 && tok_encode(t, lossy, ll, 0, &b, &nb) == 0 && na == nb &&
          !memcmp(a, b, (size_t)na * sizeof *a));
    free(a);
    free(b);
    free(lossy);
    free(full);
    free(ids);
    tok_free(t);
}

int main(void) {
    test_load_errors();
    test_stream("llama2");
    test_stream("qwen3");
    return test_summary("tok_unit");
}
