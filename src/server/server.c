// server.c - the HTTP side of `vllm serve`: listening, routing, API keys,
// the small endpoints, replies, and a graceful stop on SIGINT / SIGTERM.
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "server/server_internal.h"

#define STOP_GRACE_S 5 // how long a stop waits for aborted requests to wind down

void server_config_default(struct server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8000;
    c->max_body_bytes = 32u << 20;
    c->io_timeout_s = 60;
}

// ------------------------------------------------------------- replies --

int api_fail(struct api_error *err, int status, const char *param, const char *fmt, ...) {
    if (err->status) return -1; // keep the first error
    err->status = status;
    err->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

int api_status_of(int st) {
    switch (st) {
    case VLLM_ERR_INVALID_ARGUMENT:
    case VLLM_ERR_TOO_LONG:
    case VLLM_ERR_UNSUPPORTED:
    case VLLM_ERR_FORMAT: return 400;
    case VLLM_ERR_QUEUE_FULL: return 429;
    case VLLM_ERR_SHUTDOWN: return 503;
    default: return 500;
    }
}

static const char *error_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowedError";
    case 408: return "RequestTimeoutError";
    case 413: return "RequestEntityTooLargeError";
    case 431: return "RequestHeaderFieldsTooLargeError";
    case 501: return "NotImplementedError";
    case 429: return "RateLimitError";
    case 503: return "ServiceUnavailableError";
    default: return "InternalServerError";
    }
}

json_t *api_error_json(const struct api_error *err) {
    json_t *e = json_object();
    json_object_set_new(e, "message", json_text(err->message, strlen(err->message)));
    json_object_set_new(e, "type", json_string(error_type(err->status)));
    json_object_set_new(e, "param", err->param ? json_string(err->param) : json_null());
    json_object_set_new(e, "code", json_integer(err->status));
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return o;
}

const char *http_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
    }
}

static void on_sent(struct evhttp_request *req, void *arg) {
    struct server *s = arg;
    client_reply_done(s, req);
    client_set_closecb(s, evhttp_request_get_connection(req), NULL, NULL);
    s->num_sending--;
    server_maybe_exit(s);
}

static void on_sent_close(struct evhttp_connection *evcon, void *arg) {
    (void)evcon;
    struct server *s = arg;
    s->num_sending--;
    server_maybe_exit(s);
}

void server_track_reply(struct server *s, struct evhttp_request *req) {
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    if (!evcon) return; // the client is gone: libevent frees the request at once
    s->num_sending++;
    // Exactly one of the two runs: on_sent clears the close callback.
    evhttp_request_set_on_complete_cb(req, on_sent, s);
    client_set_closecb(s, evcon, on_sent_close, s);
}

void send_json(struct server *srv, struct evhttp_request *req, int status, json_t *body) {
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    struct evbuffer *buf = evbuffer_new();
    if (s) evbuffer_add(buf, s, strlen(s));
    free(s);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    server_track_reply(srv, req);
    evhttp_send_reply(req, status, http_reason(status), buf);
    evbuffer_free(buf);
}

void send_error(struct server *s, struct evhttp_request *req, const struct api_error *err) {
    if (err->status == 401)
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
    send_json(s, req, err->status, api_error_json(err));
}

// Length of the valid UTF-8 sequence at s (1..4), or 0 if it is invalid.
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (!len || c > 0xf4 || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if (c == 0xe0 && s[1] < 0xa0) return 0;                // overlong
    if (c == 0xed && s[1] >= 0xa0) return 0;               // surrogates
    if (c == 0xf0 && s[1] < 0x90) return 0;                // overlong
    if (c == 0xf4 && s[1] >= 0x90) return 0;               // > U+10FFFF
    return len;
}

