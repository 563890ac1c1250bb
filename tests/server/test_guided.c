// test_guided.c - the server's structured-output glue (src/server/guided.c)
// on the tiny_chat fixture, without HTTP: a request's constraint follows its
// grammar token by token; with --reasoning-parser and thinking on, the
// grammar starts only after the model's </think> (one token or several),
// unless the prompt closed the reasoning; the answer then splits into
// reasoning_content and the constrained content; allowed_token_ids narrows
// the grammar's mask.
#include "core/common.h"
#include "engine/engine.h"
#include "server/server_internal.h"
#include "test.h"
#include "util.h"

static struct server s;

static int32_t *ids_of(const char *text, int *n) {
    int32_t *ids = NULL;
    if (vllm_tokenize(s.engine, text, strlen(text), 0, &ids, n)) return NULL;
    return ids;
}

static int popcount_mask(const uint32_t *m, int words) {
    int c = 0;
    for (int i = 0; i < words; i++) c += __builtin_popcount(m[i]);
    return c;
}

// The request's constraint for body and a prompt of text.
static struct guided_req *parse(const char *body_js, const char *prompt, struct vllm_constraint *c) {
    json_error_t je;
    json_t *body = json_loads(body_js, 0, &je);
    struct gen_params gp = {0};
    struct gen_prompt pr = {0};
    pr.ids = ids_of(prompt, &pr.num);
    gp.prompts = &pr;
    gp.num_prompts = 1;
    struct api_error err = {0};
    int rc = guided_parse(&s, API_CHAT, body, &gp, &err);
    CHECKF(rc == 0, "parse %s: %s", body_js, err.message);
    json_decref(body);
    vllm_free(pr.ids);
    struct guided_req *q = gp.guided;
    CHECK(q && guided_constraint(q, c));
    return q;
}

static void feed(struct vllm_constraint *c, const char *text) {
    int n;
    int32_t *ids = ids_of(text, &n);
    for (int i = 0; ids && i < n; i++) CHECKF(c->accept(c->user, ids[i]) == 0, "accept %d of '%s'", i, text);
    vllm_free(ids);
}

static void check_reasoning_first(void) {
    int words = CDIV(s.info.vocab_size, 32);
    uint32_t *m = xcalloc((size_t)words, sizeof *m);
    struct vllm_constraint c;
    const char *body = "{\"guided_choice\": [\"yes\", \"no\"]}";
    struct guided_req *q = parse(body, "<|im_start|>assistant\n", &c);
    c.fill_mask(c.user, m, words);
    CHECKF(popcount_mask(m, words) == words * 32, "reasoning: every id allowed (%d)", popcount_mask(m, words));
    feed(&c, "let me think </thi");
    memset(m, 0, sizeof *m * words);
    c.fill_mask(c.user, m, words);
    CHECK(popcount_mask(m, words) == words * 32); // the tag is not complete yet
    feed(&c, "nk>");
    memset(m, 0, sizeof *m * words);
    c.fill_mask(c.user, m, words);
    int allowed = popcount_mask(m, words);
    CHECKF(allowed >= 2 && allowed <= 8, "after </think>: the choice's first tokens only (%d allowed)", allowed);
    feed(&c, "yes");
    memset(m, 0, sizeof *m * words);
    c.fill_mask(c.user, m, words);
    int32_t eos = s.info.eos_token_ids[0];
    CHECKF(popcount_mask(m, words) == 1 && (m[eos / 32] >> (eos % 32) & 1), "after the choice: EOS only");
    json_t *msg = json_object();
    const char *text = "let me think </think>yes";
    const char *fin = guided_message(q, text, strlen(text), VLLM_FINISH_EOS, msg);
    CHECK(fin == NULL);
    const char *rc = json_string_value(json_object_get(msg, "reasoning_content"));
    const char *cc = json_string_value(json_object_get(msg, "content"));
    CHECKF(rc && !strcmp(rc, "let me think ") && cc && !strcmp(cc, "yes"), "split: '%s' / '%s'", rc ? rc : "(null)",
           cc ? cc : "(null)");
    json_decref(msg);
    c.release(c.user);
    guided_req_free(q);

    // the prompt closed the reasoning, or thinking is off: the grammar applies at once, all content
    const char *closed[][2] = {{body, "<|im_start|>assistant\n<think>\n\n</think>\n\n"},
                               {"{\"guided_choice\": [\"yes\", \"no\"], \"chat_template_kwargs\": "
                                "{\"enable_thinking\": false}}",
                                "<|im_start|>assistant\n"}};
    for (int k = 0; k < 2; k++) {
        q = parse(closed[k][0], closed[k][1], &c);
        memset(m, 0, sizeof *m * words);
        c.fill_mask(c.user, m, words);
        allowed = popcount_mask(m, words);
        CHECKF(allowed >= 2 && allowed <= 8, "case %d: constrained from the first token (%d allowed)", k, allowed);
        msg = json_object();
        guided_message(q, "no", 2, VLLM_FINISH_EOS, msg);
        cc = json_string_value(json_object_get(msg, "content"));
        CHECKF(cc && !strcmp(cc, "no") && !json_object_get(msg, "reasoning_content"), "case %d: all content", k);
        json_decref(msg);
        c.release(c.user);
        guided_req_free(q);
    }
    // allowed_token_ids narrows the grammar's mask: of "yes" / "no", only no's first token
    int nn;
    int32_t *no = ids_of("no", &nn);
    char js[256];
    snprintf(js, sizeof js, "{\"guided_choice\": [\"yes\", \"no\"], \"allowed_token_ids\": [%d, 3], "
                            "\"chat_template_kwargs\": {\"enable_thinking\": false}}", no ? no[0] : 0);
    q = parse(js, "<|im_start|>assistant\n", &c);
    memset(m, 0, sizeof *m * words);
    c.fill_mask(c.user, m, words);
    CHECKF(no && popcount_mask(m, words) == 1 && (m[no[0] / 32] >> (no[0] % 32) & 1), "allowed_token_ids and a grammar");
    vllm_free(no);
    c.release(c.user);
    guided_req_free(q);
    // an open <think> in the prompt: reasoning first
    q = parse(body, "<|im_start|>assistant\n<think>\n", &c);
    memset(m, 0, sizeof *m * words);
    c.fill_mask(c.user, m, words);
    CHECK(popcount_mask(m, words) == words * 32);
    c.release(c.user);
    guided_req_free(q);
    free(m);
}

int main(void) {
    char *dir = tu_fixture("tiny_chat");
    struct vllm_engine_params ep;
    vllm_engine_params_default(&ep);
    ep.model = dir;
    ep.num_threads = 1;
    ep.max_model_len = 256;
    if (vllm_engine_load(&ep, &s.engine)) {
        fprintf(stderr, "load: %s\n", vllm_last_error());
        return 1;
    }
    vllm_engine_info(s.engine, &s.info);
    s.cfg.reasoning_parser = "qwen3";
    CHECK(guided_init(&s) == 0);
    check_reasoning_first();
    guided_free(&s);
    vllm_engine_free(s.engine);
    free(dir);
    return test_summary("guided");
}
