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
            "usage: vllm serve MODEL_DIR [options]   (or --model MODEL_DIR; --flag=value works too)\n\n"
            "OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions, /v1/models,\n"
            "/tokenize, /detokenize, /health, /ping, /load, /version, /metrics (docs/SERVING.md).\n\n"
            "frontend:\n"
            "  --host ADDR                  address to listen on (default 127.0.0.1)\n"
            "  --port N                     port (default 8000; 0: any free port)\n"
            "  --api-key-file PATH          require 'Authorization: Bearer KEY' on every route but\n"
            "                               /health, /ping and /version; KEY is the file's first line\n"
            "                               (also: $VLLM_API_KEY, or --api-key KEY, which ps shows)\n"
            "  --metrics-no-auth            /metrics without the key\n"
            "  --served-model-name NAME [ALIAS ...]  the model's name in the API (default: the model\n"
            "                               directory's name; the aliases and the path are accepted too)\n"
            "  --chat-template T            a template file, or the Jinja source itself, for every chat request\n"
            "  --generation-config G        auto (default): the model's generation_config.json sets the defaults\n"
            "                               of temperature, top_p, top_k, min_p, repetition_penalty, max_tokens\n"
            "                               and adds its eos ids; vllm: ignore it; or a directory holding one\n"
            "  --trust-request-chat-template  let requests send their own \"chat_template\"\n"
            "  --allowed-origins JSON       CORS: allowed origins (default [\"*\"])\n"
            "  --allowed-methods JSON       CORS: allowed methods (default [\"*\"])\n"
            "  --allowed-headers JSON       CORS: allowed headers (default [\"*\"])\n"
            "  --allow-credentials          CORS: allow credentials (the origin is echoed, not \"*\")\n"
            "  --max-body-bytes N           larger request bodies get 413 (default 32 MiB)\n"
            "  --timeout-s N                idle connections, stalled writes and requests not read whole\n"
            "                               in N s are closed (default 60)\n"
            "  --tool-call-parser NAME      hermes, qwen3_coder or llama3_json: tool_calls from the text\n"
            "  --enable-auto-tool-choice    parse tool calls under tool_choice \"auto\" (needs the parser)\n"
            "  --reasoning-parser NAME      deepseek_r1, qwen3 or nemotron_v3: reasoning_content\n\n"
            "scheduler:\n"
            "  --scheduling-policy P        fcfs (default) or priority: requests' \"priority\" field orders\n"
            "                               the waiting queue (lower first); the least urgent is preempted first\n"
            "  --max-queued N               waiting requests at most; more get 429 (default 0: no limit)\n\n"
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
    printf("vllm serve: KV cache %s, %d blocks x %d tokens (%lld tokens, %.1f MB), %d state slots (%.1f MB)\n",
           in.kv_cache_dtype, in.num_kv_blocks, in.block_size, (long long)in.num_kv_blocks * in.block_size, in.kv_cache_bytes / 1e6,
           in.num_state_slots, in.state_bytes / 1e6);
    if (in.prefix_caching)
        printf("vllm serve: prefix caching on, %d state checkpoints every %d tokens (%.1f MB)\n",
               in.num_state_checkpoints, in.state_checkpoint_interval, in.checkpoint_bytes / 1e6);
    if (in.generation_defaults && strcmp(in.generation_defaults, "{}"))
        printf("vllm serve: sampling defaults from generation_config.json: %s\n", in.generation_defaults);
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