json_t *json_text(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *fixed = xmalloc(n * 3 + 1); // each bad byte becomes U+FFFD (3 bytes)
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int len = utf8_seq((const unsigned char *)s + i, n - i);
        if (len) memcpy(fixed + o, s + i, len), o += len, i += len;
        else memcpy(fixed + o, "\xef\xbf\xbd", 3), o += 3, i++;
    }
    j = json_stringn(fixed, o);
    free(fixed);
    return j ? j : json_string("");
}

const char *server_piece(struct server *s, int32_t id) {
    if (id < 0 || id >= s->info.vocab_size) return "";
    if (!s->piece_cache) s->piece_cache = xcalloc(s->info.vocab_size, sizeof(char *));
    if (!s->piece_cache[id]) {
        char *t = NULL;
        if (!s->info.has_tokenizer || vllm_detokenize(s->engine, &id, 1, 0, &t)) {
            char buf[32];
            snprintf(buf, sizeof buf, "token_id:%d", id);
            t = xstrdup(buf);
        }
        s->piece_cache[id] = t;
    }
    return s->piece_cache[id];
}

void server_new_id(struct server *s, const char *prefix, char *out, size_t cap) {
    uint64_t a = s->id_state += 0x9E3779B97F4A7C15ull, b = a ^ (a >> 31) ^ 0xD6E8FEB86659FD93ull;
    a = (a ^ (a >> 30)) * 0xBF58476D1CE4E5B9ull;
    b = (b ^ (b >> 27)) * 0x94D049BB133111EBull;
    snprintf(out, cap, "%s%016llx%016llx", prefix, (unsigned long long)(a ^ (a >> 31)),
             (unsigned long long)(b ^ (b >> 31)));
}

// ------------------------------------------------------------- routing --

// Constant-time in the key: compares every byte whatever the first mismatch.
static int key_matches(const char *key, const char *got) {
    size_t n = strlen(key), m = strlen(got);
    volatile unsigned char d = (unsigned char)(n != m);
    for (size_t i = 0; i < m; i++) d |= (unsigned char)(got[i] ^ key[i % (n ? n : 1)]);
    return n > 0 && d == 0;
}

static int authorized(struct server *s, struct evhttp_request *req) {
    if (!s->cfg.api_key) return 1;
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return key_matches(s->cfg.api_key, h);
}

static json_t *model_card(struct server *s, const char *name) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(s->start_time));
    json_object_set_new(m, "owned_by", json_string("vllm"));
    json_object_set_new(m, "root", json_text(s->cfg.model_path, strlen(s->cfg.model_path)));
    json_object_set_new(m, "parent", json_null());
    json_object_set_new(m, "max_model_len", json_integer(s->info.max_model_len));
    return m;
}

// One card per served name (--served-model-name A B ...), as vLLM lists them.
static void handle_models(struct server *s, struct evhttp_request *req) {
    json_t *list = json_object(), *data = json_array();
    json_array_append_new(data, model_card(s, s->cfg.served_model_name));
    for (int i = 0; i < s->cfg.num_model_aliases; i++) json_array_append_new(data, model_card(s, s->cfg.model_aliases[i]));
    json_object_set_new(list, "object", json_string("list"));
    json_object_set_new(list, "data", data);
    send_json(s, req, 200, list);
}

static void handle_metrics(struct server *s, struct evhttp_request *req) {
    struct evbuffer *buf = evbuffer_new();
    metrics_render(s, buf);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    server_track_reply(s, req);
    evhttp_send_reply(req, 200, "OK", buf);
    evbuffer_free(buf);
}

static void handle_plain(struct server *s, struct evhttp_request *req, const char *text) {
    struct evbuffer *buf = evbuffer_new();
    evbuffer_add(buf, text, strlen(text));
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; charset=utf-8");
    server_track_reply(s, req);
    evhttp_send_reply(req, 200, "OK", buf);
    evbuffer_free(buf);
}

