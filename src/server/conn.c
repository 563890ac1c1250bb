// conn.c - client connections under evhttp, and the listener's backoff.
//
// evhttp's bevcb gives each connection a socket bufferevent of ours. A
// callback on its input buffer sees every byte before evhttp parses it:
//  - the head of each request is checked for ambiguous framing (RFC 9112
//    6.3): Content-Length twice or not digits, Content-Length with
//    Transfer-Encoding, a coding other than chunked, obs-fold. Such a
//    request gets a 400 at once (501 for a coding), the connection is shut
//    for writing, and nothing more it sends reaches evhttp, so nothing
//    behind it can be smuggled;
//  - --timeout-s bounds the whole read of a request, from its first byte
//    (or from when the previous answer went out) to on_request: a client
//    that trickles bytes gets a 408 and a closed connection.
// While a request is answered, evhttp may not read the socket (a read
// high-watermark of 1 over a sentinel byte): a client's half-close (FIN after
// its request) is not seen as a disconnect, so the whole answer is written.
// Only a reset or a failed write is a disconnect; after the answer evhttp
// reads again, sees the FIN and closes.
// The connection's close callback is this file's, so that every client is
// freed with its connection; others hook in through client_set_closecb.
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <strings.h>
#include <sys/socket.h>

#include "core/common.h"
#include "server/server_internal.h"

#define MAX_HEAD (64 << 10)     // request line + headers (evhttp's limit too)
#define ACCEPT_PAUSE_MS 100     // accept() failing (fd limit): listener off this long
#define ACCEPT_LOG_EVERY_S 10.0 // and at most one log line per this interval

struct client {
    struct server *srv;
    struct bufferevent *bev;
    struct evhttp_connection *evcon; // known once `init` ran
    struct evbuffer_cb_entry *in_cb;
    struct event *init, *deadline;
    evhttp_close_cb user_close; // client_set_closecb's
    void *user_arg;
    char *head; // the head of the request being read, while it is incomplete
    size_t head_len;
    int reading;   // a request's bytes are arriving and evhttp does not have it whole
    int scanning;  // its head is being collected
    int answering; // evhttp has the request and has not answered it
    int holding;   // the sentinel byte is in the input buffer
    int refused;   // answered by conn.c itself: the rest of the input is dropped
    struct client *hnext; // in srv->client_hash
    struct client *prev, *next;
};

// ------------------------------------------------------------ registry --

static size_t hash_ptr(const void *p, int cap) { return ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull >> 32 & (cap - 1); }

static void hash_add(struct server *s, struct client *c) {
    if (2 * (s->num_hashed + 1) > s->hash_cap) { // rehash: keeps chains short
        int cap = s->hash_cap ? 2 * s->hash_cap : 256;
        struct client **h = xcalloc(cap, sizeof *h);
        for (int i = 0; i < s->hash_cap; i++)
            for (struct client *x = s->client_hash[i], *n; x; x = n) {
                n = x->hnext;
                size_t k = hash_ptr(x->evcon, cap);
                x->hnext = h[k];
                h[k] = x;
            }
        free(s->client_hash);
        s->client_hash = h;
        s->hash_cap = cap;
    }
    size_t k = hash_ptr(c->evcon, s->hash_cap);
    c->hnext = s->client_hash[k];
    s->client_hash[k] = c;
    s->num_hashed++;
}

static void hash_del(struct server *s, struct client *c) {
    if (!c->evcon || !s->hash_cap) return;
    for (struct client **p = &s->client_hash[hash_ptr(c->evcon, s->hash_cap)]; *p; p = &(*p)->hnext)
        if (*p == c) {
            *p = c->hnext;
            s->num_hashed--;
            return;
        }
}

static struct client *client_of(struct server *s, struct evhttp_connection *evcon) {
    if (!evcon || !s->hash_cap) return NULL;
    for (struct client *c = s->client_hash[hash_ptr(evcon, s->hash_cap)]; c; c = c->hnext)
        if (c->evcon == evcon && c->bev == evhttp_connection_get_bufferevent(evcon)) return c;
    return NULL;
}

