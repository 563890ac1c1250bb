// guided.c - structured output, tool calls and reasoning in the OpenAI
// server (src/structured does the grammars and the parsers).
//
// Requests: response_format (json_object, json_schema), vLLM's
// structured_outputs {json, regex, choice, grammar, json_object} and the
// older guided_json / guided_regex / guided_choice / guided_grammar compile
// (through a registry: agents resend the same schemas) to a grammar whose
// matcher becomes the request's vllm_constraint. tool_choice "required" or a
// named function compiles the tools' call grammar in the server's tool-call
// format (hermes when --tool-call-parser is not set). Parsing happens on the
// worker thread that parses the body; the engine thread only asks the
// matcher for masks.
//
// Answers (chat only): with --reasoning-parser the text splits into
// reasoning_content and content (a grammar then waits for the reasoning's
// end tag while thinking is on); with tools in play (auto under
// --enable-auto-tool-choice, or a forced choice) content is parsed into
// tool_calls. Streamed, the same parsers run incrementally.
#include <time.h>

#include "core/common.h"
#include "engine/engine.h"
#include "server/server_internal.h"
#include "structured/structured.h"
#include "tokenizer/tokenizer.h"

#define THINK_OPEN "<think>"
#define THINK_END "</think>"

struct guided {
    struct sg_registry *reg;
    pthread_mutex_t mu;      // guards vocab's creation and seed
    struct sg_vocab *vocab;  // built on first use (a trie of every token)
    int have_tools, have_reasoning, auto_tools;
    enum sg_tool_format tfmt;
    enum sg_reasoning_format rfmt;
    uint64_t seed;
};

enum tool_mode { TOOLS_OFF, TOOLS_AUTO, TOOLS_REQUIRED, TOOLS_NAMED };

struct guided_req {
    struct sg_grammar *grammar; // NULL: unconstrained
    struct sg_vocab *vocab;
    int chat;
    int reasoning, thinking;
    int include_reasoning; // false: reasoning_content is dropped (vLLM's include_reasoning)
    enum tool_mode tools;
    int parallel;
    enum sg_tool_format tfmt;
    enum sg_reasoning_format rfmt;
    json_t *tool_list; // the request's tools
    uint64_t id_seed;
    // Reasoning first: the grammar applies from the token after the
    // reasoning's end tag (vLLM's reasoning-aware structured output).
    int reason_first;
    const struct tokenizer *tok;
    uint32_t *allow; // allowed_token_ids as a mask [CDIV(vocab_size, 32)], or NULL
    int allow_words;
    struct bad_words *bad; // bad_words as token sequences, or NULL
    // streaming
    struct sg_reasoning_stream *rs;
    struct sg_tool_stream *ts;
    int calls_sent;
};

// ------------------------------------------------------------- server --

int guided_init(struct server *s) {
    struct guided *g = xcalloc(1, sizeof *g);
    s->guided = g;
    pthread_mutex_init(&g->mu, NULL);
    g->reg = sg_registry_create(64);
    g->seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
    const struct server_config *c = &s->cfg;
    if (c->tool_call_parser) {
        TRY(sg_tool_format_parse(c->tool_call_parser, &g->tfmt));
        g->have_tools = 1;
    }
    if (c->reasoning_parser) {
        TRY(sg_reasoning_format_parse(c->reasoning_parser, &g->rfmt));
        g->have_reasoning = 1;
    }
    if (c->enable_auto_tool_choice && !g->have_tools)
        return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "--enable-auto-tool-choice needs --tool-call-parser");
    g->auto_tools = c->enable_auto_tool_choice;
    return VLLM_OK;
}

void guided_free(struct server *s) {
    struct guided *g = s->guided;
    if (!g) return;
    sg_registry_free(g->reg);
    sg_vocab_free(g->vocab);
    pthread_mutex_destroy(&g->mu);
    free(g);
    s->guided = NULL;
}

