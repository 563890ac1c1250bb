// test_server_fields.c - every request field of OpenAI's and vLLM's
// completions and chat schemas, from one list (tests/server/fields.tsv):
// each honored field has an observable effect, each no-op value is
// accepted, each rejected field gets a 400 naming it; and docs/SERVING.md's
// field table holds exactly the list's fields, each with the list's status.
// usage: test_server_fields VLLM_BINARY MODEL_DIR FIELDS_TSV SERVING_MD
#include <string.h>

#include "server/harness.h"
#include "test.h"

struct row {
    char *name, *api, *status, *value, *checks, *ref, *note;
};

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    s[fread(s, 1, (size_t)n, f)] = 0;
    fclose(f);
    return s;
}

// The rows of the list (tabs split columns in place; text is kept alive).
static int load_rows(char *text, struct row *rows, int cap) {
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (*line == '#' || !*line) continue;
        char *col[7] = {0};
        int k = 0;
        for (char *p = line; k < 7; k++) {
            col[k] = p;
            char *t = strchr(p, '\t');
            if (!t) { k++; break; }
            *t = 0;
            p = t + 1;
        }
        CHECKF(k >= 3 && n < cap, "fields.tsv: bad line '%s'", line);
        if (k < 3 || n >= cap) continue;
        for (int j = k; j < 7; j++) col[j] = "";
        rows[n++] = (struct row){col[0], col[1], col[2], col[3], col[4], col[5], col[6]};
    }
    return n;
}

static json_t *base_request(int chat) {
    if (chat)
        return json_pack("{s:[{s:s,s:s}],s:i,s:f}", "messages", "role", "user", "content", "hello", "max_tokens", 8,
                         "temperature", 0.0);
    return json_pack("{s:s,s:i,s:f}", "prompt", "hello world", "max_tokens", 8, "temperature", 0.0);
}

struct reply {
    int status;
    char *body;
    json_t *json;
};

static void post(int port, int chat, const char *overlay, struct reply *r) {
    json_t *req = base_request(chat);
    if (overlay && *overlay && strcmp(overlay, "-")) {
        json_error_t e;
        json_t *o = json_loads(overlay, 0, &e);
        CHECKF(json_is_object(o), "fields.tsv: bad JSON %s: %s", overlay, e.text);
        if (o) json_object_update(req, o);
        json_decref(o);
    }
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    struct resp hr;
    http_request(port, "POST", chat ? "/v1/chat/completions" : "/v1/completions", NULL, body, &hr);
    free(body);
    r->status = hr.status;
    r->body = hr.body ? strdup(hr.body) : strdup("");
    r->json = json_loads(r->body, 0, NULL);
    resp_free(&hr);
}

static void reply_free(struct reply *r) {
    free(r->body);
    json_decref(r->json);
}

// A dotted path ("choices.0.text"; "text": the output text of either API).
static json_t *get_path(json_t *j, const char *path) {
    if (!strcmp(path, "text")) {
        json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        json_t *t = json_object_get(c, "text");
        return t ? t : json_object_get(json_object_get(c, "message"), "content");
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = strtok(buf, "."); p && j; p = strtok(NULL, "."))
        j = json_is_array(j) ? json_array_get(j, strtoul(p, NULL, 10)) : json_object_get(j, p);
    return j;
}

static void trim(char *s) {
    char *e = s + strlen(s);
    while (e > s && e[-1] == ' ') *--e = 0;
}

// One check of a honored field's reply (ref: the ref request's, or NULL).
static void check_one(const struct row *w, int chat, char *chk, const struct reply *r, const struct reply *ref) {
    while (*chk == ' ') chk++;
    trim(chk);
    const char *api = chat ? "chat" : "completions";
    char *op;
    if (!strcmp(chk, "accepted")) return; // the status was checked
    if ((op = strstr(chk, "!="))) {
        *op = 0;
        json_t *a = get_path(r->json, chk), *b = ref ? get_path(ref->json, chk) : NULL;
        char *sa = a ? json_dumps(a, JSON_ENCODE_ANY) : NULL, *sb = b ? json_dumps(b, JSON_ENCODE_ANY) : NULL;
        CHECKF(a && !json_equal(a, b), "%s (%s): %s is %s, the same as without it (%s)", w->name, api, chk,
               sa ? sa : "missing", sb ? sb : "missing");
        free(sa), free(sb);
    } else if ((op = strchr(chk, '='))) {
        *op = 0;
        json_t *want = json_loads(op + 1, JSON_DECODE_ANY, NULL), *got = get_path(r->json, chk);
        char *s = got ? json_dumps(got, JSON_ENCODE_ANY) : NULL;
        CHECKF(want && json_equal(got, want), "%s (%s): %s is %s, want %s", w->name, api, chk, s ? s : "missing", op + 1);
        free(s);
        json_decref(want);
    } else if ((op = strchr(chk, '~'))) {
        *op = 0;
        const char *text = !strcmp(chk, "body") ? r->body : json_string_value(get_path(r->json, chk));
        CHECKF(text && strstr(text, op + 1), "%s (%s): %s does not hold '%s'", w->name, api, chk, op + 1);
    } else {
        CHECKF(0, "fields.tsv: %s: unknown check '%s'", w->name, chk);
    }
}

