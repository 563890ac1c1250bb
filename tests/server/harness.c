// harness.c - see harness.h.
#include "server/harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIN_(a, b) ((a) < (b) ? (a) : (b))

double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path) { // works on /proc files too (no size)
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t n = 0, cap = 4096, got;
    char *s = malloc(cap);
    while ((got = fread(s + n, 1, cap - n - 1, f)) > 0)
        if ((n += got) + 1 == cap) s = realloc(s, cap *= 2);
    s[n] = 0;
    fclose(f);
    return s;
}

void srv_dump_log(const struct srv *s) {
    char *log = slurp(s->log);
    fprintf(stderr, "----- server log (%s) -----\n%s----- end of server log -----\n", s->log, log ? log : "");
    free(log);
}

void srv_start(struct srv *s, const char *vllm, const char *model, const char *const *extra) {
    srv_start_marked(s, vllm, model, extra, " on http://127.0.0.1:");
}

void srv_start_marked(struct srv *s, const char *vllm, const char *model, const char *const *extra,
                      const char *marker) {
    memset(s, 0, sizeof *s);
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(s->log, sizeof s->log, "%s/vllm_serve_test_%d_%ld.log", tmp, (int)getpid(), (long)(now_sec() * 1e6) % 1000000);
    const char *argv[64] = {vllm, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0", "--threads", "1"};
    int n = 10;
    for (int i = 0; extra && extra[i] && n < 63; i++) argv[n++] = extra[i];
    char *env = getenv("VLLM_SERVER_TEST_ARGS") ? strdup(getenv("VLLM_SERVER_TEST_ARGS")) : NULL;
    for (char *save, *t = env ? strtok_r(env, " ", &save) : NULL; t && n < 63; t = strtok_r(NULL, " ", &save))
        argv[n++] = t;
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM); // no orphan server if the test dies
        int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
        execv(vllm, (char *const *)argv);
        perror("execv");
        _exit(127);
    }
    s->pid = pid;
    free(env);
    double t0 = now_sec();
    while (now_sec() - t0 < 120) {
        char *log = slurp(s->log);
        const char *p = log ? strstr(log, marker) : NULL;
        if (p) s->port = atoi(p + strlen(marker));
        int skip = log && strstr(log, "tokenizer support is not built yet");
        free(log);
        if (s->port > 0) return;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            srv_dump_log(s);
            if (skip) {
                fprintf(stderr, "SKIP: this build has no tokenizer yet (src/tokenizer/stub.c); the server tests need "
                                "tests/fixtures/tiny_chat's tokenizer.json\n");
                exit(77);
            }
            fprintf(stderr, "FAIL: the server exited before listening\n");
            exit(1);
        }
        usleep(20000);
    }
    srv_dump_log(s);
    fprintf(stderr, "FAIL: the server did not listen within 120 s\n");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    exit(1);
}

int srv_stop(struct srv *s, double timeout_s) {
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    return srv_wait(s, timeout_s);
}

int srv_wait(struct srv *s, double timeout_s) {
    if (s->pid <= 0) return -1;
    double t0 = now_sec();
    int st = 0;
    while (waitpid(s->pid, &st, WNOHANG) != s->pid) {
        if (now_sec() - t0 > timeout_s) {
            fprintf(stderr, "server %d did not exit %.0f s after SIGTERM; killing it\n", (int)s->pid, timeout_s);
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            s->pid = 0;
            return -1;
        }
        usleep(10000);
    }
    s->pid = 0;
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc == 0) unlink(s->log);
    else srv_dump_log(s);
    return rc;
}

long srv_rss_kb(const struct srv *s) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)s->pid);
    char *st = slurp(path);
    const char *p = st ? strstr(st, "VmRSS:") : NULL;
    long kb = p ? atol(p + 6) : -1;
    free(st);
    return kb;
}