// vLLM flags accepted for compatibility that change nothing here (listed in
// --help), and those it has that vllm.c does not implement (a startup error
// saying why, as any unknown flag is one).
static const struct {
    const char *flag;
    int takes_value;
    const char *note;
} noop_flags[] = {
    {"--disable-log-requests", 0, "requests are not logged"},
    {"--enable-log-requests", 0, "requests are not logged"},
    {"--disable-log-stats", 0, "no periodic stats log; see /metrics"},
    {"--uvicorn-log-level", 1, "there is no uvicorn"},
    {"--disable-uvicorn-access-log", 0, "there is no uvicorn"},
    {"--disable-fastapi-docs", 0, "there are no /docs"},
    {"--max-log-len", 1, "requests are not logged"},
    {"--trust-remote-code", 0, "no model code is downloaded or run"},
    {"--download-dir", 1, "models are local directories"},
    {"--swap-space", 1, "preemption recomputes; nothing is swapped"},
    {"--enable-chunked-prefill", 0, "prefill is always chunked"},
    {"--enable-server-load-tracking", 0, "/load always counts"},
    {"--disable-frontend-multiprocessing", 0, "one process"},
};
static const struct {
    const char *flag;
    const char *why;
} unsupported_flags[] = {
    {"--enforce-eager", "not implemented: CUDA graphs are always used (VLLM_NO_GRAPHS=1 turns them off)"},
    {"--lora-modules", "LoRA is not supported"},
    {"--enable-lora", "LoRA is not supported"},
    {"--pipeline-parallel-size", "pipeline parallelism is not supported"},
    {"--ssl-keyfile", "TLS is not supported: put a proxy in front"},
    {"--ssl-certfile", "TLS is not supported: put a proxy in front"},
    {"--root-path", "not supported"},
    {"--middleware", "not supported"},
    {"--tokenizer", "the tokenizer is the model directory's tokenizer.json"},
    {"--revision", "models are local directories"},
};

static void usage_noops(FILE *f) {
    fprintf(f, "\naccepted for vLLM compatibility, no-ops:\n");
    for (size_t i = 0; i < sizeof noop_flags / sizeof noop_flags[0]; i++)
        fprintf(f, "  %-28s %s\n", noop_flags[i].flag, noop_flags[i].note);
}

struct serve_opts {
    struct vllm_engine_params ep;
    struct server_config sc;
    const char *key_file, *chat_template;
    const char *aliases[16];
    char **argv; // split_equals's, kept (and so reachable) until exit
};

// A serve flag (not an engine one): 1 if consumed, 0 if unknown, -1 on a bad value.
static int serve_flag(int argc, char **argv, int *i, struct serve_opts *o) {
    const char *f = argv[*i], *v;
    struct server_config *sc = &o->sc;
    int x;
#define VAL() if (!(v = cli_value(argc, argv, i))) return -1
    if (!strcmp(f, "--host")) { VAL(); sc->host = v; }
    else if (!strcmp(f, "--port")) { VAL(); if (cli_int(f, v, 0, 65535, &sc->port)) return -1; }
    else if (!strcmp(f, "--api-key")) { VAL(); sc->api_key = v; }
    else if (!strcmp(f, "--api-key-file")) { VAL(); o->key_file = v; }
    else if (!strcmp(f, "--metrics-no-auth")) sc->metrics_no_auth = 1;
    else if (!strcmp(f, "--served-model-name")) { // NAME [ALIAS ...], as vLLM's nargs="+"
        VAL();
        sc->served_model_name = v;
        sc->num_model_aliases = 0;
        while (*i + 1 < argc && argv[*i + 1][0] != '-') {
            if (sc->num_model_aliases == 16) {
                fprintf(stderr, "vllm serve: --served-model-name: at most 17 names\n");
                return -1;
            }
            o->aliases[sc->num_model_aliases++] = argv[++*i];
        }
        sc->model_aliases = o->aliases;
    }
    else if (!strcmp(f, "--max-queued")) { VAL(); if (cli_int(f, v, 0, 1 << 30, &o->ep.max_queued)) return -1; }
    else if (!strcmp(f, "--max-body-bytes")) { VAL(); if (cli_int(f, v, 1024, 1 << 30, &x)) return -1; sc->max_body_bytes = (size_t)x; }
    else if (!strcmp(f, "--timeout-s")) { VAL(); if (cli_int(f, v, 1, 86400, &sc->io_timeout_s)) return -1; }
    else if (!strcmp(f, "--scheduling-policy")) {
        VAL();
        if (strcmp(v, "fcfs") && strcmp(v, "priority")) {
            fprintf(stderr, "vllm serve: --scheduling-policy must be fcfs or priority, got '%s'\n", v);
            return -1;
        }
        o->ep.scheduling_policy = v;
        sc->priority_scheduling = !strcmp(v, "priority");
    }
    else if (!strcmp(f, "--chat-template")) { VAL(); o->chat_template = v; }
    else if (!strcmp(f, "--generation-config")) { VAL(); o->ep.generation_config = v; }
    else if (!strcmp(f, "--trust-request-chat-template")) sc->trust_request_chat_template = 1;
    else if (!strcmp(f, "--allowed-origins")) { VAL(); sc->allowed_origins = v; }
    else if (!strcmp(f, "--allowed-methods")) { VAL(); sc->allowed_methods = v; }
    else if (!strcmp(f, "--allowed-headers")) { VAL(); sc->allowed_headers = v; }
    else if (!strcmp(f, "--allow-credentials")) sc->allow_credentials = 1;
    else if (!strcmp(f, "--tool-call-parser")) { VAL(); sc->tool_call_parser = v; }
    else if (!strcmp(f, "--enable-auto-tool-choice")) sc->enable_auto_tool_choice = 1;
    else if (!strcmp(f, "--reasoning-parser")) { VAL(); sc->reasoning_parser = v; }
    else {
        for (size_t k = 0; k < sizeof noop_flags / sizeof noop_flags[0]; k++)
            if (!strcmp(f, noop_flags[k].flag)) {
                if (noop_flags[k].takes_value) VAL();
                return 1;
            }
        return 0;
    }
#undef VAL
    return 1;
}

