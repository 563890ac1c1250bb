// test_chat_template.c - renders every conversation in
// tests/fixtures/chat/<template>/cases.jsonl with chat_template_render and
// compares the bytes to what @huggingface/jinja rendered (written by
// tools/oracle/chat/gen.mjs). Also checks chat_template_load's errors.
// Usage: test_chat_template FIXTURES/chat
#include <time.h>

#include "core/common.h"
#include "test.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

static int compared, identical;

static void report_diff(const char *name, const char *id, const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "%s [%s]: differs at byte %zu\n  got:  \"%.80s\"\n  want: \"%.80s\"\n", name, id, i, got + from,
            want + from);
}

static void run_case(const char *name, const struct chat_template *ct, const json_t *c,
                     const struct jinja_render_opts *opts) {
    const char *id = json_string_value(json_object_get(c, "id"));
    const json_t *want = json_object_get(c, "output"), *err = json_object_get(c, "error");
    char *out = NULL;
    int rc = chat_template_render_opts(ct, json_object_get(c, "request"), opts, &out);
    compared++;
    if (want) {
        CHECKF(rc == VLLM_OK, "%s [%s]: %s", name, id, vllm_last_error());
        if (rc == VLLM_OK) {
            int same = !strcmp(out, json_string_value(want)) && strlen(out) == json_string_length(want);
            if (!same) report_diff(name, id, out, json_string_value(want));
            CHECK(same);
            identical += same;
        }
    } else {
        // The oracle refused this conversation: so must we, and a
        // raise_exception must carry the template's message.
        CHECKF(rc != VLLM_OK, "%s [%s]: rendered what the oracle rejects (%s)", name, id, json_string_value(err));
        if (json_is_true(json_object_get(c, "raised"))) {
            CHECKF(rc == VLLM_ERR_INVALID_ARGUMENT && strstr(vllm_last_error(), json_string_value(err)),
                   "%s [%s]: want raise_exception \"%s\", got %d \"%s\"", name, id, json_string_value(err), rc,
                   vllm_last_error());
        }
        identical += rc != VLLM_OK;
    }
    free(out);
}

static void run_template(const char *fixtures, const char *name, const struct jinja_render_opts *opts) {
    char *dir = path_join(fixtures, name), *cases = path_join(dir, "cases.jsonl");
    struct chat_template *ct = NULL;
    int rc = chat_template_load(dir, &ct);
    CHECKF(rc == VLLM_OK, "%s: %s", name, vllm_last_error());
    char *text = NULL;
    size_t len = 0;
    CHECKF(read_file(cases, &text, &len) == VLLM_OK, "%s", vllm_last_error());
    int before = compared, same_before = identical;
    for (char *line = text; ct && line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        json_error_t e;
        json_t *c = json_loads(line, 0, &e);
        CHECKF(c != NULL, "%s: bad case line: %s", name, e.text);
        if (c) run_case(name, ct, c, opts);
        json_decref(c);
        line = nl ? nl + 1 : NULL;
    }
    printf("%s: %d/%d conversations identical to @huggingface/jinja\n", name, identical - same_before,
           compared - before);
    CHECKF(compared - before >= 30, "%s: only %d conversations", name, compared - before);
    chat_template_free(ct);
    free(text);
    free(cases);
    free(dir);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FIXTURES/chat\n", argv[0]);
        return 2;
    }
    json_t *meta;
    char *meta_path = path_join(argv[1], "meta.json");
    json_error_t e;
    meta = json_load_file(meta_path, 0, &e);
    free(meta_path);
    if (!meta) {
        fprintf(stderr, "cannot read meta.json: %s\n", e.text);
        return 1;
    }
    // The oracle ran with the clock pinned, in UTC (strftime_now).
    setenv("TZ", json_string_value(json_object_get(meta, "tz")), 1);
    tzset();
    struct jinja_render_opts opts;
    jinja_render_opts_default(&opts);
    opts.now = json_integer_value(json_object_get(meta, "now_unix"));
    const char *name;
    json_t *t;
    json_object_foreach(json_object_get(meta, "templates"), name, t) run_template(argv[1], name, &opts);
    printf("chat templates: %d/%d conversations identical\n", identical, compared);
    CHECK(compared > 0);
    json_decref(meta);
    return test_summary("chat_template");
}
