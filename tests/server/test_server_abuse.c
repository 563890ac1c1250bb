// test_server_abuse.c - `vllm serve` against hostile clients on loopback,
// bounded in time: slowloris, 500 concurrent connections, fd exhaustion under
// a lowered RLIMIT_NOFILE, a 30 MB body while /health is polled (p99 under
// 50 ms), duplicate and conflicting Content-Length, Content-Length with
// Transfer-Encoding, half-closed clients, chat_template_kwargs that try to
// replace the messages, garbage tools; API keys from a file and from
// VLLM_API_KEY. Afterwards the server is healthy, its RSS is back within 10%
// and /metrics shows nothing left open or in flight.
// usage: test_server_abuse VLLM_BINARY MODEL_DIR
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server/harness.h"
#include "test.h"

#define KEY "abuse-key-0123"
#define AUTH "Authorization: Bearer " KEY "\r\n"
#define TIMEOUT_S 2 // the server's --timeout-s

static const char *vllm_bin, *model_dir;
static int port;

static int post(const char *path, const char *headers, const char *body, struct resp *r) {
    return http_request(port, "POST", path, headers, body, r);
}

static void expect_error(const struct resp *r, int status, const char *param, const char *what) {
    CHECKF(r->status == status, "%s: status %d, want %d (%.200s)", what, r->status, status, r->body ? r->body : "");
    if (!param) return;
    json_t *j = r->body ? json_loads(r->body, 0, NULL) : NULL;
    const char *p = json_string_value(json_object_get(json_object_get(j, "error"), "param"));
    CHECKF(p && !strcmp(p, param), "%s: param %s, want %s", what, p ? p : "null", param);
    json_decref(j);
}

// Sends raw bytes, optionally half-closes, reads one response and whether
// the server closed the connection after it.
static int raw(const char *req, size_t len, int shut_wr, struct resp *r) {
    struct conn c;
    memset(r, 0, sizeof *r);
    if (conn_open(&c, port, 10)) return -1;
    conn_send(&c, req, len);
    if (shut_wr) shutdown(c.fd, SHUT_WR);
    conn_read_response(&c, r);
    conn_read_more(&c, 1);
    int closed = c.eof;
    conn_close(&c);
    return closed;
}

static double metric(const char *name) {
    char *m = http_metrics(port);
    double v = metric_value(m, name, NULL);
    free(m);
    return v;
}

// ------------------------------------------------------------ framing --

static void test_framing(void) {
    static const struct {
        const char *headers;
        int status;
    } cases[] = {
        {"Content-Length: 15\r\nContent-Length: 15\r\n", 400},
        {"Content-Length: 15\r\nContent-Length: 5\r\n", 400},
        {"Content-Length: 5\r\nContent-Length: 15\r\n", 400}, // the first would leave 10 bytes "smuggled"
        {"Content-Length: 15\r\nTransfer-Encoding: chunked\r\n", 400},
        {"Transfer-Encoding: chunked\r\nContent-Length: 15\r\n", 400},
        {"Transfer-Encoding: gzip\r\nContent-Length: 15\r\n", 501},
        {"Content-Length: +15\r\n", 400},
        {"Content-Length: 1 5\r\n", 400},
        {"Content-Length : 15\r\n", 400},
        {"X-Folded: a\r\n b\r\nContent-Length: 15\r\n", 400},
    };
    const char *body = "{\"prompt\":\"hi\"}";
    double refused0 = metric("vllm:http_framing_refused_total");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char req[512];
        int n = snprintf(req, sizeof req, "POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "%s\r\n%sGET /health HTTP/1.1\r\n\r\n",
                         cases[i].headers, body);
        struct resp r;
        int closed = raw(req, n, 0, &r);
        expect_error(&r, cases[i].status, NULL, cases[i].headers);
        CHECKF(closed == 1, "%s: the connection stayed open after the refusal", cases[i].headers);
        resp_free(&r);
    }
    double refused = metric("vllm:http_framing_refused_total") - refused0;
    CHECKF(refused == (double)(sizeof cases / sizeof cases[0]), "framing refusals counted %g", refused);
    // a valid chunked body still works, and a pipelined request behind it
    const char *ok = "POST /tokenize HTTP/1.1\r\nHost: x\r\n" AUTH "Transfer-Encoding: chunked\r\n\r\n"
                     "f\r\n{\"prompt\":\"hi\"}\r\n0\r\n\r\n";
    struct resp r;
    raw(ok, strlen(ok), 1, &r);
    CHECKF(r.status == 200 && r.body && strstr(r.body, "\"count\""), "chunked /tokenize: %d", r.status);
    resp_free(&r);
}

