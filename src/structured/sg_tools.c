// sg_tools.c - tool-call parsers: model text -> OpenAI tool_calls + content.
//
//   hermes       <tool_call>{"name": N, "arguments": {...}}</tool_call>, any
//                number, with text around them (Qwen2.5 / Qwen3);
//   qwen3_coder  <tool_call><function=N><parameter=K>value</parameter>...
//                </function></tool_call> (Qwen3-Coder, Nemotron-3); a value
//                is typed by the tool's parameter schema as vLLM does
//                (string types raw; integer, number, boolean, null parsed;
//                object / array as JSON; anything unparsable stays a
//                string); `<function=` without `<tool_call>` counts too;
//   llama3_json  {"name": N, "parameters" (or "arguments"): {...}} at the
//                start, after an optional <|python_tag|>, several separated
//                by ';'.
//
// One state machine serves both modes; the whole-text parse is a stream in
// "hold" mode fed at once. Text outside calls is content (all of it: before,
// between and after calls; whitespace-only content next to calls is
// dropped). A call that does not parse stays in content, tags and all.
//
// Streaming (sg_tool_stream_*): a call's first delta carries index, id, type
// and name, once the name is known; its arguments follow as fragments whose
// concatenation is the call's arguments string. hermes / llama3_json stream
// the raw text of the arguments value as it arrives (as vLLM); qwen3_coder
// one parameter at a time ("{", then `"k": v` pieces, then "}"). The
// arguments of a hermes / llama3 call that breaks after its arguments began
// streaming (cut by max_tokens, or invalid JSON) stay as streamed; the text
// after the break is content. A whole-text parse of the same output would
// have left that call in content; everything else streams exactly as the
// whole-text parse reads it.
#include <math.h>
#include <strings.h>

#include "core/common.h"
#include "structured/sg_internal.h"

#define TAG_CALL "<tool_call>"
#define TAG_END "</tool_call>"
#define TAG_FUNC "<function="
#define TAG_FUNC_END "</function>"
#define TAG_PARAM "<parameter="
#define TAG_PARAM_END "</parameter>"
#define TAG_PY "<|python_tag|>"

int sg_tool_format_parse(const char *name, enum sg_tool_format *out) {
    static const char *const NAMES[] = {"hermes", "qwen3_coder", "llama3_json"};
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, NAMES[i])) {
            *out = (enum sg_tool_format)i;
            return VLLM_OK;
        }
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown tool-call parser '%s' (hermes, qwen3_coder, llama3_json)",
                    name ? name : "");
}

void sg_tool_result_clear(struct sg_tool_result *r) {
    free(r->content);
    json_decref(r->tool_calls);
    r->content = NULL;
    r->tool_calls = NULL;
}

// ------------------------------------------------------------ JSON scans --

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

// The end of the JSON value at s[i]: 1 with *end when it is complete, 0 when
// the text ends inside it, -1 when s[i] cannot start one. Structure only
// (brackets, strings); validity is jansson's to judge on the range.
static int scan_value(const char *s, size_t n, size_t i, size_t *end) {
    if (i >= n) return 0;
    char c = s[i];
    if (c == '"') {
        for (size_t k = i + 1; k < n; k++) {
            if (s[k] == '\\') k++;
            else if (s[k] == '"') {
                *end = k + 1;
                return 1;
            }
        }
        return 0;
    }
    if (c == '{' || c == '[') {
        int depth = 0, in_str = 0;
        for (size_t k = i; k < n; k++) {
            char d = s[k];
            if (in_str) {
                if (d == '\\') k++;
                else if (d == '"') in_str = 0;
            } else if (d == '"') in_str = 1;
            else if (d == '{' || d == '[') depth++;
            else if (d == '}' || d == ']') {
                if (--depth == 0) {
                    *end = k + 1;
                    return 1;
                }
            }
        }
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        size_t k = i;
        while (k < n && strchr("+-0123456789.eE", s[k])) k++;
        if (k == n) return 0;
        *end = k;
        return 1;
    }
    static const char *const LIT[] = {"true", "false", "null"};
    for (int l = 0; l < 3; l++) {
        size_t m = strlen(LIT[l]);
        if (n - i < m) {
            if (!memcmp(s + i, LIT[l], n - i)) return 0;
        } else if (!memcmp(s + i, LIT[l], m)) {
            *end = i + m;
            return 1;
        }
    }
    return -1;
}