static void client_free(struct client *c) {
    struct server *s = c->srv;
    hash_del(s, c);
    if (c->prev) c->prev->next = c->next;
    else s->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    s->num_clients--;
    if (c->in_cb) evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->in_cb);
    event_free(c->init);
    event_free(c->deadline);
    free(c->head);
    free(c);
}

// -------------------------------------------------------- connection --

// evhttp frees the connection: the user's close callback, then the client.
static void on_close(struct evhttp_connection *evcon, void *arg) {
    struct client *c = arg;
    if (c->user_close) c->user_close(evcon, c->user_arg);
    client_free(c);
}

void client_set_closecb(struct server *s, struct evhttp_connection *evcon, evhttp_close_cb cb, void *arg) {
    struct client *c = client_of(s, evcon);
    if (c) {
        c->user_close = cb;
        c->user_arg = arg;
    } else {
        evhttp_connection_set_closecb(evcon, cb, arg); // not one of ours (cannot happen: every connection is)
    }
}

// Right after evhttp set the connection up (scheduled by client_new): its
// evhttp_connection is the bufferevent's callback argument now.
static void on_init(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    struct client *c = arg;
    bufferevent_event_cb ev = NULL;
    void *evcon = NULL;
    bufferevent_getcb(c->bev, NULL, NULL, &ev, &evcon);
    struct bufferevent *bev = c->bev;
    if (!ev || !evcon) { // evhttp gave up on it already (freed: the callbacks are cleared)
        client_free(c);
    } else {
        c->evcon = evcon;
        hash_add(c->srv, c);
        evhttp_connection_set_closecb(c->evcon, on_close, c);
    }
    bufferevent_decref(bev); // client_new's reference
}

static void scan_head(struct client *c, struct evbuffer *in, size_t n);
static void deadline_arm(struct client *c);

// ----------------------------------------------------- answering --

// The request is evhttp's whole: its read is over, and evhttp reads no more
// (so sees no FIN) until it is answered.
void client_request_read(struct server *s, struct evhttp_request *req) {
    struct client *c = client_of(s, evhttp_request_get_connection(req));
    if (!c) return;
    c->reading = c->scanning = 0;
    c->head_len = 0;
    c->answering = 1;
    evtimer_del(c->deadline);
    if (!c->holding) {
        c->holding = 1; // the input callback ignores the sentinel's arrival
        evbuffer_prepend(bufferevent_get_input(c->bev), "", 1);
        bufferevent_setwatermark(c->bev, EV_READ, 0, 1);
    }
}

// The answer went out (evhttp is about to read the next request).
void client_reply_done(struct server *s, struct evhttp_request *req) {
    struct client *c = client_of(s, evhttp_request_get_connection(req));
    if (!c || !c->answering) return;
    c->answering = 0;
    if (c->holding) {
        bufferevent_setwatermark(c->bev, EV_READ, 0, 0);
        evbuffer_drain(bufferevent_get_input(c->bev), 1);
        c->holding = 0;
    }
    // bytes of a next request that came with this one: its read starts now
    struct evbuffer *in = bufferevent_get_input(c->bev);
    if (evbuffer_get_length(in)) {
        c->reading = c->scanning = 1;
        c->head_len = 0;
        deadline_arm(c);
        scan_head(c, in, evbuffer_get_length(in));
    }
}

// ------------------------------------------------------------ refusing --

static void deadline_arm(struct client *c) {
    struct timeval tv = {c->srv->cfg.io_timeout_s, 0};
    evtimer_add(c->deadline, &tv);
}

