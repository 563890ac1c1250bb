// metrics.c - GET /metrics: engine gauges and counters (vllm_engine_stats)
// and the server's latency histograms, in Prometheus text format 0.0.4,
// under vLLM's metric names where vLLM has one.
#include <event2/buffer.h>

#include "core/common.h"
#include "server/server_internal.h"

static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5, 0.75,
                                     1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160, 640, 2560};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                                    0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10,  20,   40,  80};
static const double e2e_bounds[] = {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0,  2.5,  5.0,  10,  15,
                                    20,   30,   40,  50,  60,  120, 240, 480, 960, 1920, 7680};
#define NB(a) ((int)(sizeof(a) / sizeof(a[0])))

void hist_init(struct hist *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n = n;
}

void hist_observe(struct hist *h, double v) {
    int i = 0;
    while (i < h->n && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->count++;
}

void metrics_init(struct metrics *m) {
    memset(m, 0, sizeof *m);
    hist_init(&m->ttft, ttft_bounds, NB(ttft_bounds));
    hist_init(&m->itl, itl_bounds, NB(itl_bounds));
    hist_init(&m->e2e, e2e_bounds, NB(e2e_bounds));
}

// The model name as a label value: \, " and newlines escaped.
static void label(struct evbuffer *b, const char *name) {
    evbuffer_add_printf(b, "{model_name=\"");
    for (const char *p = name; *p; p++) {
        if (*p == '\\' || *p == '"') evbuffer_add_printf(b, "\\%c", *p);
        else if (*p == '\n') evbuffer_add_printf(b, "\\n");
        else evbuffer_add(b, p, 1);
    }
    evbuffer_add_printf(b, "\"");
}

static void scalar(struct evbuffer *b, const char *model, const char *type, const char *name, const char *help,
                   double v) {
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s", name, help, name, type, name);
    label(b, model);
    evbuffer_add_printf(b, "} %.17g\n", v);
}

static void histogram(struct evbuffer *b, const char *model, const char *name, const char *help, const struct hist *h) {
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n; i++) {
        cum += h->counts[i];
        evbuffer_add_printf(b, "%s_bucket", name);
        label(b, model);
        if (i < h->n) evbuffer_add_printf(b, ",le=\"%g\"} %llu\n", h->bounds[i], (unsigned long long)cum);
        else evbuffer_add_printf(b, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    evbuffer_add_printf(b, "%s_sum", name);
    label(b, model);
    evbuffer_add_printf(b, "} %.17g\n%s_count", h->sum, name);
    label(b, model);
    evbuffer_add_printf(b, "} %llu\n", (unsigned long long)h->count);
}

void metrics_render(struct server *s, struct evbuffer *b) {
    struct vllm_stats st;
    vllm_engine_stats(s->engine, &st);
    pthread_mutex_lock(&s->mu);
    struct metrics m = s->m;
    pthread_mutex_unlock(&s->mu);
    const char *model = s->cfg.served_model_name;
    scalar(b, model, "gauge", "vllm:num_requests_running", "Requests running on the engine.", st.num_running);
    scalar(b, model, "gauge", "vllm:num_requests_waiting", "Requests waiting to be scheduled.", st.num_waiting);
    scalar(b, model, "gauge", "vllm:kv_cache_blocks_used", "KV cache blocks in use.", st.kv_blocks_used);
    scalar(b, model, "gauge", "vllm:kv_cache_blocks_total", "KV cache blocks in the pool.", st.kv_blocks_total);
    scalar(b, model, "gauge", "vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = 100%).",
           st.kv_blocks_total ? (double)st.kv_blocks_used / st.kv_blocks_total : 0);
    scalar(b, model, "gauge", "vllm:state_slots_used", "Recurrent-state slots in use.", st.state_slots_used);
    scalar(b, model, "gauge", "vllm:state_slots_total", "Recurrent-state slots in the pool.", st.state_slots_total);
    scalar(b, model, "counter", "vllm:prompt_tokens_total", "Prompt tokens processed (recompute included).",
           (double)st.prompt_tokens_total);
    scalar(b, model, "counter", "vllm:generation_tokens_total", "Tokens generated.", (double)st.generation_tokens_total);
    scalar(b, model, "counter", "vllm:num_preemptions_total", "Requests preempted (recomputed later).",
           (double)st.num_preemptions);
    scalar(b, model, "counter", "vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
           (double)st.prefix_cache_queries);
    scalar(b, model, "counter", "vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
           (double)st.prefix_cache_hits);
    scalar(b, model, "gauge", "vllm:state_checkpoints_used", "Recurrent-state checkpoints held or cached.",
           st.state_checkpoints_used);
    scalar(b, model, "gauge", "vllm:state_checkpoints_total", "Recurrent-state checkpoints in the pool.",
           st.state_checkpoints_total);
    static const char *const reasons[4] = {"stop", "length", "abort", "error"};
    evbuffer_add_printf(b, "# HELP vllm:request_success_total Requests finished, by finish reason.\n"
                           "# TYPE vllm:request_success_total counter\n");
    for (int i = 0; i < 4; i++) {
        evbuffer_add_printf(b, "vllm:request_success_total");
        label(b, model);
        evbuffer_add_printf(b, ",finished_reason=\"%s\"} %llu\n", reasons[i], (unsigned long long)m.finished[i]);
    }
    // the HTTP side: what is open and in flight (0 and 1 on an idle server
    // polled by one client), and what was refused
    scalar(b, model, "gauge", "vllm:http_connections_open", "Client connections open.", s->num_clients);
    scalar(b, model, "gauge", "vllm:http_requests_in_flight", "Generation requests not yet answered.", s->num_live);
    scalar(b, model, "gauge", "vllm:http_jobs_in_flight", "Request bodies being parsed or tokenized.", s->num_jobs);
    scalar(b, model, "gauge", "vllm:http_replies_sending", "Replies not yet written out.", s->num_sending);
    scalar(b, model, "counter", "vllm:http_framing_refused_total",
           "Requests refused for ambiguous framing (RFC 9112), before they were read.", (double)s->framing_refused);
    scalar(b, model, "counter", "vllm:http_request_timeouts_total",
           "Requests not read whole within --timeout-s (408).", (double)s->request_timeouts);
    scalar(b, model, "counter", "vllm:http_accept_errors_total", "accept() failures (e.g. at the fd limit).",
           (double)s->accept_errors);
    histogram(b, model, "vllm:time_to_first_token_seconds", "Time from the HTTP request to its first token.", &m.ttft);
    histogram(b, model, "vllm:inter_token_latency_seconds", "Time between successive tokens of a request.", &m.itl);
    histogram(b, model, "vllm:e2e_request_latency_seconds", "Time from the HTTP request to its last token.", &m.e2e);
}