// ---------------------------------------------------------- half-close --

static void test_half_close(void) {
    char req[1024];
    const char *nb = "{\"prompt\": [3, 4], \"max_tokens\": 24, \"ignore_eos\": true}";
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: %zu\r\n\r\n%s",
                     strlen(nb), nb);
    struct resp r;
    raw(req, n, 1, &r);
    CHECKF(r.status == 200 && r.body && strstr(r.body, "\"completion_tokens\":24"), "half-closed completion: %d %.200s",
           r.status, r.body ? r.body : "");
    resp_free(&r);
    const char *sb = "{\"prompt\": [3, 4], \"max_tokens\": 24, \"ignore_eos\": true, \"stream\": true}";
    n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: %zu\r\n\r\n%s",
                 strlen(sb), sb);
    raw(req, n, 1, &r);
    int events = 0;
    char **ev = r.body ? sse_events(r.body, &events) : NULL;
    CHECKF(r.status == 200 && events >= 2 && !strcmp(ev[events - 1], "[DONE]") &&
               strstr(ev[events - 2], "\"finish_reason\":\"length\""),
           "half-closed stream: %d, %d events, not ending in finish_reason length and [DONE]", r.status, events);
    sse_free(ev);
    resp_free(&r);
    const char *h = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    raw(h, strlen(h), 1, &r);
    CHECKF(r.status == 200, "half-closed /health: %d", r.status);
    resp_free(&r);
}

// ------------------------------------------------- chat input checks --

static void test_chat_checks(void) {
    static const struct {
        const char *extra, *param;
    } bad[] = {
        {"\"chat_template_kwargs\": {\"messages\": [{\"role\": \"user\", \"content\": \"unchecked\"}]}", "chat_template_kwargs"},
        {"\"chat_template_kwargs\": {\"add_generation_prompt\": false}", "chat_template_kwargs"},
        {"\"chat_template_kwargs\": {\"bos_token\": \"x\"}", "chat_template_kwargs"},
        {"\"chat_template_kwargs\": {\"tools\": []}", "chat_template_kwargs"},
        {"\"chat_template_kwargs\": [1]", "chat_template_kwargs"},
        {"\"tools\": \"garbage\"", "tools"},
        {"\"tools\": [1, 2, 3]", "tools"},
        {"\"tools\": [{\"type\": \"function\"}]", "tools"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"has space\"}}]", "tools"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 5}}]", "tools"},
        {"\"tool_choice\": \"garbage\"", "tool_choice"},
        {"\"tool_choice\": {\"type\": \"function\"}", "tool_choice"},
        {"\"tool_choice\": \"required\"", "tool_choice"},
        {"\"parallel_tool_calls\": \"yes\"", "parallel_tool_calls"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 1, %s}",
                 bad[i].extra);
        struct resp r;
        post("/v1/chat/completions", AUTH, body, &r);
        expect_error(&r, 400, bad[i].param, bad[i].extra);
        resp_free(&r);
        post("/tokenize", AUTH, body, &r); // /tokenize renders chat the same way
        expect_error(&r, 400, bad[i].param, bad[i].extra);
        resp_free(&r);
    }
    const char *good = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 1, \"tools\": "
                       "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"d\", "
                       "\"parameters\": {\"type\": \"object\"}}}], \"tool_choice\": \"auto\", "
                       "\"chat_template_kwargs\": {\"enable_thinking\": false}}";
    struct resp r;
    post("/v1/chat/completions", AUTH, good, &r);
    CHECKF(r.status == 200, "valid tools: %d %.200s", r.status, r.body ? r.body : "");
    resp_free(&r);
}

// ------------------------------------------------------------- auth --

static void test_auth(void) {
    struct resp r;
    post("/tokenize", NULL, "{\"prompt\": \"hi\"}", &r);
    expect_error(&r, 401, NULL, "/tokenize without the key");
    resp_free(&r);
    post("/detokenize", NULL, "{\"tokens\": [1]}", &r);
    expect_error(&r, 401, NULL, "/detokenize without the key");
    resp_free(&r);
    post("/tokenize", AUTH, "{\"prompt\": \"hi\"}", &r);
    CHECKF(r.status == 200, "/tokenize with the key from --api-key-file: %d", r.status);
    resp_free(&r);
    http_request(port, "GET", "/metrics", NULL, NULL, &r); // --metrics-no-auth
    CHECKF(r.status == 200 && r.body && strstr(r.body, "model_name=\"tiny_chat\"") && !strstr(r.body, model_dir),
           "/metrics: %d, labelled with the served name, not the path", r.status);
    resp_free(&r);
    // the path is still accepted as "model" (vLLM's default name)
    char body[1024];
    snprintf(body, sizeof body, "{\"model\": \"%s\", \"prompt\": \"hi\"}", model_dir);
    post("/tokenize", AUTH, body, &r);
    CHECKF(r.status == 200, "\"model\": the path: %d", r.status);
    resp_free(&r);
}

