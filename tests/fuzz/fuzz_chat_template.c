// fuzz_chat_template.c - libFuzzer harness: the input is template source,
// parsed and then rendered against a fixed conversation under tight bounds.
// Errors are fine; a crash, a hang, a leak or an out-of-bounds read is not.
// An input whose first byte is >= 0x80 is read as a list of fragments (one
// byte each, from FRAGMENTS), so that mutations keep the shape of Jinja.
// Seeds (real chat templates, small ones) in tests/fuzz/corpus/chat_template/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja.h"

static const char *CONVERSATION =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful. \\u00e9\\u4e2d\\ud83d\\ude00\"},"
    "{\"role\": \"user\", \"content\": \"  Hi <think>x</think> {{ y }}\\n\"},"
    "{\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"hmm\", \"thinking\": \"t\","
    " \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2.5, null, true]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"s\", \"arguments\": \"{\\\"q\\\": 1}\"}}]},"
    "{\"role\": \"tool\", \"content\": \"{\\\"t\\\": 21}\", \"tool_call_id\": \"c1\"},"
    "{\"role\": \"assistant\", \"content\": null},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"enum\": [\"a\", \"b\"]},"
    " \"n\": {\"type\": [\"number\", \"null\"], \"default\": 1}}, \"required\": [\"city\"]}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"reasoning_effort\": \"low\", \"builtin_tools\": [\"browser\", \"python\"]}";

static const char *FRAGMENTS[] = {
    "{%", "%}", "{%-", "-%}", "{{", "}}", "{{-", "-}}", "{#", "#}", "\n", " ", "  ", "\t", "x", "'s'", "\"q\"",
    "0", "1", "-1", "2.5", "(", ")", "[", "]", "{", "}", ",", ":", ".", "|", "=", "+", "-", "~", "*", "/", "//",
    "%", "**", "==", "!=", "<", ">", "<=", ">=", " in ", " not ", " and ", " or ", " is ", " if ", " else ",
    "for ", "endfor", "if ", "elif ", "else", "endif", "set ", "endset", "macro ", "endmacro", "call ",
    "endcall", "filter ", "endfilter", "break", "continue", "generation", "endgeneration", "messages",
    "message", "m", "loop", "loop.index", "loop.first", "loop.last", "loop.previtem", "ns", "namespace(",
    "range(", "raise_exception(", "strftime_now(", "dict(", "caller()", "varargs", "kwargs", "tools",
    "tool", "add_generation_prompt", "bos_token", "true", "false", "none", "role", "content",
    "tool_calls", "function", "arguments", "['content']", ".items()", ".keys()", ".get(", ".split(",
    ".strip(", ".startswith(", ".replace(", ".upper()", "[::-1]", "[1:]", "[-1]", "tojson", "tojson(indent=2)",
    "trim", "length", "join", "join(',')", "default(", "list", "string", "int", "float", "map(attribute='role')",
    "selectattr('role', 'equalto', 'user')", "rejectattr(", "sort", "unique", "reverse", "first", "last",
    "indent", "items", "dictsort", "round", "abs", "safe", "upper", "lower", "title", "capitalize", "replace(",
    "defined", "undefined", "string", "mapping", "iterable", "sequence", "number", "divisibleby ", "equalto ",
    "x = ", "ns.x = ", "a, b", "*", "**", "\\u00e9", "\xc3\xa9", "\xff", "\x00",
};

// Fragment mode: each byte after the first picks a fragment.
static char *from_fragments(const uint8_t *data, size_t size, size_t *len) {
    size_t n = sizeof FRAGMENTS / sizeof FRAGMENTS[0], total = 0;
    for (size_t i = 1; i < size; i++) total += strlen(FRAGMENTS[data[i] % n]);
    char *s = malloc(total + 1), *p = s;
    for (size_t i = 1; i < size; i++) {
        const char *f = FRAGMENTS[data[i] % n];
        memcpy(p, f, strlen(f));
        p += strlen(f);
    }
    *p = 0;
    *len = total;
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars) vars = json_loads(CONVERSATION, 0, NULL);
    if (!vars) abort();
    char *src = NULL;
    size_t len = size;
    if (size && data[0] >= 0x80) src = from_fragments(data, size, &len);
    struct jinja_template *t;
    int rc = jinja_parse(src ? src : (const char *)data, len, &t);
    free(src);
    if (rc != 0) return 0;
    struct jinja_render_opts o;
    jinja_render_opts_default(&o);
    o.now = 1754388000;
    o.max_output = 1 << 20;
    o.max_steps = 200000;
    o.max_call_depth = 32;
    char *out = NULL;
    if (jinja_render(t, vars, &o, &out, NULL) == 0) free(out);
    jinja_free(t);
    return 0;
}
