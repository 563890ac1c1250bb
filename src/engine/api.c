// api.c - requests through vllm.h: validation, submit, cancel, blocking
// helpers, and the tokenizer calls.
#include <math.h>

#include "core/common.h"
#include "core/json.h"
#include "engine/engine.h"
#include "engine/kv_cache.h"
#include "tokenizer/tokenizer.h"


void vllm_sampling_params_default(struct vllm_sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->repetition_penalty = 1.0f;
    p->seed = -1;
    p->max_tokens = 16;
    p->logprobs = -1;
    p->skip_special_tokens = 1;
}

void vllm_prompt_default(struct vllm_prompt *p) {
    memset(p, 0, sizeof *p);
    p->add_special_tokens = 1;
}

static int check_sampling(const struct vllm_sampling_params *sp) {
#define BAD(...) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, __VA_ARGS__)
    if (!(sp->temperature >= 0) || isinf(sp->temperature)) BAD("temperature must be >= 0, got %g", sp->temperature);
    if (!(sp->top_p > 0 && sp->top_p <= 1)) BAD("top_p must be in (0, 1], got %g", sp->top_p);
    if (sp->top_k < -1) BAD("top_k must be -1, 0 (off) or positive, got %d", sp->top_k);
    if (!(sp->min_p >= 0 && sp->min_p <= 1)) BAD("min_p must be in [0, 1], got %g", sp->min_p);
    if (!(sp->repetition_penalty > 0) || isinf(sp->repetition_penalty))
        BAD("repetition_penalty must be > 0, got %g", sp->repetition_penalty);
    if (!(sp->presence_penalty >= -2 && sp->presence_penalty <= 2))
        BAD("presence_penalty must be in [-2, 2], got %g", sp->presence_penalty);
    if (!(sp->frequency_penalty >= -2 && sp->frequency_penalty <= 2))
        BAD("frequency_penalty must be in [-2, 2], got %g", sp->frequency_penalty);
    if (sp->max_tokens < 1) BAD("max_tokens must be >= 1, got %d", sp->max_tokens);
    if (sp->min_tokens < 0 || sp->min_tokens > sp->max_tokens) BAD("min_tokens must be in [0, max_tokens]");
    if (sp->logprobs > VLLM_MAX_LOGPROBS) BAD("logprobs must be <= %d, got %d", VLLM_MAX_LOGPROBS, sp->logprobs);
    if (sp->num_stop_token_ids < 0 || (sp->num_stop_token_ids && !sp->stop_token_ids)) BAD("bad stop_token_ids");
    if (sp->num_stop < 0 || (sp->num_stop && !sp->stop)) BAD("bad stop strings");
    for (int i = 0; i < sp->num_stop; i++)
        if (!sp->stop[i] || !*sp->stop[i]) BAD("stop strings must be non-empty");
    return VLLM_OK;
#undef BAD
}

// Entries within the vocabulary, finite, each id once (the device adds them
// without atomics).
static int check_logit_bias(const struct vllm_sampling_params *sp, int vocab) {
    int n = sp->num_logit_bias;
    if (n < 0 || n > VLLM_MAX_LOGIT_BIAS || (n && (!sp->logit_bias_ids || !sp->logit_bias_values)))
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "logit_bias: %d entries (at most %d)", n, VLLM_MAX_LOGIT_BIAS);
    for (int i = 0; i < n; i++) {
        int32_t id = sp->logit_bias_ids[i];
        if (id < 0 || id >= vocab)
            return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "logit_bias: token id %d is not in [0, %d)", id, vocab);
        if (!isfinite(sp->logit_bias_values[i]))
            return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "logit_bias: the bias of token %d is not finite", id);
        for (int j = 0; j < i; j++)
            if (sp->logit_bias_ids[j] == id)
                return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "logit_bias: token id %d appears twice", id);
    }
    return VLLM_OK;
}

static void constraint_release(const struct vllm_constraint *c) {
    if (c && c->release) c->release(c->user);
}

static void request_free(struct request *r) {
    if (r->has_cons) constraint_release(&r->cons);
    if (r->ts) text_stream_free(r->ts);
    for (int i = 0; i < r->sp.num_stop; i++) free(r->stop_strs[i]);
    free(r->stop_strs);
    free(r->stop_ids);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->tokens);
    free(r->blocks);
    free(r->hashes);
    free(r->pend);
    free(r);
}

