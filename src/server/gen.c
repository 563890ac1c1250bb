// gen.c - one completion or chat request from submit to its last byte.
//
// A request has one choice per prompt and sample (n of each prompt; index
// prompt * n + sample), each its own engine request. The engine's callback
// (engine thread) only appends to the choice's `pend` buffer under
// server.mu, queues the choice and wakes the loop; the loop thread swaps
// `pend` with `work` and turns the events into SSE chunks (the choices'
// interleave, each with its index) or, once every choice is done, into the
// final JSON. A prompt's samples share its prefill through the prefix cache:
// sample 0 goes first, the others once it has a token (its prompt blocks
// are in the cache then; submitted together, each would compute them). A
// client that leaves (the connection's close callback, or for a
// non-streaming request a watch on its socket) cancels every engine
// request; a client that only half-closed its side gets the whole answer
// (conn.c).
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>

#include "core/common.h"
#include "server/server_internal.h"

// ------------------------------------------------------- engine thread --

// num_output: the tokens delivered so far, these included (counted here:
// vllm_output.num_output_tokens also counts tokens still in flight).
static void events_append(struct gen_events *ev, const struct vllm_output *o, int num_output) {
    if (o->text_len) {
        if (ev->text_len + o->text_len > ev->text_cap) {
            ev->text_cap = (ev->text_len + o->text_len) * 2;
            ev->text = xrealloc(ev->text, ev->text_cap);
        }
        memcpy(ev->text + ev->text_len, o->text, o->text_len);
        ev->text_len += o->text_len;
    }
    int n = o->num_token_ids;
    if (n) {
        int k = o->logprobs ? o->num_top_logprobs : 0;
        if (ev->n + n > ev->cap || k != ev->k) {
            ev->cap = MAX(ev->cap, (ev->n + n) * 2);
            ev->k = k;
            ev->ids = xrealloc(ev->ids, sizeof(int32_t) * ev->cap);
            ev->lp = xrealloc(ev->lp, sizeof(float) * ev->cap);
            ev->top_ids = xrealloc(ev->top_ids, sizeof(int32_t) * ev->cap * (k ? k : 1));
            ev->top_lp = xrealloc(ev->top_lp, sizeof(float) * ev->cap * (k ? k : 1));
        }
        memcpy(ev->ids + ev->n, o->token_ids, sizeof(int32_t) * n);
        for (int i = 0; i < n; i++) ev->lp[ev->n + i] = o->logprobs ? o->logprobs[i] : 0;
        if (k) {
            memcpy(ev->top_ids + (size_t)ev->n * k, o->top_ids, sizeof(int32_t) * n * k);
            memcpy(ev->top_lp + (size_t)ev->n * k, o->top_logprobs, sizeof(float) * n * k);
        }
        ev->n += n;
    }
    ev->num_prompt = o->num_prompt_tokens;
    ev->num_cached = o->num_cached_tokens;
    ev->num_output = num_output;
    if (o->finish_reason != VLLM_FINISH_NONE) {
        ev->done = 1;
        ev->reason = o->finish_reason;
        ev->status = o->status;
        free(ev->stop_str);
        ev->stop_str = o->stop_str ? xstrdup(o->stop_str) : NULL;
        ev->stop_token = o->stop_token_id;
        snprintf(ev->error, sizeof ev->error, "%s", o->error ? o->error : "");
    }
}

static int finish_index(vllm_finish_reason r) {
    return r == VLLM_FINISH_LENGTH ? 1 : r == VLLM_FINISH_ABORT ? 2 : r == VLLM_FINISH_ERROR ? 3 : 0;
}

