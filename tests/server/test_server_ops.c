// test_server_ops.c - what deployments around `vllm serve` rely on: /health
// 503 while the model loads (and the model routes 503, /version and /load
// answering), /ping (GET and POST), /load counting requests in flight, CORS
// with vLLM's defaults and with explicit lists (preflights answered before
// authentication), and --scheduling-policy priority end to end: of two
// waiting requests the more urgent runs first.
// usage: test_server_ops VLLM_BINARY MODEL_DIR
#include <string.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/harness.h"
#include "test.h"

static const char *vllm_bin, *model_dir;

static int status_of(int port, const char *method, const char *path, const char *headers, const char *body) {
    struct resp r;
    http_request(port, method, path, headers, body, &r);
    int st = r.status;
    resp_free(&r);
    return st;
}

static void test_loading(void) {
    setenv("VLLM_TEST_LOAD_DELAY_MS", "4000", 1); // long enough for the checks below on a loaded (or ASan) machine
    const char *extra[] = {"--api-key", "k", NULL};
    struct srv s;
    srv_start_marked(&s, vllm_bin, model_dir, extra, " port "); // bound, not loaded
    unsetenv("VLLM_TEST_LOAD_DELAY_MS");
    const char *auth = "Authorization: Bearer k\r\n";
    CHECKF(status_of(s.port, "GET", "/health", NULL, NULL) == 503, "/health while loading is not 503");
    CHECKF(status_of(s.port, "GET", "/ping", NULL, NULL) == 503, "/ping while loading is not 503");
    CHECKF(status_of(s.port, "POST", "/v1/completions", auth, "{\"prompt\": \"hi\"}") == 503,
           "a completion while loading is not 503");
    CHECKF(status_of(s.port, "GET", "/v1/models", auth, NULL) == 503, "/v1/models while loading is not 503");
    CHECKF(status_of(s.port, "GET", "/version", NULL, NULL) == 200, "/version while loading is not 200");
    CHECKF(status_of(s.port, "GET", "/load", auth, NULL) == 200, "/load while loading is not 200");
    CHECKF(status_of(s.port, "GET", "/load", NULL, NULL) == 401, "/load needs the API key");
    double t0 = now_sec();
    while (status_of(s.port, "GET", "/health", NULL, NULL) != 200 && now_sec() - t0 < 60) usleep(20000);
    CHECKF(status_of(s.port, "GET", "/health", NULL, NULL) == 200, "/health is not 200 once loaded");
    CHECKF(status_of(s.port, "POST", "/v1/completions", auth, "{\"prompt\": \"hi\", \"max_tokens\": 2}") == 200,
           "a completion once loaded is not 200");
    CHECKF(srv_stop(&s, 20) == 0, "the server did not exit 0 after SIGTERM");
}

static char *header(int port, const char *method, const char *path, const char *headers, const char *name, int *st,
                    char **body) {
    struct resp r;
    http_request(port, method, path, headers, NULL, &r);
    char *v = resp_header(&r, name);
    if (st) *st = r.status;
    if (body) *body = r.body ? strdup(r.body) : NULL;
    resp_free(&r);
    return v;
}

static int is(const char *v, const char *want) { return v && !strcmp(v, want); }

static const char *str(const json_t *j) { return json_is_string(j) ? json_string_value(j) : ""; }

