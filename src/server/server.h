// server.h - `vllm serve`: an OpenAI-compatible HTTP server over one engine.
//
// One libevent loop thread does all HTTP I/O; request bodies are parsed and
// tokenized on worker threads (work.c); the engine runs on its own thread
// and hands its streaming events to the loop through a locked queue
// (server_internal.h), so HTTP never blocks an engine step and no body
// blocks the loop.
#ifndef VLLM_SERVER_SERVER_H
#define VLLM_SERVER_SERVER_H

#include <stddef.h>

#include "vllm.h"

struct server_config {
    const char *host;              // default "127.0.0.1"
    int port;                      // 0: any free port (server_port tells which)
    const char *api_key;           // NULL: no authentication; else every route but /health, /ping, /version
    int metrics_no_auth;           // /metrics without the key too
    const char *served_model_name; // the name clients send as "model", and the one answers carry
    const char *const *model_aliases; // more names clients may send (--served-model-name A B ...)
    int num_model_aliases;
    const char *model_path;        // shown as "root" in /v1/models
    size_t max_body_bytes;         // larger request bodies get 413
    int io_timeout_s;              // idle connections, stalled writes, and a request's whole read
    int priority_scheduling;       // --scheduling-policy priority: requests may set "priority"
    const char *chat_template;     // --chat-template: Jinja source for every chat request (NULL: the model's)
    int trust_request_chat_template; // a request's own "chat_template" is allowed
    // CORS (cors.c): JSON lists (NULL: ["*"]), as vLLM's flags take them
    const char *allowed_origins, *allowed_methods, *allowed_headers;
    int allow_credentials;
    const char *tool_call_parser;  // NULL: none; "hermes", "qwen3_coder" or "llama3_json"
    int enable_auto_tool_choice;   // parse tool calls under tool_choice "auto" (needs the parser)
    const char *reasoning_parser;  // NULL: none; "deepseek_r1", "qwen3" or "nemotron_v3"
};
void server_config_default(struct server_config *c);

struct server;

// Binds the listening socket. Takes ownership of the engine (freed by
// server_free), also on failure. e may be NULL: the model is still loading
// (on another thread), /health answers 503 and every model route 503 until
// server_set_engine hands it over.
int server_create(struct vllm_engine *e, const struct server_config *cfg, struct server **out);
// From the loading thread: the engine (taken over), or the load's failure
// status (the server then stops, and server_run returns it).
void server_set_engine(struct server *s, struct vllm_engine *e, int status);
int server_port(const struct server *s);
// Serves until SIGINT / SIGTERM, then stops accepting, aborts what is in
// flight and returns VLLM_OK (or the status of a failed load).
int server_run(struct server *s);
void server_free(struct server *s);

#endif
