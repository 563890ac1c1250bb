// responses.c - /v1/responses, OpenAI's Responses API, over the chat path:
// "input" (a string, or a list of messages with text content) and
// "instructions" become chat messages rendered by the chat template;
// max_output_tokens, temperature and top_p are honoured; the answer is a
// response object with one output message, or (streamed) the typed events
// response.created ... response.completed. Nothing is stored: "store": true,
// previous_response_id, conversation and background are a 400, as is any
// field vllm.c cannot honour (tools, reasoning and text.format belong to
// structured output, issue 14).
#include <event2/buffer.h>
#include <time.h>

#include "core/common.h"
#include "server/server_internal.h"

static json_t *field(const json_t *body, const char *key) {
    json_t *v = json_object_get(body, key);
    return json_is_null(v) ? NULL : v;
}

// A message's content: a string, or a list of input_text / output_text parts.
static json_t *content_text(const json_t *c, size_t i, struct api_error *err) {
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        api_fail(err, 400, "input", "input[%zu].content must be a string or a list of text parts", i);
        return NULL;
    }
    json_t *parts = json_array(), *p;
    size_t j;
    json_array_foreach(c, j, p) {
        const char *type = json_string_value(json_object_get(p, "type"));
        json_t *t = json_object_get(p, "text");
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text")) || !json_is_string(t)) {
            json_decref(parts);
            api_fail(err, 400, "input", "input[%zu].content[%zu]: only input_text and output_text parts are supported", i, j);
            return NULL;
        }
        json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", t));
    }
    return parts;
}

static json_t *input_messages(const json_t *body, struct api_error *err) {
    json_t *in = field(body, "input"), *ins = field(body, "instructions"), *msgs = json_array(), *m;
    if (ins && !json_is_string(ins)) return json_decref(msgs), api_fail(err, 400, "instructions", "'instructions' must be a string"), NULL;
    if (ins) json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    if (json_is_string(in)) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", in));
        return msgs;
    }
    if (!json_is_array(in) || !json_array_size(in))
        return json_decref(msgs), api_fail(err, 400, "input", "'input' must be a string or a non-empty list of messages"), NULL;
    size_t i;
    json_array_foreach(in, i, m) {
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *role = json_string_value(json_object_get(m, "role"));
        if ((type && strcmp(type, "message")) || !role ||
            (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") && strcmp(role, "developer"))) {
            json_decref(msgs);
            api_fail(err, 400, "input", "input[%zu]: only messages (role user, assistant, system or developer) are supported", i);
            return NULL;
        }
        json_t *c = content_text(json_object_get(m, "content"), i, err);
        if (!c) return json_decref(msgs), NULL;
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", !strcmp(role, "developer") ? "system" : role, "content", c));
    }
    return msgs;
}

// Fields that need server-side state or features vllm.c lacks.
static int check_fields(const json_t *body, struct api_error *err) {
    json_t *v;
    if ((v = field(body, "store")) && !json_is_false(v))
        return api_fail(err, 400, "store", "nothing is stored server-side: 'store' must be false");
    static const char *const stateful[] = {"previous_response_id", "conversation", "prompt", NULL};
    for (int i = 0; stateful[i]; i++)
        if (field(body, stateful[i]))
            return api_fail(err, 400, stateful[i], "'%s' needs server-side state, which is not kept", stateful[i]);
    if ((v = field(body, "background")) && !json_is_false(v))
        return api_fail(err, 400, "background", "background responses need server-side state");
    static const char *const unsupported[] = {"tools", "tool_choice", "reasoning", "include", "top_logprobs", NULL};
    for (int i = 0; unsupported[i]; i++)
        if ((v = field(body, unsupported[i])) && !(json_is_array(v) && !json_array_size(v)) &&
            !(json_is_string(v) && !strcmp(json_string_value(v), "auto") && !strcmp(unsupported[i], "tool_choice")))
            return api_fail(err, 400, unsupported[i], "'%s' is not supported on /v1/responses", unsupported[i]);
    json_t *text = field(body, "text"), *fmt = text ? field(text, "format") : NULL;
    if (fmt && strcmp(json_string_value(json_object_get(fmt, "type")) ? json_string_value(json_object_get(fmt, "type")) : "", "text"))
        return api_fail(err, 400, "text", "only the text format is supported");
    if ((v = field(body, "truncation")) && (!json_is_string(v) || strcmp(json_string_value(v), "disabled")))
        return api_fail(err, 400, "truncation", "only 'truncation': \"disabled\" is supported");
    return 0;
}

int responses_parse(struct server *s, const json_t *body, struct gen_params *gp, struct api_error *err) {
    if (check_fields(body, err)) return -1;
    json_t *msgs = input_messages(body, err);
    if (!msgs) return -1;
    json_t *chat = json_pack("{s:o}", "messages", msgs), *v;
    static const char *const copied[] = {"temperature", "top_p", "stream", "model", "user", "metadata", NULL};
    for (int i = 0; copied[i]; i++)
        if ((v = field(body, copied[i]))) json_object_set(chat, copied[i], v);
    if ((v = field(body, "max_output_tokens"))) json_object_set(chat, "max_tokens", v);
    int rc = gen_params_parse(s, API_CHAT, chat, gp, err);
    json_decref(chat);
    if (rc) {
        if (err->param && !strcmp(err->param, "max_tokens")) err->param = "max_output_tokens";
        if (err->param && !strcmp(err->param, "messages")) err->param = "input";
        return -1;
    }
    gp->kind = API_RESPONSES;
    gp->resp_echo = json_object();
    static const char *const echoed[] = {"instructions", "max_output_tokens", "temperature", "top_p", "metadata", "user", NULL};
    for (int i = 0; echoed[i]; i++)
        json_object_set_new(gp->resp_echo, echoed[i], (v = field(body, echoed[i])) ? json_incref(v) : json_null());
    if (json_is_null(json_object_get(gp->resp_echo, "metadata"))) json_object_set_new(gp->resp_echo, "metadata", json_object());
    return 0;
}

