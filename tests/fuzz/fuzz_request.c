// fuzz_request.c - libFuzzer harness: the input is an HTTP request body for
// /v1/completions (first byte even) or /v1/chat/completions (odd), after
// that byte. It is refused with a 4xx naming a field, or it gives sampling
// parameters the engine takes. The server has no tokenizer here, so prompts
// are token ids (text prompts and chat get their 400).
// Seeds in tests/fuzz/corpus/request/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct server s;
    if (!s.info.vocab_size) {
        s.info.vocab_size = 256;
        s.info.max_model_len = 512;
        s.max_token_bytes = 4;
        s.cfg.served_model_name = "m";
        s.cfg.model_path = "/models/m";
        if (guided_init(&s)) abort(); // structured output: no engine, so no vocabulary (a 400)
    }
    if (!size) return 0;
    enum api_kind kind = data[0] & 1 ? API_CHAT : API_COMPLETION;
    json_t *body = json_loadb((const char *)data + 1, size - 1, 0, NULL);
    if (json_is_object(body)) {
        struct api_error err = {0};
        struct gen_params gp;
        if (!check_model(&s, body, &err) && !gen_params_parse(&s, kind, body, &gp, &err)) {
            if (gp.num_prompts < 1 || gp.n < 1 || gp.num_prompts * gp.n > GEN_MAX_CHOICES) abort();
            for (int k = 0; k < gp.num_prompts; k++) {
                const struct gen_prompt *pr = &gp.prompts[k];
                if (pr->num < 1 || pr->num + pr->max_tokens > s.info.max_model_len || pr->max_tokens < 1) abort();
                for (int i = 0; i < pr->num; i++)
                    if (pr->ids[i] < 0 || pr->ids[i] >= s.info.vocab_size) abort();
            }
            gen_params_free(&gp);
        } else if (err.status < 400 || err.status > 499 || !err.message[0]) {
            abort(); // every refusal is a client error with a message
        }
    }
    json_decref(body);
    return 0;
}