void gen_on_output(void *user, const struct vllm_output *o) {
    struct gen_choice *c = user;
    struct server *s = c->g->srv;
    double now = now_s();
    int wake = 0;
    pthread_mutex_lock(&s->mu);
    if (o->prompt_logprobs) prompt_lp_capture(c, o);
    c->num_output += o->num_token_ids;
    events_append(c->pend, o, c->num_output);
    if (o->num_token_ids) {
        if (c->t_first == 0) hist_observe(&s->m.ttft, now - c->g->t_arrival), c->t_first = now;
        else hist_observe(&s->m.itl, now - c->t_last);
        c->t_last = now;
    }
    if (o->finish_reason == VLLM_FINISH_ERROR && (o->status == VLLM_ERR_BACKEND || o->status == VLLM_ERR_INTERNAL))
        s->fatal = 1; // the device or the engine broke: /health says so
    if (o->finish_reason != VLLM_FINISH_NONE) {
        if (o->finish_reason != VLLM_FINISH_ABORT) hist_observe(&s->m.e2e, now - c->g->t_arrival);
        if (o->finish_reason != VLLM_FINISH_ABORT && o->finish_reason != VLLM_FINISH_ERROR) {
            struct gen_choice *c0 = c - c->index % c->g->p.n; // the prompt's sample 0
            c0->max_output = MAX(c0->max_output, c->num_output);
            metrics_finished(&s->m, c, o, ++c0->samples_finished == c->g->p.n ? c0->max_output : -1);
        }
        s->m.finished[finish_index(o->finish_reason)]++;
    }
    if (!c->queued) {
        c->queued = 1;
        c->qnext = NULL;
        if (s->ready_tail) s->ready_tail->qnext = c;
        else s->ready_head = c, wake = 1;
        s->ready_tail = c;
    }
    pthread_mutex_unlock(&s->mu);
    // The gen may be freed from here on: only the server is touched.
    if (wake) event_active(s->wake, EV_READ, 0);
}

// ---------------------------------------------------------- lifecycle --

static void events_free(struct gen_events *ev) {
    if (!ev) return;
    free(ev->text), free(ev->stop_str), free(ev->ids), free(ev->lp), free(ev->top_ids), free(ev->top_lp);
    free(ev);
}

static void choice_release(struct gen_choice *c) {
    events_free(c->pend);
    events_free(c->work);
    events_free(c->last);
    free(c->text);
    free(c->ids);
    json_decref(c->logprobs);
    prompt_lp_free(c->plp);
    guided_req_free(c->parse);
}

static void gen_maybe_free(struct gen *g) {
    if (g->num_done < g->num_choices || g->req) return;
    struct server *s = g->srv;
    if (g->prev) g->prev->next = g->next;
    else s->live = g->next;
    if (g->next) g->next->prev = g->prev;
    s->num_live--;
    for (int i = 0; i < g->num_choices; i++) choice_release(&g->ch[i]);
    free(g->ch);
    gen_params_free(&g->p);
    free(g);
    server_maybe_exit(s);
}

// Cancels every choice: a submitted one's last event still comes, one never
// submitted is done now.
static void gen_cancel_choices(struct gen *g) {
    for (int i = 0; i < g->num_choices; i++) {
        struct gen_choice *c = &g->ch[i];
        if (c->vreq) vllm_request_free(c->vreq);
        c->vreq = NULL;
        if (!c->submitted && !c->engine_done) c->engine_done = 1, g->num_done++;
    }
}

// Takes the HTTP request back from the gen: no close callback or socket
// watch refers to the gen after this.
static struct evhttp_request *gen_detach(struct gen *g) {
    struct evhttp_request *req = g->req;
    if (g->watch) event_free(g->watch);
    if (g->evcon) client_set_closecb(g->srv, g->evcon, NULL, NULL);
    g->watch = NULL;
    g->evcon = NULL;
    g->req = NULL;
    return req;
}

// The client's connection closed before the answer was complete.
static void on_close(struct evhttp_connection *evcon, void *arg) {
    (void)evcon;
    struct gen *g = arg;
    struct evhttp_request *req = g->req;
    // Mid-stream, libevent let go of the request (no connection): it is ours
    // to free. Otherwise libevent frees it with the connection.
    int ours = req && !evhttp_request_get_connection(req);
    gen_detach(g);
    if (ours) evhttp_request_free(req);
    gen_cancel_choices(g);
    gen_maybe_free(g);
}

