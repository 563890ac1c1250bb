// fields.c - the request fields of vLLM's and OpenAI's schemas beyond
// sampling and the prompt: those vllm.c honours (priority, request_id,
// cache_salt, truncate_prompt_tokens, logit_bias, a per-request
// chat_template, documents, n, echo; prompt_logprobs is prompt_logprobs.c's) and those it cannot, which get a 400 naming
// them unless they hold the value that changes nothing ("store": false), so
// that no field is ever silently ignored. docs/SERVING.md lists every field
// with its status; tests/server/fields.tsv is the list both are checked
// against. (allowed_token_ids is guided.c's: a token mask, as structured
// output.)
#include <errno.h>
#include <limits.h>
#include <math.h>

#include "core/common.h"
#include "server/server_internal.h"

#define MAX_REQUEST_ID 128 // bytes: it goes into every response's id

static json_t *field(const json_t *body, const char *key) {
    json_t *v = json_object_get(body, key);
    return json_is_null(v) ? NULL : v;
}

// The value a field may hold and change nothing.
enum noop { NOOP_NONE, NOOP_FALSE, NOOP_TRUE, NOOP_ONE, NOOP_EMPTY, NOOP_TEXT_ONLY, NOOP_AUTO };

static int is_noop(const json_t *v, enum noop k) {
    switch (k) {
    case NOOP_NONE: return 0;
    case NOOP_FALSE: return json_is_false(v);
    case NOOP_TRUE: return json_is_true(v);
    case NOOP_ONE: return json_is_number(v) && json_number_value(v) == 1.0;
    case NOOP_EMPTY: return (json_is_array(v) && !json_array_size(v)) || (json_is_object(v) && !json_object_size(v));
    case NOOP_TEXT_ONLY:
        return json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
               !strcmp(json_string_value(json_array_get(v, 0)), "text");
    case NOOP_AUTO:
        return json_is_string(v) && (!strcmp(json_string_value(v), "auto") || !strcmp(json_string_value(v), "default"));
    }
    return 0;
}

// Fields vllm.c does not implement: a 400 naming the field (and why) for
// any value but null and the no-op one.
static const struct {
    const char *name;
    enum noop ok;
    const char *why;
} rejected[] = {
    {"length_penalty", NOOP_ONE, "it applies to beam search, which is not supported"},
    {"spaces_between_special_tokens", NOOP_TRUE, "special tokens are always detokenized as they are"},
    {"logits_processors", NOOP_EMPTY, "custom logits processors are not supported"},
    {"return_tokens_as_token_ids", NOOP_FALSE, "it is not implemented (use return_token_ids)"},
    {"kv_transfer_params", NOOP_EMPTY, "disaggregated prefill is not supported"},
    {"vllm_xargs", NOOP_EMPTY, "no extension reads it"},
    {"prompt_embeds", NOOP_NONE, "prompts are text or token ids"},
    {"mm_processor_kwargs", NOOP_EMPTY, "the models are text-only"},
    {"media_io_kwargs", NOOP_EMPTY, "the models are text-only"},
    {"modalities", NOOP_TEXT_ONLY, "the models produce text only"},
    {"audio", NOOP_NONE, "the models produce text only"},
    {"prediction", NOOP_NONE, "predicted outputs are not supported"},
    {"web_search_options", NOOP_NONE, "there is no web search"},
    {"verbosity", NOOP_NONE, "it is not implemented"},
    {"store", NOOP_FALSE, "nothing is stored server-side: only false"},
    {"service_tier", NOOP_AUTO, "there is one tier: only \"auto\" or \"default\""},
    {"n_predict", NOOP_NONE, "it is llama-server's; use max_tokens"},
    {"cache_prompt", NOOP_NONE, "it is llama-server's; prefix caching is automatic"},
    {"grammar", NOOP_NONE, "it is llama-server's; grammars are not supported here"},
    {"json_schema", NOOP_NONE, "it is llama-server's; use response_format"},
};

