// stub.c - placeholder until the tokenizer and chat templates land.
#include "core/common.h"
#include "tokenizer/tokenizer.h"

int tok_load(const char *model_dir, struct tokenizer **out) {
    (void)out;
    return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: tokenizer support is not built yet", model_dir);
}
void tok_free(struct tokenizer *t) { (void)t; }
int tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids, int *n) {
    (void)t, (void)text, (void)len, (void)add_special, (void)ids, (void)n;
    return vllm_err(VLLM_ERR_UNSUPPORTED, "no tokenizer");
}
int tok_decode(const struct tokenizer *t, const int32_t *ids, int n, int skip, char **text, size_t *len) {
    (void)t, (void)ids, (void)n, (void)skip, (void)text, (void)len;
    return vllm_err(VLLM_ERR_UNSUPPORTED, "no tokenizer");
}
struct text_stream *text_stream_create(const struct tokenizer *t, const int32_t *p, int np, int skip,
                                       const char *const *stop, int ns, int inc) {
    (void)t, (void)p, (void)np, (void)skip, (void)stop, (void)ns, (void)inc;
    return NULL;
}
int text_stream_push(struct text_stream *s, int32_t id, char **out, size_t *len) {
    (void)s, (void)id, (void)out, (void)len;
    return 0;
}
void text_stream_flush(struct text_stream *s, char **out, size_t *len) { (void)s, (void)out, (void)len; }
void text_stream_free(struct text_stream *s) { (void)s; }