// Answers the request being read with `status` and stops the connection's
// input: the client sees the answer, then the end of the stream. With
// drop_input (a 408) the socket's read side is shut too, so evhttp sees an
// EOF and frees the connection; otherwise the rest of what the client sends
// is dropped until it closes (or evhttp's idle timeout closes it).
static void refuse(struct client *c, int status, const char *why, int drop_input) {
    struct api_error err = {0};
    api_fail(&err, status, NULL, "%s", why);
    json_t *j = api_error_json(&err);
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n",
                     status, http_reason(status), body ? strlen(body) : 0);
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    // nothing of this connection is being answered (refusals happen while a
    // request is read), so this cannot interleave with another reply; it is
    // small enough for any socket's send buffer
    if (fd >= 0 && send(fd, head, n, MSG_NOSIGNAL | MSG_DONTWAIT) == n && body)
        if (send(fd, body, strlen(body), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* the close tells the rest */ }
    free(body);
    c->refused = 1;
    c->reading = c->scanning = 0;
    evbuffer_drain(bufferevent_get_input(c->bev), evbuffer_get_length(bufferevent_get_input(c->bev)));
    if (fd >= 0) shutdown(fd, drop_input ? SHUT_RDWR : SHUT_WR);
    if (!drop_input) deadline_arm(c); // a client that keeps sending is cut at the deadline
}

static void on_deadline(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    struct client *c = arg;
    evutil_socket_t sfd = bufferevent_getfd(c->bev);
    if (c->refused) { // already answered: only the input is left to cut
        if (sfd >= 0) shutdown(sfd, SHUT_RDWR);
        return;
    }
    c->srv->request_timeouts++;
    char why[96];
    snprintf(why, sizeof why, "the request was not received whole within %d s (--timeout-s)", c->srv->cfg.io_timeout_s);
    refuse(c, 408, why, 1);
}

// ------------------------------------------------------------- framing --

// The value of the header line "Name: value" if its name is `name`, trimmed.
static const char *header_value(const char *line, size_t len, const char *name, size_t *vlen) {
    size_t n = strlen(name);
    if (len <= n || line[n] != ':' || strncasecmp(line, name, n)) return NULL;
    const char *v = line + n + 1, *e = line + len;
    while (v < e && (*v == ' ' || *v == '\t')) v++;
    while (e > v && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) e--;
    *vlen = (size_t)(e - v);
    return v;
}

// Why a complete head (NUL-terminated) has ambiguous framing, or NULL.
static const char *check_framing(const char *head, int *status) {
    int cl = 0, te = 0;
    *status = 400;
    const char *p = strchr(head, '\n');
    for (p = p ? p + 1 : head + strlen(head); *p && *p != '\r' && *p != '\n';) {
        const char *eol = strchr(p, '\n');
        if (!eol) break;
        size_t len = (size_t)(eol - p), vlen;
        if (*p == ' ' || *p == '\t') return "obsolete line folding in the request headers";
        const char *colon = memchr(p, ':', len), *v;
        if (colon && colon > p && (colon[-1] == ' ' || colon[-1] == '\t'))
            return "whitespace between a header name and its colon";
        if ((v = header_value(p, len, "Content-Length", &vlen))) {
            if (++cl > 1) return "more than one Content-Length header";
            int digits = vlen > 0 && vlen <= 18;
            for (size_t i = 0; digits && i < vlen; i++) digits = v[i] >= '0' && v[i] <= '9';
            if (!digits) return "Content-Length is not a decimal byte count";
        } else if ((v = header_value(p, len, "Transfer-Encoding", &vlen))) {
            if (++te > 1) return "more than one Transfer-Encoding header";
            if (vlen != 7 || strncasecmp(v, "chunked", 7)) {
                *status = 501;
                return "only the chunked transfer coding is supported";
            }
        }
        p = eol + 1;
    }
    if (cl && te) return "Content-Length together with Transfer-Encoding";
    return NULL;
}