// Non-streaming: libevent does not read the socket while the answer is
// pending, so a client that leaves is noticed here. A FIN is a half-close
// (the client may still read): the answer goes out, then the connection
// closes. Only an error (a reset) is a disconnect.
static void on_watch(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    struct gen *g = arg;
    char c;
    ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r > 0) return; // a pipelined request: stop watching, it waits its turn
    if (r == 0) return; // stop watching: the answer's write tells whether the client is still there
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        event_add(g->watch, NULL);
        return;
    }
    evhttp_connection_free(g->evcon); // calls on_close
}

// While a stream runs the socket is not read (conn.c holds evhttp's reads
// until the answer is out): no read timeout either, the client is silent.
// Restored for the next request. A client that left is noticed when a
// write fails.
static void set_streaming(struct gen *g, int on) {
    struct bufferevent *bev = evhttp_connection_get_bufferevent(g->evcon);
    struct timeval tv = {g->srv->cfg.io_timeout_s, 0};
    bufferevent_set_timeouts(bev, on ? NULL : &tv, &tv);
}

// -------------------------------------------------------------- JSON --

static const char *finish_string(vllm_finish_reason r) {
    return r == VLLM_FINISH_LENGTH ? "length" : r == VLLM_FINISH_ABORT ? "abort" : "stop";
}

// vLLM's stop_reason: the stop string or stop token id that finished the
// request; null for EOS, a length limit, or a request still running.
static json_t *stop_reason_json(const struct gen_events *ev) {
    if (!ev->done || ev->reason != VLLM_FINISH_STOP) return json_null();
    if (ev->stop_str) return json_text(ev->stop_str, strlen(ev->stop_str));
    return ev->stop_token >= 0 ? json_integer(ev->stop_token) : json_null();
}

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

// Prompt tokens count once per prompt (its sample 0's), completion tokens
// over every choice, as vLLM's usage does.
static json_t *usage_json(const struct gen *g) {
    int prompt = 0, cached = 0, output = 0;
    for (int i = 0; i < g->num_choices; i++) {
        const struct gen_events *ev = g->ch[i].last;
        if (!ev) continue;
        if (i % g->p.n == 0) prompt += ev->num_prompt, cached += ev->num_cached;
        output += ev->num_output;
    }
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", prompt, "completion_tokens", output, "total_tokens",
                     prompt + output, "prompt_tokens_details", "cached_tokens", cached);
}

static json_t *logprob_json(float lp) { return json_real(isfinite(lp) ? lp : -9999.0); }

static json_t *bytes_json(const char *piece) {
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)piece; *p; p++) json_array_append_new(a, json_integer(*p));
    return a;
}

static json_t *chat_logprob(struct server *s, int32_t id, float lp) {
    const char *piece = server_piece(s, id);
    return json_pack("{s:o,s:o,s:o}", "token", json_text(piece, strlen(piece)), "logprob", logprob_json(lp), "bytes",
                     bytes_json(piece));
}

// Appends the events' tokens to a choice's logprobs object: chat's
// {"content": [...]} or the completions API's {"tokens", "token_logprobs",
// "top_logprobs", "text_offset"}.
static void append_logprobs(struct gen_choice *c, json_t *obj, const struct gen_events *ev) {
    struct gen *g = c->g;
    struct server *s = g->srv;
    int k = MIN(ev->k, g->p.logprobs);
    if (g->p.kind == API_CHAT) {
        json_t *content = json_object_get(obj, "content");
        for (int i = 0; i < ev->n; i++) {
            json_t *e = chat_logprob(s, ev->ids[i], ev->lp[i]), *tops = json_array();
            for (int j = 0; j < k; j++)
                json_array_append_new(tops, chat_logprob(s, ev->top_ids[i * ev->k + j], ev->top_lp[i * ev->k + j]));
            json_object_set_new(e, "top_logprobs", tops);
            json_array_append_new(content, e);
        }
        return;
    }
    for (int i = 0; i < ev->n; i++) {
        const char *piece = server_piece(s, ev->ids[i]);
        json_array_append_new(json_object_get(obj, "tokens"), json_text(piece, strlen(piece)));
        json_array_append_new(json_object_get(obj, "token_logprobs"), logprob_json(ev->lp[i]));
        json_array_append_new(json_object_get(obj, "text_offset"), json_integer((json_int_t)c->text_offset));
        c->text_offset += strlen(piece);
        json_t *top = json_object();
        for (int j = 0; j < k; j++) {
            const char *p = server_piece(s, ev->top_ids[i * ev->k + j]);
            json_object_set_new(top, p, logprob_json(ev->top_lp[i * ev->k + j]));
        }
        if (!json_object_get(top, piece)) json_object_set_new(top, piece, logprob_json(ev->lp[i]));
        json_array_append_new(json_object_get(obj, "top_logprobs"), top);
    }
}