// Sends one row's request to one API and checks what the row says.
static int run_row(int port, const struct row *w, int chat) {
    const char *api = chat ? "chat" : "completions";
    struct reply r;
    if (!strcmp(w->status, "rejected")) {
        post(port, chat, w->value, &r);
        char param[128];
        snprintf(param, sizeof param, "%.*s", (int)strcspn(w->name, "."), w->name);
        json_t *p = json_object_get(json_object_get(r.json, "error"), "param");
        CHECKF(r.status == 400 && json_is_string(p) && !strcmp(json_string_value(p), param),
               "%s (%s): %s gives %d, param %s, want a 400 naming it (%.200s)", w->name, api, w->value, r.status,
               json_is_string(p) ? json_string_value(p) : "null", r.body);
        reply_free(&r);
        return 1;
    }
    if (!strcmp(w->status, "noop")) {
        post(port, chat, w->value, &r);
        CHECKF(r.status == 200, "%s (%s): %s gives %d, want 200 (%.200s)", w->name, api, w->value, r.status, r.body);
        reply_free(&r);
        return 1;
    }
    if (strcmp(w->status, "honored")) return 0; // structured: issue 14's tests
    CHECKF(*w->checks, "fields.tsv: %s has no checks", w->name);
    struct reply ref;
    post(port, chat, w->ref, &ref); // twice: the second sees the prefix cache warm
    reply_free(&ref);
    post(port, chat, w->ref, &ref);
    post(port, chat, w->value, &r);
    CHECKF(r.status == 200 && ref.status == 200, "%s (%s): %s gives %d, its ref %d (%.200s)", w->name, api, w->value,
           r.status, ref.status, r.body);
    if (r.status == 200) {
        char checks[1024];
        snprintf(checks, sizeof checks, "%s", w->checks);
        char *save = NULL;
        for (char *c = strtok_r(checks, ";", &save); c; c = strtok_r(NULL, ";", &save)) check_one(w, chat, c, &r, &ref);
    }
    reply_free(&r);
    reply_free(&ref);
    return 1;
}

// docs/SERVING.md's field table (its "## Request fields" section):
// "| `name` | api | status | note |" rows.
static void check_docs(const char *all, const struct row *rows, int n) {
    int found = 0;
    const char *sec = strstr(all, "\n## Request fields\n");
    CHECKF(sec, "docs/SERVING.md has no '## Request fields' section");
    if (!sec) return;
    const char *next = strstr(sec + 1, "\n## ");
    char *md = strndup(sec, next ? (size_t)(next - sec) : strlen(sec));
    for (int i = 0; i < n; i++) {
        char key[160];
        snprintf(key, sizeof key, "| `%s` | %s | %s |", rows[i].name, rows[i].api, rows[i].status);
        CHECKF(strstr(md, key), "docs/SERVING.md has no row '%s'", key);
    }
    for (const char *p = strstr(md, "\n| `"); p; p = strstr(p + 1, "\n| `")) {
        const char *name = p + 4, *end = strchr(name, '`');
        if (!end) break;
        int known = 0;
        for (int i = 0; i < n && !known; i++)
            known = strlen(rows[i].name) == (size_t)(end - name) && !strncmp(rows[i].name, name, end - name);
        CHECKF(known, "docs/SERVING.md lists `%.*s`, which fields.tsv does not", (int)(end - name), name);
        found++;
    }
    CHECKF(found >= 90, "docs/SERVING.md's field table has only %d rows", found);
    free(md);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s VLLM_BINARY MODEL_DIR FIELDS_TSV SERVING_MD\n", argv[0]);
        return 2;
    }
    static struct row rows[256];
    char *tsv = slurp(argv[3]), *md = slurp(argv[4]);
    CHECKF(tsv && md, "cannot read %s or %s", argv[3], argv[4]);
    if (!tsv || !md) return test_summary("server_fields");
    int n = load_rows(tsv, rows, 256);
    CHECKF(n >= 90, "fields.tsv has only %d rows", n);
    check_docs(md, rows, n);
    const char *extra[] = {"--scheduling-policy", "priority", "--trust-request-chat-template", NULL};
    struct srv s;
    srv_start(&s, argv[1], argv[2], extra);
    int sent = 0;
    for (int i = 0; i < n; i++) {
        const char *api = rows[i].api;
        if (strcmp(api, "chat")) sent += run_row(s.port, &rows[i], 0);
        if (strcmp(api, "cmpl")) sent += run_row(s.port, &rows[i], 1);
    }
    CHECKF(sent >= 100, "only %d requests were checked", sent);
    CHECKF(srv_stop(&s, 20) == 0, "the server did not exit 0 after SIGTERM");
    free(tsv);
    free(md);
    return test_summary("server_fields");
}