static void test_cors_default(int port) {
    char *v = header(port, "GET", "/v1/models", "Origin: http://example.com\r\n", "Access-Control-Allow-Origin", NULL,
                     NULL);
    CHECKF(is(v, "*"), "default CORS: Access-Control-Allow-Origin is %s, want *", v ? v : "missing");
    free(v);
    v = header(port, "GET", "/v1/models", NULL, "Access-Control-Allow-Origin", NULL, NULL);
    CHECKF(!v, "no Origin, yet Access-Control-Allow-Origin %s", v);
    free(v);
    const char *pre = "Origin: http://example.com\r\nAccess-Control-Request-Method: POST\r\n"
                      "Access-Control-Request-Headers: authorization, content-type\r\n";
    int st;
    char *m = header(port, "OPTIONS", "/v1/chat/completions", pre, "Access-Control-Allow-Methods", &st, NULL);
    char *h = header(port, "OPTIONS", "/v1/chat/completions", pre, "Access-Control-Allow-Headers", NULL, NULL);
    char *a = header(port, "OPTIONS", "/v1/chat/completions", pre, "Access-Control-Max-Age", NULL, NULL);
    CHECKF(st == 200, "preflight: %d", st);
    CHECKF(m && strstr(m, "POST") && strstr(m, "GET"), "preflight: Allow-Methods %s", m ? m : "missing");
    CHECKF(is(h, "authorization, content-type"), "preflight: Allow-Headers %s", h ? h : "missing");
    CHECKF(is(a, "600"), "preflight: Max-Age %s", a ? a : "missing");
    free(m), free(h), free(a);
    // an OPTIONS that is no preflight is still a 405
    CHECKF(status_of(port, "OPTIONS", "/v1/models", NULL, NULL) == 405, "a plain OPTIONS is not 405");
}

static void test_cors_lists(void) {
    const char *extra[] = {"--allowed-origins", "[\"http://ok.example\"]", "--allowed-methods", "[\"GET\", \"POST\"]",
                           "--allowed-headers", "[\"x-custom\"]", "--allow-credentials", "--api-key", "k", NULL};
    struct srv s;
    srv_start(&s, vllm_bin, model_dir, extra);
    int st;
    char *body = NULL;
    // a preflight needs no key: the browser sends none
    char *v = header(s.port, "OPTIONS", "/v1/completions",
                     "Origin: http://ok.example\r\nAccess-Control-Request-Method: POST\r\n"
                     "Access-Control-Request-Headers: X-Custom\r\n",
                     "Access-Control-Allow-Origin", &st, NULL);
    CHECKF(st == 200 && is(v, "http://ok.example"), "allowed preflight: %d, origin %s", st, v ? v : "missing");
    free(v);
    v = header(s.port, "OPTIONS", "/v1/completions",
               "Origin: http://ok.example\r\nAccess-Control-Request-Method: POST\r\n", "Access-Control-Allow-Credentials",
               &st, NULL);
    CHECKF(is(v, "true"), "--allow-credentials: %s", v ? v : "missing");
    free(v);
    v = header(s.port, "OPTIONS", "/v1/completions",
               "Origin: http://evil.example\r\nAccess-Control-Request-Method: DELETE\r\n"
               "Access-Control-Request-Headers: x-other\r\n",
               "Access-Control-Allow-Origin", &st, &body);
    CHECKF(st == 400 && !v, "disallowed preflight: %d, origin %s", st, v ? v : "none");
    CHECKF(body && strstr(body, "Disallowed CORS origin") && strstr(body, "method") && strstr(body, "headers"),
           "disallowed preflight body: %s", body ? body : "");
    free(v), free(body);
    v = header(s.port, "GET", "/v1/models", "Origin: http://ok.example\r\nAuthorization: Bearer k\r\n", "Vary", &st,
               NULL);
    CHECKF(st == 200 && is(v, "Origin"), "an allowed origin's request: %d, Vary %s", st, v ? v : "missing");
    free(v);
    v = header(s.port, "GET", "/v1/models", "Origin: http://evil.example\r\nAuthorization: Bearer k\r\n",
               "Access-Control-Allow-Origin", &st, NULL);
    CHECKF(st == 200 && !v, "a disallowed origin got Access-Control-Allow-Origin %s", v ? v : "");
    free(v);
    CHECKF(srv_stop(&s, 20) == 0, "the CORS server did not exit 0");
}

// A raw request on its own connection, answered later.
static int send_raw(struct conn *c, int port, const char *body) {
    char req[1024];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    return conn_open(c, port, 30) || conn_send(c, req, n);
}

static double metric(int port, const char *name) {
    char *m = http_metrics(port);
    double v = metric_value(m, name, NULL);
    free(m);
    return v;
}