static struct sg_vocab *get_vocab(struct server *s, struct api_error *err) {
    struct guided *g = s->guided;
    pthread_mutex_lock(&g->mu);
    if (!g->vocab && s->engine && s->engine->tok)
        g->vocab = sg_vocab_create(s->engine->tok, s->info.eos_token_ids, s->info.num_eos_token_ids);
    struct sg_vocab *v = g->vocab;
    pthread_mutex_unlock(&g->mu);
    if (!v) api_fail(err, 400, NULL, "structured output needs the model's tokenizer (tokenizer.json)");
    else if (sg_vocab_size(v) > s->info.vocab_size) {
        api_fail(err, 400, NULL, "the tokenizer has %d ids, more than the model's %d", sg_vocab_size(v),
                 s->info.vocab_size);
        v = NULL;
    }
    return v;
}

// ------------------------------------------------------------ requests --

static json_t *field(const json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

// One structured-output spec: kind and its JSON (schema, string, choices).
struct spec {
    enum sg_spec kind;
    json_t *value; // owned
    const char *param;
};

static int set_spec(struct spec *sp, enum sg_spec kind, json_t *value, const char *param, struct api_error *err) {
    if (sp->param) {
        json_decref(value);
        return api_fail(err, 400, param, "'%s' and '%s' both ask for structured output: give one", sp->param, param);
    }
    sp->kind = kind, sp->value = value, sp->param = param;
    return 0;
}

// A schema as an object, or as JSON text (vLLM takes both).
static int schema_value(json_t *v, const char *param, json_t **out, struct api_error *err) {
    if (json_is_object(v) || json_is_boolean(v)) {
        *out = json_incref(v);
        return 0;
    }
    if (json_is_string(v)) {
        json_error_t je;
        *out = json_loadb(json_string_value(v), json_string_length(v), JSON_DECODE_ANY, &je);
        if (*out && (json_is_object(*out) || json_is_boolean(*out))) return 0;
        json_decref(*out);
        return api_fail(err, 400, param, "'%s' is not a JSON schema: %s", param, *out ? "not an object" : je.text);
    }
    return api_fail(err, 400, param, "'%s' must be a JSON schema (an object)", param);
}

static int string_spec(json_t *v, const char *param, enum sg_spec kind, struct spec *sp, struct api_error *err) {
    if (!json_is_string(v)) return api_fail(err, 400, param, "'%s' must be a string", param);
    return set_spec(sp, kind, json_incref(v), param, err);
}

static int choice_spec(json_t *v, const char *param, struct spec *sp, struct api_error *err) {
    size_t i;
    json_t *c;
    if (!json_is_array(v) || !json_array_size(v)) return api_fail(err, 400, param, "'%s' must be a non-empty list of strings", param);
    json_array_foreach(v, i, c) if (!json_is_string(c)) return api_fail(err, 400, param, "'%s'[%zu] must be a string", param, i);
    return set_spec(sp, SG_SPEC_CHOICE, json_incref(v), param, err);
}

static int response_format(const json_t *body, struct spec *sp, struct api_error *err) {
    json_t *rf = field(body, "response_format");
    if (!rf) return 0;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        return api_fail(err, 400, "response_format", "'response_format' must be an object with a string 'type'");
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) return set_spec(sp, SG_SPEC_JSON_OBJECT, NULL, "response_format", err);
    if (strcmp(type, "json_schema"))
        return api_fail(err, 400, "response_format",
                        "response_format type '%.64s' is not supported (text, json_object or json_schema)", type);
    json_t *js = field(rf, "json_schema"), *schema = js ? field(js, "schema") : NULL, *v;
    if (!json_is_object(js)) return api_fail(err, 400, "response_format", "'response_format.json_schema' must be an object");
    if ((v = field(js, "name")) && !json_is_string(v))
        return api_fail(err, 400, "response_format", "'response_format.json_schema.name' must be a string");
    if ((v = field(js, "strict")) && !json_is_boolean(v))
        return api_fail(err, 400, "response_format", "'response_format.json_schema.strict' must be a boolean");
    json_t *s = NULL;
    if (!schema) return set_spec(sp, SG_SPEC_JSON_OBJECT, NULL, "response_format", err); // no schema: any JSON object
    if (schema_value(schema, "response_format", &s, err)) return -1;
    return set_spec(sp, SG_SPEC_JSON_SCHEMA, s, "response_format", err);
}