void request_release(struct vllm_engine *e, struct request *r) {
    (void)e;
    if (--r->refs == 0) request_free(r);
}

// Tokenizes a text prompt, or copies ids; checks every id and the length.
static int prompt_ids(struct vllm_engine *e, const struct vllm_prompt *p, int32_t **ids, int *n) {
    if (p->text) {
        if (!e->tok) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "a text prompt needs a tokenizer; %s has no tokenizer.json",
                                     e->model_dir);
        TRY(tok_encode(e->tok, p->text, strlen(p->text), p->add_special_tokens, ids, n));
    } else {
        if (p->num_token_ids < 0 || (p->num_token_ids && !p->token_ids))
            return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "bad prompt token ids");
        *n = p->num_token_ids;
        *ids = xmalloc(sizeof(int32_t) * (*n ? *n : 1));
        if (*n) memcpy(*ids, p->token_ids, sizeof(int32_t) * *n);
    }
    int rc = VLLM_OK;
    if (*n == 0) rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT, "the prompt is empty");
    for (int i = 0; i < *n && !rc; i++)
        if ((*ids)[i] < 0 || (*ids)[i] >= e->info.vocab_size)
            rc = vllm_err(VLLM_ERR_INVALID_ARGUMENT, "prompt token %d is %d, outside the vocabulary [0, %d)", i, (*ids)[i],
                          e->info.vocab_size);
    if (!rc && *n >= e->max_model_len)
        rc = vllm_err(VLLM_ERR_TOO_LONG, "the prompt has %d tokens; max_model_len is %d, which leaves no room to generate",
                      *n, e->max_model_len);
    if (rc) free(*ids), *ids = NULL;
    return rc;
}

static struct request *request_new(struct vllm_engine *e, int32_t *ids, int n, const struct vllm_sampling_params *sp) {
    struct request *r = xcalloc(1, sizeof *r);
    r->engine = e;
    r->tokens = ids;
    r->num_prompt = r->num_tokens = n;
    r->cap_tokens = n;
    r->slot = r->row = -1;
    r->stop_token = -1;
    r->sp = *sp;
    if (sp->num_stop_token_ids) {
        r->stop_ids = xmalloc(sizeof(int32_t) * sp->num_stop_token_ids);
        memcpy(r->stop_ids, sp->stop_token_ids, sizeof(int32_t) * sp->num_stop_token_ids);
    }
    r->sp.stop_token_ids = r->stop_ids;
    if (sp->num_logit_bias) {
        r->bias_ids = xmalloc(sizeof(int32_t) * sp->num_logit_bias);
        r->bias_vals = xmalloc(sizeof(float) * sp->num_logit_bias);
        memcpy(r->bias_ids, sp->logit_bias_ids, sizeof(int32_t) * sp->num_logit_bias);
        memcpy(r->bias_vals, sp->logit_bias_values, sizeof(float) * sp->num_logit_bias);
    }
    r->sp.logit_bias_ids = r->bias_ids;
    r->sp.logit_bias_values = r->bias_vals;
    r->stop_strs = xcalloc(sp->num_stop ? sp->num_stop : 1, sizeof(char *));
    for (int i = 0; i < sp->num_stop; i++) r->stop_strs[i] = xstrdup(sp->stop[i]);
    r->sp.stop = (const char *const *)r->stop_strs;
    r->salt = kv_hash_salt(sp->cache_salt); // the string itself is not kept
    r->sp.cache_salt = NULL;
    if (sp->constraint) r->cons = *sp->constraint, r->has_cons = 1;
    r->sp.constraint = NULL;
    r->max_tokens = MIN(sp->max_tokens, e->max_model_len - n);
    r->t_submit = now_s();
    return r;
}

// The checks before a request exists: a failure releases the constraint here.
static int submit_checks(struct vllm_engine *e, const struct vllm_prompt *prompt, const struct vllm_sampling_params *sp,
                         struct vllm_request **out, int32_t **ids, int *n) {
    if (!e || !prompt || !sp || !out) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    *out = NULL;
    TRY(check_sampling(sp));
    if (sp->priority && !e->priority)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT,
                        "priority %d needs the engine's scheduling_policy \"priority\" (vllm serve --scheduling-policy "
                        "priority); with fcfs it must be 0", sp->priority);
    if (sp->constraint && !sp->constraint->fill_mask)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "a constraint without fill_mask");
    TRY(check_logit_bias(sp, e->info.vocab_size));
    if (sp->num_stop && !e->tok)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "stop strings need a tokenizer; %s has no tokenizer.json", e->model_dir);
    return prompt_ids(e, prompt, ids, n);
}