static json_t *logprobs_new(const struct gen *g) {
    if (g->p.kind == API_CHAT) return json_pack("{s:[]}", "content");
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static json_t *response_base(struct gen *g, const char *object) {
    return json_pack("{s:s,s:s,s:I,s:s}", "id", g->id, "object", object, "created", (json_int_t)g->created, "model",
                     g->srv->cfg.served_model_name);
}

static const struct gen_prompt *prompt_of(const struct gen_choice *c) { return &c->g->p.prompts[c->prompt]; }

// The error a failed choice answers with: an abort is the server stopping.
static void event_error(const struct gen_events *ev, struct api_error *err) {
    api_fail(err, ev->reason == VLLM_FINISH_ABORT ? 503 : api_status_of(ev->status), NULL, "%s",
             ev->reason == VLLM_FINISH_ABORT ? "the request was aborted: the server is shutting down" : ev->error);
}

// ---------------------------------------------------------- streaming --

static void sse_send(struct gen *g, json_t *obj) {
    char *js = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    struct evbuffer *buf = evbuffer_new();
    evbuffer_add_printf(buf, "data: %s\n\n", js ? js : "{}");
    evhttp_send_reply_chunk(g->req, buf);
    evbuffer_free(buf);
    free(js);
}

// A chunk holding one choice's delta; prompt_token_ids ride on the first
// chunk (chat) or on each choice's first (completions: its prompt's).
static json_t *stream_chunk(struct gen_choice *ch, json_t *choice) {
    struct gen *g = ch->g;
    int chat = g->p.kind == API_CHAT;
    json_t *c = response_base(g, chat ? "chat.completion.chunk" : "text_completion");
    if (g->p.return_token_ids && (chat ? !g->started : !ch->started))
        json_object_set_new(chat ? c : choice, "prompt_token_ids", ids_json(prompt_of(ch)->ids, prompt_of(ch)->num));
    g->started = ch->started = 1;
    json_object_set_new(c, "choices", json_pack("[o]", choice));
    if (g->p.include_usage) json_object_set_new(c, "usage", json_null());
    return c;
}

// Echo: a choice's prompt text (and with logprobs its log-probs) as its first chunk.
static void send_echo(struct gen_choice *c, json_t *logprobs) {
    const struct gen_prompt *pr = prompt_of(c);
    json_t *choice = json_pack("{s:i,s:o,s:o,s:n}", "index", c->index, "text", json_text(pr->echo, pr->echo_len),
                               "logprobs", logprobs, "finish_reason");
    sse_send(c->g, stream_chunk(c, choice));
    c->echoed = 1;
}

static void stream_start(struct gen *g) {
    struct evkeyvalq *h = evhttp_request_get_output_headers(g->req);
    evhttp_add_header(h, "Content-Type", "text/event-stream; charset=utf-8");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_send_reply_start(g->req, 200, "OK");
    set_streaming(g, 1);
    // Each event goes out at once, not after the client's delayed ACK.
    int one = 1;
    evutil_socket_t fd = bufferevent_getfd(evhttp_connection_get_bufferevent(g->evcon));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (g->p.kind == API_RESPONSES) {
        responses_stream_start(g);
        return;
    }
    for (int i = 0; i < g->num_choices; i++) { // each choice opens with its prompt's text (echo) or the role
        struct gen_choice *c = &g->ch[i];
        const struct gen_prompt *pr = prompt_of(c);
        if (pr->echo) {
            if (!g->p.echo_logprobs) send_echo(c, json_null()); // with logprobs: once they arrive
        } else if (g->p.kind == API_CHAT) {
            json_t *choice = json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", c->index, "delta", "role", "assistant",
                                       "content", "", "logprobs", "finish_reason");
            sse_send(g, stream_chunk(c, choice));
        }
    }
}

