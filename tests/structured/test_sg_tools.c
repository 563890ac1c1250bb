// test_sg_tools.c - the tool-call parsers on outputs in each format (as
// Qwen3, Nemotron-3 and Llama 3 write them), malformed ones included: the
// calls and content they give, and their streams in random chunks, which
// must give the same calls (first delta: index, id, type, name; then
// argument fragments) and content. Then forced-call grammars: random walks on
// the qwen3 vocabulary through the grammar of each format parse back into
// calls whose arguments ajv validates against the tools' parameter schemas
// (skipped loudly without node / ajv; no tokenizer: that part skips).
#include <unistd.h>

#include "sg_test_util.h"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":14},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"set_config\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"ratio\":{\"type\":\"number\"},\"on\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"extra\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"integer\"}}},"
    "\"note\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":20},{\"type\":\"null\"}]}},\"required\":[\"ratio\",\"on\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}}]";

struct kase {
    enum sg_tool_format f;
    const char *text;
    const char *content; // NULL: none
    int n_calls;
    const char *name0, *args0; // the first call
    int stream_exact;          // the incremental stream equals the whole-text parse
};

static const struct kase CASES[] = {
    // hermes (Qwen2.5 / Qwen3)
    {SG_TOOL_HERMES,
     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
     "Let me check.\n", 1, "get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}", 1},
    {SG_TOOL_HERMES,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call>\n<tool_call>\n"
     "{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>",
     NULL, 2, "get_weather", "{\"city\": \"東京\"}", 1},
    {SG_TOOL_HERMES, "<tool_call>\n{\"arguments\": {\"a\": [1, {\"b\": \"}\"}]}, \"name\": \"f\"}\n</tool_call>\n", NULL, 1,
     "f", "{\"a\": [1, {\"b\": \"}\"}]}", 1},
    {SG_TOOL_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}", NULL, 1, "f", "{\"a\": 1}", 1},
    {SG_TOOL_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>",
     "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>", 0, NULL, NULL, 0},
    {SG_TOOL_HERMES, "<tool_call>\n{\"name\": \"f\", \"argu", "<tool_call>\n{\"name\": \"f\", \"argu", 0, NULL, NULL, 1},
    {SG_TOOL_HERMES, "<tool_call>hello</tool_call> and more", "<tool_call>hello</tool_call> and more", 0, NULL, NULL, 1},
    {SG_TOOL_HERMES, "Plain answer, no tools. <tool_ca", "Plain answer, no tools. <tool_ca", 0, NULL, NULL, 1},
    {SG_TOOL_HERMES,
     "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n<tool_call>\nnot json\n</tool_call>\nDone.",
     "\n<tool_call>\nnot json\n</tool_call>\nDone.", 1, "ping", "{}", 1},
    {SG_TOOL_HERMES, "\n\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n", NULL, 1, "ping", "{}", 1},
    // qwen3_coder (Qwen3-Coder, Nemotron-3)
    {SG_TOOL_QWEN3_CODER,
     "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
     "</parameter>\n</function>\n</tool_call>",
     "I'll check.\n", 1, "get_weather", "{\"city\": \"Paris\", \"days\": 3}", 1},
    {SG_TOOL_QWEN3_CODER,
     "<tool_call>\n<function=set_config>\n<parameter=ratio>\n2.50\n</parameter>\n<parameter=on>\nTrue\n</parameter>\n"
     "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=extra>\n{\"k\": 1}\n</parameter>\n<parameter=note>\nnull\n"
     "</parameter>\n<parameter=other>\nx < y\n</parameter>\n</function>\n</tool_call>",
     NULL, 1, "set_config",
     "{\"ratio\": 2.50, \"on\": true, \"tags\": [\"a\", \"b\"], \"extra\": {\"k\": 1}, \"note\": null, \"other\": \"x < y\"}", 1},
    {SG_TOOL_QWEN3_CODER,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n<parameter=days>\nabc\n</parameter>\n</function>\n"
     "</tool_call>\n<function=ping>\n</function>",
     NULL, 2, "get_weather", "{\"city\": \"New\\nYork\", \"days\": \"abc\"}", 1},
    {SG_TOOL_QWEN3_CODER, "<tool_call>\nhello\n</tool_call> text", "<tool_call>\nhello\n</tool_call> text", 0, NULL, NULL, 1},
    {SG_TOOL_QWEN3_CODER, "<tool_call>\n<function=get_weather>\n<parameter=city>\nRo", NULL, 1, "get_weather",
     "{\"city\": \"Ro\"}", 1},
    {SG_TOOL_QWEN3_CODER, "Just text with <function but no call.", "Just text with <function but no call.", 0, NULL, NULL, 1},
    // llama3_json
    {SG_TOOL_LLAMA3_JSON, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", NULL, 1, "get_weather",
     "{\"city\": \"Oslo\"}", 1},
    {SG_TOOL_LLAMA3_JSON,
     "<|python_tag|>{\"name\": \"ping\", \"parameters\": {}}; {\"name\": \"get_weather\", \"arguments\": {\"city\": \"a;b\"}}",
     NULL, 2, "ping", "{}", 1},
    {SG_TOOL_LLAMA3_JSON, "Sure! {\"name\": \"ping\", \"parameters\": {}}", "Sure! {\"name\": \"ping\", \"parameters\": {}}", 0,
     NULL, NULL, 1},
    {SG_TOOL_LLAMA3_JSON, "{\"name\": \"ping\"}", "{\"name\": \"ping\"}", 0, NULL, NULL, 1},
    {SG_TOOL_LLAMA3_JSON, "{\"name\": \"ping\", \"parameters\": {}}; {\"oops\": 1}",
     "{\"name\": \"ping\", \"parameters\": {}}; {\"oops\": 1}", 0, NULL, NULL, 0},
    {SG_TOOL_LLAMA3_JSON, "{\"name\": \"ping\", \"parameters\": {}}\nThat was the call.", "\nThat was the call.", 1, "ping",
     "{}", 1},
};

static int same_str(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

// Streams text in random chunks (at UTF-8 boundaries); the merged result.
static void stream(enum sg_tool_format f, const json_t *tools, const char *text, struct sg_tool_result *merged,
                   int *shape_ok) {
    struct sg_tool_stream *s = sg_tool_stream_create(f, tools, 7);
    struct sg_buf content = {0};
    json_t *calls = json_array();
    size_t n = strlen(text), i = 0;
    *shape_ok = 1;
    for (int last = 0; !last;) {
        size_t k = i + 1 + (size_t)sgt_rand(6);
        while (k < n && (text[k] & 0xC0) == 0x80) k++;
        struct sg_tool_result d;
        if (k >= n) {
            k = n;
            sg_tool_stream_push(s, text + i, k - i, &d);
            struct sg_tool_result e;
            sg_tool_stream_finish(s, &e);
            if (e.content) sg_buf_add(&content, e.content, strlen(e.content));
            if (e.tool_calls) json_array_extend(d.tool_calls ? d.tool_calls : (d.tool_calls = json_array()), e.tool_calls);
            sg_tool_result_clear(&e);
            last = 1;
        } else {
            sg_tool_stream_push(s, text + i, k - i, &d);
        }
        i = k;
        if (d.content) sg_buf_add(&content, d.content, strlen(d.content));
        size_t q;
        json_t *x;
        json_array_foreach(d.tool_calls, q, x) {
            int idx = (int)json_integer_value(json_object_get(x, "index"));
            json_t *fn = json_object_get(x, "function");
            if (idx == (int)json_array_size(calls)) { // a new call: its header
                *shape_ok &= json_object_get(x, "id") && json_object_get(x, "type") && json_object_get(fn, "name") &&
                             !json_object_get(fn, "arguments");
                json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", json_object_get(x, "id"), "type",
                                                       "function", "function", "name", json_object_get(fn, "name"),
                                                       "arguments", ""));
            } else if (idx == (int)json_array_size(calls) - 1) {
                *shape_ok &= !json_object_get(x, "id") && !json_object_get(fn, "name");
                json_t *cur = json_object_get(json_array_get(calls, (size_t)idx), "function");
                struct sg_buf a = {0};
                const char *p = json_string_value(json_object_get(cur, "arguments"));
                const char *m = json_string_value(json_object_get(fn, "arguments"));
                sg_buf_add(&a, p, strlen(p));
                sg_buf_add(&a, m ? m : "", m ? strlen(m) : 0);
                json_object_set_new(cur, "arguments", json_string(a.p));
                free(a.p);
            } else {
                *shape_ok = 0;
            }
        }
        sg_tool_result_clear(&d);
    }
    CHECK(sg_tool_stream_num_calls(s) == (int)json_array_size(calls));
    sg_tool_stream_free(s);
    merged->content = content.len ? sg_buf_take(&content) : NULL;
    free(content.p);
    if (merged->content && json_array_size(calls) && strspn(merged->content, " \t\r\n") == strlen(merged->content)) {
        free(merged->content);
        merged->content = NULL;
    }
    merged->tool_calls = json_array_size(calls) ? calls : (json_decref(calls), NULL);
}