vllm_status vllm_submit(struct vllm_engine *e, const struct vllm_prompt *prompt, const struct vllm_sampling_params *sp,
                        vllm_stream_fn cb, void *user, struct vllm_request **out) {
    vllm_err_clear();
    int32_t *ids;
    int n;
    int crc = submit_checks(e, prompt, sp, out, &ids, &n);
    if (crc) {
        if (sp) constraint_release(sp->constraint);
        return crc;
    }
    struct request *r = request_new(e, ids, n, sp);
    r->cb = cb;
    r->user = user;
    if (e->tok) {
        r->ts = text_stream_create(e->tok, ids, n, sp->skip_special_tokens, r->sp.stop, sp->num_stop,
                                   sp->include_stop_str_in_output);
    }
    pthread_mutex_lock(&e->mu);
    int rc = VLLM_OK;
    if (e->stop) rc = vllm_err(VLLM_ERR_SHUTDOWN, "the engine is shutting down");
    else if (e->params.max_queued && e->num_inbox + e->stats.num_waiting >= e->params.max_queued)
        rc = vllm_err(VLLM_ERR_QUEUE_FULL, "%d requests are already waiting (max_queued)", e->params.max_queued);
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        request_free(r);
        return rc;
    }
    r->id = e->next_id++;
    r->seed = sp->seed >= 0 ? (uint64_t)sp->seed : e->params.seed * 0x9E3779B97F4A7C15ull + r->id * 0xBF58476D1CE4E5B9ull;
    r->refs = 2; // the caller's and the engine's
    r->next = NULL;
    if (e->inbox_tail) e->inbox_tail->next = r;
    else e->inbox_head = r;
    e->inbox_tail = r;
    e->num_inbox++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *out = (struct vllm_request *)r;
    return VLLM_OK;
}

static void ask_cancel(struct vllm_engine *e, struct request *r) {
    if (!r->finished && !r->cancel) {
        r->cancel = 1;
        e->num_cancel++;
        pthread_cond_signal(&e->cv);
    }
}

vllm_status vllm_request_cancel(struct vllm_request *vr) {
    struct request *r = (struct request *)vr;
    if (!r) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL request");
    struct vllm_engine *e = r->engine;
    pthread_mutex_lock(&e->mu);
    ask_cancel(e, r);
    pthread_mutex_unlock(&e->mu);
    return VLLM_OK;
}

uint64_t vllm_request_id(const struct vllm_request *vr) { return vr ? ((const struct request *)vr)->id : 0; }

void vllm_request_free(struct vllm_request *vr) {
    struct request *r = (struct request *)vr;
    if (!r) return;
    struct vllm_engine *e = r->engine;
    pthread_mutex_lock(&e->mu);
    ask_cancel(e, r);
    request_release(e, r);
    pthread_mutex_unlock(&e->mu);
}

// ------------------------------------------------------------ blocking --

struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int32_t *ids;
    int n, cap;
    char *text;
    size_t text_len, text_cap;
    vllm_finish_reason reason;
    int status;
    char error[512];
};

