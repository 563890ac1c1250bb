// server_internal.h - what the server's files share.
//
// Threads: everything here belongs to the libevent loop thread, except what
// `struct server.mu` guards (the ready queue, each gen's `pend` buffer, the
// timing fields and the histograms), which the engine's stream callback
// writes from the engine thread.
#ifndef VLLM_SERVER_INTERNAL_H
#define VLLM_SERVER_INTERNAL_H

#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "server/server.h"

// ------------------------------------------------------------- errors --

// An OpenAI error: {"error": {"message", "type", "param", "code"}}.
struct api_error {
    int status; // HTTP status; 0: no error
    const char *param;
    char message[512];
};
// Sets *err (when no error is set yet) and returns -1.
int api_fail(struct api_error *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
// The status for a vllm_status from the engine.
int api_status_of(int vllm_status);
json_t *api_error_json(const struct api_error *err);

// ------------------------------------------------------------ metrics --

struct hist {
    const double *bounds; // upper bounds, ascending; +Inf is implicit
    int n;
    uint64_t counts[32];  // [n + 1]
    double sum;
    uint64_t count;
};
void hist_init(struct hist *h, const double *bounds, int n);
void hist_observe(struct hist *h, double v);

struct metrics {
    struct hist ttft, itl, e2e;
    // per finished request (not aborted), as vLLM's dashboard queries them
    struct hist queue, prefill, decode, inference, tpot;
    struct hist prompt_tokens, generation_tokens, max_generation_tokens, max_tokens_param;
    double token_bounds[32]; // 1, 2, 5, 10, ... up to max_model_len
    uint64_t finished[4]; // stop, length, abort, error
};
void metrics_init(struct metrics *m);
// The token-count histograms' buckets, once max_model_len is known.
void metrics_init_tokens(struct metrics *m, int max_model_len);
// A request finished (engine thread, under server.mu).
// max_output: the most tokens a sample of the prompt generated, once its
// last sample finished (vLLM's max over a request's n samples), else -1.
struct gen_choice;
void metrics_finished(struct metrics *m, const struct gen_choice *c, const struct vllm_output *o, int max_output);
// Prometheus text exposition (format 0.0.4) into buf.
struct server;
void metrics_render(struct server *s, struct evbuffer *buf);

// ------------------------------------------------------------ requests --

enum api_kind { API_COMPLETION, API_CHAT, API_RESPONSES };

// Choices per request at most: n, times the prompts of a completions list.
#define GEN_MAX_N 128
#define GEN_MAX_PROMPTS 1024
#define GEN_MAX_CHOICES 1024

// One prompt of a request (completions take a list of them).
struct gen_prompt {
    int32_t *ids;
    int num;
    int max_tokens; // sp.max_tokens for this prompt (the default depends on its length)
    char *echo;     // completions' "echo": the prompt's text, before the completion (NULL: off)
    size_t echo_len;
};

// A validated request: what vllm_submit gets, and how to answer.
struct gen_params {
    enum api_kind kind;
    struct vllm_sampling_params sp; // arrays below owned; max_tokens: the prompts'
    char **stop;
    int32_t *stop_ids;
    struct gen_prompt *prompts; // [num_prompts]
    int num_prompts;
    int n;                      // samples per prompt: choice index prompt * n + sample
    int stream, include_usage, return_token_ids;
    int logprobs; // -1: none; else top logprobs per token
    // fields.c
    char *request_id; // the response id's suffix (NULL: a random one)
    char *cache_salt; // sp.cache_salt
    int truncate;     // keep the prompt's last N tokens (0: all)
    int32_t *bias_ids; // sp.logit_bias_ids / values
    float *bias_vals;
    int echo;         // completions' "echo" (the text: gen_prompt.echo)
    int echo_only;    // max_tokens 0 with echo: the prompt alone (one token is generated and dropped, as vLLM)
    // prompt_logprobs.c
    int prompt_logprobs; // the "prompt_logprobs" list's k (-1: no list)
    int echo_logprobs;   // echo with logprobs: the prompt's tokens lead "logprobs"
    int max_new_tokens; // generation_config.json's: max_tokens at most (0: none)
    json_t *resp_echo;  // /v1/responses: the request fields its response objects repeat
    struct guided_req *guided; // structured output / tools / reasoning (guided.c); NULL: none
};
// Parses and checks a /v1/completions or /v1/chat/completions body: fields,
// the prompt (tokenized; chat through the template) and the length limit.
int gen_params_parse(struct server *s, enum api_kind kind, const json_t *body, struct gen_params *gp,
                     struct api_error *err);
void gen_params_free(struct gen_params *gp);
// The prompt of /tokenize: "prompt" (text) or "messages" (chat template).
int tokenize_body(struct server *s, const json_t *body, int32_t **ids, int *n, struct api_error *err);
// The answers of /tokenize and /detokenize, or NULL with *err set.
json_t *tokenize_reply(struct server *s, const json_t *body, struct api_error *err);
json_t *detokenize_reply(struct server *s, const json_t *body, struct api_error *err);
// The chat template's input for a chat body: the checked messages (content
// parts joined), tools and tool_choice checked against OpenAI's schema, and
// chat_template_kwargs, which may not set what the server sets. NULL with a
// 400 in *err. *text_bytes: the messages' text.
json_t *chat_template_input(const json_t *body, size_t *text_bytes, struct api_error *err);
// fields.c: the fields beyond sampling and the prompt. fields_parse checks
// the rejected ones and reads priority, request_id, cache_salt and
// truncate_prompt_tokens; fields_truncate applies the last once the prompt is
// tokenized; fields_chat_template gives the template source for a chat body
// (the request's, when trusted, or --chat-template's; NULL: the model's);
// fields_documents adds "documents" to the template's variables.
int fields_parse(struct server *s, const json_t *body, struct gen_params *gp, struct api_error *err);
void fields_truncate(const struct gen_params *gp, struct gen_prompt *pr);
// "echo" (completions): whether it is on, into gp->echo.
int fields_echo(const json_t *body, struct gen_params *gp, struct api_error *err);
// With echo on, a prompt's text into pr->echo once it is tokenized: text as
// sent (NULL: token ids), else detokenized.
int fields_echo_text(struct server *s, const struct gen_params *gp, const json_t *text, struct gen_prompt *pr,
                     struct api_error *err);
// "n" and "best_of", into gp->n.
int fields_n(const json_t *body, struct gen_params *gp, struct api_error *err);
int fields_chat_template(struct server *s, const json_t *body, const char **src, struct api_error *err);
int fields_documents(const json_t *body, json_t *template_vars, struct api_error *err);
// generation_config.json's sampling defaults (as vLLM applies them): into
// gp->sp before the request's own fields are read.
void fields_defaults(struct server *s, struct gen_params *gp);
void fields_free(struct gen_params *gp);
// Checks an optional "model" field against the served name (404 if unknown).
int check_model(struct server *s, const json_t *body, struct api_error *err);

// ---------------------------------------- structured output (guided.c) --

struct guided_req;
// The server's parsers (--tool-call-parser, --reasoning-parser) and grammar
// registry; an unknown parser name is an error.
int guided_init(struct server *s);
void guided_free(struct server *s);
// A chat / completions body's response_format, structured_outputs,
// guided_*, tools and tool_choice: compiles the grammar (400 naming the
// field and what it cannot do); gp->guided stays NULL when none applies.
int guided_parse(struct server *s, enum api_kind kind, const json_t *body, struct gen_params *gp,
                 struct api_error *err);
void guided_req_free(struct guided_req *q);
// Another choice's streaming parsers: q's settings and fresh state (tool
// call ids from another seed); no grammar or masks (q's constraint has them).
struct guided_req *guided_req_fork(const struct guided_req *q, int index);
// The request's vllm_constraint: 1 and *out set when it has a grammar.
int guided_constraint(struct guided_req *q, struct vllm_constraint *out);
// Whether the answer goes through the reasoning / tool-call parsers.
int guided_parses(const struct guided_req *q);
// Non-streaming: content, reasoning_content and tool_calls into msg; the
// finish_reason to report instead of the engine's, or NULL.
const char *guided_message(struct guided_req *q, const char *text, size_t len, vllm_finish_reason reason,
                           json_t *msg);
// Streaming: one event's text (fin: the last) into delta's fields; 1 when
// delta has any.
int guided_delta(struct guided_req *q, const char *text, size_t len, int fin, json_t *delta);
const char *guided_stream_finish(const struct guided_req *q, vllm_finish_reason reason);

// ------------------------------------------ prompt log-probs (prompt_logprobs.c) --

struct gen_choice;
struct prompt_lp;
// "prompt_logprobs", and echo with logprobs: gp->sp.prompt_logprobs (after
// echo, stream and logprobs are read).
int prompt_lp_parse(const json_t *body, struct gen_params *gp, struct api_error *err);
// The engine event that carries them (engine thread): into c->plp.
void prompt_lp_capture(struct gen_choice *c, const struct vllm_output *o);
void prompt_lp_free(struct prompt_lp *p);
// Echo: the choice's prompt tokens into a completions logprobs object (the
// first with nulls), advancing c->text_offset.
void prompt_lp_echo(struct gen_choice *c, json_t *logprobs);
// The "prompt_logprobs" list, when asked: into the chat response (once), or
// into the completions choice.
void prompt_lp_attach(struct gen_choice *c, json_t *response, json_t *choice);

// --------------------------------------------------------- generations --

// Engine events for one request not yet handled by the loop thread.
struct gen_events {
    char *text;
    size_t text_len, text_cap;
    char *stop_str;     // with done: the stop string that finished it (vLLM's stop_reason), or NULL
    int32_t stop_token; // with done: the stop token id that finished it, or -1
    int32_t *ids;
    float *lp;          // [n] sampled-token logprobs (when asked)
    int32_t *top_ids;   // [n * k]
    float *top_lp;      // [n * k]
    int n, cap, k;
    int num_prompt, num_output;
    int num_cached;     // prompt tokens the prefix cache held
    int done;           // the last event arrived
    vllm_finish_reason reason;
    int status;
    char error[256];
};

// One choice: the engine request of one sample of one prompt.
struct gen_choice {
    struct gen *g;
    int index;                       // prompt * n + sample
    int prompt;                      // into g->p.prompts
    struct vllm_request *vreq;       // NULL before it is submitted and once released
    int submitted, engine_done;
    int started;                     // streaming: its first chunk went out
    struct guided_req *parse;        // chat: its own parsers (a fork of g->p.guided: state, tool call ids), or NULL
    // non-streaming: the answer so far (the Responses API's text, streamed too)
    char *text;
    size_t text_len, text_cap;
    int32_t *ids;
    int num_ids, cap_ids;
    json_t *logprobs;
    size_t text_offset;              // completions logprobs: offset of the next token
    struct gen_events *last;         // the last event's (reason, stop_reason, counts); NULL before it
    struct prompt_lp *plp;           // the prompt's log-probs, once they arrived (written under srv->mu)
    int echoed;                      // streaming: the echo chunk went out
    // under srv->mu
    struct gen_events *pend, *work;  // engine side, loop side (swapped under mu)
    int queued;
    double t_first, t_last;
    int num_output;                  // tokens delivered by the engine
    int samples_finished, max_output; // sample 0's: its prompt's samples the engine finished, their most tokens
    struct gen_choice *qnext;
};

// One generation request, from its HTTP request to the last engine event of
// its last choice. It is freed once both sides are through: every choice's
// engine request ended (or never started) and the HTTP side is answered or
// gone (req == NULL).
struct gen {
    struct server *srv;
    struct gen_params p;
    struct evhttp_request *req;      // NULL once answered or the client left
    struct evhttp_connection *evcon;
    struct event *watch;             // non-streaming: notices a client that leaves
    struct gen_choice *ch;           // [num_choices]: p.num_prompts * p.n, by index
    int num_choices, num_done;
    int started;                     // streaming: headers sent
    char id[160];                    // "chatcmpl-" + request_id or 32 hex digits
    long long created;
    char msg_id[48];                 // /v1/responses: the output message's id
    int seq;                         // /v1/responses: the next event's sequence_number
    double t_arrival;
    // live list (loop thread)
    struct gen *prev, *next;
};

// /v1/responses (responses.c): the body as a chat request; the final
// response object; the typed stream events (start, text deltas, the end).
int responses_parse(struct server *s, const json_t *body, struct gen_params *gp, struct api_error *err);
// One choice (responses_parse asks for no more), whose text is ch[0].text.
json_t *responses_final(struct gen *g, const struct gen_events *ev);
void responses_stream_start(struct gen *g);
void responses_stream_events(struct gen *g, const struct gen_events *ev);
void responses_stream_done(struct gen *g, const struct gen_events *ev);

// Starts a generation for a parsed request (takes over gp), or answers the
// error. Called on the loop thread.
void gen_start(struct server *s, struct evhttp_request *req, struct gen_params *gp);
// The engine's stream callback (engine thread).
void gen_on_output(void *user, const struct vllm_output *o);
// Loop thread: handles the events queued since the last call.
void gen_handle_ready(struct server *s);
// Shutdown: cancels every request in flight.
void gen_cancel_all(struct server *s);
// Teardown: drops every engine request still held (before the engine is
// freed), then frees the gens left once the engine is gone.
void gen_release_all(struct server *s);
void gen_free_all(struct server *s);

// ---------------------------------------------------------- workers --

// Requests whose bodies are parsed (and tokenized) on a worker thread.
enum job_kind { JOB_TOKENIZE, JOB_DETOKENIZE, JOB_COMPLETION, JOB_CHAT, JOB_RESPONSES };
struct job;
// Loop thread: takes the request's body and answers when the job is done.
void work_submit(struct server *s, struct evhttp_request *req, enum job_kind kind);
int work_start(struct server *s);
void work_stop(struct server *s);

// ---------------------------------------------------------- clients --

// evhttp's bevcb: a client connection's bufferevent (conn.c).
struct bufferevent *client_new(struct event_base *base, void *server);
typedef void (*evhttp_close_cb)(struct evhttp_connection *, void *);
// The connection's close callback (conn.c owns evhttp's, and calls this one
// first); cb NULL clears it.
void client_set_closecb(struct server *s, struct evhttp_connection *evcon, evhttp_close_cb cb, void *arg);
// on_request, first: the request's read is over; evhttp reads no more of the
// socket (a FIN is no disconnect) until client_reply_done.
void client_request_read(struct server *s, struct evhttp_request *req);
void client_reply_done(struct server *s, struct evhttp_request *req);
// The listener's accept backoff at the fd limit.
void client_listener_setup(struct server *s);
// Teardown, after evhttp_free.
void client_free_all(struct server *s);
struct server *server_of_http(void *http);
// The reason phrase of an HTTP status.
const char *http_reason(int status);

// --------------------------------------------------------------- CORS --

struct str_list {
    char **v;
    int n, cap;
};
void str_list_free(struct str_list *l);
// Parses --allowed-origins / --allowed-methods / --allowed-headers.
int cors_init(struct server *s);
void cors_free(struct server *s);
// First in on_request: adds the CORS headers for an allowed Origin, and
// answers a preflight (then returns 1).
int cors_handle(struct server *s, struct evhttp_request *req);

// -------------------------------------------------------------- server --

struct server {
    struct server_config cfg; // strings owned
    struct vllm_engine *engine; // NULL while the model loads (server_set_engine)
    struct vllm_model_info info;
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    struct event *wake, *sig_int, *sig_term, *stop_timer;
    int port;
    int stopping;
    long long start_time;
    uint64_t id_state;
    char **piece_cache; // [vocab] token strings for logprobs, made on demand

    pthread_mutex_t mu;
    struct gen_choice *ready_head, *ready_tail;
    struct metrics m;

    struct gen_choice **batch; // gen_handle_ready's scratch
    int batch_cap;
    struct gen *live;   // every gen not yet freed
    int num_live;
    int num_sending;    // replies handed to libevent, not yet written
    int max_token_bytes; // the longest text one token decodes to (prompt length bound)

    // clients (conn.c; loop thread)
    struct client *clients, **client_hash; // every client; those by evhttp connection
    int num_clients, num_hashed, hash_cap;
    uint64_t framing_refused, request_timeouts, accept_errors, accept_errors_unlogged;
    double accept_logged_at;
    struct event *accept_timer;

    // workers (work.c): todo / done under work_mu
    pthread_mutex_t work_mu;
    pthread_cond_t work_cv;
    pthread_t workers[4];
    int num_workers, work_stop;
    struct job *todo, *todo_tail, *done;
    struct event *work_wake;
    int num_jobs; // submitted, not yet answered or dropped (loop thread)

    struct str_list cors_origins, cors_methods, cors_headers;
    // loading (server_set_engine): the loaded engine waits here, under mu,
    // until the loop thread adopts it
    struct vllm_engine *loaded;
    int load_status;     // != VLLM_OK: the load failed, the server exits
    int load_done;       // under mu
    struct event *loaded_ev;
    int fatal;           // under mu: a request failed with a device or internal error: /health is 503
    json_t *gen_defaults; // info.generation_defaults parsed (NULL: none)
    struct guided *guided; // guided.c
};

// Replies (loop thread). The body is JSON; send_json takes over `body`.
void send_json(struct server *s, struct evhttp_request *req, int status, json_t *body);
void send_error(struct server *s, struct evhttp_request *req, const struct api_error *err);
// Counts a reply as in flight until libevent has written it (or the
// connection closed), so that a stopping server exits only after its last
// answers went out. Call just before handing the reply to libevent.
void server_track_reply(struct server *s, struct evhttp_request *req);
// A JSON string of text that may hold invalid UTF-8 (replaced by U+FFFD).
json_t *json_text(const char *s, size_t n);
// The text of one token, for logprobs (cached).
const char *server_piece(struct server *s, int32_t id);
// A stopping server exits once no generation is left and its replies are out.
void server_maybe_exit(struct server *s);
// A fresh response id: prefix + 32 hex digits.
void server_new_id(struct server *s, const char *prefix, char *out, size_t cap);

#endif
