// serve.c - `vllm serve`: loads the model and runs the OpenAI-compatible
// HTTP server (src/server) until SIGINT / SIGTERM.
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
            "  --api-key KEY                require 'Authorization: Bearer KEY' on /v1/*\n"
            "  --served-model-name NAME     the model's name in the API (default: the --model path)\n"
            "  --max-queued N               waiting requests at most; more get 429 (default 0: no limit)\n"
            "  --max-body-bytes N           larger request bodies get 413 (default 32 MiB)\n"
            "  --timeout-s N                idle connections and stalled writes are closed (default 60)\n\n"
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

int cli_serve(int argc, char **argv) {
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.enable_prefix_caching = 1; // as in vLLM; --no-enable-prefix-caching turns it off
    struct server_config sc;
    server_config_default(&sc);
    const char *v;
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
        else if (!strcmp(f, "--served-model-name")) { VAL(); sc.served_model_name = v; }
        else if (!strcmp(f, "--max-queued")) { VAL(); if (cli_int(f, v, 0, 1 << 30, &ep.max_queued)) return 2; }
        else if (!strcmp(f, "--max-body-bytes")) { VAL(); if (cli_int(f, v, 1024, 1 << 30, &x)) return 2; sc.max_body_bytes = (size_t)x; }
        else if (!strcmp(f, "--timeout-s")) { VAL(); if (cli_int(f, v, 1, 86400, &sc.io_timeout_s)) return 2; }
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
    if (sc.api_key && !*sc.api_key) {
        fprintf(stderr, "vllm serve: --api-key is empty\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN); // a client that left is noticed by the server, not by a signal
    sc.model_path = ep.model;
    if (!sc.served_model_name) sc.served_model_name = ep.model;
    struct vllm_engine *e;
    if (load(&ep, &e)) return 1;
    struct server *s;
    if (server_create(e, &sc, &s)) {
        fprintf(stderr, "vllm serve: %s\n", vllm_last_error());
        return 1;
    }
    printf("vllm serve: serving %s on http://%s:%d (Ctrl-C to stop)\n", sc.served_model_name, sc.host,
           server_port(s));
    int rc = server_run(s);
    server_free(s);
    printf("vllm serve: stopped\n");
    return rc ? 1 : 0;
}