static int check_rejected(const json_t *body, struct api_error *err) {
    for (size_t i = 0; i < sizeof rejected / sizeof rejected[0]; i++) {
        json_t *v = field(body, rejected[i].name);
        if (v && !is_noop(v, rejected[i].ok))
            return api_fail(err, 400, rejected[i].name, "'%s' is not supported: %s", rejected[i].name, rejected[i].why);
    }
    json_t *so = field(body, "stream_options"), *cu = so ? field(so, "continuous_usage_stats") : NULL;
    if (cu && !json_is_false(cu))
        return api_fail(err, 400, "stream_options", "'stream_options.continuous_usage_stats' is not supported");
    return 0;
}

// An optional string of at most max bytes, copied into *out.
static int get_string(const json_t *body, const char *key, size_t max, char **out, struct api_error *err) {
    json_t *v = field(body, key);
    if (!v) return 0;
    if (!json_is_string(v)) return api_fail(err, 400, key, "'%s' must be a string", key);
    if (json_string_length(v) > max) return api_fail(err, 400, key, "'%s' is longer than %zu bytes", key, max);
    *out = xstrdup(json_string_value(v));
    return 0;
}

static int get_priority(struct server *s, const json_t *body, struct gen_params *gp, struct api_error *err) {
    json_t *v = field(body, "priority");
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX)
        return api_fail(err, 400, "priority", "'priority' must be an integer");
    int p = (int)json_integer_value(v);
    if (p && !s->cfg.priority_scheduling)
        return api_fail(err, 400, "priority",
                        "'priority' needs the priority scheduling policy (vllm serve --scheduling-policy priority)");
    gp->sp.priority = p;
    return 0;
}

static int get_truncate(struct server *s, const json_t *body, struct gen_params *gp, struct api_error *err) {
    json_t *v = field(body, "truncate_prompt_tokens");
    if (!v) return 0;
    long long n = json_is_integer(v) ? json_integer_value(v) : 0;
    if (!json_is_integer(v) || (n < 1 && n != -1))
        return api_fail(err, 400, "truncate_prompt_tokens", "'truncate_prompt_tokens' must be -1 or a positive integer");
    if (n > s->info.max_model_len)
        return api_fail(err, 400, "truncate_prompt_tokens", "'truncate_prompt_tokens' (%lld) is larger than max_model_len (%d)",
                        n, s->info.max_model_len);
    gp->truncate = n == -1 ? s->info.max_model_len : (int)n;
    return 0;
}

// OpenAI's logit_bias: {"token id": bias}, each bias clamped to [-100, 100]
// as vLLM does; ids in the vocabulary, each once.
static int get_logit_bias(struct server *s, const json_t *body, struct gen_params *gp, struct api_error *err) {
    json_t *v = field(body, "logit_bias"), *b;
    if (!v) return 0;
    if (!json_is_object(v)) return api_fail(err, 400, "logit_bias", "'logit_bias' must be an object of token ids to biases");
    size_t n = json_object_size(v);
    if (n > VLLM_MAX_LOGIT_BIAS)
        return api_fail(err, 400, "logit_bias", "'logit_bias' has %zu entries; at most %d", n, VLLM_MAX_LOGIT_BIAS);
    gp->bias_ids = xmalloc(sizeof(int32_t) * (n ? n : 1));
    gp->bias_vals = xmalloc(sizeof(float) * (n ? n : 1));
    const char *k;
    json_object_foreach(v, k, b) {
        char *end;
        errno = 0;
        long id = strtol(k, &end, 10);
        if (!*k || *end || errno || id < 0 || id >= s->info.vocab_size)
            return api_fail(err, 400, "logit_bias", "logit_bias key '%.40s' is not a token id in [0, %d)", k,
                            s->info.vocab_size);
        if (!json_is_number(b) || !isfinite(json_number_value(b)))
            return api_fail(err, 400, "logit_bias", "logit_bias['%.40s'] must be a number", k);
        for (int j = 0; j < gp->sp.num_logit_bias; j++)
            if (gp->bias_ids[j] == id)
                return api_fail(err, 400, "logit_bias", "logit_bias names token %ld twice", id);
        gp->bias_ids[gp->sp.num_logit_bias] = (int32_t)id;
        gp->bias_vals[gp->sp.num_logit_bias++] = (float)fmin(100.0, fmax(-100.0, json_number_value(b)));
    }
    gp->sp.logit_bias_ids = gp->bias_ids;
    gp->sp.logit_bias_values = gp->bias_vals;
    return 0;
}

