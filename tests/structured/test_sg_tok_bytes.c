// test_sg_tok_bytes.c - tok_token_bytes, the bytes constrained decoding
// matches, against tok_decode (itself checked against HF tokenizers): for
// random runs of ids after a context token, the concatenated bytes equal the
// decoded text after the context's, wherever that text is valid UTF-8 (the
// decoder replaces a broken character; the bytes keep it). Byte-level BPE
// (qwen3), byte fallback with Replace + Strip (llama2), Metaspace (synthetic).
#include "test.h"
#include "tokenizer/tok_fixture.h"

static int compared;

static void check(const char *name) {
    struct tokenizer *t;
    int rc = tokfx_load(name, &t);
    if (rc == 77) return;
    CHECKF(rc == 0, "%s: %s", name, vllm_last_error());
    if (rc) return;
    int V = tok_vocab_size(t);
    CHECK(tok_token_bytes(t, -1, NULL, 0) == -1 && tok_token_bytes(t, V, NULL, 0) == -1);
    int32_t *ctx_ids;
    int n_ctx;
    CHECK(tok_encode(t, "Hello", 5, 0, &ctx_ids, &n_ctx) == 0 && n_ctx >= 1);
    char *ctx_text;
    size_t ctx_len;
    CHECK(tok_decode(t, ctx_ids, n_ctx, 0, &ctx_text, &ctx_len) == 0);
    uint64_t seed = 42;
    for (int run = 0; run < 3000; run++) {
        int32_t ids[64];
        int n = 0;
        memcpy(ids, ctx_ids, (size_t)n_ctx * sizeof *ids);
        n = n_ctx;
        int k = 1 + run % 4;
        char bytes[4096];
        int blen = 0;
        for (int i = 0; i < k; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int32_t id = (int32_t)((seed >> 33) % (uint64_t)V);
            if (tok_is_special(t, id) || !tok_id_to_piece(t, id)) continue;
            int l = tok_token_bytes(t, id, bytes + blen, (int)sizeof bytes - blen);
            if (l < 0 || blen + l > (int)sizeof bytes) break;
            blen += l;
            ids[n++] = id;
        }
        char *text;
        size_t len;
        if (tok_decode(t, ids, n, 0, &text, &len)) continue;
        if (utf8_valid(bytes, (size_t)blen) && len >= ctx_len && !memcmp(text, ctx_text, ctx_len)) {
            CHECKF(len - ctx_len == (size_t)blen && !memcmp(text + ctx_len, bytes, (size_t)blen),
                   "%s: ids after the context decode to '%.*s', bytes '%.*s'", name, (int)(len - ctx_len),
                   text + ctx_len, blen, bytes);
            compared++;
        }
        free(text);
    }
    // A short buffer gets the first bytes and the full length.
    for (int32_t id = 0; id < V; id++) {
        if (tok_is_special(t, id)) continue;
        char full[1024], part[2];
        int l = tok_token_bytes(t, id, full, (int)sizeof full);
        if (l >= 3) {
            CHECK(tok_token_bytes(t, id, part, 2) == l && !memcmp(part, full, 2));
            break;
        }
    }
    free(ctx_ids);
    free(ctx_text);
    tok_free(t);
}

int main(void) {
    const char *names[] = {"qwen3", "llama2", "synth_metaspace"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) check(names[i]);
    if (!test_checks) TEST_SKIP("no tokenizer installed (scripts/install-deps.sh)");
    CHECKF(compared > 5000, "only %d runs compared", compared);
    return test_summary("test_sg_tok_bytes");
}