static void waiter_cb(void *user, const struct vllm_output *o) {
    struct waiter *w = user;
    pthread_mutex_lock(&w->mu);
    if (o->num_token_ids) {
        xgrow((void **)&w->ids, &w->cap, w->n + o->num_token_ids, sizeof(int32_t));
        memcpy(w->ids + w->n, o->token_ids, sizeof(int32_t) * o->num_token_ids);
        w->n += o->num_token_ids;
    }
    if (o->text_len) {
        if (w->text_len + o->text_len + 1 > w->text_cap) {
            w->text_cap = (w->text_len + o->text_len + 1) * 2;
            w->text = xrealloc(w->text, w->text_cap);
        }
        memcpy(w->text + w->text_len, o->text, o->text_len);
        w->text_len += o->text_len;
    }
    if (o->finish_reason != VLLM_FINISH_NONE) {
        w->reason = o->finish_reason;
        w->status = o->status;
        if (o->error) snprintf(w->error, sizeof w->error, "%s", o->error);
        w->done = 1;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
}

static int run_blocking(struct vllm_engine *e, const struct vllm_prompt *p, const struct vllm_sampling_params *sp,
                        struct waiter *w) {
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    struct vllm_request *r;
    int rc = vllm_submit(e, p, sp, waiter_cb, w, &r);
    if (!rc) {
        pthread_mutex_lock(&w->mu);
        while (!w->done) pthread_cond_wait(&w->cv, &w->mu);
        pthread_mutex_unlock(&w->mu);
        vllm_request_free(r);
        rc = w->status;
        if (rc) vllm_err(rc, "%s", w->error);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    return rc;
}

vllm_status vllm_complete_tokens(struct vllm_engine *e, const int32_t *prompt, int num_prompt,
                                 const struct vllm_sampling_params *sp, int32_t **out_ids, int *num_out,
                                 vllm_finish_reason *reason) {
    if (!out_ids || !num_out) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL output argument");
    struct vllm_prompt p;
    vllm_prompt_default(&p);
    p.token_ids = prompt;
    p.num_token_ids = num_prompt;
    struct waiter w;
    int rc = run_blocking(e, &p, sp, &w);
    free(w.text);
    if (rc) {
        free(w.ids);
        return rc;
    }
    *out_ids = w.ids ? w.ids : xcalloc(1, sizeof(int32_t));
    *num_out = w.n;
    if (reason) *reason = w.reason;
    return VLLM_OK;
}

vllm_status vllm_complete_text(struct vllm_engine *e, const char *prompt, const struct vllm_sampling_params *sp,
                               char **out_text, vllm_finish_reason *reason) {
    if (!out_text || !prompt) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    struct vllm_prompt p;
    vllm_prompt_default(&p);
    p.text = prompt;
    struct waiter w;
    int rc = run_blocking(e, &p, sp, &w);
    free(w.ids);
    if (rc) {
        free(w.text);
        return rc;
    }
    if (!w.text) w.text = xcalloc(1, 1);
    else w.text[w.text_len] = 0;
    *out_text = w.text;
    if (reason) *reason = w.reason;
    return VLLM_OK;
}

// ----------------------------------------------------------- tokenizer --

vllm_status vllm_tokenize(struct vllm_engine *e, const char *text, size_t len, int add_special_tokens, int32_t **ids,
                          int *num_ids) {
    vllm_err_clear();
    if (!e || !text || !ids || !num_ids) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    if (!e->tok) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s has no tokenizer.json", e->model_dir);
    return tok_encode(e->tok, text, len, add_special_tokens, ids, num_ids);
}

vllm_status vllm_detokenize(struct vllm_engine *e, const int32_t *ids, int num_ids, int skip_special_tokens,
                            char **text) {
    vllm_err_clear();
    if (!e || (!ids && num_ids) || !text) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    if (!e->tok) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s has no tokenizer.json", e->model_dir);
    size_t len;
    return tok_decode(e->tok, ids, num_ids, skip_special_tokens, text, &len);
}

vllm_status vllm_apply_chat_template(struct vllm_engine *e, const char *request_json, char **out) {
    vllm_err_clear();
    if (!e || !request_json || !out) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    if (!e->chat) return vllm_err(VLLM_ERR_UNSUPPORTED, "%s has no chat template", e->model_dir);
    json_t *req;
    TRY(json_parse_python(request_json, strlen(request_json), "chat request", &req));
    int rc = chat_template_render(e->chat, req, out);
    json_decref(req);
    return rc;
}

vllm_status vllm_apply_chat_template_source(struct vllm_engine *e, const char *template_src, const char *request_json,
                                            char **out) {
    if (!template_src) return vllm_apply_chat_template(e, request_json, out);
    vllm_err_clear();
    if (!e || !request_json || !out) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "NULL argument");
    struct chat_template *ct;
    TRY(chat_template_from_source(template_src, e->chat, &ct));
    json_t *req = NULL;
    int rc = json_parse_python(request_json, strlen(request_json), "chat request", &req);
    if (!rc) rc = chat_template_render(ct, req, out);
    json_decref(req);
    chat_template_free(ct);
    return rc;
}
