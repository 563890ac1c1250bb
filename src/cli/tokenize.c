// tokenize.c - `vllm tokenize`: encode / decode text with a model's tokenizer.
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/common.h"
#include "core/json.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: vllm tokenize --model DIR [options] [TEXT]\n\n"
               "Encodes TEXT (or standard input) with the model's tokenizer.json and prints\n"
               "one line per token: the id and its vocabulary string (JSON-quoted).\n\n"
               "options:\n"
               "  --model DIR     model directory (tokenizer.json, tokenizer_config.json)\n"
               "  --ids           print only the ids, space-separated\n"
               "  --no-special    do not add BOS/EOS (the post-processor)\n"
               "  --jsonl FILE    each line a JSON string; prints one line of ids per line\n"
               "                  (no special tokens added)\n"
               "  --decode        with --jsonl: each line a JSON array of ids; prints one\n"
               "                  JSON string per line\n"
               "  --chat FILE     render the chat template for {\"messages\", ...}\n");
}

static void print_json_string(const char *s, size_t n) {
    json_t *j = json_stringn_nocheck(s, n);
    char *d = json_dumps(j, JSON_ENCODE_ANY);
    fputs(d ? d : "\"\"", stdout);
    free(d);
    json_decref(j);
}

static int encode_line(const struct tokenizer *t, const char *text, size_t len, int add_special,
                       int ids_only) {
    int32_t *ids;
    int n;
    if (tok_encode(t, text, len, add_special, &ids, &n)) return 1;
    for (int i = 0; i < n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", (int)ids[i]);
            continue;
        }
        const char *p = tok_id_to_piece(t, ids[i]);
        printf("%d\t", (int)ids[i]);
        print_json_string(p ? p : "", p ? strlen(p) : 0);
        putchar('\n');
    }
    if (ids_only) putchar('\n');
    free(ids);
    return 0;
}

// --jsonl: one JSON value per input line, one output line each.
static int run_jsonl(const struct tokenizer *t, const char *path, int decode) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "vllm tokenize: cannot open %s\n", path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int lineno = 0, rc = 0;
    while (!rc && (got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) got--;
        json_error_t e;
        json_t *j = json_loadb(line, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
        if (!decode && json_is_string(j)) {
            if (encode_line(t, json_string_value(j), json_string_length(j), 0, 1)) rc = 1;
        } else if (decode && json_is_array(j)) {
            size_t n = json_array_size(j);
            int32_t *ids = xmalloc((n + 1) * sizeof *ids);
            for (size_t i = 0; i < n && !rc; i++) {
                json_t *v = json_array_get(j, i);
                if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX) {
                    vllm_err(VLLM_ERR_INVALID_ARGUMENT, "line %d: element %zu is not a token id", lineno, i);
                    rc = 1;
                } else {
                    ids[i] = (int32_t)json_integer_value(v);
                }
            }
            char *text;
            size_t len;
            if (!rc && tok_decode(t, ids, (int)n, 0, &text, &len) == 0) {
                print_json_string(text, len);
                putchar('\n');
                free(text);
            } else {
                rc = 1;
            }
            free(ids);
        } else {
            vllm_err(VLLM_ERR_INVALID_ARGUMENT, "%s line %d: expected a JSON %s", path, lineno,
                     decode ? "array of ids" : "string");
            rc = 1;
        }
        json_decref(j);
        if (rc) fprintf(stderr, "vllm tokenize: %s line %d: %s\n", path, lineno, vllm_last_error());
    }
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

// Prints the chat template of `model` rendered for the request in `path`:
// {"messages": [...], "add_generation_prompt": bool, "tools": [...]}.
static int run_chat(const char *model, const char *path) {
    struct chat_template *ct;
    json_t *req = NULL;
    char *out = NULL;
    int rc = chat_template_load(model, &ct);
    if (rc == VLLM_ERR_IO && !strstr(vllm_last_error(), model)) vllm_err(rc, "%s has no chat template", model);
    if (!rc) {
        rc = json_load_path(path, &req);
        if (!rc) rc = chat_template_render(ct, req, &out);
        chat_template_free(ct);
    }
    if (rc) fprintf(stderr, "vllm tokenize: %s\n", vllm_last_error());
    else fputs(out, stdout);
    free(out);
    json_decref(req);
    return rc ? 1 : 0;
}

int cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *jsonl = NULL, *chat = NULL, *text = NULL;
    int ids_only = 0, decode = 0, add_special = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--jsonl") && i + 1 < argc) jsonl = argv[++i];
        else if (!strcmp(a, "--chat") && i + 1 < argc) chat = argv[++i];
        else if (!strcmp(a, "--ids")) ids_only = 1;
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "--no-special")) add_special = 0;
        else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "vllm tokenize: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!text) text = a;
        else {
            fprintf(stderr, "vllm tokenize: give the text as one argument (quote it)\n");
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "vllm tokenize: --model DIR is required\n");
        usage(stderr);
        return 2;
    }
    if (decode && !jsonl) {
        fprintf(stderr, "vllm tokenize: --decode needs --jsonl FILE\n");
        return 2;
    }
    if (chat) return run_chat(model, chat);
    struct tokenizer *t;
    if (tok_load(model, &t)) {
        fprintf(stderr, "vllm tokenize: %s\n", vllm_last_error());
        return 1;
    }
    int rc;
    if (jsonl) {
        rc = run_jsonl(t, jsonl, decode);
    } else {
        char *buf = NULL;
        size_t len = 0;
        if (!text) { // standard input, whole
            size_t cap = 0, got;
            do {
                buf = xrealloc(buf, cap += 65536);
                got = fread(buf + len, 1, cap - len, stdin);
                len += got;
            } while (got > 0);
            text = buf;
        } else {
            len = strlen(text);
        }
        rc = encode_line(t, text, len, add_special, ids_only);
        if (rc) fprintf(stderr, "vllm tokenize: %s\n", vllm_last_error());
        free(buf);
    }
    tok_free(t);
    return rc;
}
