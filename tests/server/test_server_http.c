// test_server_http.c - `vllm serve` over raw HTTP: every error status with
// the OpenAI error JSON, malformed and truncated requests, invalid UTF-8,
// huge headers and bodies, 1,000 keep-alive requests on one connection,
// pipelining, API keys, 429 past --max-queued, client disconnects (the
// request is aborted and its KV blocks and state slot return), and a
// SIGTERM with requests in flight (they end, the server exits 0).
// usage: test_server_http VLLM_BINARY MODEL_DIR
#include <math.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/harness.h"
#include "test.h"

static const char *vllm_bin, *model_dir;

// Sends raw bytes on a fresh connection and reads one response (status 0 if
// the server closed the connection without one).
static void raw(int port, const char *req, size_t len, int shut_wr, struct resp *r) {
    struct conn c;
    memset(r, 0, sizeof *r);
    if (conn_open(&c, port, 10)) return;
    conn_send(&c, req, len); // the server may close early (413): ignore
    if (shut_wr) shutdown(c.fd, SHUT_WR);
    if (conn_read_response(&c, r)) r->status = r->status ? r->status : 0;
    conn_close(&c);
}

// The body is {"error": {"message", "type", "param", "code"}} with this status.
static void check_error(const struct resp *r, int status, const char *param, const char *what) {
    CHECKF(r->status == status, "%s: status %d, want %d (body %.300s)", what, r->status, status, r->body ? r->body : "");
    json_t *j = r->body ? json_loads(r->body, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    CHECKF(json_is_object(e), "%s: no error object in %.300s", what, r->body ? r->body : "");
    if (json_is_object(e)) {
        json_t *msg = json_object_get(e, "message"), *p = json_object_get(e, "param");
        CHECKF(json_is_string(msg) && json_string_length(msg) > 0, "%s: no message", what);
        CHECKF(json_is_string(json_object_get(e, "type")), "%s: no type", what);
        CHECKF(json_integer_value(json_object_get(e, "code")) == status, "%s: code is not %d", what, status);
        CHECKF(p && (json_is_null(p) || json_is_string(p)), "%s: param missing", what);
        if (param) CHECKF(json_is_string(p) && !strcmp(json_string_value(p), param), "%s: param %s, want %s", what,
                          json_is_string(p) ? json_string_value(p) : "null", param);
    }
    json_decref(j);
}

static void post_expect(int port, const char *path, const char *body, int status, const char *param) {
    struct resp r;
    http_request(port, "POST", path, NULL, body, &r);
    char what[300];
    snprintf(what, sizeof what, "POST %s %.200s", path, body);
    if (status == 200) CHECKF(r.status == 200, "%s: status %d (%.300s)", what, r.status, r.body ? r.body : "");
    else check_error(&r, status, param, what);
    resp_free(&r);
}

static void healthy(int port, const char *after) {
    struct resp r;
    http_request(port, "GET", "/health", NULL, NULL, &r);
    CHECKF(r.status == 200, "the server is not healthy after %s", after);
    resp_free(&r);
}

// ------------------------------------------------------------- errors --

static void test_field_errors(int port) {
    static const struct {
        const char *path, *body, *param;
        int status;
    } cases[] = {
        {"/v1/completions", "{not json", NULL, 400},
        {"/v1/completions", "[1, 2]", NULL, 400},
        {"/v1/completions", "", NULL, 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2", NULL, 400}, // truncated JSON
        {"/v1/completions", "{\"prompt\": 5}", "prompt", 400},
        {"/v1/completions", "{\"max_tokens\": 3}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": []}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": [999]}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": [1, -1]}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": [[1, 2], []]}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": [\"a\", [1]]}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": [[1], \"a\"]}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": [[1], [-1]]}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": \"x\"}", "max_tokens", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 0}", "max_tokens", 400}, // 0 only with echo
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 1.5}", "max_tokens", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", "temperature", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": -1}", "temperature", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"top_p\": 0}", "top_p", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"top_k\": -5}", "top_k", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"min_p\": 2}", "min_p", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"presence_penalty\": 3}", "presence_penalty", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"frequency_penalty\": -3}", "frequency_penalty", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"repetition_penalty\": 0}", "repetition_penalty", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"seed\": \"x\"}", "seed", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stream\": \"yes\"}", "stream", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stream_options\": 1}", "stream_options", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": [1]}", "stop", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": \"\"}", "stop", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"stop_token_ids\": [999]}", "stop_token_ids", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"n\": 200}", "n", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"n\": true}", "n", 400},
        {"/v1/completions", "{\"prompt\": [\"hi\", 5]}", "prompt", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"best_of\": 0}", "best_of", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"prompt_logprobs\": 21}", "prompt_logprobs", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"prompt_logprobs\": -1}", "prompt_logprobs", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"echo\": 1}", "echo", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": 21}", "logprobs", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": true}", "logprobs", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"logit_bias\": {\"1\": \"2\"}}", "logit_bias", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"min_tokens\": 5, \"max_tokens\": 2}", "min_tokens", 400},
        {"/v1/completions", "{\"prompt\": \"\\u00ff\\ud800\"}", NULL, 400}, // lone surrogate
        {"/v1/completions", "{\"model\": \"other\", \"prompt\": \"hi\"}", "model", 404},
        {"/v1/completions", "{\"model\": 5, \"prompt\": \"hi\"}", "model", 400},
        {"/v1/chat/completions", "{\"messages\": []}", "messages", 400},
        {"/v1/chat/completions", "{\"messages\": \"hi\"}", "messages", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"content\": \"x\"}]}", "messages", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "messages", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
         "top_logprobs", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 1}",
         "logprobs", 400},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": 0}",
         "max_completion_tokens", 400},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 0}", "n", 400},
        // without --scheduling-policy priority / --trust-request-chat-template
        {"/v1/completions", "{\"prompt\": \"hi\", \"priority\": 1}", "priority", 400},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 1, \"priority\": 0}", NULL, 200},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template\": \"x\"}",
         "chat_template", 400},
        {"/tokenize", "{}", "prompt", 400},
        {"/tokenize", "{\"prompt\": 3}", "prompt", 400},
        {"/detokenize", "{\"tokens\": [999]}", "tokens", 400},
        {"/detokenize", "{\"tokens\": \"x\"}", "tokens", 400},
        // unknown fields are ignored, nulls are "not given"
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2, \"foo\": {\"bar\": 1}, \"user\": \"me\"}", NULL, 200},
        {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": null, \"temperature\": null, \"stop\": null}", NULL, 200},
        {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                                 "\"a\"}]}], \"max_tokens\": 2, \"foo\": 1}", NULL, 200},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        post_expect(port, cases[i].path, cases[i].body, cases[i].status, cases[i].param);
}