static void stream_events(struct gen_choice *c, const struct gen_events *ev) {
    struct gen *g = c->g;
    if (g->p.kind == API_RESPONSES) {
        responses_stream_events(g, ev);
        return;
    }
    if (g->p.echo_logprobs && !c->echoed && c->plp) {
        json_t *lp = logprobs_new(g);
        prompt_lp_echo(c, lp);
        send_echo(c, lp);
    }
    struct gen_events cut;
    if (g->p.echo_only) cut = *ev, cut.n = 0, cut.text_len = 0, ev = &cut; // max_tokens 0: the prompt alone
    int failed = ev->done && (ev->reason == VLLM_FINISH_ABORT || ev->reason == VLLM_FINISH_ERROR);
    int fin = ev->done && !failed, tokens = ev->n && (g->p.logprobs >= 0 || g->p.return_token_ids);
    if (!ev->text_len && !tokens && !fin) return;
    json_t *choice = json_pack("{s:i}", "index", c->index), *text = json_text(ev->text ? ev->text : "", ev->text_len);
    const char *fin_reason = fin ? finish_string(ev->reason) : NULL;
    struct guided_req *q = c->parse ? c->parse : g->p.guided;
    if (g->p.kind == API_CHAT && guided_parses(q)) { // reasoning / tool calls: the parsers' deltas
        json_t *delta = json_object();
        int any = guided_delta(q, ev->text, ev->text_len, fin, delta);
        json_object_set_new(choice, "delta", delta);
        json_decref(text);
        if (fin && guided_stream_finish(q, ev->reason)) fin_reason = guided_stream_finish(q, ev->reason);
        if (!any && !tokens && !fin) {
            json_decref(choice);
            return;
        }
    } else if (g->p.kind == API_CHAT) {
        json_t *delta = json_object(); // the finish chunk's delta is {}
        if (ev->text_len || !fin) json_object_set(delta, "content", text);
        json_object_set_new(choice, "delta", delta);
        json_decref(text);
    } else {
        json_object_set_new(choice, "text", text);
    }
    json_t *lp = json_null();
    if (g->p.logprobs >= 0 && ev->n) append_logprobs(c, lp = logprobs_new(g), ev);
    json_object_set_new(choice, "logprobs", lp);
    json_object_set_new(choice, "finish_reason", fin ? json_string(fin_reason) : json_null());
    json_object_set_new(choice, "stop_reason", stop_reason_json(ev));
    if (g->p.return_token_ids) json_object_set_new(choice, "token_ids", ids_json(ev->ids, ev->n));
    sse_send(g, stream_chunk(c, choice));
}