static json_t *parse_range(const char *s, size_t lo, size_t hi) {
    return json_loadb(s + lo, hi - lo, JSON_DECODE_ANY, NULL);
}

// A call object {"name": N, "arguments" | "parameters": V, ...} at s[i]:
// what is known of it so far.
struct callscan {
    int bad;                 // not such an object
    int complete;            // the object closed: *end
    size_t end;
    int have_name;           // the name string is complete: [name_lo, name_hi)
    size_t name_lo, name_hi;
    int have_args;           // the arguments value started at args_lo
    size_t args_lo, args_hi; // args_done: it ended at args_hi
    int args_done;
};

static void scan_call(const char *s, size_t n, size_t i, struct callscan *c) {
    memset(c, 0, sizeof *c);
    i = skip_ws(s, n, i);
    if (i >= n) return;
    if (s[i] != '{') {
        c->bad = 1;
        return;
    }
    i++;
    for (int first = 1;; first = 0) {
        i = skip_ws(s, n, i);
        if (i >= n) return;
        if (s[i] == '}' && first) {
            c->complete = 1, c->end = i + 1;
            return;
        }
        size_t klo = i, khi;
        int r = scan_value(s, n, i, &khi);
        if (r < 0 || s[i] != '"') {
            c->bad = 1;
            return;
        }
        if (!r) return;
        i = skip_ws(s, n, khi);
        if (i >= n) return;
        if (s[i] != ':') {
            c->bad = 1;
            return;
        }
        i = skip_ws(s, n, i + 1);
        if (i >= n) return;
        size_t vhi;
        r = scan_value(s, n, i, &vhi);
        if (r < 0) {
            c->bad = 1;
            return;
        }
        int is_name = khi - klo == 6 && !memcmp(s + klo, "\"name\"", 6);
        int is_args = (khi - klo == 11 && !memcmp(s + klo, "\"arguments\"", 11)) ||
                      (khi - klo == 12 && !memcmp(s + klo, "\"parameters\"", 12));
        if (is_args && !c->have_args) c->have_args = 1, c->args_lo = i;
        if (!r) return;
        if (is_name && s[i] == '"') c->have_name = 1, c->name_lo = i, c->name_hi = vhi;
        if (is_args && c->args_lo == i) c->args_done = 1, c->args_hi = vhi;
        i = skip_ws(s, n, vhi);
        if (i >= n) return;
        if (s[i] == '}') {
            c->complete = 1, c->end = i + 1;
            return;
        }
        if (s[i] != ',') {
            c->bad = 1;
            return;
        }
        i++;
    }
}

// The call is well formed: a JSON object with a string name and an object
// of arguments. *name malloc'd.
static int call_valid(const char *s, const struct callscan *c, size_t lo, char **name) {
    if (c->bad || !c->complete || !c->have_name || !c->args_done) return 0;
    json_t *obj = parse_range(s, lo, c->end), *args = parse_range(s, c->args_lo, c->args_hi);
    json_t *nm = parse_range(s, c->name_lo, c->name_hi);
    int ok = json_is_object(obj) && json_is_object(args) && json_is_string(nm) && json_string_length(nm) > 0;
    if (ok) *name = xstrdup(json_string_value(nm));
    json_decref(obj), json_decref(args), json_decref(nm);
    return ok;
}

// ---------------------------------------------------------------- stream --

