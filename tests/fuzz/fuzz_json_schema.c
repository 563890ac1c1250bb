// fuzz_json_schema.c - arbitrary bytes as a JSON schema: the compiler either
// errors or gives a grammar, and the grammar behaves: a byte walk (at each
// step the first byte, from a rotating start, that keeps the text a viable
// prefix) never leaves the language, and its accepting states agree with a
// matcher's.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "structured/sg_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    json_t *s = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (!s) return 0;
    struct sg_grammar *g;
    if (sg_compile_json_schema(s, &g) == VLLM_OK) {
        char text[96];
        size_t n = 0;
        unsigned start = size ? data[size / 2] : 0;
        for (int step = 0; step < 64 && n < sizeof text; step++) {
            int found = 0;
            for (unsigned k = 0; k < 256 && !found; k++) {
                text[n] = (char)((start + k * 7) & 255);
                found = sg_grammar_viable(g, text, n + 1, NULL);
            }
            if (!found) {
                int acc;
                // a dead end must be a complete text (pruning keeps only viable states)
                if (!sg_grammar_viable(g, text, n, &acc) || !acc) abort();
                break;
            }
            n++;
            start = start * 31 + 17;
        }
        struct sg_matcher *m = sg_matcher_create(g, NULL);
        int acc;
        if (!sg_matcher_accept_bytes(m, text, n)) abort();
        if (!sg_grammar_viable(g, text, n, &acc) || acc != sg_matcher_is_accepting(m)) abort();
        sg_matcher_free(m);
        sg_grammar_free(g);
    }
    json_decref(s);
    return 0;
}