enum route {
    R_COMPLETIONS, R_CHAT, R_RESPONSES, R_MODELS, R_HEALTH, R_PING, R_VERSION, R_TOKENIZE, R_DETOKENIZE, R_METRICS,
    R_LOAD, R_NONE
};
static const struct {
    const char *path;
    enum evhttp_cmd_type method;
} routes[R_NONE] = {
    [R_COMPLETIONS] = {"/v1/completions", EVHTTP_REQ_POST},
    [R_CHAT] = {"/v1/chat/completions", EVHTTP_REQ_POST},
    [R_RESPONSES] = {"/v1/responses", EVHTTP_REQ_POST},
    [R_MODELS] = {"/v1/models", EVHTTP_REQ_GET},
    [R_HEALTH] = {"/health", EVHTTP_REQ_GET},
    [R_PING] = {"/ping", EVHTTP_REQ_GET},
    [R_VERSION] = {"/version", EVHTTP_REQ_GET},
    [R_TOKENIZE] = {"/tokenize", EVHTTP_REQ_POST},
    [R_DETOKENIZE] = {"/detokenize", EVHTTP_REQ_POST},
    [R_METRICS] = {"/metrics", EVHTTP_REQ_GET},
    [R_LOAD] = {"/load", EVHTTP_REQ_GET},
};

// Routes that answer while the model loads (the others are 503 then).
static int needs_engine(enum route r) {
    return r != R_HEALTH && r != R_PING && r != R_VERSION && r != R_LOAD && r != R_NONE;
}

// /health: 200 once the model is loaded, 503 while it loads or after a
// device or internal error broke the engine (as vLLM's engine-dead check).
static void handle_health(struct server *s, struct evhttp_request *req) {
    pthread_mutex_lock(&s->mu);
    int fatal = s->fatal;
    pthread_mutex_unlock(&s->mu);
    if (!s->engine || fatal) {
        struct api_error err = {0};
        api_fail(&err, 503, NULL, "%s", fatal ? "the engine failed (see the server's log)" : "the model is loading");
        send_error(s, req, &err);
        return;
    }
    handle_plain(s, req, "");
}

// With an API key, every route needs it but these (and /metrics with
// --metrics-no-auth); an unknown path needs it too, so that it tells nothing.
static int open_route(const struct server *s, enum route r) {
    return r == R_HEALTH || r == R_PING || r == R_VERSION || (r == R_METRICS && s->cfg.metrics_no_auth);
}

static void on_request(struct evhttp_request *req, void *arg) {
    struct server *s = arg;
    struct api_error err = {0};
    const char *uri = evhttp_request_get_uri(req);
    size_t plen = strcspn(uri, "?#");
    client_request_read(s, req);
    if (cors_handle(s, req)) return;
    enum route r = R_NONE;
    for (int i = 0; i < R_NONE; i++)
        if (strlen(routes[i].path) == plen && !strncmp(uri, routes[i].path, plen)) r = (enum route)i;
    enum evhttp_cmd_type method = evhttp_request_get_command(req);
    if (!open_route(s, r) && !authorized(s, req))
        api_fail(&err, 401, NULL, "a valid API key is required (Authorization: Bearer <key>)");
    else if (r == R_NONE) api_fail(&err, 404, NULL, "no route %.*s", (int)MIN(plen, 200), uri);
    else if (method != routes[r].method && !(r == R_PING && method == EVHTTP_REQ_POST)) { // vLLM's /ping takes both
        int post = routes[r].method == EVHTTP_REQ_POST;
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", post ? "POST" : "GET");
        api_fail(&err, 405, NULL, "%s takes %s", routes[r].path, post ? "POST" : "GET");
    } else if (s->stopping) api_fail(&err, 503, NULL, "the server is shutting down");
    else if (!s->engine && needs_engine(r)) api_fail(&err, 503, NULL, "the model is loading");
    if (err.status) {
        send_error(s, req, &err);
        return;
    }
    switch (r) {
    case R_COMPLETIONS: work_submit(s, req, JOB_COMPLETION); break;
    case R_CHAT: work_submit(s, req, JOB_CHAT); break;
    case R_RESPONSES: work_submit(s, req, JOB_RESPONSES); break;
    case R_MODELS: handle_models(s, req); break;
    case R_HEALTH:
    case R_PING: handle_health(s, req); break;
    case R_LOAD: send_json(s, req, 200, json_pack("{s:i}", "server_load", s->num_live + s->num_jobs)); break;
    case R_VERSION: send_json(s, req, 200, json_pack("{s:s}", "version", vllm_version())); break;
    case R_TOKENIZE: work_submit(s, req, JOB_TOKENIZE); break;
    case R_DETOKENIZE: work_submit(s, req, JOB_DETOKENIZE); break;
    case R_METRICS: handle_metrics(s, req); break;
    case R_NONE: break;
    }
}

