// fuzz_chat_input.c - libFuzzer harness: the input is a chat request body.
// chat_template_input checks messages, tools, tool_choice and
// chat_template_kwargs: it refuses with a 400, or gives the template's
// input, whose messages, tools and flags are the server's, never the
// kwargs'. Seeds in tests/fuzz/corpus/chat_input/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *body = json_loadb((const char *)data, size, 0, NULL);
    if (json_is_object(body)) {
        struct api_error err = {0};
        size_t bytes;
        json_t *in = chat_template_input(body, &bytes, &err);
        if (in) {
            json_t *kw = json_object_get(body, "chat_template_kwargs");
            // what the server set is what renders
            if (!json_is_array(json_object_get(in, "messages")) ||
                !json_is_boolean(json_object_get(in, "add_generation_prompt")))
                abort();
            if (json_object_get(kw, "messages") || json_object_get(kw, "tools") || json_object_get(kw, "bos_token"))
                abort();
            json_decref(in);
        } else if (err.status != 400 || !err.param) {
            abort(); // a 400 naming the field
        }
    }
    json_decref(body);
    return 0;
}
