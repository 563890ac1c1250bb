// test_server_equiv.c - the server adds no divergence: greedy token ids from
// /v1/completions (streamed or not, one at a time or all at once) equal
// offline `vllm generate` for the fixture prompts (tests/fixtures/nh_dense/
// golden.json, whose weights tiny_chat shares), and with ignore_eos equal the
// transformers oracle's greedy tokens. Prompts through the tokenizer and the
// chat template equal what HF tokenizers and @huggingface/jinja gave
// (tests/fixtures/tiny_chat/oracle.json).
// usage: test_server_equiv VLLM_BINARY MODEL_DIR   (env VLLM_FIXTURES)
#include <pthread.h>
#include <string.h>

#include "server/harness.h"
#include "test.h"
#include "util.h"

static const char *vllm_bin, *model_dir;
static int port, compared;

// `vllm generate` for one prompt: its ids (JSON text) and finish reason.
static int offline(const json_t *prompt, int max_tokens, int ignore_eos, char **ids_json, char *finish, size_t cap) {
    char cmd[8192];
    const char *args = getenv("VLLM_SERVER_TEST_ARGS"); // the server's backend flags (harness.h)
    int n = snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --threads 1 %s --max-tokens %d%s --prompt-ids ",
                     vllm_bin, model_dir, args ? args : "", max_tokens, ignore_eos ? " --ignore-eos" : "");
    for (size_t i = 0; i < json_array_size(prompt); i++)
        n += snprintf(cmd + n, sizeof cmd - n, "%s%lld", i ? "," : "", json_integer_value(json_array_get(prompt, i)));
    FILE *f = popen(cmd, "r");
    char line[65536] = "", fin[256] = "";
    if (!f || !fgets(line, sizeof line, f) || !fgets(fin, sizeof fin, f)) {
        if (f) pclose(f);
        return -1;
    }
    int rc = pclose(f);
    json_t *ids = json_array();
    for (char *p = line, *end; *p && *p != '\n'; p = end) {
        long x = strtol(p, &end, 10);
        if (end == p) break;
        json_array_append_new(ids, json_integer(x));
    }
    *ids_json = json_dumps(ids, JSON_COMPACT);
    json_decref(ids);
    // "[finish: eos]" -> the OpenAI name: eos and stop strings are "stop"
    snprintf(finish, cap, "%s", strstr(fin, "length") ? "length" : "stop");
    return rc;
}

struct answer {
    char *ids;  // token_ids, JSON text
    char *text;
    char finish[16];
};

static int complete(const json_t *prompt, int max_tokens, int ignore_eos, int stream, struct answer *a) {
    json_t *b = json_pack("{s:O,s:i,s:f,s:b,s:b,s:b}", "prompt", prompt, "max_tokens", max_tokens, "temperature", 0.0,
                          "ignore_eos", ignore_eos, "stream", stream, "return_token_ids", 1);
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    struct resp r;
    int rc = http_request(port, "POST", "/v1/completions", NULL, body, &r);
    free(body);
    memset(a, 0, sizeof *a);
    if (rc || r.status != 200) {
        resp_free(&r);
        return -1;
    }
    json_t *ids = json_array();
    size_t cap = 4096;
    a->text = calloc(1, cap);
    int nev = 1;
    char **ev = stream ? sse_events(r.body, &nev) : NULL;
    for (int i = 0; i < nev; i++) {
        json_t *j = json_loads(stream ? ev[i] : r.body, 0, NULL);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_array_extend(ids, json_object_get(ch, "token_ids"));
        const char *t = json_string_value(json_object_get(ch, "text"));
        if (t && strlen(a->text) + strlen(t) < cap) strcat(a->text, t);
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f) snprintf(a->finish, sizeof a->finish, "%s", f);
        json_decref(j);
    }
    sse_free(ev);
    a->ids = json_dumps(ids, JSON_COMPACT);
    json_decref(ids);
    resp_free(&r);
    return 0;
}

static void answer_free(struct answer *a) {
    free(a->ids);
    free(a->text);
}

static int count_ids(const char *json) {
    json_t *j = json_loads(json, 0, NULL);
    int n = (int)json_array_size(j);
    json_decref(j);
    return n;
}

struct job {
    const json_t *prompt;
    int max_tokens;
    struct answer a;
};

static void *job_main(void *arg) {
    struct job *j = arg;
    complete(j->prompt, j->max_tokens, 1, 1, &j->a);
    return NULL;
}

