// test_sg_reasoning.c - the reasoning parsers on outputs of each family
// (DeepSeek-R1, Qwen3 / Qwen3.5 templates, Nemotron-3), thinking on and off:
// the split into reasoning and content, and the same split from streams in
// random chunks (tags cut anywhere).
#include "sg_test_util.h"

struct kase {
    enum sg_reasoning_format f;
    int thinking;
    const char *text, *reasoning, *content; // NULL: none
};

static const struct kase CASES[] = {
    {SG_REASONING_DEEPSEEK_R1, 1, "<think>\nplan\n</think>\n\nAnswer", "\nplan\n", "\n\nAnswer"},
    {SG_REASONING_DEEPSEEK_R1, 1, "plan</think>Answer", "plan", "Answer"},
    {SG_REASONING_DEEPSEEK_R1, 1, "still thinking", "still thinking", NULL},
    {SG_REASONING_DEEPSEEK_R1, 1, "</think>", NULL, NULL},
    {SG_REASONING_DEEPSEEK_R1, 1, "a<think>b</think>c<think>d", "ab", "c<think>d"},
    {SG_REASONING_DEEPSEEK_R1, 1, "x</thin", "x</thin", NULL},
    {SG_REASONING_QWEN3, 1, "plan</think>\n\nhi", "plan", "\n\nhi"},
    {SG_REASONING_QWEN3, 1, "<think>x</think>y", "x", "y"},
    {SG_REASONING_QWEN3, 1, "plan\n<tool_call>\n<function=f>\n</function>\n</tool_call>", "plan\n",
     "<tool_call>\n<function=f>\n</function>\n</tool_call>"},
    {SG_REASONING_QWEN3, 1, "mention <tool_call> in text</think>ok", "mention <tool_call> in text", "ok"},
    {SG_REASONING_QWEN3, 1, "cut <tool_call>", "cut <tool_call>", NULL},
    {SG_REASONING_QWEN3, 0, "Hello</think> there", NULL, "Hello</think> there"},
    {SG_REASONING_QWEN3, 1, "思考中……</think>答案", "思考中……", "答案"},
    {SG_REASONING_NEMOTRON_V3, 1, "<think>\nok\n</think>\nDone.", "\nok\n", "\nDone."},
    {SG_REASONING_NEMOTRON_V3, 0, "Just the answer.", NULL, "Just the answer."},
    {SG_REASONING_NEMOTRON_V3, 1, "no end tag", "no end tag", NULL},
};

static int same(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

int main(void) {
    for (size_t c = 0; c < sizeof CASES / sizeof *CASES; c++) {
        const struct kase *k = &CASES[c];
        char *r, *t;
        CHECK(sg_reasoning_split(k->f, k->thinking, k->text, strlen(k->text), &r, &t) == 0);
        CHECKF(same(r, k->reasoning) && same(t, k->content), "case %zu: reasoning '%s' content '%s'", c, r ? r : "(null)",
               t ? t : "(null)");
        for (int rep = 0; rep < 12; rep++) {
            struct sg_reasoning_stream *s = sg_reasoning_stream_create(k->f, k->thinking);
            struct sg_buf rr = {0}, cc = {0};
            size_t n = strlen(k->text);
            for (size_t i = 0; i <= n;) {
                char *dr, *dc;
                if (i == n) {
                    sg_reasoning_stream_finish(s, &dr, &dc);
                    i++;
                } else {
                    size_t j = i + 1 + (size_t)sgt_rand(5);
                    while (j < n && (k->text[j] & 0xC0) == 0x80) j++;
                    j = MIN(j, n);
                    sg_reasoning_stream_push(s, k->text + i, j - i, &dr, &dc);
                    i = j;
                }
                if (dr) sg_buf_add(&rr, dr, strlen(dr));
                if (dc) sg_buf_add(&cc, dc, strlen(dc));
                free(dr), free(dc);
            }
            CHECKF(same(rr.p, r) && same(cc.p, t), "case %zu: streamed '%s' / '%s'", c, rr.p ? rr.p : "(null)",
                   cc.p ? cc.p : "(null)");
            free(rr.p), free(cc.p);
            sg_reasoning_stream_free(s);
        }
        free(r), free(t);
    }
    enum sg_reasoning_format f;
    CHECK(sg_reasoning_format_parse("nemotron_v3", &f) == 0 && f == SG_REASONING_NEMOTRON_V3);
    CHECK(sg_reasoning_format_parse("granite", &f) == VLLM_ERR_INVALID_ARGUMENT);
    return test_summary("test_sg_reasoning");
}