// ----------------------------------------------------------- slowloris --

static void test_slowloris(void) {
    struct conn c;
    CHECK(conn_open(&c, port, 10) == 0);
    const char *req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" AUTH "Content-Length: 100\r\n\r\n{\"prompt\": ";
    double t0 = now_sec(), closed_at = 0;
    int sent = 0;
    for (const char *p = req; *p && !closed_at; p++) { // a byte every 50 ms: 8 s for the whole head
        if (send(c.fd, p, 1, MSG_NOSIGNAL) != 1) closed_at = now_sec();
        sent++;
        usleep(50000);
        char b[256];
        ssize_t got = recv(c.fd, b, sizeof b - 1, MSG_DONTWAIT);
        if (got > 0) {
            b[got] = 0;
            CHECKF(strstr(b, " 408 "), "slowloris: got %s", b);
        }
        if (got == 0 || (got < 0 && errno != EAGAIN)) closed_at = now_sec();
    }
    double dt = (closed_at ? closed_at : now_sec()) - t0;
    CHECKF(closed_at && dt < TIMEOUT_S + 1.5, "slowloris: closed after %.1f s (%d bytes), --timeout-s is %d", dt, sent,
           TIMEOUT_S);
    conn_close(&c);
    CHECK(metric("vllm:http_request_timeouts_total") >= 1);
}

// -------------------------------------------------------- many clients --

static void raise_nofile(int want) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)want) {
        rl.rlim_cur = rl.rlim_max < (rlim_t)want ? rl.rlim_max : (rlim_t)want;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static void test_concurrent(void) {
    enum { N = 500 };
    static struct conn c[N];
    int opened = 0, ok = 0;
    const char *h = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < N; i++) // each asks at once: an idle one would be closed after --timeout-s
        if (conn_open(&c[i], port, 20) == 0 && conn_send(&c[i], h, strlen(h)) == 0) opened++;
    CHECKF(opened == N, "opened %d of %d connections", opened, N);
    for (int i = 0; i < N; i++) {
        struct resp r;
        int rc = c[i].fd >= 0 ? conn_read_response(&c[i], &r) : -2;
        if (!rc && r.status == 200) ok++;
        resp_free(&r);
    }
    CHECKF(ok == N, "%d of %d concurrent /health answered", ok, N);
    for (int i = 0; i < N; i++) conn_close(&c[i]);
}

static int count_fds(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static size_t file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n > 0 ? (size_t)n : 0;
}

// Polls until the server holds no client connection but /metrics' own.
static void wait_closed(void) {
    for (double t0 = now_sec(); now_sec() - t0 < 5 && metric("vllm:http_connections_open") > 1;) usleep(20000);
}

static void test_fd_exhaustion(const struct srv *s) {
    enum { N = 120 };
    static struct conn c[N];
    struct rlimit old, low;
    wait_closed();
    CHECK(prlimit(s->pid, RLIMIT_NOFILE, NULL, &old) == 0);
    low = old;
    low.rlim_cur = (rlim_t)count_fds(s->pid) + 8;
    CHECK(prlimit(s->pid, RLIMIT_NOFILE, &low, NULL) == 0);
    size_t log0 = file_size(s->log);
    double loop0, cpu0 = srv_cpu_s(s, &loop0);
    for (int i = 0; i < N; i++) conn_open(&c[i], port, 5); // the kernel's backlog takes what is not accepted
    usleep(1500000);
    double loop1, cpu1 = srv_cpu_s(s, &loop1);
    size_t log1 = file_size(s->log);
    CHECKF(loop1 - loop0 < 0.3, "at the fd limit the loop used %.2f s of CPU in 1.5 s (spinning?)", loop1 - loop0);
    CHECKF(log1 - log0 < 1024, "at the fd limit the server logged %zu bytes in 1.5 s", log1 - log0);
    printf("server_abuse: at the fd limit: %.3f s loop CPU (%.3f s all threads) in 1.5 s, %zu log bytes\n",
           loop1 - loop0, cpu1 - cpu0, log1 - log0);
    for (int i = 0; i < N; i++) conn_close(&c[i]);
    CHECK(prlimit(s->pid, RLIMIT_NOFILE, &old, NULL) == 0);
    CHECK(metric("vllm:http_accept_errors_total") >= 1);
    struct resp r;
    http_request(port, "GET", "/health", NULL, NULL, &r);
    CHECKF(r.status == 200, "/health after the fd limit: %d", r.status);
    resp_free(&r);
}

