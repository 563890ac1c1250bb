// serve.c - `vllm serve`: loads the model and runs the OpenAI-compatible
// HTTP server (src/server) until SIGINT / SIGTERM.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "core/common.h"
#include "server/server.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: vllm serve --model DIR [options]\n\n"
            "OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models,\n"
            "/tokenize, /detokenize, /health, /version, /metrics.\n\n"
            "  --host ADDR                  address to listen on (default 127.0.0.1)\n"
            "  --port N                     port (default 8000; 0: any free port)\n"
            "  --api-key-file PATH          require 'Authorization: Bearer KEY' on every route but\n"
            "                               /health, /ping and /version; KEY is the file's first line\n"
            "                               (also: $VLLM_API_KEY, or --api-key KEY, which ps shows)\n"
            "  --metrics-no-auth            /metrics without the key\n"
            "  --served-model-name NAME     the model's name in the API (default: the --model directory's\n"
            "                               name; the path is accepted as \"model\" too)\n"
            "  --max-queued N               waiting requests at most; more get 429 (default 0: no limit)\n"
            "  --max-body-bytes N           larger request bodies get 413 (default 32 MiB)\n"
            "  --timeout-s N                idle connections, stalled writes and requests not read whole\n"
            "                               in N s are closed (default 60)\n"
            "  --scheduling-policy P        fcfs (default) or priority: requests' \"priority\" field orders\n"
            "                               the waiting queue (lower first) and the least urgent is preempted first\n"
            "  --chat-template T            a template file, or the Jinja source itself, for every chat request\n"
            "  --trust-request-chat-template  let requests send their own \"chat_template\"\n"
            "  --allowed-origins JSON       CORS: allowed origins (default [\"*\"])\n"
            "  --allowed-methods JSON       CORS: allowed methods (default [\"*\"])\n"
            "  --allowed-headers JSON       CORS: allowed headers (default [\"*\"])\n"
            "  --allow-credentials          CORS: allow credentials (the origin is echoed, not \"*\")\n"
            "  --tool-call-parser NAME      hermes, qwen3_coder or llama3_json: tool_calls from the text\n"
            "  --enable-auto-tool-choice    parse tool calls under tool_choice \"auto\" (needs the parser)\n"
            "  --reasoning-parser NAME      deepseek_r1, qwen3 or nemotron_v3: reasoning_content\n\n"
            "engine:\n%s",
            cli_engine_help);
}

// Prints the elapsed time while a large model loads.
struct load_ticker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
};