struct sg_tool_stream {
    enum sg_tool_format f;
    json_t *tools;
    uint64_t seed;
    int hold;                // emit a call only whole (the whole-text parse)
    struct sg_buf text;      // all pushed text
    size_t done;             // text[0, done) is handled
    int n_calls;
    int content_seen;        // non-whitespace content was emitted
    struct sg_buf held_ws;   // whitespace-only content waiting for a verdict
    int started;             // llama3_json: 0 undecided, 1 calls, 2 content
    // the call in progress
    int in_call;
    size_t call_lo, body_lo; // its tag, its body
    int header_sent;
    size_t args_sent;        // hermes / llama3: raw argument bytes sent
    size_t param_pos;        // qwen3_coder: next unparsed byte of the function body
    size_t func_end;         // ... where </function> ended it (0: not yet)
    int params_sent;
    char *fname;
    // output of the current push
    struct sg_buf out_content;
    json_t *out_calls;
};

static void call_id(const struct sg_tool_stream *s, int index, char *buf) {
    uint64_t a = sg_hash64(s->seed ^ (uint64_t)index * 0x9E3779B97F4A7C15ull), b = sg_hash64(a ^ 0xD1B54A32D192ED03ull);
    snprintf(buf, 48, "chatcmpl-tool-%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
}

static int all_ws(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_ws(p[i])) return 0;
    return 1;
}

// Content: whitespace-only pieces wait (they are dropped next to calls).
static void emit_content(struct sg_tool_stream *s, const char *p, size_t n) {
    if (!n) return;
    if (all_ws(p, n) && !s->content_seen) {
        sg_buf_add(&s->held_ws, p, n);
        return;
    }
    if (s->held_ws.len) {
        sg_buf_add(&s->out_content, s->held_ws.p, s->held_ws.len);
        s->held_ws.len = 0;
    }
    sg_buf_add(&s->out_content, p, n);
    s->content_seen |= !all_ws(p, n);
}

static void emit_header(struct sg_tool_stream *s, const char *name) {
    char id[48];
    call_id(s, s->n_calls, id);
    json_array_append_new(s->out_calls, json_pack("{s:i, s:s, s:s, s:{s:s}}", "index", s->n_calls, "id", id, "type",
                                                  "function", "function", "name", name));
    s->header_sent = 1;
}

static void emit_args(struct sg_tool_stream *s, const char *p, size_t n) {
    if (!n) return;
    json_t *frag = json_stringn(p, n);
    if (!frag) frag = json_string(""); // not UTF-8: cannot happen for text the tokenizer decoded
    json_array_append_new(s->out_calls,
                          json_pack("{s:i, s:{s:o}}", "index", s->n_calls, "function", "arguments", frag));
}

static void end_call(struct sg_tool_stream *s, size_t after) {
    if (s->header_sent) s->n_calls++;
    s->in_call = 0;
    s->header_sent = 0;
    s->args_sent = 0;
    s->params_sent = 0;
    s->func_end = 0;
    free(s->fname);
    s->fname = NULL;
    s->done = after;
}

// The longest suffix of text[from, n) that is a proper prefix of tag.
static size_t partial_tag(const char *t, size_t from, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    for (size_t k = MIN(tl - 1, n - from); k > 0; k--)
        if (!memcmp(t + n - k, tag, k)) return k;
    return 0;
}

static const char *find(const char *t, size_t from, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = from; i + m <= n; i++)
        if (t[i] == needle[0] && !memcmp(t + i, needle, m)) return t + i;
    return NULL;
}

// Content up to the next tag (one of tags), or up to what may start one.
// Returns the tag's offset, or -1.
static long content_until(struct sg_tool_stream *s, int final, const char *const *tags, int ntags) {
    const char *t = s->text.p;
    size_t n = s->text.len;
    long best = -1;
    for (int k = 0; k < ntags; k++) {
        const char *p = find(t, s->done, n, tags[k]);
        if (p && (best < 0 || p - t < best)) best = p - t;
    }
    if (best >= 0) {
        emit_content(s, t + s->done, (size_t)best - s->done);
        s->done = (size_t)best;
        return best;
    }
    size_t keep = 0;
    if (!final)
        for (int k = 0; k < ntags; k++) keep = MAX(keep, partial_tag(t, s->done, n, tags[k]));
    emit_content(s, t + s->done, n - keep - s->done);
    s->done = n - keep;
    return -1;
}

// ---------------------------------------------------------------- hermes --

