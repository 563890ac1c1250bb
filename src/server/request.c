// request.c - OpenAI request bodies to engine requests: field types and
// ranges, the prompt (text through the tokenizer, chat through the
// template), and the max_model_len check. Unknown fields are ignored, as
// vLLM does; fields vLLM knows but vllm.c cannot honour get a 400.
#include <limits.h>
#include <math.h>

#include "core/common.h"
#include "server/server_internal.h"

#define MAX_STOP 64

// The field, or NULL when it is absent or null (OpenAI's "not given").
static json_t *field(const json_t *body, const char *key) {
    json_t *v = json_object_get(body, key);
    return json_is_null(v) ? NULL : v;
}

static int get_bool(const json_t *body, const char *key, int *out, struct api_error *err) {
    json_t *v = field(body, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return api_fail(err, 400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

// An integer (or a number with no fraction, as pydantic takes it) in [lo, hi].
static int get_int64(const json_t *body, const char *key, long long lo, long long hi, long long *out,
                     struct api_error *err) {
    json_t *v = field(body, key);
    if (!v) return 0;
    double d = json_is_real(v) ? json_real_value(v) : 0;
    if (!json_is_integer(v) && !(json_is_real(v) && d == floor(d) && fabs(d) < 9e15))
        return api_fail(err, 400, key, "'%s' must be an integer", key);
    long long x = json_is_integer(v) ? json_integer_value(v) : (long long)d;
    if (x < lo || x > hi) return api_fail(err, 400, key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

static int get_int(const json_t *body, const char *key, int lo, int hi, int *out, struct api_error *err) {
    long long x = *out;
    if (get_int64(body, key, lo, hi, &x, err)) return -1;
    *out = (int)x;
    return 0;
}

static int get_float(const json_t *body, const char *key, float *out, struct api_error *err) {
    json_t *v = field(body, key);
    if (!v) return 0;
    if (!json_is_number(v)) return api_fail(err, 400, key, "'%s' must be a number", key);
    *out = (float)json_number_value(v);
    return 0;
}

int check_model(struct server *s, const json_t *body, struct api_error *err) {
    json_t *m = field(body, "model");
    if (!m) return 0;
    if (!json_is_string(m)) return api_fail(err, 400, "model", "'model' must be a string");
    const char *name = json_string_value(m);
    for (int i = 0; i < s->cfg.num_model_aliases; i++)
        if (!strcmp(name, s->cfg.model_aliases[i])) return 0;
    if (strcmp(name, s->cfg.served_model_name) && (!*s->cfg.model_path || strcmp(name, s->cfg.model_path)))
        return api_fail(err, 404, "model", "The model `%.200s` does not exist.", json_string_value(m));
    return 0;
}

// Fields that vLLM honours and vllm.c does not: a 400, never a silent ignore.
static int check_unsupported(const json_t *body, struct api_error *err) {
    static const char *const never[] = {"suffix", NULL};
    for (int i = 0; never[i]; i++)
        if (field(body, never[i])) return api_fail(err, 400, never[i], "'%s' is not supported", never[i]);
    int beam = 0;
    if (get_bool(body, "use_beam_search", &beam, err)) return -1;
    if (beam) return api_fail(err, 400, "use_beam_search", "beam search is not supported");
    return 0; // response_format, structured_outputs, guided_*: guided.c
}

static int get_stop(const json_t *body, struct gen_params *gp, struct api_error *err) {
    json_t *v = field(body, "stop");
    if (!v) return 0;
    int n = json_is_string(v) ? 1 : json_is_array(v) ? (int)json_array_size(v) : -1;
    if (n < 0 || n > MAX_STOP)
        return api_fail(err, 400, "stop", "'stop' must be a string or a list of at most %d strings", MAX_STOP);
    gp->stop = xcalloc(n ? n : 1, sizeof(char *));
    for (int i = 0; i < n; i++) {
        json_t *x = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(x) || !json_string_length(x))
            return api_fail(err, 400, "stop", "'stop' must hold non-empty strings");
        gp->stop[gp->sp.num_stop++] = xstrdup(json_string_value(x));
    }
    gp->sp.stop = (const char *const *)gp->stop;
    return 0;
}

// A list of token ids in [0, vocab), or -1 with a 400 naming `key`.
static int get_ids(struct server *s, const json_t *v, const char *key, int32_t **ids, int *n, struct api_error *err) {
    size_t len = json_array_size(v);
    *ids = xmalloc(sizeof(int32_t) * (len ? len : 1));
    *n = (int)len;
    for (size_t i = 0; i < len; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= s->info.vocab_size)
            return api_fail(err, 400, key, "%s[%zu] is not a token id in [0, %d)", key, i, s->info.vocab_size);
        (*ids)[i] = (int32_t)json_integer_value(x);
    }
    return 0;
}

static int get_sampling(struct server *s, const json_t *body, struct gen_params *gp, struct api_error *err) {
    struct vllm_sampling_params *sp = &gp->sp;
    long long seed = -1;
    if (get_float(body, "temperature", &sp->temperature, err) || get_float(body, "top_p", &sp->top_p, err) ||
        get_int(body, "top_k", INT_MIN, INT_MAX, &sp->top_k, err) || get_float(body, "min_p", &sp->min_p, err) ||
        get_float(body, "presence_penalty", &sp->presence_penalty, err) ||
        get_float(body, "frequency_penalty", &sp->frequency_penalty, err) ||
        get_float(body, "repetition_penalty", &sp->repetition_penalty, err) ||
        get_int64(body, "seed", LLONG_MIN, LLONG_MAX, &seed, err) ||
        get_int(body, "min_tokens", 0, INT_MAX, &sp->min_tokens, err) ||
        get_bool(body, "ignore_eos", &sp->ignore_eos, err) ||
        get_bool(body, "skip_special_tokens", &sp->skip_special_tokens, err) ||
        get_bool(body, "include_stop_str_in_output", &sp->include_stop_str_in_output, err) || get_stop(body, gp, err))
        return -1;
    // vLLM takes any int seed; the engine's seeds are >= 0, so fold negatives in.
    sp->seed = seed == -1 && !field(body, "seed") ? -1 : seed < 0 ? (int64_t)((uint64_t)seed >> 1) : seed;
    json_t *ids = field(body, "stop_token_ids");
    if (ids) {
        if (!json_is_array(ids)) return api_fail(err, 400, "stop_token_ids", "'stop_token_ids' must be a list of ids");
        if (get_ids(s, ids, "stop_token_ids", &gp->stop_ids, &sp->num_stop_token_ids, err)) return -1;
        sp->stop_token_ids = gp->stop_ids;
    }
    if (sp->num_stop && !s->info.has_tokenizer)
        return api_fail(err, 400, "stop", "stop strings need a tokenizer; the model has no tokenizer.json");
    return 0;
}

static int get_stream(const json_t *body, struct gen_params *gp, struct api_error *err) {
    if (get_bool(body, "stream", &gp->stream, err) || get_bool(body, "return_token_ids", &gp->return_token_ids, err))
        return -1;
    json_t *so = field(body, "stream_options");
    if (so && !json_is_object(so)) return api_fail(err, 400, "stream_options", "'stream_options' must be an object");
    return so ? get_bool(so, "include_usage", &gp->include_usage, err) : 0;
}

// A text longer than this holds more than max_model_len tokens: no token
// stands for more than max_token_bytes of text (x4: normalizers that shrink
// text, such as NFKC). It is refused before it is tokenized.
static size_t max_text_bytes(const struct server *s) {
    return (size_t)s->info.max_model_len * (size_t)MAX(s->max_token_bytes, 1) * 4;
}

static int check_text_len(const struct server *s, size_t len, const char *param, struct api_error *err) {
    if (len <= max_text_bytes(s)) return 0;
    return api_fail(err, 400, param,
                    "This model's maximum context length is %d tokens. However, your %s has %zu bytes of text, more "
                    "than %d tokens can hold (a token is at most %d bytes). Please reduce the length of the %s.",
                    s->info.max_model_len, param, len, s->info.max_model_len, s->max_token_bytes, param);
}

static int tokenize_text(struct server *s, const char *text, size_t len, int add_special, int32_t **ids, int *n,
                         struct api_error *err) {
    if (!s->info.has_tokenizer)
        return api_fail(err, 400, "prompt", "the model has no tokenizer.json: send the prompt as token ids");
    if (check_text_len(s, len, "prompt", err)) return -1;
    if (vllm_tokenize(s->engine, text, len, add_special, ids, n))
        return api_fail(err, 400, "prompt", "tokenizing the prompt: %s", vllm_last_error());
    return 0;
}

// One prompt's text ("prompt" or "messages") or token ids through the
// checks that depend on it: truncation, echo, emptiness and max_tokens.
static int get_max_tokens(struct server *s, const json_t *body, const struct gen_params *gp, struct gen_prompt *pr,
                          struct api_error *err);

static int prompt_add(struct server *s, const json_t *body, struct gen_params *gp, struct gen_prompt *pr,
                      const json_t *text, struct api_error *err) {
    gp->prompts = xrealloc(gp->prompts, sizeof *gp->prompts * (size_t)(gp->num_prompts + 1));
    gp->prompts[gp->num_prompts++] = *pr; // owned by gp from here on, even on an error below
    pr = &gp->prompts[gp->num_prompts - 1];
    fields_truncate(gp, pr);
    if (fields_echo_text(s, gp, text, pr, err)) return -1;
    if (pr->num == 0) return api_fail(err, 400, gp->kind == API_CHAT ? "messages" : "prompt", "the prompt is empty");
    return get_max_tokens(s, body, gp, pr, err);
}

// "prompt": a string or a list of ids, or a list of those (of one kind), at
// most GEN_MAX_PROMPTS; each list entry is one prompt with n choices.
static int completion_prompt(struct server *s, const json_t *body, struct gen_params *gp, struct api_error *err) {
    int add_special = 1;
    if (get_bool(body, "add_special_tokens", &add_special, err)) return -1;
    json_t *p = field(body, "prompt");
    if (!p) return api_fail(err, 400, "prompt", "'prompt' is required");
    if (!json_is_string(p) && !json_is_array(p))
        return api_fail(err, 400, "prompt", "'prompt' must be a string, a list of token ids, or a list of those");
    if (json_is_array(p) && json_array_size(p) == 0) return api_fail(err, 400, "prompt", "'prompt' is empty");
    // one prompt (a string, or ids), or a list of them
    int list = json_is_array(p) && !json_is_integer(json_array_get(p, 0));
    size_t np = list ? json_array_size(p) : 1;
    if (np > GEN_MAX_PROMPTS)
        return api_fail(err, 400, "prompt", "'prompt' holds %zu prompts, more than %d", np, GEN_MAX_PROMPTS);
    if (np * (size_t)gp->n > GEN_MAX_CHOICES)
        return api_fail(err, 400, gp->n > 1 ? "n" : "prompt", "%zu prompts x n=%d make %zu choices, more than %d", np,
                        gp->n, np * (size_t)gp->n, GEN_MAX_CHOICES);
    for (size_t i = 0; i < np; i++) {
        json_t *x = list ? json_array_get(p, i) : p;
        struct gen_prompt pr = {0};
        int rc;
        if (json_is_string(x) != json_is_string(json_array_get(p, 0)) && list)
            return api_fail(err, 400, "prompt", "'prompt' mixes strings and lists of token ids");
        if (json_is_string(x)) {
            rc = tokenize_text(s, json_string_value(x), json_string_length(x), add_special, &pr.ids, &pr.num, err);
        } else if (json_is_array(x) && json_array_size(x)) {
            rc = get_ids(s, x, "prompt", &pr.ids, &pr.num, err);
        } else {
            return api_fail(err, 400, "prompt", "prompt[%zu] must be a string or a non-empty list of token ids", i);
        }
        if (rc) {
            free(pr.ids);
            return -1;
        }
        if (prompt_add(s, body, gp, &pr, json_is_string(x) ? x : NULL, err)) return -1;
    }
    return 0;
}

// A message's content as the template sees it: text parts joined by "\n".
static json_t *message_content(const json_t *c, size_t i, struct api_error *err) {
    if (!c) return json_string("");
    if (json_is_string(c)) return json_incref((json_t *)c);
    if (!json_is_array(c)) {
        api_fail(err, 400, "messages", "messages[%zu].content must be a string or a list of parts", i);
        return NULL;
    }
    size_t len = 0, j;
    json_t *part;
    json_array_foreach(c, j, part) {
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(json_object_get(part, "type")) || strcmp(json_string_value(json_object_get(part, "type")), "text") ||
            !json_is_string(t)) {
            api_fail(err, 400, "messages", "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} parts are supported", i, j);
            return NULL;
        }
        len += json_string_length(t) + 1;
    }
    char *buf = xmalloc(len + 1);
    size_t o = 0;
    json_array_foreach(c, j, part) {
        json_t *t = json_object_get(part, "text");
        if (j) buf[o++] = '\n';
        memcpy(buf + o, json_string_value(t), json_string_length(t));
        o += json_string_length(t);
    }
    json_t *r = json_stringn(buf, o);
    free(buf);
    return r;
}

// "tools" and "tool_choice" against OpenAI's schema: a list of
// {"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}, and "none" | "auto" | "required" | {"type": "function",
// "function": {"name"}} (guided.c constrains the last two by the tools'
// grammar).
static int check_tools(const json_t *body, struct api_error *err) {
    json_t *tools = field(body, "tools"), *choice = field(body, "tool_choice"), *t;
    int par = 0;
    if (get_bool(body, "parallel_tool_calls", &par, err)) return -1;
    if (tools && !json_is_array(tools)) return api_fail(err, 400, "tools", "'tools' must be a list of tools");
    size_t i;
    json_array_foreach(tools, i, t) {
        json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function"))
            return api_fail(err, 400, "tools", "tools[%zu] must be an object with \"type\": \"function\"", i);
        if (!json_is_object(fn)) return api_fail(err, 400, "tools", "tools[%zu].function must be an object", i);
        json_t *name = json_object_get(fn, "name"), *desc = field(fn, "description"), *params = field(fn, "parameters");
        const char *nm = json_string_value(name);
        size_t len = nm ? strlen(nm) : 0;
        int ok = len > 0 && len <= 64 && len == json_string_length(name);
        for (size_t k = 0; ok && k < len; k++)
            ok = (nm[k] >= 'a' && nm[k] <= 'z') || (nm[k] >= 'A' && nm[k] <= 'Z') || (nm[k] >= '0' && nm[k] <= '9') ||
                 nm[k] == '_' || nm[k] == '-';
        if (!ok)
            return api_fail(err, 400, "tools", "tools[%zu].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i);
        if (desc && !json_is_string(desc))
            return api_fail(err, 400, "tools", "tools[%zu].function.description must be a string", i);
        if (params && !json_is_object(params))
            return api_fail(err, 400, "tools", "tools[%zu].function.parameters must be a JSON Schema object", i);
        if (field(fn, "strict") && !json_is_boolean(field(fn, "strict")))
            return api_fail(err, 400, "tools", "tools[%zu].function.strict must be a boolean", i);
    }
    if (!choice) return 0;
    const char *c = json_string_value(choice);
    if (!json_array_size(tools) && !(c && !strcmp(c, "none")))
        return api_fail(err, 400, "tool_choice", "When using `tool_choice`, `tools` must be set.");
    if (c && (!strcmp(c, "none") || !strcmp(c, "auto"))) return 0;
    if (c && !strcmp(c, "required")) return 0; // constrained by the tools' grammar (guided.c)
    if (json_is_object(choice)) {
        json_t *type = json_object_get(choice, "type"), *fn = json_object_get(choice, "function");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function") || !json_is_object(fn) ||
            !json_is_string(json_object_get(fn, "name")))
            return api_fail(err, 400, "tool_choice",
                            "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        return 0; // guided.c checks the name against tools
    }
    return api_fail(err, 400, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}");
}

// Names the server sets in the template's variables: chat_template_kwargs
// may not replace them (the validated messages would not be what renders).
static const char *const reserved_kwargs[] = {"messages", "tools", "add_generation_prompt", "continue_final_message",
                                              "bos_token", "eos_token", NULL};

static int check_kwargs(const json_t *kw, struct api_error *err) {
    if (!kw) return 0;
    if (!json_is_object(kw)) return api_fail(err, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (int i = 0; reserved_kwargs[i]; i++)
        if (json_object_get(kw, reserved_kwargs[i]))
            return api_fail(err, 400, "chat_template_kwargs",
                            "'chat_template_kwargs' may not set '%s': the server sets it from the request",
                            reserved_kwargs[i]);
    return 0;
}

// An assistant message's tool calls carry their arguments as a JSON string
// on the wire; templates expect the object (`arguments | tojson`, or items()),
// so a string that parses to an object becomes it, as vLLM does.
static void tool_call_arguments(json_t *msg) {
    json_t *calls = json_object_get(msg, "tool_calls"), *tc;
    size_t i;
    json_array_foreach(calls, i, tc) {
        json_t *fn = json_object_get(tc, "function"), *a = json_object_get(fn, "arguments");
        if (!json_is_string(a)) continue;
        json_t *obj = json_loads(json_string_value(a), JSON_DECODE_ANY, NULL);
        if (json_is_object(obj)) json_object_set_new(fn, "arguments", obj);
        else json_decref(obj);
    }
}

json_t *chat_template_input(const json_t *body, size_t *text_bytes, struct api_error *err) {
    json_t *msgs = field(body, "messages"), *m;
    *text_bytes = 0;
    if (!json_is_array(msgs) || !json_array_size(msgs)) {
        api_fail(err, 400, "messages", "'messages' must be a non-empty list");
        return NULL;
    }
    json_t *kw = field(body, "chat_template_kwargs"), *tools = field(body, "tools");
    int gen_prompt = 1, cont = 0;
    if (check_kwargs(kw, err) || check_tools(body, err) || get_bool(body, "add_generation_prompt", &gen_prompt, err) ||
        get_bool(body, "continue_final_message", &cont, err))
        return NULL;
    json_t *req = json_object(), *norm = json_array();
    json_object_set_new(req, "messages", norm);
    size_t i;
    json_array_foreach(msgs, i, m) {
        json_t *content;
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            api_fail(err, 400, "messages", "messages[%zu] must be an object with a string 'role'", i);
        } else if ((content = message_content(field(m, "content"), i, err))) {
            *text_bytes += json_string_length(content);
            json_t *c = json_deep_copy(m);
            json_object_set_new(c, "content", content);
            tool_call_arguments(c);
            json_array_append_new(norm, c);
            continue;
        }
        json_decref(req);
        return NULL;
    }
    if (kw) json_object_update(req, kw);
    if (fields_documents(body, req, err)) {
        json_decref(req);
        return NULL;
    }
    json_object_set_new(req, "add_generation_prompt", json_boolean(gen_prompt && !cont));
    json_object_set_new(req, "continue_final_message", json_boolean(cont));
    if (tools) json_object_set(req, "tools", tools);
    json_t *effort = field(body, "reasoning_effort"); // a template variable (gpt-oss's); guided.c checks it
    if (json_is_string(effort)) json_object_set(req, "reasoning_effort", effort);
    return req;
}

static int chat_prompt(struct server *s, const json_t *body, int32_t **ids, int *n, struct api_error *err) {
    int add_special = 0; // the template writes BOS itself
    const char *tmpl;
    if (get_bool(body, "add_special_tokens", &add_special, err) || fields_chat_template(s, body, &tmpl, err)) return -1;
    if (!s->info.has_chat_template && !tmpl)
        return api_fail(err, 400, "messages", "the model has no chat template (tokenizer_config.json chat_template)");
    size_t text_bytes;
    json_t *req = chat_template_input(body, &text_bytes, err);
    if (!req) return -1;
    if (check_text_len(s, text_bytes, "messages", err)) return json_decref(req), -1;
    char *js = json_dumps(req, JSON_COMPACT), *text = NULL;
    json_decref(req);
    int rc = vllm_apply_chat_template_source(s->engine, tmpl, js, &text);
    free(js);
    if (rc) return api_fail(err, 400, "messages", "applying the chat template: %s", vllm_last_error());
    rc = check_text_len(s, strlen(text), "messages", err) ||
         tokenize_text(s, text, strlen(text), add_special, ids, n, err);
    vllm_free(text);
    return rc;
}

int tokenize_body(struct server *s, const json_t *body, int32_t **ids, int *n, struct api_error *err) {
    *ids = NULL;
    if (field(body, "messages")) return chat_prompt(s, body, ids, n, err);
    int add_special = 1;
    json_t *p = field(body, "prompt");
    if (get_bool(body, "add_special_tokens", &add_special, err)) return -1;
    if (!json_is_string(p)) return api_fail(err, 400, "prompt", "'prompt' (a string) or 'messages' is required");
    return tokenize_text(s, json_string_value(p), json_string_length(p), add_special, ids, n, err);
}

// Max tokens: asked for (checked against max_model_len, as vLLM does), or
// what is left (chat) or 16 (completions), for each prompt.
static int get_max_tokens(struct server *s, const json_t *body, const struct gen_params *gp, struct gen_prompt *pr,
                          struct api_error *err) {
    int mml = s->info.max_model_len, n = pr->num, mt = -1;
    const char *what = gp->kind == API_CHAT ? "messages" : "prompt";
    const char *key = gp->kind == API_CHAT && field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (get_int(body, key, gp->echo ? 0 : 1, INT_MAX, &mt, err)) return -1;
    if (mt == 0) mt = 1; // echo's max_tokens 0 (gp->echo_only): vLLM generates one token and drops it
    if (n >= mml)
        return api_fail(err, 400, what,
                        "This model's maximum context length is %d tokens. However, your %s has %d tokens, which "
                        "leaves no room for the completion. Please reduce the length of the %s.",
                        mml, what, n, what);
    if (mt > 0 && (long long)n + mt > mml)
        return api_fail(err, 400, key,
                        "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in "
                        "the %s, %d in the completion). Please reduce the length of the %s or completion.",
                        mml, (long long)n + mt, n, what, mt, what);
    pr->max_tokens = mt > 0 ? mt : gp->kind == API_CHAT ? mml - n : MIN(16, mml - n);
    if (gp->max_new_tokens) pr->max_tokens = MIN(pr->max_tokens, gp->max_new_tokens); // as vLLM: the least
    if (gp->sp.min_tokens > pr->max_tokens)
        return api_fail(err, 400, "min_tokens", "'min_tokens' (%d) is larger than max_tokens (%d)", gp->sp.min_tokens,
                        pr->max_tokens);
    return 0;
}

static int get_logprobs(const json_t *body, struct gen_params *gp, struct api_error *err) {
    gp->logprobs = -1;
    if (gp->kind == API_COMPLETION) {
        int k = -1;
        if (json_is_boolean(json_object_get(body, "logprobs")))
            return api_fail(err, 400, "logprobs", "'logprobs' must be an integer (the number of top logprobs)");
        if (get_int(body, "logprobs", 0, VLLM_MAX_LOGPROBS, &k, err)) return -1;
        gp->logprobs = k;
    } else {
        int on = 0, k = 0;
        if (get_bool(body, "logprobs", &on, err) || get_int(body, "top_logprobs", 0, VLLM_MAX_LOGPROBS, &k, err)) return -1;
        if (k > 0 && !on) return api_fail(err, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        gp->logprobs = on ? k : -1;
    }
    gp->sp.logprobs = gp->logprobs;
    return 0;
}

int gen_params_parse(struct server *s, enum api_kind kind, const json_t *body, struct gen_params *gp,
                     struct api_error *err) {
    memset(gp, 0, sizeof *gp);
    gp->kind = kind;
    vllm_sampling_params_default(&gp->sp);
    fields_defaults(s, gp);
    int rc = check_unsupported(body, err) || fields_parse(s, body, gp, err) || fields_n(body, gp, err) ||
             get_sampling(s, body, gp, err) || get_stream(body, gp, err) || get_logprobs(body, gp, err) ||
             fields_echo(body, gp, err) || prompt_lp_parse(body, gp, err);
    json_t *mt = field(body, "max_tokens");
    gp->echo_only = gp->echo && json_is_integer(mt) && json_integer_value(mt) == 0;
    if (!rc && kind == API_CHAT) {
        struct gen_prompt pr = {0};
        rc = chat_prompt(s, body, &pr.ids, &pr.num, err);
        if (rc) free(pr.ids);
        else rc = prompt_add(s, body, gp, &pr, NULL, err);
    } else if (!rc) {
        rc = completion_prompt(s, body, gp, err);
    }
    if (!rc) gp->sp.max_tokens = gp->prompts[0].max_tokens; // gen.c sets each prompt's
    if (!rc) rc = guided_parse(s, kind, body, gp, err);
    if (rc) gen_params_free(gp);
    return rc ? -1 : 0;
}

void gen_params_free(struct gen_params *gp) {
    for (int i = 0; i < gp->sp.num_stop; i++) free(gp->stop[i]);
    free(gp->stop);
    free(gp->stop_ids);
    for (int i = 0; i < gp->num_prompts; i++) free(gp->prompts[i].ids), free(gp->prompts[i].echo);
    free(gp->prompts);
    fields_free(gp);
    guided_req_free(gp->guided);
    memset(gp, 0, sizeof *gp);
}

// ------------------------------------------------ /tokenize, /detokenize --

json_t *tokenize_reply(struct server *s, const json_t *body, struct api_error *err) {
    int32_t *ids = NULL;
    int n = 0;
    if (tokenize_body(s, body, &ids, &n, err)) {
        free(ids);
        return NULL;
    }
    json_t *toks = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(toks, json_integer(ids[i]));
    free(ids);
    return json_pack("{s:i,s:i,s:o,s:n}", "count", n, "max_model_len", s->info.max_model_len, "tokens", toks,
                     "token_strs");
}

json_t *detokenize_reply(struct server *s, const json_t *body, struct api_error *err) {
    json_t *toks = json_object_get(body, "tokens");
    if (!json_is_array(toks)) return api_fail(err, 400, "tokens", "'tokens' must be a list of token ids"), NULL;
    if (!s->info.has_tokenizer) return api_fail(err, 400, NULL, "the model has no tokenizer"), NULL;
    int32_t *ids;
    int n;
    if (get_ids(s, toks, "tokens", &ids, &n, err)) return free(ids), NULL;
    char *text = NULL;
    json_t *r = NULL;
    if (vllm_detokenize(s->engine, ids, n, 0, &text)) api_fail(err, 400, "tokens", "%s", vllm_last_error());
    else r = json_pack("{s:o}", "prompt", json_text(text, strlen(text)));
    vllm_free(text);
    free(ids);
    return r;
}