// The stream's end: the usage chunk (every choice done) or the error, then
// [DONE] (the Responses API ends with its last event instead).
static void stream_finish(struct gen *g, const struct api_error *err) {
    if (err) {
        sse_send(g, api_error_json(err));
    } else if (g->p.kind == API_RESPONSES) {
        responses_stream_done(g, g->ch->last);
    } else if (g->p.include_usage) {
        json_t *c = response_base(g, g->p.kind == API_CHAT ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(c, "choices", json_array());
        json_object_set_new(c, "usage", usage_json(g));
        sse_send(g, c);
    }
    if (g->p.kind != API_RESPONSES) {
        struct evbuffer *buf = evbuffer_new();
        evbuffer_add_printf(buf, "data: [DONE]\n\n");
        evhttp_send_reply_chunk(g->req, buf);
        evbuffer_free(buf);
    }
    set_streaming(g, 0);
    struct evhttp_request *req = gen_detach(g);
    server_track_reply(g->srv, req);
    evhttp_send_reply_end(req);
}

// ------------------------------------------------------ non-streaming --

static void collect_events(struct gen_choice *c, const struct gen_events *ev) {
    if (c->g->p.echo_logprobs && !c->logprobs && c->plp) prompt_lp_echo(c, c->logprobs = logprobs_new(c->g));
    if (c->g->p.echo_only) return; // max_tokens 0: the prompt alone
    if (ev->text_len) {
        if (c->text_len + ev->text_len > c->text_cap) {
            c->text_cap = (c->text_len + ev->text_len) * 2;
            c->text = xrealloc(c->text, c->text_cap);
        }
        memcpy(c->text + c->text_len, ev->text, ev->text_len);
        c->text_len += ev->text_len;
    }
    if (ev->n && c->g->p.return_token_ids) {
        xgrow((void **)&c->ids, &c->cap_ids, c->num_ids + ev->n, sizeof(int32_t));
        memcpy(c->ids + c->num_ids, ev->ids, sizeof(int32_t) * ev->n);
        c->num_ids += ev->n;
    }
    if (ev->n && c->g->p.logprobs >= 0) {
        if (!c->logprobs) c->logprobs = logprobs_new(c->g);
        append_logprobs(c, c->logprobs, ev);
    }
}

// A finished choice of the final answer.
static json_t *choice_json(struct gen_choice *c) {
    struct gen *g = c->g;
    const struct gen_prompt *pr = prompt_of(c);
    const struct gen_events *ev = c->last;
    int chat = g->p.kind == API_CHAT;
    if (pr->echo) { // echo: the prompt's text, then the completion
        char *t = xmalloc(pr->echo_len + c->text_len + 1);
        memcpy(t, pr->echo, pr->echo_len);
        if (c->text_len) memcpy(t + pr->echo_len, c->text, c->text_len);
        free(c->text);
        c->text = t, c->text_len += pr->echo_len, c->text_cap = c->text_len + 1;
    }
    json_t *choice = json_pack("{s:i}", "index", c->index), *text = json_text(c->text ? c->text : "", c->text_len);
    const char *fin = finish_string(ev->reason);
    struct guided_req *q = c->parse ? c->parse : g->p.guided;
    if (chat && guided_parses(q)) { // reasoning_content / tool_calls (guided.c)
        json_t *msg = json_pack("{s:s}", "role", "assistant");
        const char *f = guided_message(q, c->text ? c->text : "", c->text_len, ev->reason, msg);
        if (f) fin = f;
        json_object_set_new(choice, "message", msg);
        json_decref(text);
    } else if (chat) {
        json_object_set_new(choice, "message", json_pack("{s:s,s:o}", "role", "assistant", "content", text));
    } else {
        json_object_set_new(choice, "text", text);
    }
    if (g->p.logprobs >= 0 && !c->logprobs) c->logprobs = logprobs_new(g);
    json_object_set(choice, "logprobs", c->logprobs ? c->logprobs : json_null());
    json_object_set_new(choice, "finish_reason", json_string(fin));
    json_object_set_new(choice, "stop_reason", stop_reason_json(ev));
    if (g->p.return_token_ids) {
        if (!chat) json_object_set_new(choice, "prompt_token_ids", ids_json(pr->ids, pr->num));
        json_object_set_new(choice, "token_ids", ids_json(c->ids, c->num_ids));
    }
    return choice;
}

static void reply_final(struct gen *g) {
    struct evhttp_request *req = gen_detach(g);
    if (g->p.kind == API_RESPONSES) {
        send_json(g->srv, req, 200, responses_final(g, g->ch->last));
        return;
    }
    int chat = g->p.kind == API_CHAT;
    json_t *r = response_base(g, chat ? "chat.completion" : "text_completion"), *choices = json_array();
    if (chat && g->p.return_token_ids)
        json_object_set_new(r, "prompt_token_ids", ids_json(g->p.prompts[0].ids, g->p.prompts[0].num));
    for (int i = 0; i < g->num_choices; i++) {
        json_t *cj = choice_json(&g->ch[i]);
        prompt_lp_attach(&g->ch[i], r, cj);
        json_array_append_new(choices, cj);
    }
    json_object_set_new(r, "choices", choices);
    json_object_set_new(r, "usage", usage_json(g));
    send_json(g->srv, req, 200, r);
}

// ------------------------------------------------------------- driver --

// A choice failed (or could not start): the request answers the error and
// its other choices are cancelled.
static void gen_fail(struct gen *g, const struct api_error *err) {
    if (g->req && g->p.stream) {
        stream_finish(g, err);
    } else if (g->req) {
        struct evhttp_request *req = gen_detach(g);
        send_error(g->srv, req, err);
    }
    gen_cancel_choices(g);
}

// The field an engine message is about ("temperature must be ..."), if any.
static const char *param_of(const char *msg) {
    static const char *const names[] = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                        "presence_penalty", "frequency_penalty", "max_tokens", "min_tokens", "priority", NULL};
    for (int i = 0; names[i]; i++) {
        size_t n = strlen(names[i]);
        if (!strncmp(msg, names[i], n) && msg[n] == ' ') return names[i];
    }
    return NULL;
}