// A JSON call object (hermes body, llama3 item) starting at s->body_lo and
// ending before `limit`: streams what it can. Returns 1 when settled.
static int json_call_step(struct sg_tool_stream *s, size_t limit, int closed) {
    const char *t = s->text.p;
    struct callscan c;
    scan_call(t, limit, s->body_lo, &c);
    if (s->hold) {
        if (!closed) return 0;
        char *name = NULL;
        if (!call_valid(t, &c, skip_ws(t, limit, s->body_lo), &name)) return 1;
        emit_header(s, name);
        free(name);
        emit_args(s, t + c.args_lo, c.args_hi - c.args_lo);
        return 1;
    }
    if (!s->header_sent && c.have_name && c.have_args && !c.bad) {
        json_t *nm = parse_range(t, c.name_lo, c.name_hi);
        if (json_is_string(nm) && json_string_length(nm)) emit_header(s, json_string_value(nm));
        json_decref(nm);
    }
    if (s->header_sent && c.have_args) {
        size_t hi = c.args_done ? c.args_hi : limit;
        if (hi > c.args_lo + s->args_sent) {
            emit_args(s, t + c.args_lo + s->args_sent, hi - c.args_lo - s->args_sent);
            s->args_sent = hi - c.args_lo;
        }
    }
    return closed;
}

// A streamed call that turned out malformed: what its arguments did not
// take of its text [.., limit) goes to content, so that no text is lost.
static void broken_rest(struct sg_tool_stream *s, size_t limit, size_t after) {
    const char *t = s->text.p;
    struct callscan c;
    scan_call(t, limit, s->body_lo, &c);
    char *name = NULL;
    if (call_valid(t, &c, skip_ws(t, limit, s->body_lo), &name)) {
        free(name);
        return;
    }
    size_t from = c.have_args ? c.args_lo + s->args_sent : s->body_lo;
    if (from < after) emit_content(s, t + from, after - from);
}

static void hermes_step(struct sg_tool_stream *s, int final) {
    static const char *const TAGS[] = {TAG_CALL};
    for (;;) {
        const char *t = s->text.p;
        size_t n = s->text.len;
        if (!s->in_call) {
            long at = content_until(s, final, TAGS, 1);
            if (at < 0) return;
            s->in_call = 1;
            s->call_lo = (size_t)at;
            s->body_lo = (size_t)at + strlen(TAG_CALL);
        }
        const char *e = find(t, s->body_lo, n, TAG_END);
        size_t limit = e ? (size_t)(e - t) : n;
        if (!e && !final) limit = n - partial_tag(t, s->body_lo, n, TAG_END);
        int closed = e || final;
        if (!json_call_step(s, limit, closed)) return;
        size_t after = e ? limit + strlen(TAG_END) : n;
        if (!s->header_sent) emit_content(s, t + s->call_lo, after - s->call_lo); // not a call
        else broken_rest(s, limit, after);
        end_call(s, after);
        if (s->done >= n) return;
    }
}

// ----------------------------------------------------------- llama3_json --

