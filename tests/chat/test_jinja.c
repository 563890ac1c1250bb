// test_jinja.c - the Jinja interpreter on small templates: the cases of
// tests/fixtures/chat/unit.jsonl (rendered by @huggingface/jinja, with
// vllm.c's own expectation where it follows Python's Jinja2 instead), error
// statuses, the bounds that keep hostile templates finite, and
// chat_template_load / chat_template_render on made-up model directories.
// Usage: test_jinja FIXTURES/chat
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "test.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"

// Renders src with vars (JSON text or NULL). Returns the status; *out is
// malloc'd on success.
static int render_opts(const char *src, const char *vars, const struct jinja_render_opts *o, char **out) {
    *out = NULL;
    json_t *v = NULL;
    if (vars) {
        json_error_t e;
        v = json_loads(vars, JSON_ALLOW_NUL, &e);
        if (!v) {
            fprintf(stderr, "bad test JSON: %s\n", e.text);
            return -1;
        }
    }
    struct jinja_template *t;
    int rc = jinja_parse(src, strlen(src), &t);
    if (!rc) {
        rc = jinja_render(t, v, o, out, NULL);
        jinja_free(t);
    }
    json_decref(v);
    return rc;
}

static int render(const char *src, const char *vars, char **out) { return render_opts(src, vars, NULL, out); }

static void expect(const char *src, const char *vars, const char *want) {
    char *out;
    int rc = render(src, vars, &out);
    CHECKF(rc == VLLM_OK && !strcmp(out, want), "%s\n  got:  %s\n  want: %s", src, rc ? vllm_last_error() : out, want);
    free(out);
}

static void expect_err(const char *src, const char *vars, int status, const char *msg_part) {
    char *out;
    int rc = render(src, vars, &out);
    CHECKF(rc == status && strstr(vllm_last_error(), msg_part), "%s\n  got %d: %s\n  want %d containing \"%s\"", src,
           rc, rc ? vllm_last_error() : out, status, msg_part);
    free(out);
}

// ------------------------------------------------------------- unit.jsonl --

static void unit_fixtures(const char *fixtures) {
    char *path = path_join(fixtures, "unit.jsonl"), *text;
    int n = 0;
    CHECKF(read_file(path, &text, NULL) == VLLM_OK, "%s", vllm_last_error());
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        json_t *c = json_loads(line, 0, NULL);
        CHECK(c != NULL);
        line = nl ? nl + 1 : NULL;
        if (!c) continue;
        const char *src = json_string_value(json_object_get(c, "template"));
        const json_t *ours = json_object_get(c, "ours"), *want = ours ? ours : json_object_get(c, "output");
        char *vars = json_dumps(json_object_get(c, "vars"), JSON_COMPACT), *out;
        int rc = render(src, vars, &out);
        if (want && !json_is_null(want)) {
            int same = rc == VLLM_OK && !strcmp(out, json_string_value(want));
            CHECKF(same, "%s\n  got:  %s\n  want: %s", src, rc ? vllm_last_error() : out, json_string_value(want));
        } else
            CHECKF(rc != VLLM_OK, "%s\n  rendered \"%s\" where the oracle fails (%s)", src, out,
                   json_string_value(json_object_get(c, "error")));
        n++;
        free(out);
        free(vars);
        json_decref(c);
    }
    printf("unit.jsonl: %d templates\n", n);
    CHECK(n >= 100);
    free(text);
    free(path);
}

// ---------------------------------------------------------------- errors --