// max_model_len is 256 on this server: the message names the lengths.
static void test_too_long(int port) {
    char body[4096];
    int n = sprintf(body, "{\"prompt\": [");
    for (int i = 0; i < 200; i++) n += sprintf(body + n, "%s%d", i ? "," : "", 3 + i % 200);
    sprintf(body + n, "], \"max_tokens\": 100}");
    struct resp r;
    http_request(port, "POST", "/v1/completions", NULL, body, &r);
    check_error(&r, 400, "max_tokens", "prompt + max_tokens over max_model_len");
    CHECKF(r.body && strstr(r.body, "256") && strstr(r.body, "300") && strstr(r.body, "200") && strstr(r.body, "100"),
           "the message does not give the lengths: %s", r.body ? r.body : "");
    resp_free(&r);
    n = sprintf(body, "{\"prompt\": [");
    for (int i = 0; i < 256; i++) n += sprintf(body + n, "%s%d", i ? "," : "", 3 + i % 200);
    sprintf(body + n, "]}");
    http_request(port, "POST", "/v1/completions", NULL, body, &r);
    check_error(&r, 400, "prompt", "a prompt of max_model_len tokens");
    CHECKF(r.body && strstr(r.body, "256"), "the message does not give the length: %s", r.body ? r.body : "");
    resp_free(&r);
}