static void llama3_step(struct sg_tool_stream *s, int final) {
    const char *t = s->text.p;
    size_t n = s->text.len;
    if (!s->started) { // calls only at the very start
        size_t i = skip_ws(t, n, 0);
        size_t pl = strlen(TAG_PY);
        if (i == n && !final) return;
        if (n - i < pl && !memcmp(t + i, TAG_PY, n - i) && !final) return;
        if (n - i >= pl && !memcmp(t + i, TAG_PY, pl)) i = skip_ws(t, n, i + pl);
        if (i == n && !final) return;
        s->started = i < n && t[i] == '{' ? 1 : 2;
        if (s->started == 1) {
            s->in_call = 1;
            s->call_lo = 0;
            s->body_lo = i;
        }
    }
    if (s->started == 2) {
        emit_content(s, t + s->done, n - s->done);
        s->done = n;
        return;
    }
    // In hold mode every object must be valid, else the whole text is content.
    if (s->hold) {
        if (!final) return;
        size_t i = s->body_lo, tail = 0;
        int ok = 1, k = 0;
        struct sg_buf names = {0};
        struct {
            size_t lo, hi;
        } args[64];
        for (;;) {
            struct callscan c;
            scan_call(t, n, i, &c);
            char *name = NULL;
            if (k == 64 || !call_valid(t, &c, i, &name)) {
                ok = 0;
                break;
            }
            sg_buf_add(&names, name, strlen(name) + 1);
            free(name);
            args[k].lo = c.args_lo, args[k].hi = c.args_hi, k++;
            tail = c.end;
            i = skip_ws(t, n, c.end);
            if (i < n && t[i] == ';') {
                i = skip_ws(t, n, i + 1);
                if (i < n && t[i] == '{') continue;
            }
            break;
        }
        if (ok) {
            const char *nm = names.p;
            for (int q = 0; q < k; q++, nm += strlen(nm) + 1) {
                emit_header(s, nm);
                emit_args(s, t + args[q].lo, args[q].hi - args[q].lo);
                end_call(s, tail);
            }
            emit_content(s, t + tail, n - tail); // text after the calls
        } else {
            emit_content(s, t, n);
        }
        free(names.p);
        s->done = n;
        return;
    }
    for (;;) {
        if (!s->in_call) { // after a call: "; {" starts another, anything else is content
            size_t i = skip_ws(t, n, s->done);
            if (i < n && t[i] == ';') {
                size_t j = skip_ws(t, n, i + 1);
                if (j == n && !final) return;
                if (j < n && t[j] == '{') {
                    s->in_call = 1;
                    s->call_lo = s->done;
                    s->body_lo = j;
                }
            } else if (i == n && !final) {
                return;
            }
            if (!s->in_call) {
                emit_content(s, t + s->done, n - s->done);
                s->done = n;
                return;
            }
        }
        struct callscan c;
        scan_call(t, n, s->body_lo, &c);
        int closed = c.complete || c.bad || final;
        json_call_step(s, c.complete ? c.end : n, closed);
        if (!closed) return;
        size_t after = c.complete ? c.end : n;
        if (!s->header_sent) emit_content(s, t + s->call_lo, after - s->call_lo);
        else broken_rest(s, after, after);
        end_call(s, after);
    }
}

// ----------------------------------------------------------- qwen3_coder --

// The parameter schema of `param` in the named tool, or NULL.
static const json_t *param_schema(const json_t *tools, const char *fname, const char *param) {
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        const json_t *fn = json_object_get(tool, "function");
        const char *nm = json_string_value(json_object_get(fn, "name"));
        if (nm && !strcmp(nm, fname))
            return json_object_get(json_object_get(json_object_get(fn, "parameters"), "properties"), param);
    }
    return NULL;
}

static int ieq(const char *a, const char *b) { return !strcasecmp(a, b); }

