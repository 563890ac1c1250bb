// fuzz_regex.c - arbitrary bytes as a regex (first byte even) or a GBNF
// grammar (odd): the compiler errors or gives a grammar whose byte walks stay
// in the language (as fuzz_json_schema.c), and the input itself is judged
// without a crash.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "fuzz_walk.h"
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
        fuzz_walk(g, data[0], &(struct fuzz_walk_cfg){48, 13, 29, 5});
        sg_grammar_free(g);
    }
    free(src);
    return 0;
}
