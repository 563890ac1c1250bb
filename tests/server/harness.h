// harness.h - what the server tests share: start and stop a `vllm serve`
// on 127.0.0.1 with a free port, and a small raw HTTP/1.1 client (blocking
// sockets, Content-Length and chunked bodies, SSE events).
#ifndef VLLM_TESTS_SERVER_HARNESS_H
#define VLLM_TESTS_SERVER_HARNESS_H

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>

// ---------------------------------------------------------------- server --

struct srv {
    pid_t pid;
    int port;
    char log[256]; // the server's stdout + stderr
};

// Starts `vllm serve --model MODEL --host 127.0.0.1 --port 0 --threads 1
// <extra...> $VLLM_SERVER_TEST_ARGS` (extra is NULL-terminated; the variable,
// e.g. "--device cuda --dtype float32", runs the tests on another backend) and
// waits until it listens. Exits 77 when the build cannot load a tokenizer
// yet, 1 on any other failure.
void srv_start(struct srv *s, const char *vllm, const char *model, const char *const *extra);
// SIGTERM, then waits (up to timeout_s) for the exit. Returns the exit status,
// or -1 (after SIGKILL) if it did not exit, or 128+signal if a signal ended it.
// The log is removed after a clean exit, printed otherwise.
int srv_stop(struct srv *s, double timeout_s);
// The same, ready once the log holds marker followed by the port (srv_start's
// is " on http://127.0.0.1:", printed once the model is loaded).
void srv_start_marked(struct srv *s, const char *vllm, const char *model, const char *const *extra,
                      const char *marker);
// The same without the SIGTERM (it was sent already: a second one during
// the teardown would end the server by the default action).
int srv_wait(struct srv *s, double timeout_s);
void srv_dump_log(const struct srv *s);
long srv_rss_kb(const struct srv *s); // VmRSS, -1 if unknown
// CPU seconds the server used so far; *loop_s: those of its main thread,
// which runs the HTTP loop.
double srv_cpu_s(const struct srv *s, double *loop_s);

// ------------------------------------------------------------------ HTTP --

struct conn {
    int fd;
    char *buf; // received, not yet consumed
    size_t len, cap;
    int eof;
};

struct resp {
    int status;     // 0: no response (the connection closed first)
    char *headers;  // raw header block, NUL-terminated
    char *body;     // de-chunked, NUL-terminated
    size_t body_len;
    int chunked;
};

int conn_open(struct conn *c, int port, double timeout_s); // 0 or -1
void conn_close(struct conn *c);
int conn_send(struct conn *c, const void *data, size_t len);
// Reads one whole response. 0 on success, -1 if the connection closed or
// timed out first (r->status is 0 then unless the status line arrived).
int conn_read_response(struct conn *c, struct resp *r);
// Reads until at least `n` more bytes arrived (or EOF); returns bytes added.
size_t conn_read_more(struct conn *c, size_t n);
void resp_free(struct resp *r);
// The value of a header (case-insensitive) in r->headers, malloc'd, or NULL.
char *resp_header(const struct resp *r, const char *name);

// One request on a fresh connection ("Connection: close"). body may be NULL.
// extra_headers: "Name: value\r\n..." or NULL.
int http_request(int port, const char *method, const char *path, const char *extra_headers, const char *body,
                 struct resp *r);
// POST of a JSON value (taken over); returns the parsed JSON body (or NULL).
json_t *http_post_json(int port, const char *path, json_t *body, int *status);
json_t *http_get_json(int port, const char *path, int *status);

// SSE: the payloads of "data: ..." events in body, in order (malloc'd
// strings, NULL-terminated array; *n set).
char **sse_events(const char *body, int *n);
void sse_free(char **ev);

// A metric's value from a /metrics text: the first line that starts with
// name followed by '{' or ' ' (and holds `label`, when not NULL), or NAN.
double metric_value(const char *text, const char *name, const char *label);
char *http_metrics(int port); // GET /metrics body, malloc'd

double now_sec(void);

#endif
