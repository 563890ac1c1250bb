// cors.c - Cross-Origin Resource Sharing as vLLM does it (Starlette's
// CORSMiddleware): --allowed-origins, --allowed-methods, --allowed-headers
// (JSON lists, default ["*"]) and --allow-credentials. A preflight (OPTIONS
// with Origin and Access-Control-Request-Method) is answered before
// authentication and routing, as the middleware sits in front of both; any
// other request from an allowed Origin gets Access-Control-Allow-Origin.
#include <event2/buffer.h>
#include <event2/keyvalq_struct.h>
#include <strings.h>

#include "core/common.h"
#include "server/server_internal.h"

#define ALL_METHODS "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
#define SAFELISTED_HEADERS "Accept, Accept-Language, Content-Language, Content-Type"

// A JSON list of strings ("*": any), or a comma-separated list.
static int parse_list(const char *flag, const char *text, struct str_list *out) {
    memset(out, 0, sizeof *out);
    if (!text) text = "[\"*\"]";
    json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
    if (j && !json_is_array(j)) {
        json_decref(j);
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "%s must be a JSON list of strings, got %s", flag, text);
    }
    if (j) {
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x) {
            if (!json_is_string(x)) {
                json_decref(j);
                str_list_free(out);
                return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "%s must be a JSON list of strings, got %s", flag, text);
            }
            xgrow((void **)&out->v, &out->cap, out->n + 1, sizeof(char *));
            out->v[out->n++] = xstrdup(json_string_value(x));
        }
        json_decref(j);
        return VLLM_OK;
    }
    for (const char *p = text; *p;) { // not JSON: a, b, c
        while (*p == ' ' || *p == ',') p++;
        size_t n = strcspn(p, ",");
        while (n && p[n - 1] == ' ') n--;
        if (n) {
            xgrow((void **)&out->v, &out->cap, out->n + 1, sizeof(char *));
            out->v[out->n] = xmalloc(n + 1);
            memcpy(out->v[out->n], p, n);
            out->v[out->n++][n] = 0;
        }
        p += n;
        while (*p && *p != ',') p++;
    }
    return VLLM_OK;
}

void str_list_free(struct str_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int has(const struct str_list *l, const char *x, int nocase) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], "*") || (nocase ? !strcasecmp(l->v[i], x) : !strcmp(l->v[i], x))) return 1;
    return 0;
}

static int has_star(const struct str_list *l) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], "*")) return 1;
    return 0;
}

int cors_init(struct server *s) {
    TRY(parse_list("--allowed-origins", s->cfg.allowed_origins, &s->cors_origins));
    TRY(parse_list("--allowed-methods", s->cfg.allowed_methods, &s->cors_methods));
    return parse_list("--allowed-headers", s->cfg.allowed_headers, &s->cors_headers);
}

void cors_free(struct server *s) {
    str_list_free(&s->cors_origins);
    str_list_free(&s->cors_methods);
    str_list_free(&s->cors_headers);
}

// Access-Control-Allow-Origin for an allowed origin: "*" when any origin is
// and no credentials are, else the origin itself (and Vary: Origin).
static void allow_origin(struct server *s, struct evkeyvalq *out, const char *origin) {
    if (has_star(&s->cors_origins) && !s->cfg.allow_credentials) {
        evhttp_add_header(out, "Access-Control-Allow-Origin", "*");
    } else {
        evhttp_add_header(out, "Access-Control-Allow-Origin", origin);
        evhttp_add_header(out, "Vary", "Origin");
    }
    if (s->cfg.allow_credentials) evhttp_add_header(out, "Access-Control-Allow-Credentials", "true");
}

// Every requested header ("a, b") is allowed.
static int headers_ok(const struct server *s, const char *req_headers) {
    if (!req_headers || has_star(&s->cors_headers)) return 1;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", req_headers);
    for (char *save = NULL, *h = strtok_r(buf, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        while (*h == ' ') h++;
        char *e = h + strlen(h);
        while (e > h && e[-1] == ' ') *--e = 0;
        if (!*h) continue;
        int ok = has(&s->cors_headers, h, 1);
        static const char *const safe[] = {"accept", "accept-language", "content-language", "content-type", NULL};
        for (int i = 0; safe[i] && !ok; i++) ok = !strcasecmp(h, safe[i]);
        if (!ok) return 0;
    }
    return 1;
}

static void join(struct evbuffer *b, const struct str_list *l, const char *all) {
    if (has_star(l)) {
        evbuffer_add_printf(b, "%s", all);
        return;
    }
    for (int i = 0; i < l->n; i++) evbuffer_add_printf(b, "%s%s", i ? ", " : "", l->v[i]);
}

int cors_handle(struct server *s, struct evhttp_request *req) {
    struct evkeyvalq *in = evhttp_request_get_input_headers(req), *out = evhttp_request_get_output_headers(req);
    const char *origin = evhttp_find_header(in, "Origin");
    if (!origin) return 0;
    const char *method = evhttp_find_header(in, "Access-Control-Request-Method");
    if (evhttp_request_get_command(req) != EVHTTP_REQ_OPTIONS || !method) {
        if (has(&s->cors_origins, origin, 0)) allow_origin(s, out, origin);
        return 0;
    }
    // a preflight
    const char *want_headers = evhttp_find_header(in, "Access-Control-Request-Headers");
    int origin_ok = has(&s->cors_origins, origin, 0), method_ok = has(&s->cors_methods, method, 0),
        headers_allowed = headers_ok(s, want_headers);
    struct evbuffer *body = evbuffer_new(), *hdr = evbuffer_new();
    if (origin_ok) allow_origin(s, out, origin);
    join(hdr, &s->cors_methods, ALL_METHODS);
    evbuffer_add(hdr, "", 1);
    evhttp_add_header(out, "Access-Control-Allow-Methods", (const char *)evbuffer_pullup(hdr, -1));
    evbuffer_drain(hdr, evbuffer_get_length(hdr));
    if (has_star(&s->cors_headers) && want_headers) evbuffer_add_printf(hdr, "%s", want_headers);
    else if (has_star(&s->cors_headers)) evbuffer_add_printf(hdr, "%s", SAFELISTED_HEADERS);
    else {
        evbuffer_add_printf(hdr, "%s", SAFELISTED_HEADERS);
        for (int i = 0; i < s->cors_headers.n; i++) evbuffer_add_printf(hdr, ", %s", s->cors_headers.v[i]);
    }
    evbuffer_add(hdr, "", 1);
    evhttp_add_header(out, "Access-Control-Allow-Headers", (const char *)evbuffer_pullup(hdr, -1));
    evhttp_add_header(out, "Access-Control-Max-Age", "600");
    evhttp_add_header(out, "Content-Type", "text/plain; charset=utf-8");
    int ok = origin_ok && method_ok && headers_allowed;
    if (ok) {
        evbuffer_add_printf(body, "OK");
    } else {
        const char *sep = "";
        if (!origin_ok) evbuffer_add_printf(body, "Disallowed CORS origin"), sep = ", ";
        if (!method_ok) evbuffer_add_printf(body, "%sDisallowed CORS method", sep), sep = ", ";
        if (!headers_allowed) evbuffer_add_printf(body, "%sDisallowed CORS headers", sep);
    }
    server_track_reply(s, req);
    evhttp_send_reply(req, ok ? 200 : 400, ok ? "OK" : "Bad Request", body);
    evbuffer_free(body);
    evbuffer_free(hdr);
    return 1;
}