// Appends the n newest bytes of the input to the head being collected;
// checks the head once it is whole.
static void scan_head(struct client *c, struct evbuffer *in, size_t n) {
    size_t len = evbuffer_get_length(in), from = c->head_len;
    n = MIN(n, len);
    if (c->head_len + n > MAX_HEAD) n = MAX_HEAD - c->head_len; // evhttp refuses the head (431-like 400) itself
    if (!n) {
        c->scanning = 0;
        return;
    }
    c->head = xrealloc(c->head, c->head_len + n + 1);
    struct evbuffer_ptr pos;
    evbuffer_ptr_set(in, &pos, len - n, EVBUFFER_PTR_SET);
    evbuffer_copyout_from(in, &pos, c->head + c->head_len, n);
    c->head_len += n;
    c->head[c->head_len] = 0;
    size_t skip = 0; // empty lines before the request line (RFC 9112 2.2)
    while (skip < c->head_len && (c->head[skip] == '\r' || c->head[skip] == '\n')) skip++;
    for (size_t i = MAX(from, skip + 1); i < c->head_len; i++) {
        if (c->head[i] != '\n') continue;
        int end = c->head[i - 1] == '\n' || (i >= skip + 2 && c->head[i - 1] == '\r' && c->head[i - 2] == '\n');
        if (!end) continue;
        c->head[i + 1] = 0;
        c->scanning = 0;
        int status;
        const char *why = check_framing(c->head + skip, &status);
        if (why) {
            c->srv->framing_refused++;
            refuse(c, status, why, 0);
        }
        return;
    }
}

static void on_input(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg) {
    struct client *c = arg;
    if (!info->n_added) return;
    if (c->refused) {
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    if (c->holding || c->answering) return; // the sentinel, or bytes evhttp takes after the answer
    if (!c->reading) {
        c->reading = c->scanning = 1;
        c->head_len = 0;
        deadline_arm(c);
    }
    if (c->scanning) scan_head(c, in, info->n_added);
}

struct bufferevent *client_new(struct event_base *base, void *arg) {
    struct server *s = arg;
    struct client *c = xcalloc(1, sizeof *c);
    c->srv = s;
    c->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev) {
        free(c);
        return NULL;
    }
    // held until on_init: evhttp may free the bufferevent before that
    bufferevent_incref(c->bev);
    c->in_cb = evbuffer_add_cb(bufferevent_get_input(c->bev), on_input, c);
    c->init = event_new(base, -1, 0, on_init, c);
    c->deadline = evtimer_new(base, on_deadline, c);
    event_active(c->init, EV_READ, 0);
    c->next = s->clients;
    if (s->clients) s->clients->prev = c;
    s->clients = c;
    s->num_clients++;
    return c->bev;
}

// ------------------------------------------------------------ listener --

static void on_accept_resume(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    struct server *s = arg;
    if (s->bound) evconnlistener_enable(evhttp_bound_socket_get_listener(s->bound));
}

// accept() failed. At the fd limit the listening socket stays readable, and
// libevent would retry (and log) in a tight loop: pause accepting instead.
static void on_accept_error(struct evconnlistener *l, void *http) {
    int err = EVUTIL_SOCKET_ERROR();
    struct server *s = server_of_http(http); // evhttp's listener: its argument is the evhttp
    if (!s || err == ECONNABORTED || err == EINTR || err == EAGAIN) return;
    s->accept_errors++;
    s->accept_errors_unlogged++;
    double now = now_s();
    if (now - s->accept_logged_at >= ACCEPT_LOG_EVERY_S) {
        fprintf(stderr, "vllm serve: accept: %s (%llu times since the last report); pausing new connections for "
                "%d ms each time\n", strerror(err), (unsigned long long)s->accept_errors_unlogged, ACCEPT_PAUSE_MS);
        s->accept_logged_at = now;
        s->accept_errors_unlogged = 0;
    }
    evconnlistener_disable(l);
    struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};
    evtimer_add(s->accept_timer, &tv);
}

void client_listener_setup(struct server *s) {
    s->accept_timer = evtimer_new(s->base, on_accept_resume, s);
    evconnlistener_set_error_cb(evhttp_bound_socket_get_listener(s->bound), on_accept_error);
}

void client_free_all(struct server *s) {
    while (s->clients) {
        struct client *c = s->clients;
        struct bufferevent *pending = c->evcon ? NULL : c->bev; // on_init never ran: its reference is held
        client_free(c);
        if (pending) bufferevent_decref(pending);
    }
    free(s->client_hash);
    s->client_hash = NULL;
    s->hash_cap = 0;
}
