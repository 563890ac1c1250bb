// test_sg_unit.c - each grammar front end on known strings: what it accepts
// whole, what it rejects, which prefixes stay viable, and its errors (an
// unsupported construct is an error naming it). No tokenizer needed.
#include "core/common.h"
#include "structured/sg_internal.h"
#include "test.h"

// 'A' accepted whole, 'P' a viable prefix only, 'R' rejected.
static char verdict(const struct sg_grammar *g, const char *s) {
    int acc;
    if (!sg_grammar_viable(g, s, strlen(s), &acc)) return 'R';
    return acc ? 'A' : 'P';
}

struct kase {
    char want;
    const char *s;
};

static void expect(const struct sg_grammar *g, const char *what, const struct kase *k, int n) {
    for (int i = 0; i < n; i++) {
        char got = verdict(g, k[i].s);
        CHECKF(got == k[i].want, "%s: '%s' is %c, want %c", what, k[i].s, got, k[i].want);
    }
}

#define EXPECT(g, what, ...)                                                                       \
    do {                                                                                           \
        const struct kase k_[] = {__VA_ARGS__};                                                    \
        expect(g, what, k_, (int)(sizeof k_ / sizeof *k_));                                        \
    } while (0)

static void expect_err(int rc, const char *needle, const char *what) {
    CHECKF(rc == VLLM_ERR_INVALID_ARGUMENT && strstr(vllm_last_error(), needle), "%s: rc %d, error '%s' (want '%s')",
           what, rc, rc ? vllm_last_error() : "", needle);
}

// ------------------------------------------------------------------ GBNF --

static struct sg_grammar *gbnf(const char *src) {
    struct sg_grammar *g = NULL;
    int rc = sg_compile_gbnf(src, &g);
    CHECKF(rc == 0, "GBNF %s: %s", src, rc ? vllm_last_error() : "");
    return g;
}

static void test_gbnf(void) {
    struct sg_grammar *g = gbnf("root ::= \"a\" [b-d]+ (\"x\" | \"yz\")? # comment\n");
    EXPECT(g, "gbnf1", {'A', "ab"}, {'A', "abcdx"}, {'A', "adyz"}, {'P', "a"}, {'P', "aby"}, {'R', "b"}, {'R', "abe"},
           {'R', "abxx"}, {'P', ""});
    sg_grammar_free(g);

    // rules, multi-line bodies, repetition counts, escapes, negated classes, '.'
    g = gbnf("root ::=\n  item (\",\" item){0,2}\n  | \"\\x41\\u00e9\\n\"\n"
             "item ::= [^,\\n]{2} | . \"!\"\n");
    EXPECT(g, "gbnf2", {'A', "ab"}, {'A', "ab,cd,ef"}, {'R', "ab,cd,ef,gh"}, {'A', "x!"}, {'A', "中!"},
           {'A', "Aé\n"}, {'R', "a,b"}, {'P', "ab,"}, {'A', "é中"}, {'A', "\n!"});
    sg_grammar_free(g);

    // a '|' starting the next line continues the rule; {m,} and {,n}
    g = gbnf("root ::= \"a\"{2,} \"b\"{,1}\n    | \"c\"\n");
    EXPECT(g, "gbnf3", {'A', "aa"}, {'A', "aaab"}, {'P', "a"}, {'A', "c"}, {'R', "ab"}, {'R', "aabb"});
    sg_grammar_free(g);

    // recursion (not left) and right recursion
    g = gbnf("root ::= \"(\" root \")\" | \"x\"\n");
    EXPECT(g, "gbnf4", {'A', "x"}, {'A', "((x))"}, {'P', "(("}, {'R', "(x"  ")" ")"}, {'P', "((x)"});
    sg_grammar_free(g);

    // UTF-8: a class of multi-byte characters accepts their partial bytes
    g = gbnf("root ::= [\\u4e00-\\u9fff]+\n");
    EXPECT(g, "gbnf5", {'A', "中文"}, {'P', "\xe4\xb8"}, {'R', "\xe4\x41"}, {'R', "a"}, {'R', "\xed\xa0\x80"});
    sg_grammar_free(g);

    struct sg_grammar *bad = NULL;
    expect_err(sg_compile_gbnf("root ::= foo\n", &bad), "'foo' is not defined", "undefined rule");
    expect_err(sg_compile_gbnf("root ::= root \"a\" | \"b\"\n", &bad), "left-recursive", "left recursion");
    expect_err(sg_compile_gbnf("root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"\n", &bad), "left-recursive",
               "left recursion through a nullable rule");
    expect_err(sg_compile_gbnf("root ::= \"a\" root\n", &bad), "matches no string", "empty language");
    expect_err(sg_compile_gbnf("a ::= \"x\"\n", &bad), "no 'root'", "no root");
    expect_err(sg_compile_gbnf("root ::= \"a\n", &bad), "unterminated string", "unterminated");
    expect_err(sg_compile_gbnf("root ::= [a\n", &bad), "1:", "unterminated class");
    expect_err(sg_compile_gbnf("root ::= \"a\"{3,1}\n", &bad), "n < m", "bad repetition");
    expect_err(sg_compile_gbnf("root ::= \"a\"\nroot ::= \"b\"\n", &bad), "defined twice", "defined twice");
    expect_err(sg_compile_gbnf("root = \"a\"\n", &bad), "'::='", "no ::=");
    CHECK(bad == NULL);
}

int main(void) {
    test_gbnf();
    return test_summary("test_sg_unit");
}