static int structured_outputs(const json_t *body, struct spec *sp, struct api_error *err) {
    json_t *so = field(body, "structured_outputs"), *v;
    const char *P = "structured_outputs";
    if (!so) return 0;
    if (!json_is_object(so)) return api_fail(err, 400, P, "'structured_outputs' must be an object");
    if (field(so, "structural_tag")) return api_fail(err, 400, P, "'structured_outputs.structural_tag' is not supported");
    json_t *s = NULL;
    if ((v = field(so, "json")) && (schema_value(v, P, &s, err) || set_spec(sp, SG_SPEC_JSON_SCHEMA, s, P, err))) return -1;
    if ((v = field(so, "regex")) && string_spec(v, P, SG_SPEC_REGEX, sp, err)) return -1;
    if ((v = field(so, "choice")) && choice_spec(v, P, sp, err)) return -1;
    if ((v = field(so, "grammar")) && string_spec(v, P, SG_SPEC_GBNF, sp, err)) return -1;
    if (json_is_true(field(so, "json_object")) && set_spec(sp, SG_SPEC_JSON_OBJECT, NULL, P, err)) return -1;
    return 0;
}

static int guided_fields(const json_t *body, struct spec *sp, struct api_error *err) {
    json_t *v, *s = NULL;
    if ((v = field(body, "guided_json")) &&
        (schema_value(v, "guided_json", &s, err) || set_spec(sp, SG_SPEC_JSON_SCHEMA, s, "guided_json", err)))
        return -1;
    if ((v = field(body, "guided_regex")) && string_spec(v, "guided_regex", SG_SPEC_REGEX, sp, err)) return -1;
    if ((v = field(body, "guided_choice")) && choice_spec(v, "guided_choice", sp, err)) return -1;
    if ((v = field(body, "guided_grammar")) && string_spec(v, "guided_grammar", SG_SPEC_GBNF, sp, err)) return -1;
    return 0;
}

// tool_choice: the mode, and the named function (checked against tools).
static int tool_mode(struct server *s, const json_t *body, struct guided_req *q, const char **name,
                     struct api_error *err) {
    json_t *tools = field(body, "tools"), *choice = field(body, "tool_choice");
    *name = NULL;
    int ntools = json_is_array(tools) ? (int)json_array_size(tools) : 0;
    const char *c = json_string_value(choice);
    if (choice && !ntools && !(c && !strcmp(c, "none")))
        return api_fail(err, 400, "tool_choice", "When using `tool_choice`, `tools` must be set.");
    q->tools = TOOLS_OFF;
    if (!ntools || (c && !strcmp(c, "none"))) return 0;
    if (!choice || (c && !strcmp(c, "auto"))) {
        // Without --enable-auto-tool-choice the tools only reach the template
        // and the text stays content (vLLM answers an explicit "auto" with a
        // 400 there; vllm.c served it before it had parsers, and still does).
        if (s->guided->auto_tools) q->tools = TOOLS_AUTO;
        return 0;
    }
    if (c && !strcmp(c, "required")) {
        q->tools = TOOLS_REQUIRED;
        return 0;
    }
    *name = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        if (n && *name && !strcmp(n, *name)) {
            q->tools = TOOLS_NAMED;
            return 0;
        }
    }
    return api_fail(err, 400, "tool_choice", "tool_choice names the function '%.64s', which is not in 'tools'",
                    *name ? *name : "");
}