static void test_routes(int port) {
    static const struct {
        const char *method, *path;
        int status;
        const char *allow;
    } cases[] = {
        {"GET", "/nope", 404, NULL},
        {"GET", "/", 404, NULL},
        {"POST", "/v1/completions/extra", 404, NULL},
        {"GET", "/v1/completions", 405, "POST"},
        {"PUT", "/v1/chat/completions", 405, "POST"},
        {"POST", "/health", 405, "GET"},
        {"DELETE", "/v1/models", 405, "GET"},
        {"PATCH", "/metrics", 405, "GET"},
        {"GET", "/tokenize", 405, "POST"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct resp r;
        char what[128];
        snprintf(what, sizeof what, "%s %s", cases[i].method, cases[i].path);
        http_request(port, cases[i].method, cases[i].path, NULL, NULL, &r);
        check_error(&r, cases[i].status, NULL, what);
        if (cases[i].allow) {
            char *allow = resp_header(&r, "Allow");
            CHECKF(allow && !strcmp(allow, cases[i].allow), "%s: Allow is %s", what, allow ? allow : "missing");
            free(allow);
        }
        resp_free(&r);
    }
    static const char *const ok[] = {"/health", "/version", "/v1/models", "/metrics", NULL};
    for (int i = 0; ok[i]; i++) {
        struct resp r;
        http_request(port, "GET", ok[i], NULL, NULL, &r);
        CHECKF(r.status == 200, "GET %s: %d", ok[i], r.status);
        resp_free(&r);
    }
}

// ------------------------------------------------------ malformed HTTP --

static void test_malformed(int port) {
    struct resp r;
    // A declared body over --max-body-bytes (65536): 413 before it is read.
    const char *big = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{\"prompt\": \"";
    raw(port, big, strlen(big), 0, &r);
    CHECKF(r.status == 413, "Content-Length over the limit: %d", r.status);
    resp_free(&r);
    // A chunked body that grows over the limit.
    size_t cap = 200000, n = 0;
    char *req = malloc(cap);
    n += sprintf(req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 20; i++) {
        n += sprintf(req + n, "1000\r\n");
        memset(req + n, 'a', 0x1000);
        n += 0x1000;
        n += sprintf(req + n, "\r\n");
    }
    raw(port, req, n, 0, &r);
    CHECKF(r.status == 413 || r.status == 0, "chunked body over the limit: %d", r.status);
    resp_free(&r);
    // A valid chunked body works.
    const char *chunked = "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "5\r\n{\"pro\r\nb\r\nmpt\": \"hi\"}\r\n0\r\n\r\n";
    raw(port, chunked, strlen(chunked), 0, &r);
    CHECKF(r.status == 200 && strstr(r.body, "\"count\":3"), "chunked request: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    // Truncated bodies: the client stops sending and closes its side.
    const char *trunc[] = {
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"hi\"",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"prompt\"",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len",
        "POST /v1/compl",
    };
    for (int i = 0; i < 4; i++) {
        raw(port, trunc[i], strlen(trunc[i]), 1, &r);
        CHECKF(r.status == 0 || r.status == 400, "truncated request %d: status %d", i, r.status);
        resp_free(&r);
        healthy(port, "a truncated request");
    }
    // Garbage request lines and headers: 400 (libevent's) or a closed connection.
    const char *bad[] = {"BLAH\r\n\r\n", "GET /health HTTP/1.1\r\nNoColonHere\r\n\r\n",
                         "GET /health HTTP/7.5\r\nHost: x\r\n\r\n", "\x01\x02\x03\xff\r\n\r\n"};
    for (int i = 0; i < 4; i++) {
        raw(port, bad[i], strlen(bad[i]), 0, &r);
        CHECKF(r.status == 0 || (r.status >= 400 && r.status < 500), "malformed request %d: status %d", i, r.status);
        resp_free(&r);
    }
    healthy(port, "malformed requests");
    // Invalid UTF-8: in the JSON body (400), in the path (404, valid JSON back).
    post_expect(port, "/v1/completions", "{\"prompt\": \"\xff\xfe\xfd\"}", 400, NULL);
    post_expect(port, "/tokenize", "{\"prompt\": \"ok \xc3\x28\"}", 400, NULL);
    const char *bad_path = "GET /\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    raw(port, bad_path, strlen(bad_path), 0, &r);
    if (r.status == 404) check_error(&r, 404, NULL, "invalid UTF-8 path");
    else CHECKF(r.status == 400, "invalid UTF-8 path: %d", r.status);
    resp_free(&r);
    // Huge headers: one of 100 KB, and 3,000 small ones.
    char *huge = malloc(400000);
    n = sprintf(huge, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(huge + n, 'x', 100000);
    n += 100000;
    n += sprintf(huge + n, "\r\n\r\n");
    raw(port, huge, n, 0, &r);
    CHECKF(r.status == 0 || r.status == 400 || r.status == 413 || r.status == 431, "a 100 KB header: %d", r.status);
    resp_free(&r);
    n = sprintf(huge, "GET /health HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < 3000; i++) n += sprintf(huge + n, "X-H%d: %040d\r\n", i, i);
    n += sprintf(huge + n, "\r\n");
    raw(port, huge, n, 0, &r);
    CHECKF(r.status == 0 || r.status == 400 || r.status == 413 || r.status == 431, "3,000 headers: %d", r.status);
    resp_free(&r);
    free(huge);
    free(req);
    healthy(port, "huge headers");
}

// ------------------------------------------------------- connections --

static void test_keepalive(int port) {
    struct conn c;
    CHECK(conn_open(&c, port, 30) == 0);
    int ok = 0, total = 1000;
    for (int i = 0; i < total; i++) {
        char req[512];
        const char *body = NULL, *path = "/health", *method = "GET";
        int want = 200;
        switch (i % 5) {
        case 1: method = "POST", path = "/tokenize", body = "{\"prompt\": \"keep alive\"}"; break;
        case 2: method = "POST", path = "/v1/completions", body = "{\"prompt\": [5, 6, 7], \"max_tokens\": 2}"; break;
        case 3: path = "/nope", want = 404; break;
        case 4: method = "POST", path = "/v1/completions", body = "{\"prompt\": 1}", want = 400; break;
        }
        int n = sprintf(req, "%s %s HTTP/1.1\r\nHost: x\r\n", method, path);
        if (body) n += sprintf(req + n, "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
        else n += sprintf(req + n, "\r\n");
        struct resp r;
        if (conn_send(&c, req, n) || conn_read_response(&c, &r)) {
            CHECKF(0, "keep-alive request %d: the connection closed", i);
            resp_free(&r);
            break;
        }
        if (r.status == want) ok++;
        else CHECKF(0, "keep-alive request %d (%s %s): %d, want %d", i, method, path, r.status, want);
        resp_free(&r);
    }
    CHECKF(ok == total, "%d of %d keep-alive requests answered", ok, total);
    conn_close(&c);
    // Three pipelined requests in one write: three responses, in order.
    const char *three = "GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
                        "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\n{\"prompt\": \"a\"}"
                        "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(conn_open(&c, port, 30) == 0);
    conn_send(&c, three, strlen(three));
    int want[3] = {200, 200, 404};
    for (int i = 0; i < 3; i++) {
        struct resp r;
        CHECKF(conn_read_response(&c, &r) == 0 && r.status == want[i], "pipelined response %d: %d", i, r.status);
        resp_free(&r);
    }
    conn_close(&c);
}

// An idle connection with half a request is closed after --timeout-s (2).
static void test_idle_timeout(int port) {
    struct conn c;
    CHECK(conn_open(&c, port, 10) == 0);
    const char *half = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{";
    conn_send(&c, half, strlen(half));
    double t0 = now_sec();
    struct resp r;
    conn_read_response(&c, &r);
    double dt = now_sec() - t0;
    CHECKF(c.eof && dt < 8, "a stalled request was not closed (%.1f s)", dt);
    resp_free(&r);
    conn_close(&c);
}

// ----------------------------------------------------- auth and queue --

static void test_api_key(void) {
    const char *extra[] = {"--api-key", "s3cret-key", "--served-model-name", "tiny", NULL};
    struct srv s;
    srv_start(&s, vllm_bin, model_dir, extra);
    const char *body = "{\"prompt\": [1, 2], \"max_tokens\": 1}";
    static const struct {
        const char *headers;
        int status;
    } cases[] = {
        {NULL, 401},
        {"Authorization: Bearer wrong\r\n", 401},
        {"Authorization: Bearer s3cret-ke\r\n", 401},
        {"Authorization: Bearer s3cret-keyy\r\n", 401},
        {"Authorization: Basic s3cret-key\r\n", 401},
        {"Authorization: Bearer \xff\xfe\r\n", 401},
        {"Authorization: Bearer s3cret-key\r\n", 200},
        {"authorization: bearer s3cret-key\r\n", 200},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct resp r;
        http_request(s.port, "POST", "/v1/completions", cases[i].headers, body, &r);
        if (cases[i].status == 401) check_error(&r, 401, NULL, "API key");
        else CHECKF(r.status == 200, "the right API key: %d", r.status);
        resp_free(&r);
    }
    struct resp r;
    http_request(s.port, "GET", "/v1/models", NULL, NULL, &r);
    check_error(&r, 401, NULL, "GET /v1/models without a key");
    resp_free(&r);
    static const char *const open[] = {"/health", "/ping", "/version", NULL};
    for (int i = 0; open[i]; i++) {
        http_request(s.port, "GET", open[i], NULL, NULL, &r);
        CHECKF(r.status == 200, "%s needs no key: %d", open[i], r.status);
        resp_free(&r);
    }
    // every other route needs it: /metrics, /tokenize, /detokenize, and unknown paths (before 404 / 405)
    static const char *const closed[][2] = {{"GET", "/metrics"}, {"POST", "/tokenize"}, {"POST", "/detokenize"},
                                            {"GET", "/nope"}, {"GET", "/tokenize"}, {"POST", "/v1/chat/completions"}};
    for (size_t i = 0; i < sizeof closed / sizeof closed[0]; i++) {
        http_request(s.port, closed[i][0], closed[i][1], NULL, "{\"prompt\": \"hi\", \"tokens\": [1]}", &r);
        check_error(&r, 401, NULL, closed[i][1]);
        resp_free(&r);
        http_request(s.port, closed[i][0], closed[i][1], "Authorization: Bearer s3cret-key\r\n",
                     "{\"prompt\": \"hi\", \"tokens\": [1]}", &r);
        CHECKF(r.status != 401, "%s %s with the key: 401", closed[i][0], closed[i][1]);
        resp_free(&r);
    }
    CHECKF(srv_stop(&s, 20) == 0, "the API-key server did not exit 0");
}

// Opens a streaming completion and reads until its first token event.
static int open_stream(struct conn *c, int port, int max_tokens) {
    char body[256], req[512];
    snprintf(body, sizeof body, "{\"prompt\": [5, 6, 7], \"max_tokens\": %d, \"ignore_eos\": true, \"stream\": true}",
             max_tokens);
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    if (conn_open(c, port, 30) || conn_send(c, req, n)) return -1;
    while (!c->eof && (!c->buf || !strstr(c->buf, "\"text\""))) conn_read_more(c, 1);
    return c->eof ? -1 : 0;
}

// Polls /metrics until nothing runs or waits and every block and slot is free.
static int wait_idle(int port, double timeout_s, char **last) {
    double t0 = now_sec();
    for (;;) {
        char *m = http_metrics(port);
        int idle = m && metric_value(m, "vllm:num_requests_running", NULL) == 0 &&
                   metric_value(m, "vllm:num_requests_waiting", NULL) == 0 &&
                   metric_value(m, "vllm:kv_cache_blocks_used", NULL) == 0 &&
                   metric_value(m, "vllm:state_slots_used", NULL) == 0 &&
                   metric_value(m, "vllm:http_jobs_in_flight", NULL) == 0 && // parsed, not yet submitted
                   metric_value(m, "vllm:http_requests_in_flight", NULL) == 0;
        if (idle || now_sec() - t0 > timeout_s) {
            if (last) *last = m;
            else free(m);
            return idle;
        }
        free(m);
        usleep(5000);
    }
}

// One running request, one waiting: the next one is refused with 429.
// Closing a stream mid-way aborts its request; SIGTERM ends what is left.
static void test_queue_disconnect_shutdown(void) {
    const char *extra[] = {"--max-num-seqs", "1", "--max-queued", "1", "--max-model-len", "8192", NULL};
    struct srv s;
    srv_start(&s, vllm_bin, model_dir, extra);
    struct conn a, b;
    CHECK(open_stream(&a, s.port, 8000) == 0);
    // b waits behind a (one sequence at a time): send it, do not read yet.
    const char *body = "{\"prompt\": [9, 9], \"max_tokens\": 8000, \"ignore_eos\": true, \"stream\": true}";
    char req[512];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    CHECK(conn_open(&b, s.port, 30) == 0 && conn_send(&b, req, n) == 0);
    char *m = NULL;
    double t0 = now_sec();
    while (now_sec() - t0 < 10) { // until b is seen waiting
        free(m);
        m = http_metrics(s.port);
        if (m && metric_value(m, "vllm:num_requests_waiting", NULL) >= 1) break;
        usleep(5000);
    }
    CHECKF(m && metric_value(m, "vllm:num_requests_running", NULL) == 1 &&
               metric_value(m, "vllm:num_requests_waiting", NULL) == 1,
           "expected 1 running and 1 waiting");
    free(m);
    struct resp r;
    http_request(s.port, "POST", "/v1/completions", NULL, "{\"prompt\": [1], \"max_tokens\": 2}", &r);
    check_error(&r, 429, NULL, "past --max-queued");
    resp_free(&r);

    // Disconnect a (running): its request aborts, b runs.
    m = http_metrics(s.port);
    double aborts0 = metric_value(m, "vllm:request_success_total", "\"abort\"");
    free(m);
    conn_close(&a);
    t0 = now_sec();
    m = NULL;
    while (now_sec() - t0 < 10) {
        free(m);
        m = http_metrics(s.port);
        if (metric_value(m, "vllm:request_success_total", "\"abort\"") == aborts0 + 1) break;
        usleep(2000);
    }
    CHECKF(metric_value(m, "vllm:request_success_total", "\"abort\"") == aborts0 + 1,
           "closing a stream did not abort its request");
    CHECKF(metric_value(m, "vllm:generation_tokens_total", NULL) < 8000, "the closed stream ran to its end");
    free(m);
    // b is running now: a non-streaming request waits; then SIGTERM.
    while (!b.eof && (!b.buf || !strstr(b.buf, "\"text\""))) conn_read_more(&b, 1);
    CHECK(!b.eof);
    struct conn c;
    const char *nb = "{\"prompt\": [4], \"max_tokens\": 8000, \"ignore_eos\": true}";
    n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(nb), nb);
    CHECK(conn_open(&c, s.port, 30) == 0 && conn_send(&c, req, n) == 0);
    usleep(100000);
    kill(s.pid, SIGTERM);
    // The stream ends with an error event and [DONE]; the waiting request gets 503.
    while (!b.eof) conn_read_more(&b, 1 << 16);
    CHECKF(b.buf && strstr(b.buf, "\"error\"") && strstr(b.buf, "data: [DONE]"), "the stream did not end cleanly");
    conn_close(&b);
    CHECK(conn_read_response(&c, &r) == 0);
    check_error(&r, 503, NULL, "a request in flight at SIGTERM");
    resp_free(&r);
    conn_close(&c);
    CHECKF(srv_wait(&s, 20) == 0, "the server did not exit 0 after SIGTERM");
}

// A non-streaming request whose client leaves is aborted too; afterwards
// every KV block and state slot is free.
static void test_disconnect_nonstreaming(int port) {
    struct conn c;
    const char *body = "{\"prompt\": [3, 4], \"max_tokens\": 250, \"ignore_eos\": true}";
    char req[512];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    char *m = http_metrics(port);
    double aborts0 = metric_value(m, "vllm:request_success_total", "\"abort\"");
    double len0 = metric_value(m, "vllm:request_success_total", "\"length\"");
    free(m);
    CHECK(conn_open(&c, port, 30) == 0 && conn_send(&c, req, n) == 0);
    conn_close(&c); // at once: the request is aborted before its 250 tokens
    CHECKF(wait_idle(port, 10, &m), "the server is not idle after a client left");
    double aborts = metric_value(m, "vllm:request_success_total", "\"abort\"");
    double len = metric_value(m, "vllm:request_success_total", "\"length\"");
    CHECKF(aborts + len == aborts0 + len0 + 1, "the request left no trace (aborts %g, length %g)", aborts, len);
    free(m);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s VLLM_BINARY MODEL_DIR\n", argv[0]);
        return 2;
    }
    vllm_bin = argv[1];
    model_dir = argv[2];
    const char *extra[] = {"--max-model-len", "256", "--max-body-bytes", "65536", "--timeout-s", "2",
                           "--served-model-name", "tiny", NULL};
    struct srv s;
    srv_start(&s, vllm_bin, model_dir, extra);
    test_routes(s.port);
    test_field_errors(s.port);
    test_too_long(s.port);
    test_malformed(s.port);
    test_keepalive(s.port);
    test_idle_timeout(s.port);
    test_disconnect_nonstreaming(s.port);
    char *m = NULL;
    CHECKF(wait_idle(s.port, 10, &m), "the server is not idle at the end");
    free(m);
    CHECKF(srv_stop(&s, 20) == 0, "the server did not exit 0 after SIGTERM");
    test_api_key();
    test_queue_disconnect_shutdown();
    return test_summary("server_http");
}