static void *ticker_main(void *arg) {
    struct load_ticker *t = arg;
    double t0 = now_s();
    pthread_mutex_lock(&t->mu);
    while (!t->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 5;
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        if (!t->done) printf("vllm serve: still loading (%.0f s)\n", now_s() - t0);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static int load(const struct vllm_engine_params *ep, struct vllm_engine **e) {
    printf("vllm serve: loading %s (device %s, dtype %s)\n", ep->model, ep->device, ep->dtype);
    struct load_ticker t = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    pthread_t th;
    pthread_create(&th, NULL, ticker_main, &t);
    double t0 = now_s();
    int rc = vllm_engine_load(ep, e);
    double dt = now_s() - t0;
    pthread_mutex_lock(&t.mu);
    t.done = 1;
    pthread_cond_signal(&t.cv);
    pthread_mutex_unlock(&t.mu);
    pthread_join(th, NULL);
    if (rc) {
        fprintf(stderr, "vllm serve: %s\n", vllm_last_error());
        return rc;
    }
    struct vllm_model_info in;
    vllm_engine_info(*e, &in);
    printf("vllm serve: model %s (%s), vocab %d, max_model_len %d, weights %.1f MB, loaded in %.2f s\n",
           in.model_name, in.architecture, in.vocab_size, in.max_model_len, in.weight_bytes / 1e6, dt);
    printf("vllm serve: KV cache %d blocks x %d tokens (%lld tokens, %.1f MB), %d state slots (%.1f MB)\n",
           in.num_kv_blocks, in.block_size, (long long)in.num_kv_blocks * in.block_size, in.kv_cache_bytes / 1e6,
           in.num_state_slots, in.state_bytes / 1e6);
    if (in.prefix_caching)
        printf("vllm serve: prefix caching on, %d state checkpoints every %d tokens (%.1f MB)\n",
               in.num_state_checkpoints, in.state_checkpoint_interval, in.checkpoint_bytes / 1e6);
    printf("vllm serve: tokenizer %s, chat template %s\n", in.has_tokenizer ? "yes" : "no (token-id prompts only)",
           in.has_chat_template ? "yes" : "no (no /v1/chat/completions)");
    return VLLM_OK;
}

// The model loads on its own thread while the server already answers
// (/health 503, every model route 503), as vLLM's API server does.
struct loader {
    const struct vllm_engine_params *ep;
    struct server *srv;
};

static void *loader_main(void *arg) {
    struct loader *l = arg;
    struct vllm_engine *e = NULL;
    // docs/ENVIRONMENT.md: a test holds the load back to see the server answer meanwhile
    const char *delay = getenv("VLLM_TEST_LOAD_DELAY_MS");
    if (delay) usleep((useconds_t)atoi(delay) * 1000);
    int rc = load(l->ep, &e);
    server_set_engine(l->srv, rc ? NULL : e, rc);
    return NULL;
}

// An API key: printable ASCII, no spaces (it is compared with what follows
// "Bearer " in the Authorization header).
static int key_ok(const char *k, const char *from) {
    int ok = *k != 0;
    for (const char *p = k; *p && ok; p++) ok = *p > 0x20 && *p < 0x7f;
    if (!ok) fprintf(stderr, "vllm serve: the API key from %s is empty or holds spaces or non-ASCII bytes\n", from);
    return ok;
}

// The key from --api-key-file: its first line.
static char *key_from_file(const char *path) {
    char *data = NULL;
    if (read_file(path, &data, NULL)) {
        fprintf(stderr, "vllm serve: --api-key-file: %s\n", vllm_last_error());
        return NULL;
    }
    data[strcspn(data, "\r\n")] = 0;
    if (!key_ok(data, path)) {
        free(data);
        return NULL;
    }
    return data;
}

// --chat-template FILE_OR_STRING, as vLLM takes it: a file's contents, or
// the template itself when no such file exists and it looks like Jinja.
static char *template_source(const char *arg) {
    char *data = NULL;
    if (file_exists(arg)) {
        if (!read_file(arg, &data, NULL)) return data;
        fprintf(stderr, "vllm serve: --chat-template: %s\n", vllm_last_error());
        return NULL;
    }
    if (strpbrk(arg, "{}\n")) return xstrdup(arg);
    fprintf(stderr, "vllm serve: --chat-template: no such file '%s' (and it is no Jinja template)\n", arg);
    return NULL;
}

// The directory's name: what clients send as "model" by default.
static char *default_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    char *name = xmalloc(n - b + 1);
    memcpy(name, path + b, n - b);
    name[n - b] = 0;
    return name;
}

int cli_serve(int argc, char **argv) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.enable_prefix_caching = 1; // as in vLLM; --no-enable-prefix-caching turns it off
    struct server_config sc;
    server_config_default(&sc);
    const char *v, *key_file = NULL, *chat_template = NULL;
    int x;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int r = cli_engine_flag(argc, argv, &i, &ep);
        if (r < 0) return 2;
        if (r) continue;
#define VAL() if (!(v = cli_value(argc, argv, &i))) return 2
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return usage(stdout), 0;
        else if (!strcmp(f, "--host")) { VAL(); sc.host = v; }
        else if (!strcmp(f, "--port")) { VAL(); if (cli_int(f, v, 0, 65535, &sc.port)) return 2; }
        else if (!strcmp(f, "--api-key")) { VAL(); sc.api_key = v; }
        else if (!strcmp(f, "--api-key-file")) { VAL(); key_file = v; }
        else if (!strcmp(f, "--metrics-no-auth")) sc.metrics_no_auth = 1;
        else if (!strcmp(f, "--served-model-name")) { VAL(); sc.served_model_name = v; }
        else if (!strcmp(f, "--max-queued")) { VAL(); if (cli_int(f, v, 0, 1 << 30, &ep.max_queued)) return 2; }
        else if (!strcmp(f, "--max-body-bytes")) { VAL(); if (cli_int(f, v, 1024, 1 << 30, &x)) return 2; sc.max_body_bytes = (size_t)x; }
        else if (!strcmp(f, "--timeout-s")) { VAL(); if (cli_int(f, v, 1, 86400, &sc.io_timeout_s)) return 2; }
        else if (!strcmp(f, "--scheduling-policy")) {
            VAL();
            if (strcmp(v, "fcfs") && strcmp(v, "priority")) {
                fprintf(stderr, "vllm serve: --scheduling-policy must be fcfs or priority, got '%s'\n", v);
                return 2;
            }
            ep.scheduling_policy = v;
            sc.priority_scheduling = !strcmp(v, "priority");
        }
        else if (!strcmp(f, "--chat-template")) { VAL(); chat_template = v; }
        else if (!strcmp(f, "--trust-request-chat-template")) sc.trust_request_chat_template = 1;
        else if (!strcmp(f, "--allowed-origins")) { VAL(); sc.allowed_origins = v; }
        else if (!strcmp(f, "--allowed-methods")) { VAL(); sc.allowed_methods = v; }
        else if (!strcmp(f, "--allowed-headers")) { VAL(); sc.allowed_headers = v; }
        else if (!strcmp(f, "--allow-credentials")) sc.allow_credentials = 1;
        else if (!strcmp(f, "--tool-call-parser")) { VAL(); sc.tool_call_parser = v; }
        else if (!strcmp(f, "--enable-auto-tool-choice")) sc.enable_auto_tool_choice = 1;
        else if (!strcmp(f, "--reasoning-parser")) { VAL(); sc.reasoning_parser = v; }
        else {
            fprintf(stderr, "vllm serve: unknown option '%s'\n", f);
            usage(stderr);
            return 2;
        }
#undef VAL
    }
    if (!ep.model) {
        usage(stderr);
        return 2;
    }
    char *key = NULL, *name = NULL, *tmpl = NULL;
    if (chat_template && !(sc.chat_template = tmpl = template_source(chat_template))) return 2;
    const char *env = getenv("VLLM_API_KEY");
    if (sc.api_key) {
        if (!key_ok(sc.api_key, "--api-key")) return 2;
        fprintf(stderr, "vllm serve: note: --api-key shows in the process list; --api-key-file or VLLM_API_KEY "
                        "do not\n");
    } else if (key_file) {
        if (!(key = key_from_file(key_file))) return 2;
        sc.api_key = key;
    } else if (env && *env) {
        if (!key_ok(env, "VLLM_API_KEY")) return 2;
        sc.api_key = env;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    // Request bodies of up to --max-body-bytes come and go: blocks of 1 MiB
    // and more are mmapped, so that they go back to the system when freed
    // (glibc's default threshold rises past a 30 MB block once one was
    // freed, and a worker thread's arena then keeps the next one resident).
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_TRIM_THRESHOLD, 4 << 20);
    signal(SIGPIPE, SIG_IGN); // a client that left is noticed by the server, not by a signal
    sc.model_path = ep.model;
    if (!sc.served_model_name) sc.served_model_name = name = default_name(ep.model);
    struct server *s = NULL;
    int rc = server_create(NULL, &sc, &s);
    if (rc) {
        fprintf(stderr, "vllm serve: %s\n", vllm_last_error());
        free(key), free(name), free(tmpl);
        return 1;
    }
    printf("vllm serve: listening on %s port %d; /health is 503 until the model is loaded\n", sc.host, server_port(s));
    struct loader l = {&ep, s};
    pthread_t th;
    if (pthread_create(&th, NULL, loader_main, &l)) {
        fprintf(stderr, "vllm serve: cannot start the loading thread\n");
        server_free(s);
        free(key), free(name), free(tmpl);
        return 1;
    }
    rc = server_run(s);
    pthread_join(th, NULL); // a signal during the load waits for it: it cannot be interrupted
    server_free(s);
    free(key), free(name), free(tmpl);
    printf("vllm serve: stopped\n");
    return rc ? 1 : 0;
}