// The issue-14 fields of the schemas that vllm.c does not do: a 400 naming
// them, never a silent ignore. guided_decoding_backend is accepted (there is
// one backend); include_reasoning is a boolean.
static int check_fields(const json_t *body, struct guided_req *q, struct api_error *err) {
    static const char *const no[][2] = {
        {"structural_tag", "structural tags are not supported"},
        {"guided_whitespace_pattern", "the grammars' whitespace is fixed (docs: src/structured/structured.h)"},
        {"functions", "it is deprecated: use tools"},
        {"function_call", "it is deprecated: use tool_choice"},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (field(body, no[i][0])) return api_fail(err, 400, no[i][0], "'%s' is not supported: %s", no[i][0], no[i][1]);
    json_t *v;
    if ((v = field(body, "guided_decoding_backend")) && !json_is_string(v))
        return api_fail(err, 400, "guided_decoding_backend", "'guided_decoding_backend' must be a string");
    if ((v = field(body, "include_reasoning")) && !json_is_boolean(v))
        return api_fail(err, 400, "include_reasoning", "'include_reasoning' must be a boolean");
    q->include_reasoning = !json_is_false(v);
    const char *e = json_string_value(field(body, "reasoning_effort"));
    if (field(body, "reasoning_effort") && (!e || (strcmp(e, "low") && strcmp(e, "medium") && strcmp(e, "high"))))
        return api_fail(err, 400, "reasoning_effort", "'reasoning_effort' must be \"low\", \"medium\" or \"high\"");
    return 0;
}

static int compile(struct server *s, const json_t *body, struct guided_req *q, struct api_error *err) {
    struct guided *gs = s->guided;
    struct spec sp = {0};
    int rc = check_fields(body, q, err) || response_format(body, &sp, err) || structured_outputs(body, &sp, err) ||
             guided_fields(body, &sp, err);
    const char *name = NULL;
    if (!rc && q->chat) rc = tool_mode(s, body, q, &name, err);
    if (!rc && sp.param && (q->tools == TOOLS_REQUIRED || q->tools == TOOLS_NAMED))
        rc = api_fail(err, 400, sp.param, "'%s' cannot be combined with a forced tool_choice", sp.param);
    if (rc) return json_decref(sp.value), -1;
    if (!sp.param && q->tools != TOOLS_REQUIRED && q->tools != TOOLS_NAMED) return 0;
    if (sp.param) { // compiled before the vocabulary is needed: a bad spec is the answer first
        rc = sg_registry_get(gs->reg, sp.kind, sp.value, &q->grammar);
        if (rc) api_fail(err, 400, sp.param, "%s: %s", sp.param, vllm_last_error());
    } else {
        rc = sg_compile_tool_call(q->tfmt, q->tool_list, name, name ? 0 : q->parallel, &q->grammar); // named: one call
        if (rc) api_fail(err, 400, "tools", "the tools' call grammar: %s", vllm_last_error());
    }
    json_decref(sp.value);
    if (rc || !(q->vocab = get_vocab(s, err))) return -1;
    sg_grammar_warm(q->grammar, q->vocab); // here, on the worker, not inside an engine step
    return 0;
}

// Whether the prompt leaves the reasoning open: its last THINK_OPEN has no
// THINK_END after it. The tail of the prompt's text, from its last ids.
static int prompt_state(const struct tokenizer *t, const int32_t *ids, int n) {
    char tail[512], buf[256];
    size_t len = 0;
    for (int i = MAX(0, n - 48); i < n; i++) {
        int m = tok_token_bytes(t, ids[i], buf, sizeof buf);
        if (m < 0 || m > (int)sizeof buf) m = 0;
        if (len + (size_t)m >= sizeof tail) len = 0; // keep the text near the end
        memcpy(tail + len, buf, (size_t)m);
        len += (size_t)m;
    }
    tail[len] = 0;
    char *open = NULL, *end = NULL, *p;
    for (p = tail; (p = strstr(p, THINK_OPEN)); p++) open = p;
    for (p = tail; (p = strstr(p, THINK_END)); p++) end = p;
    return open && !(end && end > open) ? 1 : end ? -1 : 0; // 1 open, -1 closed, 0 neither
}

// With --reasoning-parser and thinking on, a grammar waits for the end of
// the reasoning (the model's THINK_END), unless the prompt already closed it;
// with thinking off the answer is all content and the grammar starts at once.
static void reasoning_first(struct server *s, const struct gen_params *gp, struct guided_req *q) {
    const struct tokenizer *t = s->engine ? s->engine->tok : NULL;
    int st = t ? prompt_state(t, gp->prompts[0].ids, gp->prompts[0].num) : -1;
    q->tok = t;
    q->reason_first = q->thinking && st >= 0;
    // constrained from its first token, none of the answer is reasoning
    if (!q->reason_first) q->reasoning = 0;
}

// vLLM's allowed_token_ids: only these ids may be sampled (EOS too only if
// listed), with a grammar or without; the same mask path.
static int allowed_ids(struct server *s, const json_t *body, struct guided_req *q, struct api_error *err) {
    json_t *a = field(body, "allowed_token_ids"), *v;
    if (!a) return 0;
    int V = s->info.vocab_size;
    if (!json_is_array(a) || !json_array_size(a))
        return api_fail(err, 400, "allowed_token_ids", "'allowed_token_ids' must be a non-empty list of token ids");
    q->allow_words = CDIV(V, 32);
    q->allow = xcalloc((size_t)q->allow_words, sizeof *q->allow);
    size_t i;
    json_array_foreach(a, i, v) {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= V)
            return api_fail(err, 400, "allowed_token_ids", "allowed_token_ids[%zu] is not a token id in [0, %d)", i, V);
        q->allow[id >> 5] |= 1u << (id & 31);
    }
    return 0;
}

