// sg_reasoning.c - reasoning parsers: model text -> reasoning_content and
// content, whole or streamed (one state machine; the whole-text split is a
// stream fed at once, so the two always agree).
//
//   deepseek_r1  everything before the first </think> is reasoning, with or
//                without a <think> first (one <think> before the end tag is
//                dropped); without </think> it is all reasoning.
//   qwen3        the same, for templates that open <think> in the prompt
//                (Qwen3.5) or let the model write it; also ends at a
//                <tool_call> followed by <function= (Qwen3.5 calls tools
//                from inside its reasoning), the call being content.
//   nemotron_v3  deepseek_r1's split (vLLM's NemotronV3ReasoningParser).
//
// With thinking off (chat_template_kwargs.enable_thinking false, where the
// template closes the reasoning in the prompt) all text is content, tags
// included, as vLLM streams it. vLLM's whole-text parsers would still split
// at a stray </think> there (nemotron_v3 only when nothing follows it);
// here the streamed behaviour is the one rule. Text before <think> stays
// reasoning (vLLM's whole-text parse drops it; its stream keeps it).
#include "core/common.h"
#include "structured/sg_internal.h"

#define T_OPEN "<think>"
#define T_CLOSE "</think>"
#define T_CALL "<tool_call>"
#define T_FUNC "<function"

int sg_reasoning_format_parse(const char *name, enum sg_reasoning_format *out) {
    static const char *const NAMES[] = {"deepseek_r1", "qwen3", "nemotron_v3"};
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, NAMES[i])) {
            *out = (enum sg_reasoning_format)i;
            return VLLM_OK;
        }
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown reasoning parser '%s' (deepseek_r1, qwen3, nemotron_v3)",
                    name ? name : "");
}

struct sg_reasoning_stream {
    enum sg_reasoning_format f;
    int content;  // past the reasoning (or thinking off)
    int opened;   // a <think> was dropped
    struct sg_buf text;
    size_t done;
    struct sg_buf out_r, out_c;
};

struct sg_reasoning_stream *sg_reasoning_stream_create(enum sg_reasoning_format f, int thinking) {
    struct sg_reasoning_stream *s = xcalloc(1, sizeof *s);
    s->f = f;
    s->content = !thinking;
    return s;
}

void sg_reasoning_stream_free(struct sg_reasoning_stream *s) {
    if (!s) return;
    free(s->text.p);
    free(s->out_r.p);
    free(s->out_c.p);
    free(s);
}

static const char *find(const char *t, size_t from, size_t n, const char *tag) {
    size_t m = strlen(tag);
    for (size_t i = from; i + m <= n; i++)
        if (t[i] == tag[0] && !memcmp(t + i, tag, m)) return t + i;
    return NULL;
}

// The longest suffix of t[from, n) that is a proper prefix of tag.
static size_t partial(const char *t, size_t from, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    for (size_t k = MIN(tl - 1, n - from); k > 0; k--)
        if (!memcmp(t + n - k, tag, k)) return k;
    return 0;
}

// After a <tool_call> at t[p]: 1 a function call follows (reasoning ends),
// 0 it does not, -1 not known yet.
static int call_follows(const char *t, size_t p, size_t n, int final) {
    size_t j = p + strlen(T_CALL);
    while (j < n && (t[j] == ' ' || t[j] == '\n' || t[j] == '\t' || t[j] == '\r')) j++;
    size_t fl = strlen(T_FUNC);
    if (n - j < fl + 1) {
        if (final || memcmp(t + j, T_FUNC, MIN(n - j, fl))) return 0;
        return -1;
    }
    return !memcmp(t + j, T_FUNC, fl) && (t[j + fl] == '=' || t[j + fl] == ' ' || t[j + fl] == '\n');
}

static void step(struct sg_reasoning_stream *s, int final) {
    const char *t = s->text.p;
    size_t n = s->text.len;
    while (!s->content && s->done < n) {
        const char *tags[3] = {T_CLOSE, s->opened ? NULL : T_OPEN, s->f == SG_REASONING_QWEN3 ? T_CALL : NULL};
        const char *at = NULL;
        int which = -1;
        for (int k = 0; k < 3; k++) {
            const char *p = tags[k] ? find(t, s->done, n, tags[k]) : NULL;
            if (p && (!at || p < at)) at = p, which = k;
        }
        if (!at) {
            size_t hold = 0;
            if (!final)
                for (int k = 0; k < 3; k++)
                    if (tags[k]) hold = MAX(hold, partial(t, s->done, n, tags[k]));
            sg_buf_add(&s->out_r, t + s->done, n - hold - s->done);
            s->done = n - hold;
            return;
        }
        size_t p = (size_t)(at - t);
        if (which == 2) {
            int r = call_follows(t, p, n, final);
            if (r < 0) { // wait, but let the text before it through
                sg_buf_add(&s->out_r, t + s->done, p - s->done);
                s->done = p;
                return;
            }
            sg_buf_add(&s->out_r, t + s->done, p - s->done);
            s->done = r ? p : p + strlen(T_CALL);
            if (r) s->content = 1;
            else sg_buf_add(&s->out_r, T_CALL, strlen(T_CALL));
            continue;
        }
        sg_buf_add(&s->out_r, t + s->done, p - s->done);
        s->done = p + strlen(tags[which]);
        if (which == 0) s->content = 1;
        else s->opened = 1;
    }
    if (s->content && s->done < n) {
        sg_buf_add(&s->out_c, t + s->done, n - s->done);
        s->done = n;
    }
}

static char *take(struct sg_buf *b) {
    if (!b->len) return NULL;
    char *p = xstrdup(b->p);
    b->len = 0;
    return p;
}

int sg_reasoning_stream_push(struct sg_reasoning_stream *s, const char *delta, size_t len, char **reasoning,
                             char **content) {
    sg_buf_add(&s->text, delta, len);
    step(s, 0);
    *reasoning = take(&s->out_r);
    *content = take(&s->out_c);
    return VLLM_OK;
}

int sg_reasoning_stream_finish(struct sg_reasoning_stream *s, char **reasoning, char **content) {
    if (s->text.len) step(s, 1);
    *reasoning = take(&s->out_r);
    *content = take(&s->out_c);
    return VLLM_OK;
}

int sg_reasoning_split(enum sg_reasoning_format f, int thinking, const char *text, size_t len, char **reasoning,
                       char **content) {
    struct sg_reasoning_stream *s = sg_reasoning_stream_create(f, thinking);
    sg_buf_add(&s->text, text ? text : "", text ? len : 0);
    int rc = sg_reasoning_stream_finish(s, reasoning, content);
    sg_reasoning_stream_free(s);
    return rc;
}