// --------------------------------------------------------- big bodies --

struct big {
    const char *path;
    struct resp r;
};

static void *send_big(void *arg) {
    struct big *b = arg;
    size_t n = 30u << 20;
    char *body = malloc(n + 32);
    memcpy(body, "{\"prompt\": \"", 12);
    memset(body + 12, 'a', n - 14);
    memcpy(body + n - 2, "\"}", 3);
    post(b->path, AUTH, body, &b->r);
    free(body);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// A 30 MB body while /health is polled on another connection.
static void test_big_body(const char *path) {
    struct big b = {path, {0}};
    pthread_t th;
    pthread_create(&th, NULL, send_big, &b);
    struct conn c;
    CHECK(conn_open(&c, port, 10) == 0);
    static double lat[100000];
    int n = 0;
    const char *h = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    double t_end = 0;
    for (;;) {
        double t0 = now_sec();
        struct resp r;
        if (conn_send(&c, h, strlen(h)) || conn_read_response(&c, &r)) break;
        resp_free(&r);
        if (n < 100000) lat[n++] = now_sec() - t0;
        if (pthread_tryjoin_np(th, NULL) == 0) {
            t_end = now_sec();
            break;
        }
        usleep(2000);
    }
    if (!t_end) pthread_join(th, NULL);
    conn_close(&c);
    qsort(lat, n, sizeof *lat, cmp_double);
    double p99 = n ? lat[(int)(n * 0.99)] : INFINITY, mx = n ? lat[n - 1] : INFINITY;
    printf("server_abuse: 30 MB %s: /health p50 %.2f ms, p99 %.2f ms, max %.2f ms over %d polls\n", path,
           n ? 1e3 * lat[n / 2] : 0, 1e3 * p99, 1e3 * mx, n);
    CHECKF(n >= 10 && p99 < 0.050, "/health p99 %.1f ms over %d polls during a 30 MB %s", 1e3 * p99, n, path);
    expect_error(&b.r, 400, "prompt", "30 MB prompt");
    CHECKF(b.r.body && strstr(b.r.body, "maximum context length"), "30 MB %s: %.200s", path, b.r.body ? b.r.body : "");
    resp_free(&b.r);
}

// ------------------------------------------------------------ startup --

static char *write_key_file(const char *content) {
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char *p = malloc(256);
    snprintf(p, 256, "%s/vllm_abuse_key_%d_%ld", tmp, (int)getpid(), random() % 100000);
    FILE *f = fopen(p, "w");
    fputs(content, f);
    fclose(f);
    return p;
}

// Runs `vllm serve ARGS` until it printed `until` (or exited); returns its output.
static char *serve_output(const char *const *args, const char *until, int *exit_code) {
    int fds[2];
    if (pipe(fds)) return NULL;
    const char *argv[32] = {vllm_bin, "serve", "--model", model_dir, "--threads", "1", "--port", "0"};
    int n = 8;
    for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        execv(vllm_bin, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    size_t len = 0, cap = 1 << 16;
    char *out = calloc(1, cap);
    double t0 = now_sec();
    int st = 0, done = 0;
    while (now_sec() - t0 < 30 && !strstr(out, until)) {
        ssize_t r = read(fds[0], out + len, cap - len - 1);
        if (r > 0) len += (size_t)r;
        else if (waitpid(pid, &st, WNOHANG) == pid) {
            done = 1;
            break;
        } else usleep(10000);
    }
    if (!done) {
        kill(pid, SIGTERM);
        waitpid(pid, &st, 0);
    }
    close(fds[0]);
    *exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return out;
}

static void test_startup(void) {
    int rc;
    char *out = serve_output((const char *[]){"--host", "0.0.0.0", NULL}, "(Ctrl-C to stop)", &rc);
    CHECKF(out && strstr(out, "warning") && strstr(out, "no API key"), "no warning for 0.0.0.0 without a key: %s", out);
    free(out);
    char *empty = write_key_file("\n");
    out = serve_output((const char *[]){"--api-key-file", empty, NULL}, "(Ctrl-C to stop)", &rc);
    CHECKF(rc == 2 && strstr(out, empty), "an empty --api-key-file: exit %d: %s", rc, out);
    free(out);
    unlink(empty);
    free(empty);
    out = serve_output((const char *[]){"--api-key-file", "/nonexistent/key", NULL}, "(Ctrl-C to stop)", &rc);
    CHECKF(rc == 2 && strstr(out, "/nonexistent/key"), "a missing --api-key-file: exit %d: %s", rc, out);
    free(out);
    // VLLM_API_KEY
    setenv("VLLM_API_KEY", "env-key-42", 1);
    struct srv s;
    srv_start(&s, vllm_bin, model_dir, NULL);
    unsetenv("VLLM_API_KEY");
    struct resp r;
    http_request(s.port, "POST", "/tokenize", NULL, "{\"prompt\": \"hi\"}", &r);
    CHECKF(r.status == 401, "VLLM_API_KEY: no key gives %d", r.status);
    resp_free(&r);
    http_request(s.port, "POST", "/tokenize", "Authorization: Bearer env-key-42\r\n", "{\"prompt\": \"hi\"}", &r);
    CHECKF(r.status == 200, "VLLM_API_KEY: the key gives %d", r.status);
    resp_free(&r);
    CHECKF(srv_stop(&s, 20) == 0, "the VLLM_API_KEY server did not exit 0");
}

// ---------------------------------------------------------------- main --

static void heavy_round(const struct srv *s) {
    (void)s;
    test_concurrent();
    test_big_body("/tokenize");
    test_big_body("/v1/completions");
    wait_closed();
}

static void settle(const struct srv *s, long rss0) {
    double t0 = now_sec();
    long rss = 0;
    char *m = NULL;
    int clean = 0;
    while (now_sec() - t0 < 5 && !clean) { // closed sockets are noticed, memory is returned
        usleep(50000);
        free(m);
        m = http_metrics(port);
        rss = srv_rss_kb(s);
        clean = metric_value(m, "vllm:http_connections_open", NULL) == 1 && // this /metrics request's own
                metric_value(m, "vllm:http_requests_in_flight", NULL) == 0 &&
                metric_value(m, "vllm:http_jobs_in_flight", NULL) == 0 &&
                metric_value(m, "vllm:http_replies_sending", NULL) == 0 &&
                metric_value(m, "vllm:num_requests_running", NULL) == 0 &&
                metric_value(m, "vllm:num_requests_waiting", NULL) == 0 &&
                metric_value(m, "vllm:kv_cache_blocks_used", NULL) == 0 &&
                metric_value(m, "vllm:state_slots_used", NULL) == 0 && rss <= rss0 * 1.10;
    }
    printf("server_abuse: RSS %ld kB at the start, %ld kB after\n", rss0, rss);
    CHECKF(clean, "after the abuse: connections %g, in flight %g, jobs %g, sending %g, running %g, kv used %g, "
           "RSS %ld kB (start %ld kB)", metric_value(m, "vllm:http_connections_open", NULL),
           metric_value(m, "vllm:http_requests_in_flight", NULL), metric_value(m, "vllm:http_jobs_in_flight", NULL),
           metric_value(m, "vllm:http_replies_sending", NULL), metric_value(m, "vllm:num_requests_running", NULL),
           metric_value(m, "vllm:kv_cache_blocks_used", NULL), rss, rss0);
    free(m);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s VLLM_BINARY MODEL_DIR\n", argv[0]);
        return 2;
    }
    vllm_bin = argv[1];
    model_dir = argv[2];
    signal(SIGPIPE, SIG_IGN);
    raise_nofile(4096);
    test_startup();
    char *key = write_key_file(KEY "\n");
    char tmo[16];
    snprintf(tmo, sizeof tmo, "%d", TIMEOUT_S);
    const char *extra[] = {"--api-key-file", key, "--metrics-no-auth", "--timeout-s", tmo, NULL};
    struct srv s;
    srv_start(&s, vllm_bin, model_dir, extra);
    port = s.port;
    test_auth();
    test_half_close();
    // The heavy part runs twice: the first run takes the allocator to its
    // high-water mark (memory it keeps for reuse is no leak), the start RSS
    // is taken after it, and a second run that leaked would show.
    heavy_round(&s);
    long rss0 = srv_rss_kb(&s);
    test_framing();
    test_chat_checks();
    test_slowloris();
    test_fd_exhaustion(&s);
    heavy_round(&s);
    struct resp r;
    http_request(port, "GET", "/health", NULL, NULL, &r);
    CHECKF(r.status == 200, "/health after the abuse: %d", r.status);
    resp_free(&r);
    settle(&s, rss0);
    CHECKF(srv_stop(&s, 20) == 0, "the server did not exit 0 after the abuse");
    unlink(key);
    free(key);
    return test_summary("server_abuse");
}