// vLLM's bad_words: each word's token sequence, as it starts the text and,
// when that is a different single word's worth of tokens, after a space.
// The last id of a sequence is banned where the output so far ends in the
// ids before it (a one-token word: everywhere).
struct bad_words {
    int32_t *ids; // the sequences one after another
    int *off;     // sequence i: ids[off[i] .. off[i + 1])
    int n, longest;
};

static void bad_words_free(struct bad_words *b) {
    if (!b) return;
    free(b->ids), free(b->off), free(b);
}

static void bad_words_add(struct bad_words *b, const int32_t *ids, int n) {
    b->ids = xrealloc(b->ids, sizeof *b->ids * (size_t)(b->off[b->n] + n));
    memcpy(b->ids + b->off[b->n], ids, sizeof *ids * (size_t)n);
    b->off = xrealloc(b->off, sizeof *b->off * (size_t)(b->n + 2));
    b->off[b->n + 1] = b->off[b->n] + n;
    b->n++;
    b->longest = MAX(b->longest, n);
}

static int bad_words(struct server *s, const json_t *body, struct guided_req *q, struct api_error *err) {
    json_t *a = field(body, "bad_words"), *v;
    if (!a || (json_is_array(a) && !json_array_size(a))) return 0;
    if (!json_is_array(a)) return api_fail(err, 400, "bad_words", "'bad_words' must be a list of strings");
    if (!s->info.has_tokenizer) return api_fail(err, 400, "bad_words", "'bad_words' needs the model's tokenizer");
    struct bad_words *b = q->bad = xcalloc(1, sizeof *b);
    b->off = xcalloc(1, sizeof *b->off);
    size_t i;
    json_array_foreach(a, i, v) {
        if (!json_is_string(v)) return api_fail(err, 400, "bad_words", "bad_words[%zu] is not a string", i);
        const char *w = json_string_value(v);
        while (*w == ' ' || *w == '\t' || *w == '\n' || *w == '\r') w++;
        if (!*w) continue;
        int first = b->n;
        for (int space = 0; space < 2; space++) {
            char *text = xmalloc(strlen(w) + 2);
            snprintf(text, strlen(w) + 2, "%s%s", space ? " " : "", w);
            int32_t *ids = NULL;
            int n = 0;
            int rc = vllm_tokenize(s->engine, text, strlen(text), 0, &ids, &n);
            free(text);
            if (rc) return api_fail(err, 400, "bad_words", "bad_words[%zu]: %s", i, vllm_last_error());
            int prev = first < b->n ? b->off[first + 1] - b->off[first] : -1;
            if (n > 0 && (!space || (prev == n && ids[0] != b->ids[b->off[first]]))) bad_words_add(b, ids, n);
            vllm_free(ids);
        }
    }
    return 0;
}