// ------------------------------------------------------------- output --

static json_t *usage(const struct gen_events *ev) {
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", ev->num_prompt, "input_tokens_details",
                     "cached_tokens", ev->num_cached, "output_tokens", ev->num_output, "output_tokens_details",
                     "reasoning_tokens", 0, "total_tokens", ev->num_prompt + ev->num_output);
}

static json_t *text_part(const struct gen *g) {
    return json_pack("{s:s,s:o,s:[],s:[]}", "type", "output_text", "text", json_text(g->ch->text ? g->ch->text : "", g->ch->text_len),
                     "annotations", "logprobs");
}

// The output message: in progress (ev NULL), or done as ev ended it.
static json_t *message(const struct gen *g, const struct gen_events *ev) {
    json_t *content = ev ? json_pack("[o]", text_part(g)) : json_array();
    const char *status = !ev ? "in_progress" : ev->reason == VLLM_FINISH_LENGTH ? "incomplete" : "completed";
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", g->msg_id, "status", status, "role", "assistant",
                     "content", content);
}

// The response object: in progress (no output yet), or final with ev.
static json_t *response(const struct gen *g, const struct gen_events *ev) {
    const char *status = !ev ? "in_progress" : ev->reason == VLLM_FINISH_LENGTH ? "incomplete" : "completed";
    json_t *r = json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", g->id, "object", "response", "created_at", (json_int_t)g->created,
                          "status", status, "model", g->srv->cfg.served_model_name);
    json_object_update(r, g->p.resp_echo);
    json_object_set_new(r, "output", ev ? json_pack("[o]", message(g, ev)) : json_array());
    json_object_set_new(r, "usage", ev ? usage(ev) : json_null());
    json_object_set_new(r, "incomplete_details",
                        ev && ev->reason == VLLM_FINISH_LENGTH ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
    json_object_set_new(r, "error", json_null());
    json_object_set_new(r, "previous_response_id", json_null());
    json_object_set_new(r, "store", json_false());
    json_object_set_new(r, "parallel_tool_calls", json_true());
    json_object_set_new(r, "tool_choice", json_string("auto"));
    json_object_set_new(r, "tools", json_array());
    json_object_set_new(r, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(r, "truncation", json_string("disabled"));
    json_object_set_new(r, "reasoning", json_null());
    return r;
}

json_t *responses_final(struct gen *g, const struct gen_events *ev) { return response(g, ev); }

// One typed event: "event: TYPE" and its JSON with type and sequence_number.
static void send_event(struct gen *g, const char *type, json_t *obj) {
    json_object_set_new(obj, "type", json_string(type));
    json_object_set_new(obj, "sequence_number", json_integer(g->seq++));
    char *js = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    struct evbuffer *buf = evbuffer_new();
    evbuffer_add_printf(buf, "event: %s\ndata: %s\n\n", type, js ? js : "{}");
    evhttp_send_reply_chunk(g->req, buf);
    evbuffer_free(buf);
    free(js);
}

static json_t *at_part(const struct gen *g) {
    return json_pack("{s:s,s:i,s:i}", "item_id", g->msg_id, "output_index", 0, "content_index", 0);
}

void responses_stream_start(struct gen *g) {
    send_event(g, "response.created", json_pack("{s:o}", "response", response(g, NULL)));
    send_event(g, "response.in_progress", json_pack("{s:o}", "response", response(g, NULL)));
    send_event(g, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", 0, "item", message(g, NULL)));
    json_t *e = at_part(g);
    json_object_set_new(e, "part", json_pack("{s:s,s:s,s:[],s:[]}", "type", "output_text", "text", "", "annotations", "logprobs"));
    send_event(g, "response.content_part.added", e);
}

void responses_stream_events(struct gen *g, const struct gen_events *ev) {
    if (!ev->text_len) return;
    struct gen_choice *c = g->ch;
    if (c->text_len + ev->text_len > c->text_cap) { // the done events repeat the whole text
        c->text_cap = (c->text_len + ev->text_len) * 2;
        c->text = xrealloc(c->text, c->text_cap);
    }
    memcpy(c->text + c->text_len, ev->text, ev->text_len);
    c->text_len += ev->text_len;
    json_t *e = at_part(g);
    json_object_set_new(e, "delta", json_text(ev->text, ev->text_len));
    json_object_set_new(e, "logprobs", json_array());
    send_event(g, "response.output_text.delta", e);
}

void responses_stream_done(struct gen *g, const struct gen_events *ev) {
    json_t *e = at_part(g);
    json_object_set_new(e, "text", json_text(g->ch->text ? g->ch->text : "", g->ch->text_len));
    json_object_set_new(e, "logprobs", json_array());
    send_event(g, "response.output_text.done", e);
    e = at_part(g);
    json_object_set_new(e, "part", text_part(g));
    send_event(g, "response.content_part.done", e);
    send_event(g, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", 0, "item", message(g, ev)));
    send_event(g, ev->reason == VLLM_FINISH_LENGTH ? "response.incomplete" : "response.completed",
               json_pack("{s:o}", "response", response(g, ev)));
}