static double server_load(int port) {
    int st;
    json_t *j = http_get_json(port, "/load", &st);
    double v = st == 200 ? json_number_value(json_object_get(j, "server_load")) : -1;
    json_decref(j);
    return v;
}

// One sequence at a time: a long stream runs; b (priority 5) then c
// (priority 0) wait; when the stream is closed, c must finish first.
static void test_priority_and_load(int port) {
    CHECKF(status_of(port, "GET", "/ping", NULL, NULL) == 200 && status_of(port, "POST", "/ping", NULL, NULL) == 200,
           "/ping GET and POST");
    CHECKF(server_load(port) == 0, "/load of an idle server is %g", server_load(port));
    struct conn a, b, c;
    CHECK(send_raw(&a, port, "{\"prompt\": [5, 6], \"max_tokens\": 8000, \"ignore_eos\": true, \"stream\": true}") == 0);
    while (!a.eof && (!a.buf || !strstr(a.buf, "\"text\""))) conn_read_more(&a, 1);
    CHECK(send_raw(&b, port, "{\"prompt\": [7, 8], \"max_tokens\": 8000, \"ignore_eos\": true, \"priority\": 5}") == 0);
    double t0 = now_sec();
    while (metric(port, "vllm:num_requests_waiting") < 1 && now_sec() - t0 < 10) usleep(5000);
    CHECK(send_raw(&c, port, "{\"prompt\": [9, 10], \"max_tokens\": 3, \"priority\": 0}") == 0);
    while (metric(port, "vllm:num_requests_waiting") < 2 && now_sec() - t0 < 10) usleep(5000);
    CHECKF(metric(port, "vllm:num_requests_waiting") == 2, "b and c are not both waiting");
    CHECKF(server_load(port) == 3, "/load with three requests in flight is %g", server_load(port));
    conn_close(&a); // aborts the stream: the more urgent of b and c runs next
    struct resp rc;
    CHECK(conn_read_response(&c, &rc) == 0 && rc.status == 200);
    // b (8000 tokens) is still running when c's answer is read: FCFS would
    // have run b to its end first
    char tmp;
    ssize_t got = recv(b.fd, &tmp, 1, MSG_PEEK | MSG_DONTWAIT);
    CHECKF(got < 0, "b (priority 5) answered before c (priority 0)");
    resp_free(&rc);
    conn_close(&b), conn_close(&c);
    t0 = now_sec();
    while (server_load(port) != 0 && now_sec() - t0 < 60) usleep(5000); // b is aborted once the server sees its socket close
    CHECKF(server_load(port) == 0, "/load after the requests ended is %g", server_load(port));
}

// vLLM's command line: --flag=value, --served-model-name NAME ALIAS...,
// no-op flags accepted.
static void test_command_line(void) {
    const char *extra[] = {"--served-model-name=main", "alias1", "alias2", "--disable-log-requests",
                           "--uvicorn-log-level", "info", "--max-num-seqs=2", NULL};
    struct srv s;
    srv_start(&s, vllm_bin, model_dir, extra);
    int st;
    json_t *j = http_get_json(s.port, "/v1/models", &st), *data = json_object_get(j, "data");
    CHECKF(st == 200 && json_array_size(data) == 3, "/v1/models lists %zu models, want 3", json_array_size(data));
    const char *ids[3] = {"main", "alias1", "alias2"};
    for (size_t i = 0; i < 3 && i < json_array_size(data); i++)
        CHECK(!strcmp(str(json_object_get(json_array_get(data, i), "id")), ids[i]));
    json_decref(j);
    j = http_post_json(s.port, "/v1/completions", json_pack("{s:s,s:s,s:i}", "model", "alias2", "prompt", "hi",
                                                            "max_tokens", 1), &st);
    CHECKF(st == 200 && !strcmp(str(json_object_get(j, "model")), "main"),
           "a request for an alias: %d, model %s", st, str(json_object_get(j, "model")));
    json_decref(j);
    j = http_post_json(s.port, "/v1/completions", json_pack("{s:s,s:s}", "model", "alias3", "prompt", "hi"), &st);
    CHECKF(st == 404, "an unknown model name: %d", st);
    json_decref(j);
    CHECKF(srv_stop(&s, 20) == 0, "the server did not exit 0 after SIGTERM");
}