int guided_parse(struct server *s, enum api_kind kind, const json_t *body, struct gen_params *gp,
                 struct api_error *err) {
    struct guided *gs = s->guided;
    struct guided_req *q = xcalloc(1, sizeof *q);
    q->chat = kind == API_CHAT;
    q->tfmt = gs->have_tools ? gs->tfmt : SG_TOOL_HERMES;
    q->rfmt = gs->rfmt;
    q->parallel = 1;
    json_t *par = field(body, "parallel_tool_calls"), *kw = field(body, "chat_template_kwargs");
    if (json_is_boolean(par)) q->parallel = json_is_true(par);
    q->thinking = !(json_is_object(kw) && json_is_false(json_object_get(kw, "enable_thinking")));
    q->reasoning = q->chat && gs->have_reasoning;
    q->tool_list = json_incref(field(body, "tools"));
    pthread_mutex_lock(&gs->mu); // bodies parse on several workers
    q->id_seed = gs->seed = gs->seed * 6364136223846793005ull + 1442695040888963407ull;
    pthread_mutex_unlock(&gs->mu);
    if (compile(s, body, q, err)) {
        guided_req_free(q);
        return -1;
    }
    if (q->grammar && q->reasoning) reasoning_first(s, gp, q);
    if (allowed_ids(s, body, q, err) || bad_words(s, body, q, err)) {
        guided_req_free(q);
        return -1;
    }
    if (q->bad && !q->bad->n) bad_words_free(q->bad), q->bad = NULL; // only blank words
    if (!q->grammar && !q->allow && !q->bad && !q->reasoning && q->tools == TOOLS_OFF) guided_req_free(q), q = NULL;
    gp->guided = q;
    return 0;
}

void guided_req_free(struct guided_req *q) {
    if (!q) return;
    sg_grammar_free(q->grammar);
    json_decref(q->tool_list);
    if (q->rs) sg_reasoning_stream_free(q->rs);
    if (q->ts) sg_tool_stream_free(q->ts);
    free(q->allow);
    bad_words_free(q->bad);
    free(q);
}

struct guided_req *guided_req_fork(const struct guided_req *q, int index) {
    struct guided_req *f = xmalloc(sizeof *f);
    *f = *q;
    f->grammar = NULL, f->allow = NULL, f->bad = NULL, f->rs = NULL, f->ts = NULL, f->calls_sent = 0;
    f->tool_list = json_incref(q->tool_list);
    f->id_seed = q->id_seed + 0x9E3779B97F4A7C15ull * (uint64_t)index;
    return f;
}

// --------------------------------------------------------- constraint --

// A request's constraint: owns what it uses (the engine may release it after
// the gen and its guided_req are gone).
struct gcons {
    struct sg_grammar *g;        // a reference; NULL: allowed_token_ids only
    struct sg_matcher *m;
    const struct tokenizer *tok; // reasoning first: NULL once the grammar applies
    char tail[sizeof THINK_END]; // the last bytes of the reasoning so far
    uint32_t *allow;             // [allow_words] or NULL
    int allow_words;
    struct bad_words *bad;       // or NULL
    int32_t *hist;               // the last bad->longest - 1 output ids, oldest first
    int nhist;
};

// Reasoning, and after an EOS (the grammar is done; a request that goes on,
// with ignore_eos or before min_tokens, is its own business, and an empty
// mask would leave the sampler nothing): every id. allowed_token_ids
// narrows whatever the grammar allows.
static void c_fill(void *user, uint32_t *mask, int words) {
    struct gcons *c = user;
    if (!c->m || c->tok || sg_matcher_is_done(c->m)) memset(mask, 0xff, sizeof(uint32_t) * (size_t)words);
    else sg_matcher_fill_mask(c->m, mask); // words >= the vocabulary's: get_vocab checked the sizes
    if (c->allow)
        for (int i = 0; i < words; i++) mask[i] &= i < c->allow_words ? c->allow[i] : 0;
    const struct bad_words *b = c->bad;
    for (int k = 0; b && k < b->n; k++) {
        const int32_t *w = b->ids + b->off[k];
        int n = b->off[k + 1] - b->off[k], id = w[n - 1];
        if (n - 1 > c->nhist || memcmp(c->hist + c->nhist - (n - 1), w, sizeof *w * (size_t)(n - 1))) continue;
        if (id >= 0 && id < words * 32) mask[id >> 5] &= ~(1u << (id & 31));
    }
}

// A reasoning token: the grammar applies from the next one once the text so
// far ends in THINK_END (one token or several).
static void reasoning_token(struct gcons *c, int32_t id) {
    char buf[64], all[sizeof c->tail + sizeof buf];
    int n = tok_token_bytes(c->tok, id, buf, sizeof buf);
    if (n < 0 || n > (int)sizeof buf) n = n > 0 ? (int)sizeof buf : 0;
    size_t t = strlen(c->tail);
    memcpy(all, c->tail, t);
    memcpy(all + t, buf, (size_t)n);
    all[t + (size_t)n] = 0;
    if (strlen(all) != t + (size_t)n) all[0] = 0, t = 0, n = 0; // a NUL byte: no tag spans it
    if (strstr(all, THINK_END)) {
        c->tok = NULL;
        return;
    }
    size_t len = t + (size_t)n, keep = MIN(len, sizeof c->tail - 1);
    memcpy(c->tail, all + len - keep, keep);
    c->tail[keep] = 0;
}