static void test_generate(const json_t *golden) {
    json_t *prompts = json_object_get(golden, "prompts"), *greedy = json_object_get(golden, "greedy");
    size_t np = json_array_size(prompts);
    CHECKF(np > 0 && np == json_array_size(greedy), "golden.json has no prompts");
    struct job *jobs = calloc(np, sizeof *jobs);
    for (size_t i = 0; i < np; i++) {
        const json_t *p = json_array_get(prompts, i);
        int n = (int)json_array_size(json_array_get(greedy, i));
        char *want_greedy = json_dumps(json_array_get(greedy, i), JSON_COMPACT);
        for (int ignore_eos = 0; ignore_eos < 2; ignore_eos++) {
            char *off = NULL, fin[16];
            CHECKF(offline(p, n, ignore_eos, &off, fin, sizeof fin) == 0, "vllm generate failed on prompt %zu", i);
            if (!off) continue;
            if (ignore_eos) CHECKF(!strcmp(off, want_greedy), "prompt %zu: vllm generate differs from golden.json", i);
            struct answer a[2];
            for (int stream = 0; stream < 2; stream++) {
                CHECKF(complete(p, n, ignore_eos, stream, &a[stream]) == 0, "prompt %zu: request failed", i);
                CHECKF(a[stream].ids && !strcmp(a[stream].ids, off),
                       "prompt %zu (stream %d, ignore_eos %d): server %s, vllm generate %s", i, stream, ignore_eos,
                       a[stream].ids ? a[stream].ids : "-", off);
                CHECKF(!strcmp(a[stream].finish, fin), "prompt %zu: finish %s, vllm generate %s", i, a[stream].finish,
                       fin);
                if (a[stream].ids && !strcmp(a[stream].ids, off)) compared += count_ids(off);
            }
            CHECKF(a[0].text && a[1].text && !strcmp(a[0].text, a[1].text), "prompt %zu: streamed text differs", i);
            answer_free(&a[0]);
            answer_free(&a[1]);
            free(off);
        }
        jobs[i] = (struct job){p, n, {0}};
        free(want_greedy);
    }
    // All prompts at once: batched on the engine, each still equals the oracle.
    pthread_t th[np];
    for (size_t i = 0; i < np; i++) pthread_create(&th[i], NULL, job_main, &jobs[i]);
    for (size_t i = 0; i < np; i++) pthread_join(th[i], NULL);
    for (size_t i = 0; i < np; i++) {
        char *want = json_dumps(json_array_get(greedy, i), JSON_COMPACT);
        CHECKF(jobs[i].a.ids && !strcmp(jobs[i].a.ids, want), "prompt %zu, concurrent: %s, golden %s", i,
               jobs[i].a.ids ? jobs[i].a.ids : "-", want);
        if (jobs[i].a.ids && !strcmp(jobs[i].a.ids, want)) compared += count_ids(want);
        free(want);
        answer_free(&jobs[i].a);
    }
    free(jobs);
}

static int ids_equal(const json_t *a, const json_t *b) { return json_is_array(a) && json_equal(a, b); }

static void test_text_oracle(const json_t *oracle) {
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(oracle, "encode"), i, c) {
        for (int special = 0; special < 2; special++) {
            int st;
            json_t *r = http_post_json(port, "/tokenize",
                                       json_pack("{s:O,s:b}", "prompt", json_object_get(c, "text"),
                                                 "add_special_tokens", special),
                                       &st);
            json_t *want = json_object_get(c, special ? "ids_special" : "ids");
            CHECKF(st == 200 && ids_equal(json_object_get(r, "tokens"), want), "/tokenize %s (special %d) differs",
                   json_string_value(json_object_get(c, "text")), special);
            CHECK(json_integer_value(json_object_get(r, "count")) == (json_int_t)json_array_size(want));
            if (st == 200 && ids_equal(json_object_get(r, "tokens"), want)) compared += (int)json_array_size(want);
            json_decref(r);
        }
        // /detokenize gives the text back
        int st;
        json_t *r = http_post_json(port, "/detokenize", json_pack("{s:O}", "tokens", json_object_get(c, "ids")), &st);
        CHECKF(st == 200 && json_equal(json_object_get(r, "prompt"), json_object_get(c, "text")),
               "/detokenize of %s differs", json_string_value(json_object_get(c, "text")));
        json_decref(r);
    }
    json_t *chat = json_object_get(oracle, "chat"), *want = json_object_get(chat, "ids");
    int st;
    json_t *r = http_post_json(port, "/tokenize", json_pack("{s:O}", "messages", json_object_get(chat, "messages")), &st);
    CHECKF(st == 200 && ids_equal(json_object_get(r, "tokens"), want), "/tokenize of the chat differs from the oracle");
    json_decref(r);
    r = http_post_json(port, "/v1/chat/completions",
                       json_pack("{s:O,s:i,s:b}", "messages", json_object_get(chat, "messages"), "max_tokens", 2,
                                 "return_token_ids", 1),
                       &st);
    CHECKF(st == 200 && ids_equal(json_object_get(r, "prompt_token_ids"), want),
           "the chat prompt's token ids differ from the oracle's");
    if (st == 200 && ids_equal(json_object_get(r, "prompt_token_ids"), want)) compared += (int)json_array_size(want);
    json_decref(r);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s VLLM_BINARY MODEL_DIR\n", argv[0]);
        return 2;
    }
    vllm_bin = argv[1];
    model_dir = argv[2];
    char *gpath = tu_fixture("nh_dense/golden.json"), *opath = tu_fixture("tiny_chat/oracle.json");
    json_t *golden = json_load_file(gpath, 0, NULL), *oracle = json_load_file(opath, 0, NULL);
    CHECKF(golden && oracle, "cannot read %s or %s", gpath, opath);
    struct srv s;
    srv_start(&s, vllm_bin, model_dir, NULL);
    port = s.port;
    if (golden) test_generate(golden);
    if (oracle) test_text_oracle(oracle);
    printf("server_equiv: %d token ids compared\n", compared);
    CHECKF(compared > 0, "nothing compared");
    CHECKF(srv_stop(&s, 20) == 0, "the server did not exit 0 after SIGTERM");
    json_decref(golden);
    json_decref(oracle);
    free(gpath);
    free(opath);
    return test_summary("server_equiv");
}