// A copy of the model (links) with a generation_config.json: greedy
// decoding is "hello world"'s 28, 72, ...; eos_token_id 72 stops it after
// two tokens, temperature 0 is the default, max_new_tokens caps max_tokens.
// --generation-config vllm reads none of it.
static void test_generation_config(void) {
    char dir[256], path[512];
    snprintf(dir, sizeof dir, "%s/vllm_genconf_%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    CHECK(mkdir(dir, 0755) == 0);
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", NULL};
    char real[4096];
    for (int i = 0; files[i]; i++) {
        snprintf(path, sizeof path, "%s/%s", model_dir, files[i]);
        CHECK(realpath(path, real) != NULL);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        CHECK(symlink(real, path) == 0);
    }
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) fputs("{\"eos_token_id\": [2, 72], \"temperature\": 0.0, \"max_new_tokens\": 5, \"do_sample\": true}\n", f), fclose(f);
    for (int vllm = 0; vllm < 2; vllm++) {
        const char *extra[] = {"--generation-config", vllm ? "vllm" : "auto", NULL};
        struct srv s;
        srv_start(&s, vllm_bin, dir, extra);
        int st;
        // no temperature: the default one (0 from the file, else 1)
        json_t *j = http_post_json(s.port, "/v1/completions", json_pack("{s:s,s:b}", "prompt", "hello world",
                                                                        "return_token_ids", 1), &st);
        json_t *c = json_array_get(json_object_get(j, "choices"), 0), *ids = json_object_get(c, "token_ids");
        int n = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
        if (!vllm) {
            CHECKF(st == 200 && n == 2 && !strcmp(str(json_object_get(c, "finish_reason")), "stop") &&
                       json_is_null(json_object_get(c, "stop_reason")),
                   "generation_config.json: %d tokens (%s), want 2 ending at its eos 72", n,
                   str(json_object_get(c, "finish_reason")));
            CHECKF(json_integer_value(json_array_get(ids, 0)) == 28 && json_integer_value(json_array_get(ids, 1)) == 72,
                   "generation_config.json's temperature 0 is not the default");
        } else {
            CHECKF(st == 200 && n == 16, "--generation-config vllm: %d tokens, want 16 (no extra eos, no cap)", n);
        }
        json_decref(j);
        j = http_post_json(s.port, "/v1/completions", json_pack("{s:[i,i,i],s:b,s:i}", "prompt", 5, 6, 7, "ignore_eos", 1,
                                                                "max_tokens", 50), &st);
        n = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
        CHECKF(st == 200 && n == (vllm ? 50 : 5), "max_new_tokens 5 (%s): %d tokens", vllm ? "off" : "on", n);
        json_decref(j);
        CHECKF(srv_stop(&s, 20) == 0, "the server did not exit 0 after SIGTERM");
    }
    for (int i = 0; files[i]; i++) snprintf(path, sizeof path, "%s/%s", dir, files[i]), unlink(path);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);
    rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s VLLM_BINARY MODEL_DIR\n", argv[0]);
        return 2;
    }
    vllm_bin = argv[1];
    model_dir = argv[2];
    test_loading();
    test_command_line();
    test_generation_config();
    test_cors_lists();
    const char *extra[] = {"--max-num-seqs", "1", "--max-model-len", "8192", "--scheduling-policy", "priority", NULL};
    struct srv s;
    srv_start(&s, vllm_bin, model_dir, extra);
    test_cors_default(s.port);
    test_priority_and_load(s.port);
    CHECKF(srv_stop(&s, 20) == 0, "the server did not exit 0 after SIGTERM");
    return test_summary("server_ops");
}