// Submits one choice's engine request: its prompt's max_tokens and, with a
// seed, vLLM's per-sample seed (seed + sample). 0, or -1 with *err set.
static int choice_submit(struct gen_choice *c, struct api_error *err) {
    struct gen *g = c->g;
    const struct gen_prompt *pr = prompt_of(c);
    struct vllm_prompt vp;
    vllm_prompt_default(&vp);
    vp.token_ids = pr->ids;
    vp.num_token_ids = pr->num;
    struct vllm_sampling_params sp = g->p.sp;
    sp.max_tokens = pr->max_tokens;
    if (sp.seed >= 0) sp.seed = (int64_t)(((uint64_t)sp.seed + (uint64_t)(c->index % g->p.n)) & (uint64_t)INT64_MAX);
    struct vllm_constraint cons;
    if (guided_constraint(g->p.guided, &cons)) sp.constraint = &cons; // the engine takes it over
    int rc = vllm_submit(g->srv->engine, &vp, &sp, gen_on_output, c, &c->vreq);
    if (rc) {
        const char *msg = vllm_last_error();
        return api_fail(err, api_status_of(rc), param_of(msg), "%s", msg);
    }
    c->submitted = 1;
    return 0;
}

// Whether a prompt's samples 1.. wait for sample 0's first token, to find
// its prompt blocks in the prefix cache (a prompt of one block or less has
// none to share).
static int defers_samples(const struct gen *g, const struct gen_prompt *pr) {
    const struct vllm_model_info *in = &g->srv->info;
    return g->p.n > 1 && in->prefix_caching && pr->num > in->block_size;
}

// Submits what has not been yet of a prompt's samples from `from` on. A
// stopping server (its requests cancelled) starts none.
static int submit_samples(struct gen *g, int prompt, int from, struct api_error *err) {
    for (int j = from; j < g->p.n; j++) {
        struct gen_choice *c = &g->ch[prompt * g->p.n + j];
        if (c->submitted || c->engine_done) continue;
        if (g->srv->stopping)
            return api_fail(err, 503, NULL, "the request was aborted: the server is shutting down");
        if (choice_submit(c, err)) return -1;
    }
    return 0;
}

static void choice_handle(struct gen_choice *c) {
    struct gen *g = c->g;
    struct gen_events *ev = c->work;
    int failed = ev->done && (ev->reason == VLLM_FINISH_ABORT || ev->reason == VLLM_FINISH_ERROR);
    struct api_error err = {0};
    if (g->req) {
        if (g->p.stream) stream_events(c, ev);
        else collect_events(c, ev);
    }
    if (g->req && !failed && c->index % g->p.n == 0 && submit_samples(g, c->prompt, 1, &err)) gen_fail(g, &err);
    if (!ev->done) {
        ev->text_len = 0;
        ev->n = 0;
        return;
    }
    c->engine_done = 1;
    g->num_done++;
    if (c->vreq) vllm_request_free(c->vreq);
    c->vreq = NULL;
    c->last = ev; // no event follows: it keeps the reason and the counts
    c->work = NULL;
    if (failed && g->req) {
        event_error(ev, &err);
        gen_fail(g, &err);
    } else if (g->req && g->num_done == g->num_choices) {
        if (g->p.stream) stream_finish(g, NULL);
        else reply_final(g);
    }
    gen_maybe_free(g);
}

