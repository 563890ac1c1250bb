// test_server_metrics.c - the series vLLM's Grafana dashboard queries
// (examples/online_serving/prometheus_grafana/grafana.json, the metric
// names its PromQL reads, listed below) exist in /metrics, each with the
// model_name label, and move under load: counters and histograms grow,
// gauges leave 0 while requests run, cache_config_info is 1.
// usage: test_server_metrics VLLM_BINARY MODEL_DIR
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "server/harness.h"
#include "test.h"

enum kind { COUNTER, HISTOGRAM, GAUGE, INFO };
static const struct {
    const char *name;
    enum kind kind;
} dashboard[] = {
    {"vllm:num_requests_running", GAUGE},
    {"vllm:num_requests_waiting", GAUGE},
    {"vllm:kv_cache_usage_perc", GAUGE},
    {"vllm:prompt_tokens_total", COUNTER},
    {"vllm:generation_tokens_total", COUNTER},
    {"vllm:request_success_total", COUNTER},
    {"vllm:num_preemptions_total", COUNTER},
    {"vllm:time_to_first_token_seconds", HISTOGRAM},
    {"vllm:inter_token_latency_seconds", HISTOGRAM},
    {"vllm:e2e_request_latency_seconds", HISTOGRAM},
    {"vllm:request_prompt_tokens", HISTOGRAM},
    {"vllm:request_generation_tokens", HISTOGRAM},
    {"vllm:request_max_num_generation_tokens", HISTOGRAM},
    {"vllm:request_params_max_tokens", HISTOGRAM},
    {"vllm:request_queue_time_seconds", HISTOGRAM},
    {"vllm:request_prefill_time_seconds", HISTOGRAM},
    {"vllm:request_decode_time_seconds", HISTOGRAM},
    {"vllm:request_inference_time_seconds", HISTOGRAM},
    {"vllm:request_time_per_output_token_seconds", HISTOGRAM},
    {"vllm:iteration_tokens_total", HISTOGRAM},
    {"vllm:cache_config_info", INFO},
};
#define NUM_DASH (sizeof dashboard / sizeof dashboard[0])

static const char *label = "model_name=\"tiny\"";

static double value(const char *text, const char *name, enum kind k) {
    char key[160];
    snprintf(key, sizeof key, "%s%s", name, k == HISTOGRAM ? "_count" : "");
    // the series of requests that ended at max_tokens (all of them here)
    const char *l = !strcmp(name, "vllm:request_success_total") ? "model_name=\"tiny\",finished_reason=\"length\"" : label;
    return metric_value(text, key, l);
}

// Sends a request on its own connection; its answer is read later.
static int send_raw(struct conn *c, int port, const char *body) {
    char req[512];
    int n = snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    return conn_open(c, port, 60) || conn_send(c, req, n);
}

static void sample_gauges(const char *m, double *max_gauge) {
    for (size_t i = 0; m && i < NUM_DASH; i++)
        if (dashboard[i].kind == GAUGE) max_gauge[i] = fmax(max_gauge[i], value(m, dashboard[i].name, GAUGE));
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s VLLM_BINARY MODEL_DIR\n", argv[0]);
        return 2;
    }
    // two sequences and few KV blocks: a third request waits, a long one is preempted
    const char *extra[] = {"--served-model-name", "tiny", "--max-num-seqs", "2", "--max-model-len", "640",
                           "--num-blocks", "40", NULL};
    struct srv s;
    srv_start(&s, argv[1], argv[2], extra);
    char *before = http_metrics(s.port);
    CHECK(before != NULL);
    for (size_t i = 0; before && i < NUM_DASH; i++)
        CHECKF(!isnan(value(before, dashboard[i].name, dashboard[i].kind)), "%s (with %s) is missing",
               dashboard[i].name, label);
    // Load: a and b (500 tokens each) run, and together outgrow the 40
    // blocks of 16 tokens: one is preempted; c waits for a sequence.
    struct conn a, b, c;
    const char *longer = "{\"prompt\": [5, 6, 7], \"max_tokens\": 500, \"ignore_eos\": true, \"stream\": true}";
    CHECK(send_raw(&a, s.port, longer) == 0 && send_raw(&b, s.port, longer) == 0);
    CHECK(send_raw(&c, s.port, "{\"prompt\": \"hello world\", \"max_tokens\": 5}") == 0);
    double max_gauge[NUM_DASH] = {0};
    double t0 = now_sec();
    while (now_sec() - t0 < 10) {
        char *m = http_metrics(s.port);
        sample_gauges(m, max_gauge);
        double w = metric_value(m, "vllm:num_requests_waiting", label);
        double r = metric_value(m, "vllm:num_requests_running", label);
        free(m);
        if (w >= 1 && r >= 2) break; // a and b run, c waits
        usleep(2000);
    }
    struct resp ra, rb, rc;
    CHECK(conn_read_response(&a, &ra) == 0 && ra.status == 200);
    CHECK(conn_read_response(&b, &rb) == 0 && rb.status == 200);
    CHECK(conn_read_response(&c, &rc) == 0 && rc.status == 200);
    resp_free(&ra), resp_free(&rb), resp_free(&rc);
    conn_close(&a), conn_close(&b), conn_close(&c);
    for (int r = 0; r < 2; r++) {
        struct resp rr;
        http_request(s.port, "POST", "/v1/completions", NULL, "{\"prompt\": \"hello there\", \"max_tokens\": 5, \"stream\": true}", &rr);
        CHECK(rr.status == 200);
        resp_free(&rr);
    }
    char *after = http_metrics(s.port);
    CHECK(after != NULL);
    int compared = 0;
    for (size_t i = 0; after && before && i < NUM_DASH; i++) {
        const char *n = dashboard[i].name;
        double x0 = value(before, n, dashboard[i].kind), x1 = value(after, n, dashboard[i].kind);
        switch (dashboard[i].kind) {
        case COUNTER:
        case HISTOGRAM: CHECKF(x1 > x0, "%s did not move under load: %g -> %g", n, x0, x1); break;
        case GAUGE: CHECKF(max_gauge[i] > 0, "%s stayed 0 under load", n); break;
        case INFO: CHECKF(x1 == 1, "%s is %g, want 1", n, x1); break;
        }
        compared++;
    }
    CHECKF(compared == (int)NUM_DASH, "compared %d of %zu series", compared, NUM_DASH);
    free(before);
    free(after);
    CHECKF(srv_stop(&s, 20) == 0, "the server did not exit 0 after SIGTERM");
    return test_summary("server_metrics");
}