static int c_accept(void *user, int32_t id) {
    struct gcons *c = user;
    if (c->bad && c->bad->longest > 1) { // keep the last longest - 1 ids
        int cap = c->bad->longest - 1;
        if (c->nhist == cap) memmove(c->hist, c->hist + 1, sizeof *c->hist * (size_t)--c->nhist);
        c->hist[c->nhist++] = id;
    }
    if (!c->m) return 0;
    if (c->tok) return reasoning_token(c, id), 0;
    return !sg_matcher_is_done(c->m) && sg_matcher_accept(c->m, id) != VLLM_OK;
}

static void c_release(void *user) {
    struct gcons *c = user;
    sg_matcher_free(c->m);
    sg_grammar_free(c->g);
    free(c->allow);
    bad_words_free(c->bad);
    free(c->hist);
    free(c);
}

int guided_constraint(struct guided_req *q, struct vllm_constraint *out) {
    if (!q || (!q->grammar && !q->allow && !q->bad)) return 0;
    struct gcons *c = xcalloc(1, sizeof *c);
    if (q->grammar) {
        c->g = sg_grammar_ref(q->grammar); // the registry may evict it, the gen may go first
        c->m = sg_matcher_create(c->g, q->vocab);
    }
    if (q->allow) {
        c->allow_words = q->allow_words;
        c->allow = xmalloc(sizeof *c->allow * (size_t)q->allow_words);
        memcpy(c->allow, q->allow, sizeof *c->allow * (size_t)q->allow_words);
    }
    if (q->bad) { // the constraint outlives the request's guided_req
        c->bad = xcalloc(1, sizeof *c->bad);
        c->bad->off = xcalloc(1, sizeof *c->bad->off);
        for (int k = 0; k < q->bad->n; k++)
            bad_words_add(c->bad, q->bad->ids + q->bad->off[k], q->bad->off[k + 1] - q->bad->off[k]);
        c->hist = xmalloc(sizeof *c->hist * (size_t)MAX(1, c->bad->longest));
    }
    c->tok = q->reason_first ? q->tok : NULL;
    out->user = c;
    out->fill_mask = c_fill;
    out->accept = c_accept;
    out->release = c_release;
    return 1;
}

// ------------------------------------------------------------- answers --

static char *dup_n(const char *s, size_t n);

int guided_parses(const struct guided_req *q) { return q && q->chat && (q->reasoning || q->tools != TOOLS_OFF); }

// Calls past the first are dropped when parallel_tool_calls is false.
static json_t *take_calls(struct guided_req *q, json_t *calls) {
    if (!calls || q->parallel) return calls;
    while (json_array_size(calls) > 1) json_array_remove(calls, json_array_size(calls) - 1);
    return calls;
}

static void set_text(json_t *o, const char *key, const char *s) {
    if (s && *s) json_object_set_new(o, key, json_text(s, strlen(s)));
}

const char *guided_message(struct guided_req *q, const char *text, size_t len, vllm_finish_reason reason,
                           json_t *msg) {
    char *reasoning = NULL, *content = NULL;
    if (q->reasoning) sg_reasoning_split(q->rfmt, q->thinking, text, len, &reasoning, &content);
    else content = dup_n(text, len);
    json_object_set_new(msg, "content", json_null());
    if (q->reasoning) json_object_set_new(msg, "reasoning_content", json_null());
    if (q->include_reasoning) set_text(msg, "reasoning_content", reasoning);
    else json_object_del(msg, "reasoning_content");
    int called = 0;
    if (q->tools != TOOLS_OFF && content) {
        struct sg_tool_result r = {0};
        if (!sg_tool_parse(q->tfmt, content, strlen(content), q->tool_list, q->id_seed, &r)) {
            free(content);
            content = r.content, r.content = NULL;
            if (r.tool_calls && json_array_size(r.tool_calls)) {
                json_object_set_new(msg, "tool_calls", take_calls(q, r.tool_calls));
                r.tool_calls = NULL;
                called = 1;
            }
        }
        sg_tool_result_clear(&r);
    }
    if (content || !called) json_object_set_new(msg, "content", json_text(content ? content : "", content ? strlen(content) : 0));
    free(reasoning), free(content);
    if (!called || (reason != VLLM_FINISH_STOP && reason != VLLM_FINISH_EOS)) return NULL;
    return q->tools == TOOLS_NAMED ? "stop" : "tool_calls"; // a named choice ends in "stop", as OpenAI's
}

