// fuzz_tok_load.c - tokenizer.json from arbitrary bytes: loading either fails
// with an error or gives a tokenizer that encodes, decodes and streams.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "tokenizer/tok_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct tokenizer *t = NULL;
    if (tok_load_buffer((const char *)data, size, &t)) return 0;
    static const char *texts[] = {"", "hello world", "a  b\n\n c", "123 4567 x", "\xff\xfe ab \xe4\xbd", "<s>abc</s>",
                                  "\xe2\x96\x81 \xc4\xa0"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids;
        int n;
        if (tok_encode(t, texts[i], strlen(texts[i]), (int)(i & 1), &ids, &n)) continue;
        char *s;
        size_t l;
        if (!tok_decode(t, ids, n, (int)(i & 1), &s, &l)) free(s);
        const char *stop[] = {"b", "wor"};
        struct text_stream *st = text_stream_create(t, ids, n / 2, 0, stop, 2, (int)(i & 1));
        char *out = NULL;
        size_t ol = 0;
        for (int k = n / 2; k < n; k++) text_stream_push(st, ids[k], &out, &ol);
        text_stream_flush(st, &out, &ol);
        free(out);
        text_stream_free(st);
        free(ids);
    }
    for (int32_t id = -1; id < tok_vocab_size(t) && id < 64; id++) {
        tok_id_to_piece(t, id);
        tok_is_special(t, id);
    }
    tok_free(t);
    return 0;
}