// A parameter value typed as vLLM's qwen3_coder parser does, as JSON text.
static void typed_value(struct sg_buf *o, const json_t *schema, const char *v, size_t n) {
    char *val = xmalloc(n + 1);
    memcpy(val, v, n);
    val[n] = 0;
    const char *type = "string";
    int nullable = 0;
    const json_t *t = json_object_get(schema, "type");
    if (json_is_string(t)) {
        type = json_string_value(t);
        nullable = !strcmp(type, "null");
    } else if (json_is_array(json_object_get(schema, "anyOf"))) {
        size_t i;
        json_t *opt;
        int picked = 0;
        json_array_foreach(json_object_get(schema, "anyOf"), i, opt) {
            const char *ot = json_string_value(json_object_get(opt, "type"));
            if (!ot) continue;
            if (!strcmp(ot, "null")) nullable = 1;
            else if (!picked) type = ot, picked = 1;
        }
    }
    json_t *out = NULL;
    int is_null = ieq(val, "null") || ieq(val, "none");
    int stringy = !schema || !strcmp(type, "string") || !strcmp(type, "str") || !strcmp(type, "text") ||
                  !strcmp(type, "varchar") || !strcmp(type, "char") || !strcmp(type, "enum");
    if (schema && is_null && (nullable || !stringy)) {
        out = json_null();
    } else if (stringy) {
        out = json_stringn(val, n);
    } else if (!strncmp(type, "int", 3) || !strncmp(type, "uint", 4) || !strncmp(type, "long", 4) ||
               !strncmp(type, "short", 5) || !strncmp(type, "unsigned", 8)) {
        char *end;
        long long x = strtoll(val, &end, 10);
        out = end != val && !*end ? json_integer(x) : json_stringn(val, n);
    } else if (!strncmp(type, "num", 3) || !strncmp(type, "float", 5)) {
        char *end;
        double x = strtod(val, &end);
        if (end == val || *end || x != x || x - x != 0) out = json_stringn(val, n);
        else if (x == (double)(long long)x && fabs(x) < 9e15) out = json_integer((long long)x);
        else {
            json_t *lit = json_loads(val, JSON_DECODE_ANY, NULL); // keep the model's digits
            if (json_is_number(lit)) {
                sg_buf_add(o, val, n);
                json_decref(lit);
                free(val);
                return;
            }
            json_decref(lit);
            out = json_real(x);
        }
    } else if (!strcmp(type, "boolean") || !strcmp(type, "bool") || !strcmp(type, "binary")) {
        out = ieq(val, "true") ? json_true() : json_false();
    } else { // object, array and the rest: JSON, else the text
        json_t *j = json_loads(val, JSON_DECODE_ANY, NULL);
        if (j) {
            char *d = json_dumps(j, JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
            sg_buf_add(o, d, strlen(d));
            free(d);
            json_decref(j);
            free(val);
            return;
        }
        out = json_stringn(val, n);
    }
    if (!out) out = json_string(""); // invalid UTF-8 cannot come from a decoder
    char *d = json_dumps(out, JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    sg_buf_add(o, d, strlen(d));
    free(d);
    json_decref(out);
    free(val);
}

// One parameter at body position p (at '<parameter='): 1 when complete
// (fragment appended to o, *next after it), 0 when it needs more text.
static int coder_param(struct sg_tool_stream *s, size_t p, size_t n, int final, struct sg_buf *o, size_t *next) {
    const char *t = s->text.p;
    size_t k = p + strlen(TAG_PARAM);
    const char *gt = memchr(t + k, '>', n - k);
    if (!gt) {
        if (!final) return 0;
        *next = n; // a cut-off name: no parameter
        return 1;
    }
    size_t vlo = (size_t)(gt - t) + 1;
    if (vlo < n && t[vlo] == '\n') vlo++;
    // the value ends at </parameter>, or before the next <parameter= or </function>
    const char *e1 = find(t, vlo, n, TAG_PARAM_END), *e2 = find(t, vlo, n, TAG_PARAM), *e3 = find(t, vlo, n, TAG_FUNC_END);
    const char *e = e1;
    if (e2 && (!e || e2 < e)) e = e2;
    if (e3 && (!e || e3 < e)) e = e3;
    size_t vhi = e ? (size_t)(e - t) : n;
    if (!e && !final) return 0;
    if (e == e1 && e) *next = vhi + strlen(TAG_PARAM_END);
    else *next = vhi;
    size_t end = vhi;
    if (end > vlo && t[end - 1] == '\n') end--;
    char *key = xmalloc((size_t)(gt - t) - k + 1);
    memcpy(key, t + k, (size_t)(gt - t) - k);
    key[(size_t)(gt - t) - k] = 0;
    sg_buf_add(o, s->params_sent ? ", " : "", s->params_sent ? 2 : 0);
    json_t *kj = json_string(key);
    char *kd = json_dumps(kj ? kj : json_string(""), JSON_ENCODE_ANY);
    sg_buf_add(o, kd, strlen(kd));
    sg_buf_add(o, ": ", 2);
    typed_value(o, param_schema(s->tools, s->fname, key), t + vlo, end - vlo);
    free(kd);
    json_decref(kj);
    free(key);
    s->params_sent++;
    return 1;
}

static int starts(const char *t, size_t n, size_t p, const char *tag) {
    size_t m = strlen(tag);
    return n - p >= m && !memcmp(t + p, tag, m);
}

static int may_start(const char *t, size_t n, size_t p, const char *tag) { // a cut-off tag
    size_t m = strlen(tag);
    return n - p < m && !memcmp(t + p, tag, n - p);
}

// The function body from s->param_pos: parameters until </function> (or a
// </tool_call> where the model left it out). Returns 1 when the function
// ended; *after is where what follows it starts.
static int coder_body(struct sg_tool_stream *s, size_t n, int final, size_t *after) {
    const char *t = s->text.p;
    struct sg_buf frag = {0};
    int ended = 0;
    for (;;) {
        size_t p = skip_ws(t, n, s->param_pos);
        if (p == n) {
            if (final) *after = n, ended = 1;
            break;
        }
        if (starts(t, n, p, TAG_FUNC_END)) {
            *after = p + strlen(TAG_FUNC_END), ended = 1;
            break;
        }
        if (starts(t, n, p, TAG_END)) {
            *after = p, ended = 1;
            break;
        }
        if (starts(t, n, p, TAG_PARAM)) {
            size_t next;
            if (!coder_param(s, p, n, final, &frag, &next)) break;
            s->param_pos = next;
            continue;
        }
        if (!final && (may_start(t, n, p, TAG_FUNC_END) || may_start(t, n, p, TAG_PARAM) || may_start(t, n, p, TAG_END)))
            break;
        // stray text between parameters: skipped, up to the next '<'
        const char *lt = memchr(t + p + 1, '<', n - p - 1);
        if (!lt) {
            if (final) *after = n, ended = 1;
            break;
        }
        s->param_pos = (size_t)(lt - t);
    }
    if (ended) sg_buf_add(&frag, "}", 1);
    emit_args(s, frag.p, frag.len);
    free(frag.p);
    return ended;
}

static void coder_step(struct sg_tool_stream *s, int final) {
    static const char *const TAGS[] = {TAG_CALL, TAG_FUNC};
    for (;;) {
        const char *t = s->text.p;
        size_t n = s->text.len;
        if (!s->in_call) {
            long at = content_until(s, final, TAGS, 2);
            if (at < 0) return;
            s->in_call = 1;
            s->call_lo = (size_t)at;
            int bare = !memcmp(t + at, TAG_FUNC, strlen(TAG_FUNC));
            s->body_lo = bare ? (size_t)at : (size_t)at + strlen(TAG_CALL);
        }
        if (!s->header_sent) {
            size_t i = skip_ws(t, n, s->body_lo), fl = strlen(TAG_FUNC);
            int is_func = n - i >= fl ? !memcmp(t + i, TAG_FUNC, fl) : !memcmp(t + i, TAG_FUNC, n - i);
            const char *gt = is_func && n - i > fl ? memchr(t + i + fl, '>', n - i - fl) : NULL;
            if (is_func && !gt && !final) return;
            if (!gt || gt == t + i + fl) { // not a function: the text up to </tool_call> is content
                const char *e = find(t, s->body_lo, n, TAG_END);
                if (!e && !final) return;
                size_t after = e ? (size_t)(e - t) + strlen(TAG_END) : n;
                emit_content(s, t + s->call_lo, after - s->call_lo);
                end_call(s, after);
                continue;
            }
            s->fname = xmalloc((size_t)(gt - t) - i - fl + 1);
            memcpy(s->fname, t + i + fl, (size_t)(gt - t) - i - fl);
            s->fname[(size_t)(gt - t) - i - fl] = 0;
            s->param_pos = (size_t)(gt - t) + 1;
            emit_header(s, s->fname);
            emit_args(s, "{", 1);
        }
        size_t after = s->func_end;
        if (!after) {
            if (!coder_body(s, n, final, &after)) return;
            s->func_end = after;
        }
        // past </function>: up to </tool_call> (if the call had the tag)
        size_t j = skip_ws(t, n, after), el = strlen(TAG_END);
        int tagged = s->body_lo != s->call_lo;
        if (tagged) {
            if (n - j < el && !memcmp(t + j, TAG_END, n - j) && !final) return;
            if (n - j >= el && !memcmp(t + j, TAG_END, el)) after = j + el;
        }
        end_call(s, after);
    }
}

// ------------------------------------------------------------------ API --

static struct sg_tool_stream *stream_create(enum sg_tool_format f, const json_t *tools, uint64_t seed, int hold) {
    struct sg_tool_stream *s = xcalloc(1, sizeof *s);
    s->f = f;
    s->tools = tools ? json_incref((json_t *)tools) : NULL;
    s->seed = seed;
    s->hold = hold;
    return s;
}

struct sg_tool_stream *sg_tool_stream_create(enum sg_tool_format f, const json_t *tools, uint64_t id_seed) {
    return stream_create(f, tools, id_seed, 0);
}

void sg_tool_stream_free(struct sg_tool_stream *s) {
    if (!s) return;
    json_decref(s->tools);
    free(s->text.p);
    free(s->held_ws.p);
    free(s->out_content.p);
    json_decref(s->out_calls);
    free(s->fname);
    free(s);
}

int sg_tool_stream_num_calls(const struct sg_tool_stream *s) { return s->n_calls + (s->in_call && s->header_sent); }

static int run(struct sg_tool_stream *s, int final, struct sg_tool_result *out) {
    s->out_content.len = 0;
    s->out_calls = json_array();
    if (s->text.len) {
        if (s->f == SG_TOOL_HERMES) hermes_step(s, final);
        else if (s->f == SG_TOOL_QWEN3_CODER) coder_step(s, final);
        else llama3_step(s, final);
    }
    if (final && s->in_call && s->header_sent) end_call(s, s->text.len);
    if (final && s->held_ws.len && !sg_tool_stream_num_calls(s)) { // no calls: whitespace is the content
        sg_buf_add(&s->out_content, s->held_ws.p, s->held_ws.len);
        s->held_ws.len = 0;
    }
    out->content = s->out_content.len ? xstrdup(s->out_content.p) : NULL;
    out->tool_calls = json_array_size(s->out_calls) ? s->out_calls : NULL;
    if (!out->tool_calls) json_decref(s->out_calls);
    s->out_calls = NULL;
    return VLLM_OK;
}

int sg_tool_stream_push(struct sg_tool_stream *s, const char *delta, size_t len, struct sg_tool_result *out) {
    sg_buf_add(&s->text, delta, len);
    return run(s, 0, out);
}

int sg_tool_stream_finish(struct sg_tool_stream *s, struct sg_tool_result *out) { return run(s, 1, out); }

// The whole-text parse: the stream in hold mode, its deltas merged into calls.
int sg_tool_parse(enum sg_tool_format f, const char *text, size_t len, const json_t *tools, uint64_t id_seed,
                  struct sg_tool_result *out) {
    struct sg_tool_stream *s = stream_create(f, tools, id_seed, 1);
    struct sg_tool_result r;
    sg_buf_add(&s->text, text ? text : "", text ? len : 0);
    run(s, 1, &r);
    sg_tool_stream_free(s);
    out->content = r.content;
    out->tool_calls = NULL;
    if (r.tool_calls) {
        json_t *calls = json_array();
        size_t i;
        json_t *d;
        json_array_foreach(r.tool_calls, i, d) {
            json_t *fn = json_object_get(d, "function");
            if (json_object_get(d, "id")) {
                json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", json_object_get(d, "id"), "type",
                                                       "function", "function", "name", json_object_get(fn, "name"),
                                                       "arguments", ""));
            } else {
                json_t *cur = json_object_get(json_array_get(calls, json_array_size(calls) - 1), "function");
                struct sg_buf a = {0};
                const char *prev = json_string_value(json_object_get(cur, "arguments"));
                const char *more = json_string_value(json_object_get(fn, "arguments"));
                sg_buf_add(&a, prev, strlen(prev));
                sg_buf_add(&a, more, strlen(more));
                json_object_set_new(cur, "arguments", json_string(a.p));
                free(a.p);
            }
        }
        json_decref(r.tool_calls);
        out->tool_calls = calls;
        if (out->content && all_ws(out->content, strlen(out->content))) {
            free(out->content);
            out->content = NULL;
        }
    }
    return VLLM_OK;
}