static void errors(void) {
    expect_err("{% if x %}\n  {{ 1 + }}\n{% endif %}", NULL, VLLM_ERR_FORMAT, "line 2:");
    expect_err("{% if true %}open", NULL, VLLM_ERR_FORMAT, "missing {% endif %}");
    expect_err("{% raw %}x{% endraw %}", NULL, VLLM_ERR_UNSUPPORTED, "{% raw %}");
    expect_err("{% include 'x' %}", NULL, VLLM_ERR_UNSUPPORTED, "{% include %}");
    expect_err("ab\n{{ 'x'|wordwrap }}", NULL, VLLM_ERR_UNSUPPORTED, "line 2:8: unknown filter 'wordwrap'");
    expect_err("{{ x is prime }}", NULL, VLLM_ERR_UNSUPPORTED, "unknown test 'prime'");
    expect_err("{{ cycler(1) }}", NULL, VLLM_ERR_UNSUPPORTED, "unknown function 'cycler'");
    expect_err("{% set x = [] %}{% set _ = x.append(1) %}", NULL, VLLM_ERR_UNSUPPORTED, "unknown method 'append'");
    expect_err("{{ raise_exception('No ' ~ 'way') }}", NULL, VLLM_ERR_INVALID_ARGUMENT, "raise_exception: No way");
    expect_err("{{ m.content + '!' }}", "{\"m\": {\"content\": null}}", VLLM_ERR_INVALID_ARGUMENT, "'+' applied to none");
    expect_err("{{ [1]|upper }}", NULL, VLLM_ERR_INVALID_ARGUMENT, "filter 'upper' cannot be applied to list");
    expect_err("{% for a, b in [[1]] %}{% endfor %}", NULL, VLLM_ERR_INVALID_ARGUMENT, "cannot unpack");
    expect_err("{% break %}", NULL, VLLM_ERR_FORMAT, "outside a for loop");
    expect_err("{% macro f() %}{% break %}{% endmacro %}{% for i in [1] %}{{ f() }}{% endfor %}", NULL,
               VLLM_ERR_FORMAT, "outside a for loop");
    expect_err("{{ 9223372036854775807 + 1 }}", NULL, VLLM_ERR_INVALID_ARGUMENT, "overflow");
    expect_err("{{ 99999999999999999999 }}", NULL, VLLM_ERR_UNSUPPORTED, "out of range");
    expect_err("{{ \"\\q\" }}", NULL, VLLM_ERR_FORMAT, "unknown escape");
    expect_err("{% macro f(a, a) %}{% endmacro %}", NULL, VLLM_ERR_FORMAT, "duplicate parameter");
    expect_err("{{ f(a=1, 2) }}", NULL, VLLM_ERR_FORMAT, "positional argument after a keyword");
    expect_err("{{ {1: 2} }}", NULL, VLLM_ERR_INVALID_ARGUMENT, "dict keys must be strings");
    // Nothing renders after an error, and the message names the first one.
    expect_err("{{ raise_exception('first') }}{{ raise_exception('second') }}", NULL, VLLM_ERR_INVALID_ARGUMENT, "first");
}

// ---------------------------------------------------------------- bounds --

