// tok_bench.c - tokenizer encode throughput, single-threaded.
// Usage: tok_bench MODEL_DIR CORPUS.jsonl [SECONDS]
// Encodes every corpus string (a JSON string a line; {"hex": ...} lines are
// raw bytes) without special tokens, over and over for about SECONDS (default
// 3), and prints MB/s of input text. tools/oracle/tokenizer/bench.mjs runs it
// beside the HF tokenizers binding.
#include <jansson.h>

#include "core/common.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tok_bench MODEL_DIR CORPUS.jsonl [SECONDS]\n");
        return 2;
    }
    double secs = argc > 3 ? atof(argv[3]) : 3.0;
    struct tokenizer *t;
    double t0 = now_s();
    if (tok_load(argv[1], &t)) {
        fprintf(stderr, "tok_bench: %s\n", vllm_last_error());
        return 1;
    }
    double load_s = now_s() - t0;
    char *data;
    size_t len;
    if (read_file(argv[2], &data, &len)) {
        fprintf(stderr, "tok_bench: %s\n", vllm_last_error());
        return 1;
    }
    char **s = NULL;
    size_t *sl = NULL, bytes = 0;
    int n = 0, cap = 0;
    for (char *p = data, *e; p < data + len; p = e + 1) {
        e = memchr(p, '\n', (size_t)(data + len - p));
        if (!e) e = data + len;
        json_t *j = json_loadb(p, (size_t)(e - p), JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (json_is_string(j)) {
            xgrow((void **)&s, &cap, n + 1, sizeof *s);
            sl = xrealloc(sl, (size_t)cap * sizeof *sl);
            sl[n] = json_string_length(j);
            s[n] = xmalloc(sl[n] + 1);
            memcpy(s[n], json_string_value(j), sl[n] + 1);
            bytes += sl[n++];
        }
        json_decref(j);
    }
    free(data);
    long tokens = 0;
    int rounds = 0;
    t0 = now_s();
    double el;
    do {
        for (int i = 0; i < n; i++) {
            int32_t *ids;
            int k;
            if (tok_encode(t, s[i], sl[i], 0, &ids, &k)) {
                fprintf(stderr, "tok_bench: %s\n", vllm_last_error());
                return 1;
            }
            tokens += k;
            free(ids);
        }
        rounds++;
        el = now_s() - t0;
    } while (el < secs);
    double mb = (double)bytes * rounds / 1e6;
    printf("{\"strings\": %d, \"bytes\": %zu, \"rounds\": %d, \"seconds\": %.3f, \"mb_per_s\": %.3f, "
           "\"tokens_per_s\": %.0f, \"load_s\": %.2f}\n",
           n, bytes, rounds, el, mb / el, (double)tokens / el, load_s);
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
    free(sl);
    tok_free(t);
    return 0;
}