// argv with "--flag=value" split in two, as argparse takes both forms
// (malloc'd array; the strings are argv's or malloc'd, all freed by the OS).
static char **split_equals(int argc, char **argv, int *out_argc) {
    char **a = xcalloc((size_t)argc * 2 + 1, sizeof(char *));
    int n = 0;
    for (int i = 0; i < argc; i++) {
        char *eq = argv[i][0] == '-' && argv[i][1] == '-' ? strchr(argv[i], '=') : NULL;
        if (!eq) {
            a[n++] = argv[i];
            continue;
        }
        a[n] = xmalloc((size_t)(eq - argv[i]) + 1);
        memcpy(a[n], argv[i], (size_t)(eq - argv[i]));
        a[n++][eq - argv[i]] = 0;
        a[n++] = eq + 1;
    }
    *out_argc = n;
    return a;
}

// 0 to serve, else the exit status (after --help, 0; after an error, 2).
static int parse_args(int argc, char **argv, struct serve_opts *o, int *exit_code) {
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout), usage_noops(stdout);
            return *exit_code = 0, 1;
        }
        if (f[0] != '-') { // vllm serve MODEL
            if (o->ep.model && strcmp(o->ep.model, f)) {
                fprintf(stderr, "vllm serve: two models given: '%s' and '%s'\n", o->ep.model, f);
                return *exit_code = 2, 1;
            }
            o->ep.model = f;
            continue;
        }
        int r = cli_engine_flag(argc, argv, &i, &o->ep);
        if (!r) r = serve_flag(argc, argv, &i, o);
        if (r > 0) continue;
        if (r == 0) {
            const char *why = NULL;
            for (size_t k = 0; k < sizeof unsupported_flags / sizeof unsupported_flags[0]; k++)
                if (!strcmp(f, unsupported_flags[k].flag)) why = unsupported_flags[k].why;
            if (why) fprintf(stderr, "vllm serve: %s is not supported: %s\n", f, why);
            else fprintf(stderr, "vllm serve: unknown option '%s' (vllm serve --help lists the options)\n", f);
        }
        return *exit_code = 2, 1;
    }
    return 0;
}

int cli_serve(int argc0, char **argv0) {
    static struct serve_opts o; // aliases point into it until the server copies them
    memset(&o, 0, sizeof o);
    vllm_engine_params_default(&o.ep);
    o.ep.enable_prefix_caching = 1; // as in vLLM; --no-enable-prefix-caching turns it off
    server_config_default(&o.sc);
    int argc, code;
    char **argv = o.argv = split_equals(argc0, argv0, &argc);
    if (parse_args(argc, argv, &o, &code)) return code;
    struct vllm_engine_params ep = o.ep;
    cli_device_memory_default(&ep);
    struct server_config sc = o.sc;
    const char *key_file = o.key_file, *chat_template = o.chat_template;
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