int fields_parse(struct server *s, const json_t *body, struct gen_params *gp, struct api_error *err) {
    if (check_rejected(body, err) || get_priority(s, body, gp, err) || get_truncate(s, body, gp, err) ||
        get_logit_bias(s, body, gp, err) ||
        get_string(body, "request_id", MAX_REQUEST_ID, &gp->request_id, err) ||
        get_string(body, "cache_salt", 1 << 10, &gp->cache_salt, err))
        return -1;
    if (gp->cache_salt && !*gp->cache_salt) return api_fail(err, 400, "cache_salt", "'cache_salt' must not be empty");
    gp->sp.cache_salt = gp->cache_salt;
    // informational: accepted, typed
    static const char *const strings[] = {"user", "safety_identifier", "prompt_cache_key", NULL};
    for (int i = 0; strings[i]; i++)
        if (field(body, strings[i]) && !json_is_string(field(body, strings[i])))
            return api_fail(err, 400, strings[i], "'%s' must be a string", strings[i]);
    if (field(body, "metadata") && !json_is_object(field(body, "metadata")))
        return api_fail(err, 400, "metadata", "'metadata' must be an object");
    return 0;
}

// truncate_prompt_tokens: the prompt's last N tokens, as vLLM keeps them.
void fields_truncate(const struct gen_params *gp, struct gen_prompt *pr) {
    if (gp->truncate <= 0 || pr->num <= gp->truncate) return;
    memmove(pr->ids, pr->ids + (pr->num - gp->truncate), sizeof(int32_t) * gp->truncate);
    pr->num = gp->truncate;
}

// An integer (or a number with no fraction, as pydantic takes it), or -1
// with a 400 naming key.
static int get_count(const json_t *v, const char *key, long long *out, struct api_error *err) {
    double d = json_is_real(v) ? json_real_value(v) : 0;
    if (!json_is_integer(v) && !(json_is_real(v) && d == floor(d) && fabs(d) < 9e15))
        return api_fail(err, 400, key, "'%s' must be an integer", key);
    *out = json_is_integer(v) ? json_integer_value(v) : (long long)d;
    return 0;
}

// vLLM's n: samples per prompt, each its own engine request (gen.c), at most
// GEN_MAX_N. best_of as vLLM V1 has it: at least n (SamplingParams' check),
// and refused above 1 (V1's processor: "vLLM V1 does not yet support
// best_of"), so only 1 passes.
int fields_n(const json_t *body, struct gen_params *gp, struct api_error *err) {
    json_t *n = field(body, "n"), *b = field(body, "best_of");
    long long x = 1, best = 0;
    if (n && get_count(n, "n", &x, err)) return -1;
    if (x < 1 || x > GEN_MAX_N) return api_fail(err, 400, "n", "'n' must be in [1, %d], got %lld", GEN_MAX_N, x);
    gp->n = (int)x;
    if (!b) return 0;
    if (get_count(b, "best_of", &best, err)) return -1;
    if (best < x)
        return api_fail(err, 400, "best_of", "best_of must be greater than or equal to n, got n=%lld, best_of=%lld", x,
                        best);
    if (best > 1) return api_fail(err, 400, "best_of", "'best_of' is not supported: vLLM V1 does not yet support best_of");
    return 0;
}