// ------------------------------------------------------------ lifecycle --

static void on_wake(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    gen_handle_ready(arg);
}

static void on_stop_timer(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    struct server *s = arg;
    fprintf(stderr, "vllm serve: %d requests and %d replies were not through in %d s; exiting\n", s->num_live,
            s->num_sending, STOP_GRACE_S);
    event_base_loopexit(s->base, NULL);
}

void server_maybe_exit(struct server *s) {
    if (s->stopping && s->num_live == 0 && s->num_sending == 0 && s->num_jobs == 0) event_base_loopexit(s->base, NULL);
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    (void)what;
    struct server *s = arg;
    if (s->stopping) return;
    s->stopping = 1;
    printf("vllm serve: %s: stopping (%d requests in flight are aborted)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
           s->num_live);
    fflush(stdout);
    if (s->bound) evhttp_del_accept_socket(s->http, s->bound);
    s->bound = NULL;
    if (s->accept_timer) evtimer_del(s->accept_timer);
    gen_cancel_all(s);
    struct timeval tv = {STOP_GRACE_S, 0};
    s->stop_timer = evtimer_new(s->base, on_stop_timer, s);
    evtimer_add(s->stop_timer, &tv);
    server_maybe_exit(s);
}

static char *dup_or_null(const char *s) { return s ? xstrdup(s) : NULL; }

static int max_token_bytes(struct server *s);

static json_t *parse_defaults(const struct vllm_model_info *in) {
    json_t *d = in->generation_defaults ? json_loads(in->generation_defaults, 0, NULL) : NULL;
    if (d && !json_object_size(d)) json_decref(d), d = NULL;
    return d;
}

void server_set_engine(struct server *s, struct vllm_engine *e, int status) {
    if (e) { // the loop thread reads these only once it has adopted e
        vllm_engine_info(e, &s->info);
        s->max_token_bytes = max_token_bytes(s);
        s->gen_defaults = parse_defaults(&s->info);
    }
    pthread_mutex_lock(&s->mu);
    s->loaded = e;
    s->load_status = status;
    s->load_done = 1;
    pthread_mutex_unlock(&s->mu);
    event_active(s->loaded_ev, EV_READ, 0);
}

static void on_loaded(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    struct server *s = arg;
    pthread_mutex_lock(&s->mu);
    struct vllm_engine *e = s->loaded;
    s->loaded = NULL;
    int status = s->load_status;
    pthread_mutex_unlock(&s->mu);
    if (status || !e) {
        vllm_engine_free(e);
        s->load_status = status ? status : VLLM_ERR_INTERNAL;
        event_base_loopexit(s->base, NULL);
        return;
    }
    s->engine = e;
    pthread_mutex_lock(&s->mu); // the engine thread observes them
    metrics_init_tokens(&s->m, s->info.max_model_len);
    pthread_mutex_unlock(&s->mu);
    if (s->stopping) return; // a signal came during the load: it exits with what is left
    printf("vllm serve: serving %s on http://%s:%d (Ctrl-C to stop)\n", s->cfg.served_model_name, s->cfg.host, s->port);
    fflush(stdout);
}

// evhttp's listener calls back with the evhttp: which server it belongs to.
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static struct server *registry[16];

