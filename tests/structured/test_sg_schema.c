// test_sg_schema.c - the 300 JSON schemas of tests/fixtures/structured
// (tools/oracle/structured/gen_schemas.mjs): each compiles, and random walks
// through its grammar on the qwen3 vocabulary (random allowed tokens, then
// steering to the end, EOS when allowed) produce complete texts that parse as
// JSON (jansson) and validate against the schema (ajv, through
// tools/oracle/structured/validate.mjs). On a sample of the walks' states the
// mask is compared with the brute force as in test_sg_mask. Without node or
// ajv the validation step is skipped loudly (77) after the rest ran.
#include <unistd.h>

#include "sg_test_util.h"

#define WALKS 2

static long comparisons;

// The brute-force check of test_sg_mask on a few ids of this state.
static void sample_mask(const struct sg_grammar *g, const struct sg_vocab *v, const uint32_t *mask, int words,
                        const struct sg_buf *text, int schema) {
    static char *buf;
    if (!buf) buf = xmalloc(1 << 16);
    int n = sgt_count(mask, words);
    for (int s = 0; s < 24; s++) {
        int32_t id = s < 12 || !n ? sgt_rand(v->vocab_size) : sgt_nth(mask, words, sgt_rand(n));
        if (sgt_is_eos(v, id) || text->len + v->len[id] >= (1 << 16)) continue;
        int want = 0;
        if (v->bytes[id]) {
            memcpy(buf, text->p ? text->p : "", text->len);
            memcpy(buf + text->len, v->bytes[id], v->len[id]);
            want = sg_grammar_viable(g, buf, text->len + v->len[id], NULL);
        }
        comparisons++;
        CHECKF(sgt_bit(mask, id) == want, "schema %d: token %d mask %d, brute force %d", schema, id, sgt_bit(mask, id), want);
    }
}

// One walk; returns the text (malloc'd) or NULL when it did not finish.
static char *walk(const struct sg_grammar *g, const struct sg_vocab *v, int schema, int check) {
    int words = CDIV(v->vocab_size, 32);
    uint32_t *mask = xmalloc((size_t)words * sizeof *mask);
    struct sg_matcher *m = sg_matcher_create(g, v);
    struct sg_buf text = {0};
    int done = 0;
    for (int step = 0; step < 400 && !done; step++) {
        sg_matcher_fill_mask(m, mask);
        if (check && step % 3 == 0) sample_mask(g, v, mask, words, &text, schema);
        int32_t id = sgt_pick(m, v, mask, words, step, 24);
        if (id < 0) break;
        CHECKF(sg_matcher_accept(m, id) == VLLM_OK, "schema %d: an allowed token was refused", schema);
        if (sgt_is_eos(v, id)) done = 1;
        else sg_buf_add(&text, v->bytes[id], v->len[id]);
    }
    free(mask);
    sg_matcher_free(m);
    if (!done) {
        free(text.p);
        return NULL;
    }
    return sg_buf_take(&text);
}

int main(void) {
    struct tokenizer *tok;
    struct sg_vocab *v = sgt_vocab(&tok);
    char **lines;
    int n = tokfx_lines(VLLM_SOURCE_DIR "/tests/fixtures/structured/schemas.jsonl", &lines);
    CHECKF(n == 300, "%d schemas in the fixture", n);
    char outs[] = "/tmp/sg_schema_outputs_XXXXXX";
    int fd = mkstemp(outs);
    FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(out != NULL);
    int texts = 0;
    double compile_s = 0;
    for (int i = 0; i < n && out; i++) {
        json_error_t e;
        json_t *s = json_loads(lines[i], 0, &e);
        CHECKF(s, "schema %d: %s", i, e.text);
        struct sg_grammar *g = NULL;
        double t0 = now_s();
        int rc = s ? sg_compile_json_schema(s, &g) : 1;
        compile_s += now_s() - t0;
        CHECKF(rc == 0, "schema %d: %s\n  %s", i, vllm_last_error(), lines[i]);
        for (int w = 0; g && w < WALKS; w++) {
            char *t = walk(g, v, i, i % 5 == 0);
            CHECKF(t, "schema %d: walk %d did not finish", i, w);
            if (!t) continue;
            json_t *parsed = json_loads(t, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
            CHECKF(parsed, "schema %d: not JSON (%s): %s", i, e.text, t);
            json_decref(parsed);
            json_t *rec = json_pack("{s:i, s:s}", "schema", i, "text", t);
            char *line = json_dumps(rec, JSON_COMPACT);
            fprintf(out, "%s\n", line);
            free(line);
            json_decref(rec);
            free(t);
            texts++;
        }
        sg_grammar_free(g);
        json_decref(s);
    }
    if (out) fclose(out);
    tokfx_free_lines(lines, n);
    printf("%d texts from %d schemas (compile %.2f ms per schema), %ld mask comparisons\n", texts, n,
           compile_s * 1e3 / MAX(n, 1), comparisons);
    CHECKF(comparisons > 1000, "%ld mask comparisons", comparisons);
    sg_vocab_free(v);
    tok_free(tok);
    // the oracle
    const char *dir = VLLM_SOURCE_DIR "/tools/oracle/structured";
    if (test_failures || system("node --version >/dev/null 2>&1") != 0 ||
        access(VLLM_SOURCE_DIR "/tools/oracle/structured/node_modules/ajv/package.json", R_OK) != 0) {
        if (!test_failures) {
            unlink(outs);
            TEST_SKIP("node or ajv missing (scripts/install-deps.sh): %d texts not validated", texts);
        }
    } else {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "node %s/validate.mjs %s/tests/fixtures/structured/schemas.jsonl %s", dir,
                 VLLM_SOURCE_DIR, outs);
        int rc = system(cmd);
        CHECKF(rc == 0, "ajv rejected generated texts (%s)", outs);
        if (!rc) unlink(outs);
    }
    return test_summary("test_sg_schema");
}
