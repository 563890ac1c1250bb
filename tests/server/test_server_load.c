// test_server_load.c - `vllm serve` under load: 64 concurrent streaming
// clients, 1,024 requests (completions and chat, keep-alive), about 10% of
// them disconnecting at a random point. Every completed stream must carry
// its whole output exactly once: the same token ids and text as a reference
// run of that prompt alone, one finish chunk, one usage chunk, one [DONE].
// Afterwards /metrics shows nothing running, every KV block and state slot
// free, and one finished request per request sent; the server is healthy,
// its RSS settled between the two halves of the run, and it exits 0 on
// SIGTERM. Prints requests/s and tokens/s (docs/BENCHMARKS_CPU.md, ## Server).
// usage: test_server_load VLLM_BINARY MODEL_DIR
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "server/harness.h"
#include "test.h"

#define CLIENTS 64
#define PER_CLIENT 8 // per client and half: 2 * 64 * 8 = 1,024 requests
#define NPROMPTS 16
#define NCHAT 4      // prompts 0..3 are chat requests, the rest token ids
#define NMAXTOK 4
static const int maxtok[NMAXTOK] = {8, 16, 24, 32};

struct ref {
    char *ids; // the token ids as JSON text, for comparing
    char *text;
    int prompt_tokens;
};
static struct ref refs[NPROMPTS][NMAXTOK];
static int port;

struct tally {
    int completed, disconnected, mismatched, failed, tokens;
};
static pthread_mutex_t tally_mu = PTHREAD_MUTEX_INITIALIZER;
static struct tally tally;