static void test_parsers(const json_t *tools) {
    for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
        const struct kase *k = &CASES[c];
        struct sg_tool_result r;
        CHECK(sg_tool_parse(k->f, k->text, strlen(k->text), tools, 7, &r) == 0);
        int n = (int)json_array_size(r.tool_calls);
        CHECKF(same_str(r.content, k->content), "case %zu: content '%s', want '%s'", c, r.content ? r.content : "(null)",
               k->content ? k->content : "(null)");
        CHECKF(n == k->n_calls, "case %zu: %d calls, want %d", c, n, k->n_calls);
        if (n && k->n_calls) {
            json_t *c0 = json_array_get(r.tool_calls, 0), *fn = json_object_get(c0, "function");
            const char *id = json_string_value(json_object_get(c0, "id"));
            CHECKF(same_str(json_string_value(json_object_get(fn, "name")), k->name0), "case %zu: name", c);
            CHECKF(same_str(json_string_value(json_object_get(fn, "arguments")), k->args0), "case %zu: arguments %s", c,
                   json_string_value(json_object_get(fn, "arguments")));
            CHECK(id && !strncmp(id, "chatcmpl-tool-", 14) && strlen(id) == 46);
            CHECK(same_str(json_string_value(json_object_get(c0, "type")), "function"));
            json_t *parsed = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
            CHECKF(json_is_object(parsed), "case %zu: arguments are not a JSON object", c);
            json_decref(parsed);
        }
        // nothing is lost: without calls the content is the text
        if (!n) CHECKF(same_str(r.content, k->text) || (!r.content && !*k->text), "case %zu: text lost", c);
        for (int rep = 0; rep < 8; rep++) {
            struct sg_tool_result m;
            int shape;
            stream(k->f, tools, k->text, &m, &shape);
            CHECKF(shape, "case %zu: delta shape", c);
            if (k->stream_exact) {
                CHECKF(same_str(m.content, r.content), "case %zu: streamed content '%s' vs '%s'", c,
                       m.content ? m.content : "(null)", r.content ? r.content : "(null)");
                CHECKF(json_equal(m.tool_calls, r.tool_calls) || (!m.tool_calls && !r.tool_calls),
                       "case %zu: streamed calls differ", c);
            }
            sg_tool_result_clear(&m);
        }
        sg_tool_result_clear(&r);
    }
    enum sg_tool_format f;
    CHECK(sg_tool_format_parse("qwen3_coder", &f) == 0 && f == SG_TOOL_QWEN3_CODER);
    CHECK(sg_tool_format_parse("mistral", &f) == VLLM_ERR_INVALID_ARGUMENT);
}