static void bounds(void) {
    struct jinja_render_opts o;
    jinja_render_opts_default(&o);
    o.max_steps = 100000;
    char *out;
    int rc = render_opts("{% for i in range(1000) %}{% for j in range(1000) %}x{% endfor %}{% endfor %}", NULL, &o, &out);
    CHECKF(rc == VLLM_ERR_TOO_LONG && strstr(vllm_last_error(), "steps"), "%d %s", rc, vllm_last_error());
    free(out);
    jinja_render_opts_default(&o);
    o.max_output = 1000;
    rc = render_opts("{% for i in range(10000) %}xxxxxxxxxx{% endfor %}", NULL, &o, &out);
    CHECKF(rc == VLLM_ERR_TOO_LONG && strstr(vllm_last_error(), "1000 bytes"), "%d %s", rc, vllm_last_error());
    free(out);
    // A string doubled in a loop stops at the size bound, not at the memory's.
    expect_err("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL,
               VLLM_ERR_TOO_LONG, "bytes");
    expect_err("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, VLLM_ERR_TOO_LONG, "macro calls nested");
    expect_err("{{ range(100000000)|length }}", NULL, VLLM_ERR_TOO_LONG, "too long");
    // Parser and evaluator recursion are bounded.
    char *deep = xmalloc(20001);
    for (int i = 0; i < 10000; i++) deep[i] = '(', deep[19999 - i] = ')';
    deep[20000] = 0;
    char *src = xmalloc(20100);
    snprintf(src, 20100, "{{ %s }}", deep);
    expect_err(src, NULL, VLLM_ERR_FORMAT, "nested deeper");
    size_t k = (size_t)snprintf(src, 20100, "{{ 1");
    for (int i = 0; i < 4000; i++) k += (size_t)snprintf(src + k, 20100 - k, "+1");
    snprintf(src + k, 20100 - k, " }}");
    expect_err(src, NULL, VLLM_ERR_TOO_LONG, "nested deeper");
    free(src);
    free(deep);
    // Values that contain themselves print as an error, and are freed (ASan).
    expect_err("{% set ns = namespace() %}{% set ns.me = ns %}{% set ns.l = [ns] %}{{ ns }}", NULL, VLLM_ERR_TOO_LONG,
               "nested deeper");
    expect_err("{% set ns = namespace(x=[]) %}{% for i in range(2000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x|tojson }}",
               NULL, VLLM_ERR_TOO_LONG, "nested deeper");
    // A long chain of namespaces, dropped at once, is freed without deep recursion.
    expect("{% set st = namespace(head=namespace()) %}{% set st.cur = st.head %}{% for i in range(200000) %}"
           "{% set st.cur.next = namespace() %}{% set st.cur = st.cur.next %}{% endfor %}{% set st.head = none %}"
           "{% set st.cur = none %}ok",
           NULL, "ok");
    expect("{% macro m() %}{% macro inner() %}in{% endmacro %}{{ inner() }}{% endmacro %}{{ m() }}{{ m() }}", NULL, "inin");
}

// ---------------------------------------------------------- values, clock --

static void values(void) {
    expect("{{ x|tojson }}", "{\"x\": [1e-05, 1e16, 1e15, 0.1, -0.0, 1.5e300, 123.456, 1e-4, 2.0]}",
           "[1e-05, 1e+16, 1000000000000000.0, 0.1, -0.0, 1.5e+300, 123.456, 0.0001, 2.0]");
    expect("{{ x }} {{ x|string }} {{ y }}", "{\"x\": 1e22, \"y\": 9007199254740993}", "1e+22 1e+22 9007199254740993");
    expect("{{ s|tojson }}", "{\"s\": \"nul\\u0000 del\\u007f \\u2028\"}", "\"nul\\u0000 del\x7f \xe2\x80\xa8\"");
    expect("{{ 'é😀'|tojson(ensure_ascii=true) }}", NULL, "\"\\u00e9\\ud83d\\ude00\"");
    expect("{{ 'ΣΑΣ ΑΣ.'|lower }} {{ 'straße ﬁ'|upper }} {{ 'İ'|lower|length }}", NULL, "σας ας. STRASSE FI 2");
    expect("{{ x['a.b'] }} {{ xs|map(attribute='0')|list }}", "{\"x\": {\"a.b\": 1}, \"xs\": [[5], [6]]}", "1 [5, 6]");
    struct jinja_render_opts o;
    jinja_render_opts_default(&o);
    o.now = 1754388000; // 2025-08-05 10:00:00 UTC, a Tuesday
    char *out;
    int rc = render_opts("{{ strftime_now('%Y-%m-%d %H:%M:%S %b %B %a %A %y %j %I%p %% %Q') }}", NULL, &o, &out);
    CHECKF(rc == VLLM_OK && !strcmp(out, "2025-08-05 10:00:00 Aug August Tue Tuesday 25 217 10AM % %Q"), "%s",
           rc ? vllm_last_error() : out);
    free(out);
    o.now = 0; // the real clock: only the shape is known
    rc = render_opts("{{ strftime_now('%Y-%m-%d') }}", NULL, &o, &out);
    CHECKF(rc == VLLM_OK && strlen(out) == 10 && out[4] == '-' && out[7] == '-', "%s", rc ? vllm_last_error() : out);
    free(out);
    rc = render_opts("plain", NULL, NULL, &out);
    CHECK(rc == VLLM_OK && !strcmp(out, "plain"));
    free(out);
}

// ------------------------------------------------------- chat_template_* --

static char tmpdir[64];

static void write_file(const char *dir, const char *name, const char *text) {
    char *p = path_join(dir, name);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    free(p);
}

static char *model_dir(const char *name) {
    char *d = path_join(tmpdir, name);
    mkdir(d, 0700);
    return d;
}

static void remove_dir(const char *d) {
    static const char *files[] = {"tokenizer_config.json", "chat_template.jinja"};
    for (int i = 0; i < 2; i++) {
        char *p = path_join(d, files[i]);
        unlink(p);
        free(p);
    }
    rmdir(d);
}

static void chat_render(const char *dir, const char *request, int want_rc, const char *want) {
    struct chat_template *ct;
    int rc = chat_template_load(dir, &ct);
    CHECKF(rc == VLLM_OK, "load %s: %s", dir, vllm_last_error());
    if (rc) return;
    json_t *req = json_loads(request, 0, NULL);
    char *out;
    rc = chat_template_render(ct, req, &out);
    CHECKF(rc == want_rc && (rc ? strstr(vllm_last_error(), want) != NULL : !strcmp(out, want)),
           "%s %s\n  got %d: %s\n  want %d: %s", dir, request, rc, rc ? vllm_last_error() : out, want_rc, want);
    free(out);
    json_decref(req);
    chat_template_free(ct);
}

static void chat_templates(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/vllm_test_jinja_XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL);
    const char *msgs = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]";
    char req[256], req_gen[256], req_tools[256], req_extra[256];
    snprintf(req, sizeof req, "%s}", msgs);
    snprintf(req_gen, sizeof req_gen, "%s, \"add_generation_prompt\": true}", msgs);
    snprintf(req_tools, sizeof req_tools, "%s, \"tools\": [{\"type\": \"function\"}]}", msgs);
    snprintf(req_extra, sizeof req_extra, "%s, \"bos_token\": \"B\", \"enable_thinking\": false}", msgs);

    char *d = model_dir("string");
    write_file(d, "tokenizer_config.json",
               "{\"chat_template\": \"{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
               "{{ '|gen' if add_generation_prompt }}{{ '|' ~ enable_thinking if enable_thinking is defined }}"
               "{{ eos_token }}\", \"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"}, "
               "\"eos_token\": \"</s>\", \"pad_token\": null}");
    chat_render(d, req, VLLM_OK, "<s>hi</s>");
    chat_render(d, req_gen, VLLM_OK, "<s>hi|gen</s>");
    chat_render(d, req_extra, VLLM_OK, "Bhi|false</s>");
    chat_render(d, "[1]", VLLM_ERR_INVALID_ARGUMENT, "JSON object");
    chat_render(d, "{\"messages\": 3}", VLLM_ERR_INVALID_ARGUMENT, "\"messages\" list");
    remove_dir(d);
    free(d);

    d = model_dir("named");
    write_file(d, "tokenizer_config.json",
               "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"tools:{{ tools|length }}\"}, "
               "{\"name\": \"default\", \"template\": \"default:{{ messages|length }}\"}]}");
    chat_render(d, req, VLLM_OK, "default:1");
    chat_render(d, req_tools, VLLM_OK, "tools:1");
    remove_dir(d);
    free(d);

    // chat_template.jinja wins over the config's template, as in transformers.
    d = model_dir("jinja");
    write_file(d, "tokenizer_config.json", "{\"chat_template\": \"config\", \"eos_token\": \"E\"}");
    write_file(d, "chat_template.jinja", "file{{ eos_token }}\n");
    chat_render(d, req, VLLM_OK, "fileE");
    remove_dir(d);
    free(d);

    struct chat_template *ct = NULL;
    d = model_dir("none");
    write_file(d, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    CHECK(chat_template_load(d, &ct) == VLLM_ERR_IO && ct == NULL);
    write_file(d, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"rag\", \"template\": \"x\"}]}");
    CHECK(chat_template_load(d, &ct) == VLLM_ERR_FORMAT && strstr(vllm_last_error(), "default"));
    write_file(d, "tokenizer_config.json", "{\"chat_template\": \"{% for %}\"}");
    int rc = chat_template_load(d, &ct);
    CHECKF(rc == VLLM_ERR_FORMAT && strstr(vllm_last_error(), "tokenizer_config.json: template line 1:"), "%d %s", rc,
           vllm_last_error());
    write_file(d, "tokenizer_config.json", "{\"chat_template\": \"{% do x %}\"}");
    CHECK(chat_template_load(d, &ct) == VLLM_ERR_UNSUPPORTED && strstr(vllm_last_error(), "{% do %}"));
    write_file(d, "tokenizer_config.json", "{\"chat_template\": 5}");
    CHECK(chat_template_load(d, &ct) == VLLM_ERR_FORMAT);
    write_file(d, "tokenizer_config.json", "{not json");
    CHECK(chat_template_load(d, &ct) == VLLM_ERR_FORMAT);
    remove_dir(d);
    free(d);
    CHECK(chat_template_load("/nonexistent/model", &ct) == VLLM_ERR_IO);
    chat_template_free(NULL);
    rmdir(tmpdir);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FIXTURES/chat\n", argv[0]);
        return 2;
    }
    setenv("TZ", "UTC", 1);
    unit_fixtures(argv[1]);
    errors();
    bounds();
    values();
    chat_templates();
    return test_summary("jinja");
}
