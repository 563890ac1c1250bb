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
static const double req_bounds[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double tpot_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                     0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
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
    hist_init(&m->queue, req_bounds, NB(req_bounds));
    hist_init(&m->prefill, req_bounds, NB(req_bounds));
    hist_init(&m->decode, req_bounds, NB(req_bounds));
    hist_init(&m->inference, req_bounds, NB(req_bounds));
    hist_init(&m->tpot, tpot_bounds, NB(tpot_bounds));
    metrics_init_tokens(m, 1);
}

// vLLM's build_1_2_5_buckets(max_model_len).
void metrics_init_tokens(struct metrics *m, int max_model_len) {
    int n = 0;
    for (double p = 1; n < 30; p *= 10) {
        static const int mant[] = {1, 2, 5};
        for (int k = 0; k < 3 && n < 30 && mant[k] * p <= max_model_len; k++) m->token_bounds[n++] = mant[k] * p;
        if (p * 10 > max_model_len) break;
    }
    hist_init(&m->prompt_tokens, m->token_bounds, n);
    hist_init(&m->generation_tokens, m->token_bounds, n);
    hist_init(&m->max_generation_tokens, m->token_bounds, n);
    hist_init(&m->max_tokens_param, m->token_bounds, n);
}

void metrics_finished(struct metrics *m, const struct gen_choice *c, const struct vllm_output *o, int max_output) {
    hist_observe(&m->prompt_tokens, o->num_prompt_tokens);
    hist_observe(&m->generation_tokens, c->num_output);
    if (max_output >= 0) hist_observe(&m->max_generation_tokens, max_output);
    hist_observe(&m->max_tokens_param, c->g->p.prompts[c->prompt].max_tokens);
    if (o->queue_s > 0) hist_observe(&m->queue, o->queue_s);
    if (c->t_first == 0) return; // no token: no prefill or decode phase to time
    double prefill = MAX(o->ttft_s - o->queue_s, 0), decode = c->t_last - c->t_first;
    hist_observe(&m->prefill, prefill);
    hist_observe(&m->decode, decode);
    hist_observe(&m->inference, prefill + decode);
    if (c->num_output > 1) hist_observe(&m->tpot, decode / (c->num_output - 1));
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
    histogram(b, model, "vllm:request_queue_time_seconds", "Time from submit to the first admission.", &m.queue);
    histogram(b, model, "vllm:request_prefill_time_seconds", "Time from the first admission to the first token.",
              &m.prefill);
    histogram(b, model, "vllm:request_decode_time_seconds", "Time from the first token to the last.", &m.decode);
    histogram(b, model, "vllm:request_inference_time_seconds", "Time from the first admission to the last token.",
              &m.inference);
    histogram(b, model, "vllm:request_time_per_output_token_seconds", "Mean time per output token of a request.",
              &m.tpot);
    histogram(b, model, "vllm:request_prompt_tokens", "Prompt tokens of a finished request.", &m.prompt_tokens);
    histogram(b, model, "vllm:request_generation_tokens", "Generated tokens of a finished request.",
              &m.generation_tokens);
    histogram(b, model, "vllm:request_max_num_generation_tokens", "Generated tokens of a request's longest sequence.",
              &m.max_generation_tokens);
    histogram(b, model, "vllm:request_params_max_tokens", "The max_tokens of a finished request.", &m.max_tokens_param);
    struct hist it;
    static const double it_bounds[VLLM_NUM_ITERATION_BOUNDS] = VLLM_ITERATION_TOKEN_BOUNDS;
    hist_init(&it, it_bounds, VLLM_NUM_ITERATION_BOUNDS);
    for (int k = 0; k <= VLLM_NUM_ITERATION_BOUNDS; k++) it.counts[k] = st.iteration_tokens[k], it.count += it.counts[k];
    it.sum = (double)st.iteration_tokens_sum;
    histogram(b, model, "vllm:iteration_tokens_total", "Tokens scheduled per engine step.", &it);
    evbuffer_add_printf(b, "# HELP vllm:cache_config_info The KV cache's configuration.\n"
                           "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info");
    label(b, model);
    evbuffer_add_printf(b, ",block_size=\"%d\",num_gpu_blocks=\"%d\",enable_prefix_caching=\"%s\",num_state_slots=\"%d\"} 1\n",
                        s->info.block_size, s->info.num_kv_blocks, s->info.prefix_caching ? "True" : "False",
                        s->info.num_state_slots);
}
