// fuzz_regex.c - arbitrary bytes as a regex (first byte even) or a GBNF
// grammar (odd): the compiler errors or gives a grammar whose byte walks stay
// in the language (as fuzz_json_schema.c), and the input itself is judged
// without a crash.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "structured/sg_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 2048) return 0;
    char *src = xmalloc(size);
    memcpy(src, data + 1, size - 1);
    src[size - 1] = 0;
    struct sg_grammar *g;
    int rc = data[0] & 1 ? sg_compile_gbnf(src, &g) : sg_compile_regex(src, &g);
    if (rc == VLLM_OK) {
        sg_grammar_viable(g, src, strlen(src), NULL);
        char text[64];
        size_t n = 0;
        unsigned start = data[0];
        for (int step = 0; step < 48 && n < sizeof text; step++) {
            int found = 0;
            for (unsigned k = 0; k < 256 && !found; k++) {
                text[n] = (char)((start + k * 13) & 255);
                found = sg_grammar_viable(g, text, n + 1, NULL);
            }
            if (!found) {
                int acc;
                if (!sg_grammar_viable(g, text, n, &acc) || !acc) abort();
                break;
            }
            n++;
            start = start * 29 + 5;
        }
        struct sg_matcher *m = sg_matcher_create(g, NULL);
        int acc;
        if (!sg_matcher_accept_bytes(m, text, n)) abort();
        if (!sg_grammar_viable(g, text, n, &acc) || acc != sg_matcher_is_accepting(m)) abort();
        sg_matcher_free(m);
        sg_grammar_free(g);
    }
    free(src);
    return 0;
}
