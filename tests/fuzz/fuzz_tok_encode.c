// fuzz_tok_encode.c - arbitrary bytes (invalid UTF-8 included) through real
// tokenizers: encode, decode, and stream the ids with stop strings cut from
// the input. The first byte picks the tokenizer and the options. Tokenizers
// come from tools/oracle/tokenizer/node_modules (found from VLLM_FIXTURES);
// without them the harness checks nothing.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/tok_fixture.h"

static const char *NAMES[] = {"llama2", "qwen3", "synth_ws", "synth_metaspace", "synth_norms", "synth_wssplit"};
#define N_TOK (int)(sizeof NAMES / sizeof NAMES[0])
static struct tokenizer *toks[N_TOK];

// The tokenizers load once, before the first input: libFuzzer's -timeout
// counts each input's time, and six tokenizers under ASan took 11 s on a
// busy 2-core machine.
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    for (int i = 0; i < N_TOK; i++)
        if (tokfx_load(NAMES[i], &toks[i])) toks[i] = NULL;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    const struct tokenizer *t = toks[sel % N_TOK];
    if (!t) return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    int n;
    if (tok_encode(t, text, len, (sel >> 4) & 1, &ids, &n)) abort(); // any bytes must encode
    char *s;
    size_t l;
    if (tok_decode(t, ids, n, (sel >> 5) & 1, &s, &l)) abort();
    if (!utf8_valid(s, l)) abort();
    // Stream with a stop string taken from the middle of the decoded text.
    char stop_buf[8] = {0};
    size_t sl = MIN(l / 4, sizeof stop_buf - 1);
    memcpy(stop_buf, s + l / 2, sl);
    const char *stop[] = {stop_buf};
    struct text_stream *st = text_stream_create(t, NULL, 0, (sel >> 5) & 1, stop, utf8_valid(stop_buf, sl) ? 1 : 0, (sel >> 6) & 1);
    char *out = NULL;
    size_t ol = 0;
    int stopped = 0;
    for (int k = 0; k < n && !stopped; k++) stopped = text_stream_push(st, ids[k], &out, &ol);
    if (!stopped) text_stream_flush(st, &out, &ol);
    if (out && !utf8_valid(out, ol)) abort();
    // Without a stop string the deltas must be the full decode.
    if (!sl && !stopped && (ol != l || (l && memcmp(out, s, l)))) abort();
    free(out);
    text_stream_free(st);
    free(s);
    free(ids);
    return 0;
}