void gen_handle_ready(struct server *s) {
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (struct gen_choice *c = s->ready_head; c; c = c->qnext) {
        xgrow((void **)&s->batch, &s->batch_cap, n + 1, sizeof(struct gen_choice *));
        s->batch[n++] = c;
        c->queued = 0;
        struct gen_events *t = c->pend;
        c->pend = c->work;
        c->work = t;
    }
    s->ready_head = s->ready_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    // A gen outlives the batch: it is freed only once each of its choices'
    // last event was handled, and no choice is in the batch after its last.
    for (int i = 0; i < n; i++) choice_handle(s->batch[i]);
}

static struct gen *gen_new(struct server *s, struct gen_params *gp) {
    struct gen *g = xcalloc(1, sizeof *g);
    g->srv = s;
    g->p = *gp;
    memset(gp, 0, sizeof *gp);
    g->num_choices = g->p.num_prompts * g->p.n;
    g->ch = xcalloc((size_t)g->num_choices, sizeof *g->ch);
    for (int i = 0; i < g->num_choices; i++) {
        struct gen_choice *c = &g->ch[i];
        c->g = g;
        c->index = i;
        c->prompt = i / g->p.n;
        c->pend = xcalloc(1, sizeof *c->pend);
        c->work = xcalloc(1, sizeof *c->work);
        if (i && guided_parses(g->p.guided)) c->parse = guided_req_fork(g->p.guided, i);
    }
    const char *prefix = g->p.kind == API_RESPONSES ? "resp_" : g->p.kind == API_CHAT ? "chatcmpl-" : "cmpl-";
    if (g->p.request_id) snprintf(g->id, sizeof g->id, "%s%s", prefix, g->p.request_id);
    else server_new_id(s, prefix, g->id, sizeof g->id);
    if (g->p.kind == API_RESPONSES) server_new_id(s, "msg_", g->msg_id, sizeof g->msg_id);
    g->created = (long long)time(NULL);
    g->t_arrival = now_s();
    g->next = s->live;
    if (s->live) s->live->prev = g;
    s->live = g;
    s->num_live++;
    return g;
}

void gen_start(struct server *s, struct evhttp_request *req, struct gen_params *gp) {
    struct gen *g = gen_new(s, gp);
    struct api_error err = {0};
    int rc = 0;
    for (int i = 0; i < g->p.num_prompts && !rc; i++) // sample 0 of each; the others now or after it
        rc = choice_submit(&g->ch[i * g->p.n], &err) ||
             (!defers_samples(g, &g->p.prompts[i]) && submit_samples(g, i, 1, &err));
    if (rc) {
        send_error(s, req, &err);
        gen_cancel_choices(g);
        gen_maybe_free(g);
        return;
    }
    g->req = req;
    g->evcon = evhttp_request_get_connection(req);
    client_set_closecb(s, g->evcon, on_close, g);
    if (g->p.stream) {
        stream_start(g);
    } else {
        evutil_socket_t fd = bufferevent_getfd(evhttp_connection_get_bufferevent(g->evcon));
        g->watch = event_new(s->base, fd, EV_READ, on_watch, g);
        event_add(g->watch, NULL);
    }
}

void gen_release_all(struct server *s) {
    for (struct gen *g = s->live; g; g = g->next)
        for (int i = 0; i < g->num_choices; i++) {
            if (g->ch[i].vreq) vllm_request_free(g->ch[i].vreq);
            g->ch[i].vreq = NULL;
        }
}

void gen_free_all(struct server *s) {
    while (s->live) {
        struct gen *g = s->live;
        if (g->req) evhttp_request_free(gen_detach(g));
        g->num_done = g->num_choices;
        gen_maybe_free(g);
    }
}

void gen_cancel_all(struct server *s) {
    for (struct gen *g = s->live; g; g = g->next)
        for (int i = 0; i < g->num_choices; i++)
            if (g->ch[i].vreq) vllm_request_cancel(g->ch[i].vreq);
}