int fields_chat_template(struct server *s, const json_t *body, const char **src, struct api_error *err) {
    json_t *v = field(body, "chat_template");
    *src = s->cfg.chat_template;
    if (!v) return 0;
    if (!json_is_string(v)) return api_fail(err, 400, "chat_template", "'chat_template' must be a string");
    if (!s->cfg.trust_request_chat_template)
        return api_fail(err, 400, "chat_template",
                        "a per-request 'chat_template' needs vllm serve --trust-request-chat-template");
    *src = json_string_value(v);
    return 0;
}

int fields_documents(const json_t *body, json_t *template_vars, struct api_error *err) {
    json_t *d = field(body, "documents");
    if (!d) return 0;
    if (!json_is_array(d)) return api_fail(err, 400, "documents", "'documents' must be a list of objects");
    size_t i;
    json_t *x;
    json_array_foreach(d, i, x) {
        if (!json_is_object(x)) return api_fail(err, 400, "documents", "documents[%zu] must be an object", i);
    }
    json_object_set(template_vars, "documents", d);
    return 0;
}

void fields_defaults(struct server *s, struct gen_params *gp) {
    const json_t *d = s->gen_defaults;
    if (!d) return;
    struct vllm_sampling_params *sp = &gp->sp;
    const json_t *v;
    if ((v = json_object_get(d, "temperature"))) sp->temperature = (float)json_number_value(v);
    if ((v = json_object_get(d, "top_p"))) sp->top_p = (float)json_number_value(v);
    if ((v = json_object_get(d, "top_k"))) sp->top_k = (int)json_number_value(v);
    if ((v = json_object_get(d, "min_p"))) sp->min_p = (float)json_number_value(v);
    if ((v = json_object_get(d, "repetition_penalty"))) sp->repetition_penalty = (float)json_number_value(v);
    if ((v = json_object_get(d, "max_new_tokens")) && json_number_value(v) >= 1)
        gp->max_new_tokens = (int)MIN(json_number_value(v), 1e9);
}

// vLLM's echo: a text prompt as sent (when the whole of it is kept), else
// the kept ids detokenized. With logprobs it would need the prompt's
// logprobs, which are not computed: a 400.
int fields_echo(const json_t *body, struct gen_params *gp, struct api_error *err) {
    json_t *v = field(body, "echo");
    if (!v || json_is_false(v)) return 0;
    if (!json_is_boolean(v)) return api_fail(err, 400, "echo", "'echo' must be a boolean");
    if (gp->kind != API_COMPLETION)
        return api_fail(err, 400, "echo", "'echo' is supported on /v1/completions only");
    gp->echo = 1; // with logprobs, the prompt's log-probs lead the completion's (prompt_logprobs.c)
    return 0;
}

int fields_echo_text(struct server *s, const struct gen_params *gp, const json_t *text, struct gen_prompt *pr,
                     struct api_error *err) {
    if (!gp->echo) return 0;
    if (json_is_string(text) && !gp->truncate) {
        pr->echo_len = json_string_length(text);
        pr->echo = xmalloc(pr->echo_len + 1);
        memcpy(pr->echo, json_string_value(text), pr->echo_len + 1);
        return 0;
    }
    char *t = NULL;
    if (!s->info.has_tokenizer || vllm_detokenize(s->engine, pr->ids, pr->num, 0, &t))
        return api_fail(err, 400, "echo", "'echo' needs the model's tokenizer to show token ids as text");
    pr->echo = xstrdup(t);
    pr->echo_len = strlen(t);
    vllm_free(t);
    return 0;
}

void fields_free(struct gen_params *gp) {
    free(gp->bias_ids);
    free(gp->bias_vals);
    json_decref(gp->resp_echo);
    free(gp->request_id);
    free(gp->cache_salt);
}