static double stat_cpu(const char *path) { // utime + stime of a /proc stat file, seconds
    char *st = slurp(path);
    const char *p = st ? strrchr(st, ')') : NULL; // the command name may hold spaces
    unsigned long long ut = 0, stm = 0;
    if (p) sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &stm);
    free(st);
    return (double)(ut + stm) / sysconf(_SC_CLK_TCK);
}

double srv_cpu_s(const struct srv *s, double *loop_s) {
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/task/%d/stat", (int)s->pid, (int)s->pid);
    if (loop_s) *loop_s = stat_cpu(path);
    snprintf(path, sizeof path, "/proc/%d/stat", (int)s->pid);
    return stat_cpu(path);
}

// ------------------------------------------------------------------ HTTP --

int conn_open(struct conn *c, int port, double timeout_s) {
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) return -1;
    struct timeval tv = {(long)timeout_s, (long)((timeout_s - (long)timeout_s) * 1e6)};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a)) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    return 0;
}

void conn_close(struct conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
    c->len = c->cap = 0;
}

int conn_send(struct conn *c, const void *data, size_t len) {
    const char *p = data;
    while (len) {
        ssize_t w = send(c->fd, p, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

size_t conn_read_more(struct conn *c, size_t n) {
    size_t got = 0;
    while (got < n && !c->eof) {
        if (c->len + 65536 + 1 > c->cap) {
            c->cap = (c->len + 65536 + 1) * 2;
            c->buf = realloc(c->buf, c->cap);
        }
        ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            c->eof = 1;
            break;
        }
        c->len += (size_t)r;
        got += (size_t)r;
    }
    if (c->buf) c->buf[c->len] = 0;
    return got;
}

static void consume(struct conn *c, size_t n) {
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
    c->buf[c->len] = 0;
}

// Position just after "\r\n" at or after `from`, reading more as needed; 0 if none.
static size_t line_end(struct conn *c, size_t from) {
    for (;;) {
        if (c->buf)
            for (size_t i = from; i + 1 < c->len; i++)
                if (c->buf[i] == '\r' && c->buf[i + 1] == '\n') return i + 2;
        if (!conn_read_more(c, 1)) return 0;
    }
}

char *resp_header(const struct resp *r, const char *name) {
    size_t n = strlen(name);
    for (const char *p = r->headers; p && *p;) {
        const char *e = strstr(p, "\r\n");
        if (!e) e = p + strlen(p);
        if ((size_t)(e - p) > n && !strncasecmp(p, name, n) && p[n] == ':') {
            const char *v = p + n + 1;
            while (*v == ' ') v++;
            char *out = malloc(e - v + 1);
            memcpy(out, v, e - v);
            out[e - v] = 0;
            return out;
        }
        p = *e ? e + 2 : e;
    }
    return NULL;
}

static void body_add(struct resp *r, const char *p, size_t n) {
    r->body = realloc(r->body, r->body_len + n + 1);
    memcpy(r->body + r->body_len, p, n);
    r->body_len += n;
    r->body[r->body_len] = 0;
}

int conn_read_response(struct conn *c, struct resp *r) {
    memset(r, 0, sizeof *r);
    r->body = calloc(1, 1);
    size_t e = line_end(c, 0);
    if (!e) return -1;
    if (sscanf(c->buf, "HTTP/%*d.%*d %d", &r->status) != 1) return -1;
    size_t hs = e; // headers: until an empty line
    for (;;) {
        size_t le = line_end(c, e);
        if (!le) return -1;
        if (le == e + 2) {
            r->headers = malloc(e - hs + 1);
            memcpy(r->headers, c->buf + hs, e - hs);
            r->headers[e - hs] = 0;
            consume(c, le);
            break;
        }
        e = le;
    }
    char *te = resp_header(r, "Transfer-Encoding"), *cl = resp_header(r, "Content-Length");
    r->chunked = te && strstr(te, "chunked");
    long len = cl ? atol(cl) : -1;
    free(te), free(cl);
    if (r->chunked) {
        for (;;) {
            size_t le = line_end(c, 0);
            if (!le) return -1;
            size_t n = strtoul(c->buf, NULL, 16);
            consume(c, le);
            while (c->len < n + 2)
                if (!conn_read_more(c, n + 2 - c->len)) return -1;
            body_add(r, c->buf, n);
            consume(c, n + 2);
            if (n == 0) return 0;
        }
    }
    if (len < 0) { // until the connection closes
        while (conn_read_more(c, 1 << 20)) {}
        body_add(r, c->buf ? c->buf : "", c->len);
        consume(c, c->len);
        return 0;
    }
    while (c->len < (size_t)len)
        if (!conn_read_more(c, (size_t)len - c->len)) return -1;
    body_add(r, c->buf ? c->buf : "", (size_t)len);
    consume(c, (size_t)len);
    return 0;
}

void resp_free(struct resp *r) {
    free(r->headers);
    free(r->body);
    memset(r, 0, sizeof *r);
}

int http_request(int port, const char *method, const char *path, const char *extra_headers, const char *body,
                 struct resp *r) {
    struct conn c;
    memset(r, 0, sizeof *r);
    if (conn_open(&c, port, 30)) return -1;
    size_t blen = body ? strlen(body) : 0;
    char *req = malloc(blen + 1024 + (extra_headers ? strlen(extra_headers) : 0));
    int n = sprintf(req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path,
                    extra_headers ? extra_headers : "");
    if (body) n += sprintf(req + n, "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
    n += sprintf(req + n, "\r\n");
    if (body) memcpy(req + n, body, blen), n += (int)blen;
    int rc = conn_send(&c, req, n) || conn_read_response(&c, r);
    free(req);
    conn_close(&c);
    return rc ? -1 : 0;
}

json_t *http_post_json(int port, const char *path, json_t *body, int *status) {
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    struct resp r;
    int rc = http_request(port, "POST", path, NULL, s, &r);
    free(s);
    *status = rc ? 0 : r.status;
    json_t *j = rc ? NULL : json_loads(r.body, 0, NULL);
    resp_free(&r);
    return j;
}

json_t *http_get_json(int port, const char *path, int *status) {
    struct resp r;
    int rc = http_request(port, "GET", path, NULL, NULL, &r);
    *status = rc ? 0 : r.status;
    json_t *j = rc ? NULL : json_loads(r.body, 0, NULL);
    resp_free(&r);
    return j;
}

char **sse_events(const char *body, int *n) {
    int cap = 16;
    char **ev = malloc(sizeof(char *) * cap);
    *n = 0;
    for (const char *p = body; p && *p;) {
        const char *e = strstr(p, "\n\n");
        if (!e) break;
        if (!strncmp(p, "data: ", 6)) {
            if (*n + 2 > cap) ev = realloc(ev, sizeof(char *) * (cap *= 2));
            size_t len = e - p - 6;
            ev[*n] = malloc(len + 1);
            memcpy(ev[*n], p + 6, len);
            ev[*n][len] = 0;
            (*n)++;
        }
        p = e + 2;
    }
    ev[*n] = NULL;
    return ev;
}

void sse_free(char **ev) {
    for (int i = 0; ev && ev[i]; i++) free(ev[i]);
    free(ev);
}

double metric_value(const char *text, const char *name, const char *label) {
    size_t n = strlen(name);
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)MIN_(len, sizeof line - 1), p);
        if (!strncmp(line, name, n) && (line[n] == '{' || line[n] == ' ') && (!label || strstr(line, label))) {
            const char *v = strrchr(line, ' ');
            return v ? atof(v + 1) : NAN;
        }
        p = e ? e + 1 : NULL;
    }
    return NAN;
}

char *http_metrics(int port) {
    struct resp r;
    if (http_request(port, "GET", "/metrics", NULL, NULL, &r) || r.status != 200) {
        resp_free(&r);
        return NULL;
    }
    char *b = r.body;
    r.body = NULL;
    resp_free(&r);
    return b;
}