static void registry_set(struct server *s, int add) {
    pthread_mutex_lock(&registry_mu);
    for (int i = 0; i < 16; i++)
        if (add ? !registry[i] : registry[i] == s) {
            registry[i] = add ? s : NULL;
            break;
        }
    pthread_mutex_unlock(&registry_mu);
}

struct server *server_of_http(void *http) {
    struct server *s = NULL;
    pthread_mutex_lock(&registry_mu);
    for (int i = 0; i < 16 && !s; i++)
        if (registry[i] && registry[i]->http == http) s = registry[i];
    pthread_mutex_unlock(&registry_mu);
    return s;
}

// The longest text one token decodes to: no prompt text longer than
// max_model_len of them can fit (request.c refuses it before tokenizing).
static int max_token_bytes(struct server *s) {
    int best = 1;
    for (int32_t id = 0; s->info.has_tokenizer && id < s->info.vocab_size; id++) {
        char *t = NULL;
        if (!vllm_detokenize(s->engine, &id, 1, 0, &t)) best = MAX(best, (int)strlen(t));
        vllm_free(t);
    }
    return best;
}

static int is_loopback(const struct sockaddr_storage *ss) {
    if (ss->ss_family == AF_INET) return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family != AF_INET6) return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

static int bind_listener(struct server *s) {
    s->bound = evhttp_bind_socket_with_handle(s->http, s->cfg.host, (ev_uint16_t)s->cfg.port);
    if (!s->bound)
        return vllm_err(VLLM_ERR_IO, "cannot listen on %s:%d: %s", s->cfg.host, s->cfg.port, strerror(errno));
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    evutil_socket_t fd = evhttp_bound_socket_get_fd(s->bound);
    if (getsockname(fd, (struct sockaddr *)&ss, &len)) return vllm_err(VLLM_ERR_IO, "getsockname: %s", strerror(errno));
    s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (!s->cfg.api_key && !is_loopback(&ss))
        fprintf(stderr, "vllm serve: warning: listening on %s, which is not a loopback address, with no API key: anyone "
                "who can reach it can use the model (--api-key-file, VLLM_API_KEY)\n", s->cfg.host);
    return VLLM_OK;
}