static char *request_body(int p, int mt, int stream) {
    json_t *b = json_pack("{s:i,s:f,s:b,s:b,s:b}", "max_tokens", mt, "temperature", 0.0, "ignore_eos", 1,
                          "return_token_ids", 1, "stream", stream);
    if (stream) json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (p < NCHAT) {
        char content[64];
        snprintf(content, sizeof content, "load test prompt %d", p);
        json_object_set_new(b, "messages", json_pack("[{s:s,s:s}]", "role", "user", "content", content));
    } else {
        json_t *ids = json_array();
        for (int i = 0; i < 4 + 3 * p; i++) json_array_append_new(ids, json_integer(3 + (p * 37 + i * 11) % 250));
        json_object_set_new(b, "prompt", ids);
    }
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static const char *path_of(int p) { return p < NCHAT ? "/v1/chat/completions" : "/v1/completions"; }

// The reference outputs: each prompt alone, not streamed.
static void make_refs(void) {
    for (int p = 0; p < NPROMPTS; p++)
        for (int m = 0; m < NMAXTOK; m++) {
            char *body = request_body(p, maxtok[m], 0);
            struct resp r;
            http_request(port, "POST", path_of(p), NULL, body, &r);
            free(body);
            json_t *j = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
            json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
            json_t *text = p < NCHAT ? json_object_get(json_object_get(ch, "message"), "content")
                                     : json_object_get(ch, "text");
            json_t *ids = json_object_get(ch, "token_ids");
            CHECKF(json_is_string(text) && json_array_size(ids) == (size_t)maxtok[m], "reference %d/%d: %d %.200s", p,
                   maxtok[m], r.status, r.body ? r.body : "");
            refs[p][m].ids = json_dumps(ids ? ids : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
            refs[p][m].text = strdup(json_is_string(text) ? json_string_value(text) : "");
            refs[p][m].prompt_tokens = (int)json_integer_value(
                json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
            json_decref(j);
            resp_free(&r);
        }
}

// Checks one whole SSE stream against its reference. Returns 1 if it matches.
static int check_stream(const char *body, int p, int m, char *why, size_t cap) {
    int n, ok = 0, fin = 0, usage = 0, done = 0;
    char **ev = sse_events(body, &n);
    json_t *ids = json_array();
    size_t tcap = 1024, tlen = 0;
    char *text = calloc(1, tcap);
    for (int i = 0; i < n; i++) {
        if (!strcmp(ev[i], "[DONE]")) {
            done += i == n - 1 ? 1 : 100;
            continue;
        }
        json_t *j = json_loads(ev[i], 0, NULL);
        json_t *chs = json_object_get(j, "choices"), *ch = json_array_get(chs, 0);
        if (!j || !json_is_array(chs)) {
            snprintf(why, cap, "event %d is not a chunk: %.200s", i, ev[i]);
            json_decref(j);
            goto out;
        }
        json_t *u = json_object_get(j, "usage");
        if (json_is_object(u)) {
            usage++;
            if (json_integer_value(json_object_get(u, "completion_tokens")) != maxtok[m] ||
                json_integer_value(json_object_get(u, "prompt_tokens")) != refs[p][m].prompt_tokens)
                usage += 100;
        }
        if (ch) {
            json_t *t = p < NCHAT ? json_object_get(json_object_get(ch, "delta"), "content") : json_object_get(ch, "text");
            if (json_is_string(t)) {
                size_t l = json_string_length(t);
                if (tlen + l + 1 > tcap) text = realloc(text, tcap = (tlen + l + 1) * 2);
                memcpy(text + tlen, json_string_value(t), l);
                text[tlen += l] = 0;
            }
            json_array_extend(ids, json_object_get(ch, "token_ids"));
            json_t *fr = json_object_get(ch, "finish_reason");
            if (json_is_string(fr)) fin += strcmp(json_string_value(fr), "length") ? 100 : 1;
        }
        json_decref(j);
    }
    char *got = json_dumps(ids, JSON_COMPACT);
    if (fin != 1 || usage != 1 || done != 1)
        snprintf(why, cap, "finish chunks %d, usage chunks %d, [DONE] %d", fin, usage, done);
    else if (strcmp(got, refs[p][m].ids))
        snprintf(why, cap, "token ids %.300s, reference %.300s", got, refs[p][m].ids);
    else if (strcmp(text, refs[p][m].text))
        snprintf(why, cap, "text differs from the reference (%zu vs %zu bytes)", tlen, strlen(refs[p][m].text));
    else ok = 1;
    free(got);
out:
    json_decref(ids);
    free(text);
    sse_free(ev);
    return ok;
}

static int count_events(const struct conn *c) {
    int n = 0;
    for (const char *p = c->buf; p && (p = strstr(p, "data: ")); p += 6) n++;
    return n;
}

static void *client_main(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 12345;
    struct conn c = {.fd = -1};
    struct tally t = {0};
    for (int j = 0; j < PER_CLIENT; j++) {
        seed = seed * 1103515245u + 12345u;
        int p = (seed >> 8) % NPROMPTS, m = (seed >> 16) % NMAXTOK;
        int cut = (seed >> 4) % 10 == 0 ? (int)((seed >> 20) % (maxtok[m] + 2)) : -1; // events read before leaving
        if (c.fd < 0 && conn_open(&c, port, 60)) {
            fprintf(stderr, "FAIL: cannot connect\n");
            t.failed++;
            continue;
        }
        char *body = request_body(p, maxtok[m], 1), head[256];
        int hn = snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", path_of(p),
                          strlen(body));
        int sent = conn_send(&c, head, hn) == 0 && conn_send(&c, body, strlen(body)) == 0;
        free(body);
        if (sent && cut >= 0) {
            // (tokens may arrive several to an event: the stream may end first)
            while (!c.eof && count_events(&c) < cut && !(c.buf && strstr(c.buf, "data: [DONE]"))) conn_read_more(&c, 1);
            conn_close(&c);
            t.disconnected++;
            continue;
        }
        struct resp r;
        if (!sent || conn_read_response(&c, &r) || r.status != 200) {
            fprintf(stderr, "FAIL: request %d/%d: no whole response (status %d)\n", p, maxtok[m], sent ? r.status : -1);
            t.failed++;
            resp_free(&r);
            conn_close(&c);
            continue;
        }
        char why[800];
        if (check_stream(r.body, p, m, why, sizeof why)) t.completed++, t.tokens += maxtok[m];
        else {
            t.mismatched++;
            fprintf(stderr, "FAIL: prompt %d, max_tokens %d: %s\n", p, maxtok[m], why);
        }
        resp_free(&r);
    }
    conn_close(&c);
    pthread_mutex_lock(&tally_mu);
    tally.completed += t.completed;
    tally.disconnected += t.disconnected;
    tally.mismatched += t.mismatched;
    tally.failed += t.failed;
    tally.tokens += t.tokens;
    pthread_mutex_unlock(&tally_mu);
    return NULL;
}

static int wait_idle(char **last) {
    double t0 = now_sec();
    for (;;) {
        char *m = http_metrics(port);
        int idle = m && metric_value(m, "vllm:num_requests_running", NULL) == 0 &&
                   metric_value(m, "vllm:num_requests_waiting", NULL) == 0 &&
                   metric_value(m, "vllm:kv_cache_blocks_used", NULL) == 0 &&
                   metric_value(m, "vllm:state_slots_used", NULL) == 0 &&
                   metric_value(m, "vllm:http_jobs_in_flight", NULL) == 0 && // parsed, not yet submitted
                   metric_value(m, "vllm:http_requests_in_flight", NULL) == 0;
        if (idle || now_sec() - t0 > 20) {
            *last = m;
            return idle;
        }
        free(m);
        usleep(10000);
    }
}

// One half of the load: 64 clients x PER_CLIENT requests. Returns wall seconds.
static double run_half(int half) {
    pthread_t th[CLIENTS];
    double t0 = now_sec();
    for (int i = 0; i < CLIENTS; i++) pthread_create(&th[i], NULL, client_main, (void *)(uintptr_t)(half * 1000 + i));
    for (int i = 0; i < CLIENTS; i++) pthread_join(th[i], NULL);
    return now_sec() - t0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s VLLM_BINARY MODEL_DIR\n", argv[0]);
        return 2;
    }
    const char *extra[] = {"--max-num-seqs", "64", "--max-model-len", "128", NULL};
    struct srv s;
    srv_start(&s, argv[1], argv[2], extra);
    port = s.port;
    make_refs();
    char *m;
    wait_idle(&m);
    double gen0 = metric_value(m, "vllm:generation_tokens_total", NULL);
    free(m);

    double loop0, cpu0 = srv_cpu_s(&s, &loop0);
    double wall = run_half(0);
    CHECKF(wait_idle(&m), "not idle after the first half");
    free(m);
    long rss1 = srv_rss_kb(&s);
    wall += run_half(1);
    double loop1, cpu1 = srv_cpu_s(&s, &loop1);
    CHECKF(wait_idle(&m), "not idle after the load:\n%s", m ? m : "");
    long rss2 = srv_rss_kb(&s);

    int total = 2 * CLIENTS * PER_CLIENT, nref = NPROMPTS * NMAXTOK;
    double len = metric_value(m, "vllm:request_success_total", "\"length\"");
    double abort = metric_value(m, "vllm:request_success_total", "\"abort\"");
    double other = metric_value(m, "vllm:request_success_total", "\"stop\"") +
                   metric_value(m, "vllm:request_success_total", "\"error\"");
    double gen = metric_value(m, "vllm:generation_tokens_total", NULL) - gen0;
    printf("load: %d requests (%d completed and checked, %d disconnected), %d concurrent clients, %.2f s\n", total,
           tally.completed, tally.disconnected, CLIENTS, wall);
    printf("load: %.1f requests/s completed, %.0f tokens/s streamed to clients, %.0f tokens/s generated\n",
           tally.completed / wall, tally.tokens / wall, gen / wall);
    printf("load: server CPU %.2f s (HTTP loop thread %.2f s) in %.2f s of load\n", cpu1 - cpu0, loop1 - loop0, wall);
    printf("load: server RSS %ld kB after the first half, %ld kB after the second\n", rss1, rss2);
    CHECKF(tally.completed > 0 && tally.disconnected > 0, "nothing compared");
    CHECKF(tally.mismatched == 0 && tally.failed == 0, "%d streams differ from their reference, %d failed",
           tally.mismatched, tally.failed);
    CHECKF(tally.completed + tally.disconnected + tally.mismatched + tally.failed == total, "requests unaccounted for");
    CHECKF(tally.disconnected > total / 20 && tally.disconnected < total / 5, "%d disconnects", tally.disconnected);
    // Every request sent finished exactly once: completed ones by length,
    // those whose client left by abort (or by length, if it left late).
    CHECKF(len + abort == total + nref && other == 0, "finished: length %g + abort %g, %d sent", len, abort,
           total + nref);
    CHECKF(len >= tally.completed + nref, "length %g < %d completed", len, tally.completed + nref);
    // Clients that left early had their requests aborted (some leave after the end).
    CHECKF(abort >= 1, "no request was aborted by its client leaving");
    free(m);
#if !defined(__SANITIZE_ADDRESS__)
    CHECKF(rss1 > 0 && rss2 <= rss1 + rss1 / 10 + 8192, "RSS grew from %ld to %ld kB", rss1, rss2);
#endif
    struct resp r;
    http_request(port, "GET", "/health", NULL, NULL, &r);
    CHECK(r.status == 200);
    resp_free(&r);
    CHECKF(srv_stop(&s, 30) == 0, "the server did not exit 0 after SIGTERM");
    for (int p = 0; p < NPROMPTS; p++)
        for (int k = 0; k < NMAXTOK; k++) free(refs[p][k].ids), free(refs[p][k].text);
    return test_summary("server_load");
}