static char *dup_n(const char *s, size_t n) {
    char *d = xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static void append(char **a, const char *b) {
    if (!b) return;
    size_t n = *a ? strlen(*a) : 0, m = strlen(b);
    *a = xrealloc(*a, n + m + 1);
    memcpy(*a + n, b, m + 1);
}

// Content text through the tool parser into delta.
static void tools_delta(struct guided_req *q, const char *c, size_t n, int fin, json_t *delta, json_t **calls) {
    struct sg_tool_result r = {0};
    int rc = VLLM_OK;
    if (n) rc = sg_tool_stream_push(q->ts, c, n, &r);
    if (!rc && r.content) set_text(delta, "content", r.content);
    if (!rc && r.tool_calls) json_array_extend(*calls, r.tool_calls);
    sg_tool_result_clear(&r);
    if (!fin) return;
    memset(&r, 0, sizeof r);
    if (!sg_tool_stream_finish(q->ts, &r)) {
        if (r.content) {
            json_t *old = json_object_get(delta, "content");
            size_t ol = old ? json_string_length(old) : 0, rl = strlen(r.content);
            char *both = xmalloc(ol + rl + 1);
            if (ol) memcpy(both, json_string_value(old), ol);
            memcpy(both + ol, r.content, rl + 1);
            set_text(delta, "content", both);
            free(both);
        }
        if (r.tool_calls) json_array_extend(*calls, r.tool_calls);
    }
    sg_tool_result_clear(&r);
}

int guided_delta(struct guided_req *q, const char *text, size_t len, int fin, json_t *delta) {
    if (q->reasoning && !q->rs) q->rs = sg_reasoning_stream_create(q->rfmt, q->thinking);
    if (q->tools != TOOLS_OFF && !q->ts) q->ts = sg_tool_stream_create(q->tfmt, q->tool_list, q->id_seed);
    char *reasoning = NULL, *content = NULL, *r2 = NULL, *c2 = NULL;
    if (q->rs) {
        if (len) sg_reasoning_stream_push(q->rs, text, len, &reasoning, &content);
        if (fin) {
            sg_reasoning_stream_finish(q->rs, &r2, &c2);
            append(&reasoning, r2); // the push's pieces, then the flush's
            append(&content, c2);
        }
    } else if (len) {
        content = dup_n(text, len);
    }
    if (q->include_reasoning) set_text(delta, "reasoning_content", reasoning);
    json_t *calls = json_array();
    if (q->ts) tools_delta(q, content ? content : "", content ? strlen(content) : 0, fin, delta, &calls);
    else set_text(delta, "content", content);
    size_t i;
    json_t *c;
    json_t *kept = json_array();
    json_array_foreach(calls, i, c) {
        json_int_t idx = json_integer_value(json_object_get(c, "index"));
        if (q->parallel || idx == 0) json_array_append(kept, c);
        if (idx + 1 > q->calls_sent) q->calls_sent = (int)idx + 1;
    }
    json_decref(calls);
    if (json_array_size(kept)) json_object_set_new(delta, "tool_calls", kept);
    else json_decref(kept);
    free(reasoning), free(content), free(r2), free(c2);
    return json_object_size(delta) > 0;
}

const char *guided_stream_finish(const struct guided_req *q, vllm_finish_reason reason) {
    if (!q->calls_sent || (reason != VLLM_FINISH_STOP && reason != VLLM_FINISH_EOS)) return NULL;
    return q->tools == TOOLS_NAMED ? "stop" : "tool_calls";
}