// ------------------------------------------------------ forced-call grammars --

static void test_grammars(const json_t *tools) {
    struct sg_grammar *g;
    CHECK(sg_compile_tool_call(SG_TOOL_HERMES, tools, "nope", 0, &g) == VLLM_ERR_INVALID_ARGUMENT);
    struct tokenizer *tok;
    if (tokfx_load("qwen3", &tok)) {
        fprintf(stderr, "SKIP part: qwen3 tokenizer not installed: forced-call grammars not walked\n");
        return;
    }
    int32_t eos[2] = {151645, 151643};
    struct sg_vocab *v = sg_vocab_create(tok, eos, 2);
    int words = CDIV(v->vocab_size, 32);
    uint32_t *mask = xmalloc((size_t)words * sizeof *mask);
    char schemas[] = "/tmp/sg_tool_schemas_XXXXXX", outs[] = "/tmp/sg_tool_outputs_XXXXXX";
    FILE *fs = fdopen(mkstemp(schemas), "w"), *fo = fdopen(mkstemp(outs), "w");
    size_t ti;
    json_t *tool;
    json_array_foreach(tools, ti, tool) {
        json_t *p = json_object_get(json_object_get(tool, "function"), "parameters");
        char *d = p ? json_dumps(p, JSON_COMPACT) : strdup("{}");
        fprintf(fs, "%s\n", d);
        free(d);
    }
    fclose(fs);
    int validated = 0;
    for (int f = 0; f < 3; f++)
        for (int mode = 0; mode < 3; mode++) { // required, named, required + parallel
            const char *name = mode == 1 ? "set_config" : NULL;
            CHECKF(sg_compile_tool_call((enum sg_tool_format)f, tools, name, mode == 2, &g) == 0, "format %d: %s", f,
                   vllm_last_error());
            for (int w = 0; w < 6; w++) {
                struct sg_matcher *m = sg_matcher_create(g, v);
                struct sg_buf text = {0};
                int done = 0;
                for (int step = 0; step < 400 && !done; step++) {
                    sg_matcher_fill_mask(m, mask);
                    int32_t id = sgt_pick(m, v, mask, words, step, 30);
                    if (id < 0 || sg_matcher_accept(m, id)) break;
                    if (sgt_is_eos(v, id)) done = 1;
                    else sg_buf_add(&text, v->bytes[id], v->len[id]);
                }
                CHECKF(done, "format %d mode %d: the walk did not finish", f, mode);
                struct sg_tool_result r;
                sg_tool_parse((enum sg_tool_format)f, text.p ? text.p : "", text.len, tools, 1, &r);
                int n = (int)json_array_size(r.tool_calls);
                CHECKF(n >= 1 && (mode == 2 || n == 1), "format %d mode %d: %d calls from '%s'", f, mode, n, text.p);
                CHECKF(!r.content, "format %d: content '%s' from '%s'", f, r.content, text.p);
                size_t q;
                json_t *call;
                json_array_foreach(r.tool_calls, q, call) {
                    json_t *fn = json_object_get(call, "function");
                    const char *nm = json_string_value(json_object_get(fn, "name"));
                    int idx = -1;
                    json_array_foreach(tools, ti, tool) if (same_str(nm, json_string_value(json_object_get(
                                                             json_object_get(tool, "function"), "name")))) idx = (int)ti;
                    CHECKF(idx >= 0 && (!name || !strcmp(nm, name)), "format %d: tool '%s'", f, nm);
                    json_t *rec = json_pack("{s:i, s:O}", "schema", idx, "text", json_object_get(fn, "arguments"));
                    char *line = json_dumps(rec, JSON_COMPACT);
                    fprintf(fo, "%s\n", line);
                    free(line);
                    json_decref(rec);
                    validated++;
                }
                sg_tool_result_clear(&r);
                free(text.p);
                sg_matcher_free(m);
            }
            sg_grammar_free(g);
        }
    fclose(fo);
    free(mask);
    sg_vocab_free(v);
    tok_free(tok);
    if (system("node --version >/dev/null 2>&1") || access(VLLM_SOURCE_DIR "/tools/oracle/structured/node_modules/ajv/package.json", R_OK)) {
        fprintf(stderr, "SKIP part: node or ajv missing: %d forced calls not validated\n", validated);
    } else {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "node %s/tools/oracle/structured/validate.mjs %s %s", VLLM_SOURCE_DIR, schemas, outs);
        CHECKF(system(cmd) == 0, "ajv rejected forced-call arguments (%s)", outs);
    }
    unlink(schemas);
    if (!test_failures) unlink(outs);
}

int main(void) {
    json_t *tools = json_loads(TOOLS, 0, NULL);
    CHECK(tools != NULL);
    test_parsers(tools);
    test_grammars(tools);
    json_decref(tools);
    return test_summary("test_sg_tools");
}