int server_create(struct vllm_engine *e, const struct server_config *cfg, struct server **out) {
    *out = NULL;
    struct server *s = xcalloc(1, sizeof *s);
    s->engine = e;
    s->cfg = *cfg;
    s->cfg.host = xstrdup(cfg->host ? cfg->host : "127.0.0.1");
    s->cfg.api_key = dup_or_null(cfg->api_key);
    s->cfg.model_path = xstrdup(cfg->model_path ? cfg->model_path : "");
    s->cfg.served_model_name = xstrdup(cfg->served_model_name ? cfg->served_model_name : s->cfg.model_path);
    s->cfg.chat_template = dup_or_null(cfg->chat_template);
    char **aliases = xcalloc(cfg->num_model_aliases + 1, sizeof(char *));
    for (int i = 0; i < cfg->num_model_aliases; i++) aliases[i] = xstrdup(cfg->model_aliases[i]);
    s->cfg.model_aliases = (const char *const *)aliases;
    pthread_mutex_init(&s->mu, NULL);
    metrics_init(&s->m);
    int crc = cors_init(s);
    s->cfg.allowed_origins = s->cfg.allowed_methods = s->cfg.allowed_headers = NULL; // parsed, not kept
    if (crc) {
        server_free(s);
        return crc;
    }
    json_t *name = json_string(s->cfg.served_model_name); // it goes into every response
    json_decref(name);
    for (int i = 0; i < s->cfg.num_model_aliases && name; i++) {
        name = json_string(s->cfg.model_aliases[i]);
        json_decref(name);
    }
    if (!name) {
        server_free(s);
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "the served model name is not valid UTF-8");
    }
    s->start_time = (long long)time(NULL);
    s->id_state = (uint64_t)s->start_time * 0x2545F4914F6CDD1Dull ^ (uint64_t)getpid() << 32 ^ (uint64_t)(now_s() * 1e9);
    if (e) vllm_engine_info(e, &s->info);
    // The engine thread activates `wake`: libevent must lock its base.
    if (evthread_use_pthreads() || !(s->base = event_base_new())) {
        server_free(s);
        return vllm_err(VLLM_ERR_INTERNAL, "libevent: cannot create an event base");
    }
    s->wake = event_new(s->base, -1, 0, on_wake, s);
    s->loaded_ev = event_new(s->base, -1, 0, on_loaded, s);
    s->sig_int = evsignal_new(s->base, SIGINT, on_signal, s);
    s->sig_term = evsignal_new(s->base, SIGTERM, on_signal, s);
    event_add(s->sig_int, NULL);
    event_add(s->sig_term, NULL);
    s->http = evhttp_new(s->base);
    evhttp_set_gencb(s->http, on_request, s);
    evhttp_set_bevcb(s->http, client_new, s); // conn.c sees every connection's bytes first
    if (e) {
        s->max_token_bytes = max_token_bytes(s);
        s->gen_defaults = parse_defaults(&s->info);
        metrics_init_tokens(&s->m, s->info.max_model_len);
    }
    // Every method reaches on_request, which answers 405 as JSON.
    evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                            EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
    evhttp_set_max_body_size(s->http, (ev_ssize_t)s->cfg.max_body_bytes);
    evhttp_set_max_headers_size(s->http, 64 << 10);
    evhttp_set_timeout(s->http, s->cfg.io_timeout_s);
    int rc = guided_init(s);
    if (!rc) rc = bind_listener(s);
    if (!rc) rc = work_start(s);
    if (rc) {
        server_free(s);
        return rc;
    }
    client_listener_setup(s);
    registry_set(s, 1);
    *out = s;
    return VLLM_OK;
}

int server_port(const struct server *s) { return s->port; }

int server_run(struct server *s) {
    if (s->engine)
        printf("vllm serve: serving %s on http://%s:%d (Ctrl-C to stop)\n", s->cfg.served_model_name, s->cfg.host,
               s->port);
    event_base_dispatch(s->base);
    return s->load_status;
}

void server_free(struct server *s) {
    if (!s) return;
    // Connections first (their close callbacks release requests), the
    // workers, then the engine (it sends the last events of what is left),
    // then those events.
    registry_set(s, 0);
    if (s->http) evhttp_free(s->http);
    client_free_all(s);
    work_stop(s); // before the engine: a worker may be tokenizing
    gen_release_all(s);
    vllm_engine_free(s->engine);
    vllm_engine_free(s->loaded); // loaded, never adopted
    if (s->base) gen_handle_ready(s);
    gen_free_all(s);
    guided_free(s);
    if (s->piece_cache)
        for (int i = 0; i < s->info.vocab_size; i++) free(s->piece_cache[i]);
    free(s->piece_cache);
    free(s->batch);
    if (s->wake) event_free(s->wake);
    if (s->loaded_ev) event_free(s->loaded_ev);
    json_decref(s->gen_defaults);
    cors_free(s);
    if (s->sig_int) event_free(s->sig_int);
    if (s->sig_term) event_free(s->sig_term);
    if (s->stop_timer) event_free(s->stop_timer);
    if (s->accept_timer) event_free(s->accept_timer);
    if (s->base) event_base_free(s->base);
    pthread_mutex_destroy(&s->mu);
    free((char *)s->cfg.host);
    free((char *)s->cfg.api_key);
    free((char *)s->cfg.model_path);
    free((char *)s->cfg.served_model_name);
    free((char *)s->cfg.chat_template);
    for (int i = 0; s->cfg.model_aliases && i < s->cfg.num_model_aliases; i++) free((char *)s->cfg.model_aliases[i]);
    free((void *)s->cfg.model_aliases);
    free(s);
}
