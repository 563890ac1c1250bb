// fuzz_json_schema.c - arbitrary bytes as a JSON schema: the compiler either
// errors or gives a grammar, and the grammar behaves: a byte walk (at each
// step the first byte, from a rotating start, that keeps the text a viable
// prefix) never leaves the language, and its accepting states agree with a
// matcher's.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "fuzz_walk.h"
#include "structured/sg_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    json_t *s = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (!s) return 0;
    struct sg_grammar *g;
    if (sg_compile_json_schema(s, &g) == VLLM_OK) {
        fuzz_walk(g, size ? data[size / 2] : 0, &(struct fuzz_walk_cfg){64, 7, 31, 17});
        sg_grammar_free(g);
    }
    json_decref(s);
    return 0;
}
