// work.c - request bodies are parsed, tokenized and rendered through the
// chat template on worker threads, never on the HTTP loop: a 30 MB body
// stalls no other client. The loop moves a request's body out of libevent
// (no copy), queues a job, and answers when the job comes back; a client
// that leaves meanwhile only makes the result be dropped.
#include <event2/buffer.h>
#include <malloc.h>

#include "core/common.h"
#include "server/server_internal.h"

#define NUM_WORKERS 2
#define TRIM_BYTES (1 << 20) // after a body this large, free memory goes back to the system

struct job {
    struct server *srv;
    enum job_kind kind;
    struct evhttp_request *req; // NULL once the client left
    struct evhttp_connection *evcon;
    struct evbuffer *body;
    // results
    struct api_error err;
    json_t *reply;
    struct gen_params gp;
    int have_gp;
    struct job *next;
};

// ------------------------------------------------------------ worker --

static json_t *parse_body(struct evbuffer *b, struct api_error *err) {
    size_t len = evbuffer_get_length(b);
    evbuffer_add(b, "", 1);
    const char *text = (const char *)evbuffer_pullup(b, -1);
    json_error_t je;
    json_t *j = text ? json_loadb(text, len, 0, &je) : NULL;
    if (!j) {
        api_fail(err, 400, NULL, "the request body is not valid JSON: %s (line %d, column %d)", text ? je.text : "",
                 text ? je.line : 0, text ? je.column : 0);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        api_fail(err, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return j;
}

static void run_job(struct job *j) {
    struct server *s = j->srv;
    size_t body_len = evbuffer_get_length(j->body);
    json_t *body = parse_body(j->body, &j->err);
    evbuffer_free(j->body);
    j->body = NULL;
    if (body && !check_model(s, body, &j->err)) {
        switch (j->kind) {
        case JOB_TOKENIZE: j->reply = tokenize_reply(s, body, &j->err); break;
        case JOB_DETOKENIZE: j->reply = detokenize_reply(s, body, &j->err); break;
        case JOB_COMPLETION:
        case JOB_CHAT:
            j->have_gp = !gen_params_parse(s, j->kind == JOB_CHAT ? API_CHAT : API_COMPLETION, body, &j->gp, &j->err);
            break;
        case JOB_RESPONSES: j->have_gp = !responses_parse(s, body, &j->gp, &j->err); break;
        }
    }
    json_decref(body);
    if (body_len >= TRIM_BYTES) malloc_trim(0);
}

static void *worker_main(void *arg) {
    struct server *s = arg;
    pthread_mutex_lock(&s->work_mu);
    for (;;) {
        while (!s->todo && !s->work_stop) pthread_cond_wait(&s->work_cv, &s->work_mu);
        if (!s->todo) break;
        struct job *j = s->todo;
        s->todo = j->next;
        if (!s->todo) s->todo_tail = NULL;
        pthread_mutex_unlock(&s->work_mu);
        run_job(j);
        pthread_mutex_lock(&s->work_mu);
        j->next = s->done;
        s->done = j;
        event_active(s->work_wake, EV_READ, 0);
    }
    pthread_mutex_unlock(&s->work_mu);
    return NULL;
}

// -------------------------------------------------------------- loop --

static void job_free(struct job *j) {
    if (j->body) evbuffer_free(j->body);
    json_decref(j->reply);
    if (j->have_gp) gen_params_free(&j->gp);
    j->srv->num_jobs--;
    free(j);
}

// The client left while its job ran.
static void on_job_close(struct evhttp_connection *evcon, void *arg) {
    (void)evcon;
    struct job *j = arg;
    // libevent let go of the request (not answered yet): it is ours to free
    if (j->req && !evhttp_request_get_connection(j->req)) evhttp_request_free(j->req);
    j->req = NULL;
    j->evcon = NULL;
}

static void answer(struct job *j) {
    struct server *s = j->srv;
    struct evhttp_request *req = j->req;
    client_set_closecb(s, j->evcon, NULL, NULL);
    if (j->err.status) send_error(s, req, &j->err);
    else if (j->reply) send_json(s, req, 200, json_incref(j->reply));
    else if (s->stopping) send_error(s, req, &(struct api_error){503, NULL, "the server is shutting down"});
    else {
        gen_start(s, req, &j->gp);
        j->have_gp = 0;
    }
}

static void on_work_done(evutil_socket_t fd, short what, void *arg) {
    (void)fd, (void)what;
    struct server *s = arg;
    pthread_mutex_lock(&s->work_mu);
    struct job *list = s->done, *rev = NULL;
    s->done = NULL;
    pthread_mutex_unlock(&s->work_mu);
    while (list) { // in the order they finished
        struct job *n = list->next;
        list->next = rev;
        rev = list;
        list = n;
    }
    while (rev) {
        struct job *j = rev;
        rev = j->next;
        if (j->req) answer(j);
        job_free(j);
    }
    server_maybe_exit(s);
}

void work_submit(struct server *s, struct evhttp_request *req, enum job_kind kind) {
    struct job *j = xcalloc(1, sizeof *j);
    j->srv = s;
    j->kind = kind;
    j->req = req;
    j->evcon = evhttp_request_get_connection(req);
    j->body = evbuffer_new();
    evbuffer_add_buffer(j->body, evhttp_request_get_input_buffer(req)); // moves the chains
    client_set_closecb(s, j->evcon, on_job_close, j);
    s->num_jobs++;
    pthread_mutex_lock(&s->work_mu);
    if (s->todo_tail) s->todo_tail->next = j;
    else s->todo = j;
    s->todo_tail = j;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->work_mu);
}

int work_start(struct server *s) {
    pthread_mutex_init(&s->work_mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    s->work_wake = event_new(s->base, -1, 0, on_work_done, s);
    for (int i = 0; i < NUM_WORKERS; i++)
        if (pthread_create(&s->workers[i], NULL, worker_main, s))
            return vllm_err(VLLM_ERR_INTERNAL, "cannot start a server worker thread");
        else s->num_workers++;
    return VLLM_OK;
}

// Teardown, once no connection is left (their close callbacks ran): stops
// the workers and drops every job.
void work_stop(struct server *s) {
    if (!s->work_wake) return;
    pthread_mutex_lock(&s->work_mu);
    s->work_stop = 1;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->work_mu);
    for (int i = 0; i < s->num_workers; i++) pthread_join(s->workers[i], NULL);
    for (struct job *l = s->todo, *n; l; l = n) n = l->next, job_free(l);
    for (struct job *l = s->done, *n; l; l = n) n = l->next, job_free(l);
    s->todo = s->todo_tail = s->done = NULL;
    event_free(s->work_wake);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->work_mu);
}
