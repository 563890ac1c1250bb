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


// ----------------------------------------------------------------- regex --

static struct sg_grammar *regex(const char *re) {
    struct sg_grammar *g = NULL;
    int rc = sg_compile_regex(re, &g);
    CHECKF(rc == 0, "regex %s: %s", re, rc ? vllm_last_error() : "");
    return g;
}

static void test_regex(void) {
    struct sg_grammar *g = regex("^[a-z]+\\d{2,3}$");
    EXPECT(g, "re1", {'A', "ab12"}, {'A', "z909"}, {'A', "x123"}, {'R', "x1234"}, {'P', "ab1"}, {'R', "AB12"}, {'R', "12"});
    sg_grammar_free(g);
    g = regex("(?:foo|ba+r)?x*?");
    EXPECT(g, "re2", {'A', ""}, {'A', "foo"}, {'A', "baaarxx"}, {'R', "fox"}, {'A', "xx"});
    sg_grammar_free(g);
    g = regex("\\w+@\\w+\\.com|(?<n>[^\\s]{2})|a.b");
    EXPECT(g, "re3", {'A', "a_1@b.com"}, {'R', "a@b.org"}, {'A', "ab"}, {'R', "ab "}, {'A', "a中b"}, {'R', "a\nb"},
           {'A', "é!"});
    sg_grammar_free(g);
    g = regex("\\x41\\u00e9\\x{1F600}[\\d\\-x]+a{,}b{2,}");
    EXPECT(g, "re4", {'A', "Aé😀1-xa{,}bb"}, {'R', "Aé😀1-xabb"}, {'P', "Aé\xf0\x9f"});
    sg_grammar_free(g);
    struct sg_grammar *bad = NULL;
    expect_err(sg_compile_regex("(a)\\1", &bad), "backreference", "backref");
    expect_err(sg_compile_regex("(?=a)b", &bad), "lookaround", "lookahead");
    expect_err(sg_compile_regex("a\\bc", &bad), "\\b", "word boundary");
    expect_err(sg_compile_regex("\\p{L}", &bad), "Unicode property", "property");
    expect_err(sg_compile_regex("(?i)a", &bad), "inline flags", "flags");
    expect_err(sg_compile_regex("a++", &bad), "possessive", "possessive");
    expect_err(sg_compile_regex("a|^b", &bad), "anchor", "inner anchor");
    expect_err(sg_compile_regex("[[:alpha:]]", &bad), "POSIX", "posix");
    expect_err(sg_compile_regex("(ab", &bad), "missing ')'", "unclosed");
    expect_err(sg_compile_regex("a{3,1}", &bad), "n < m", "bad count");
    expect_err(sg_compile_regex("a**", &bad), "quantifier", "double quantifier");
    // nullable repetitions: the epsilon-free automaton grows as the count's
    // square; refused by name, never seconds of one request's compile
    expect_err(sg_compile_regex("(x|y?){5000}(x|y?){5000}", &bad), "too complex", "nullable repetition");
    expect_err(sg_compile_regex("([a-z]{0,9}[0-9]{0,9}){999}", &bad), "too complex", "nested optional counts");
    // ... and a smaller one whose matcher would walk its 500k edges a byte
    // (19 s of one fuzz input under ASan)
    expect_err(sg_compile_regex("}({?){998}", &bad), "too complex", "nullable count, matcher-bound");
    CHECK(bad == NULL);
    // a count overlapping what precedes it: the subset construction gives up
    // (its work bound) and the epsilon-free automaton still matches exactly
    g = regex("t+[a-z]{243}");
    char s[250];
    memset(s, 'a', sizeof s);
    s[0] = 't';
    s[244] = 0;
    EXPECT(g, "re5", {'A', s}, {'P', "t"});
    s[200] = '1';
    EXPECT(g, "re5b", {'R', s});
    sg_grammar_free(g);
}

// ----------------------------------------------------- choice, json_object --

static void test_choice_object(void) {
    const char *ch[] = {"yes", "no", "y"};
    struct sg_grammar *g = NULL;
    CHECK(sg_compile_choice(ch, 3, &g) == 0);
    EXPECT(g, "choice", {'A', "yes"}, {'A', "no"}, {'A', "y"}, {'P', "ye"}, {'R', "maybe"}, {'R', "yess"});
    sg_grammar_free(g);
    CHECK(sg_compile_json_object(&g) == 0);
    EXPECT(g, "json_object", {'A', "{}"}, {'A', "{\"a\": [1, {\"b\": null}, -2.5e+3], \"c\": \"x\\u00e9\\n\"}"},
           {'R', "[]"}, {'R', "\"s\""}, {'P', "{\"a\": "}, {'R', "{\"a\" 1}"}, {'A', "{ \"a\" : 1 }"},
           {'A', "{\n  \"a\": [\n    true\n  ]\n}"}, {'R', "{   \"a\": 1}"}, {'R', "{\"a\": 01}"},
           {'R', "{\"a\": \"\\ud800\"}"}, {'A', "{\"a\": \"\\ud83d\\ude00\"}"}, {'R', "{\"a\": 1,}"});
    sg_grammar_free(g);
}

// ----------------------------------------------------------- JSON schema --

static struct sg_grammar *schema(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    CHECKF(j, "bad test JSON %s: %s", text, e.text);
    struct sg_grammar *g = NULL;
    int rc = sg_compile_json_schema(j, &g);
    CHECKF(rc == 0, "schema %s: %s", text, rc ? vllm_last_error() : "");
    json_decref(j);
    return g;
}

static void schema_err(const char *text, const char *needle) {
    json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
    struct sg_grammar *g = NULL;
    expect_err(sg_compile_json_schema(j, &g), needle, text);
    CHECK(g == NULL);
    json_decref(j);
}

static void test_schema(void) {
    struct sg_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                                  "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}},\"required\":[\"name\"]}");
    EXPECT(g, "object", {'A', "{\"name\": \"Bob\", \"age\": 42}"}, {'A', "{\"name\": \"Bob\"}"}, {'R', "{\"age\": 42}"},
           {'R', "{\"name\": \"B\", \"age\": 151}"}, {'R', "{\"name\": \"B\", \"age\": -1}"},
           {'R', "{\"name\": \"B\", \"x\": 1}"}, {'A', "{\"name\":\"B\",\"age\":0}"}, {'R', "{}"});
    sg_grammar_free(g);
    g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"string\"}}");
    EXPECT(g, "additional", {'A', "{\"a\": 1, \"b\": \"x\"}"}, {'R', "{\"a\": 1, \"a\": \"x\"}"}, {'A', "{\"ab\": \"x\"}"},
           {'A', "{}"}, {'R', "{\"b\": 1}"}, {'A', "{\"\": \"\", \"é\": \"y\"}"}, {'R', "{\"\\u0061\": \"x\"}"});
    sg_grammar_free(g);
    g = schema("{\"enum\": [\"red\", 1, null, {\"a\": 1}], \"description\": \"colour\"}");
    EXPECT(g, "enum", {'A', "\"red\""}, {'A', "1"}, {'A', "null"}, {'A', "{\"a\":1}"}, {'R', "\"blue\""});
    sg_grammar_free(g);
    g = schema("{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"null\"}]}");
    EXPECT(g, "anyOf", {'A', "\"abc\""}, {'R', "\"abcd\""}, {'A', "null"}, {'A', "\"\\n中\\\"\""});
    sg_grammar_free(g);
    g = schema("{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"}},\"required\":[\"k\"]},"
               "{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"b\"},\"v\":{\"type\":\"integer\"}},\"required\":[\"k\",\"v\"]}]}");
    EXPECT(g, "oneOf", {'A', "{\"k\": \"a\"}"}, {'A', "{\"k\": \"b\", \"v\": 3}"}, {'R', "{\"k\": \"a\", \"v\": 3}"});
    sg_grammar_free(g);
    g = schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
               "\"next\":{\"$ref\":\"#/$defs/node\"}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}");
    EXPECT(g, "ref", {'A', "{\"v\": 1, \"next\": {\"v\": 2, \"next\": {\"v\": 3}}}"}, {'R', "{\"v\": 1, \"next\": {}}"});
    sg_grammar_free(g);
    g = schema("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":2}");
    EXPECT(g, "array", {'R', "[]"}, {'A', "[true]"}, {'A', "[true, false]"}, {'R', "[true, false, true]"});
    sg_grammar_free(g);
    g = schema("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}");
    EXPECT(g, "prefixItems", {'A', "[\"a\", 1]"}, {'A', "[\"a\"]"}, {'A', "[]"}, {'R', "[\"a\", 1, 2]"}, {'R', "[1]"});
    sg_grammar_free(g);
    g = schema("{\"type\":\"number\",\"minimum\":-1.5,\"exclusiveMaximum\":2}");
    EXPECT(g, "number range", {'A', "-1"}, {'A', "1.99"}, {'A', "-0.5"}, {'R', "2"}, {'R', "-2"}, {'A', "0"},
           {'R', "2.0"}, {'R', "1e0"});
    sg_grammar_free(g);
    g = schema("{\"type\":\"integer\",\"minimum\":-20,\"maximum\":305}");
    EXPECT(g, "integer range", {'A', "-20"}, {'A', "305"}, {'A', "0"}, {'R', "306"}, {'R', "-21"}, {'R', "-0"},
           {'R', "007"}, {'A', "99"}, {'A', "100"}, {'A', "-9"}, {'R', "1000"});
    sg_grammar_free(g);
    g = schema("{\"type\":\"integer\",\"exclusiveMinimum\":7}");
    EXPECT(g, "integer min", {'P', "7"}, {'R', "7,"}, {'A', "8"}, {'A', "12345"}, {'R', "-1"}, {'A', "10"});
    sg_grammar_free(g);
    g = schema("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},"
               "\"t\":{\"type\":\"string\",\"format\":\"date-time\"},\"u\":{\"type\":\"string\",\"format\":\"uuid\"},"
               "\"e\":{\"type\":\"string\",\"format\":\"email\"}}}");
    EXPECT(g, "formats", {'A', "{\"d\": \"2024-02-28\"}"}, {'R', "{\"d\": \"2024-02-30\"}"}, {'R', "{\"d\": \"2024-13-01\"}"},
           {'A', "{\"t\": \"2024-01-02T03:04:05Z\"}"}, {'A', "{\"t\": \"2024-01-02T03:04:05.123+05:30\"}"},
           {'A', "{\"u\": \"123e4567-e89b-12d3-a456-426614174000\"}"}, {'A', "{\"e\": \"a.b@example.com\"}"},
           {'R', "{\"e\": \"a@b\"}"});
    sg_grammar_free(g);
    g = schema("{\"type\":\"string\",\"pattern\":\"^a\\\"b\\\\\\\\c.$\"}");
    EXPECT(g, "pattern", {'A', "\"a\\\"b\\\\cx\""}, {'R', "\"a\"b\\cx\""}, {'R', "\"a\\\"b\\\\c\\n\""});
    sg_grammar_free(g);
    g = schema("{\"type\":\"string\",\"minLength\":2,\"maxLength\":2}");
    EXPECT(g, "lengths", {'A', "\"ab\""}, {'A', "\"\\n中\""}, {'R', "\"a\""}, {'R', "\"abc\""});
    sg_grammar_free(g);
    g = schema("{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
               "{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}");
    EXPECT(g, "allOf", {'A', "{\"a\": 1, \"b\": \"x\"}"}, {'R', "{\"a\": 1}"});
    sg_grammar_free(g);
    g = schema("{\"type\":[\"string\",\"null\"]}");
    EXPECT(g, "type list", {'A', "null"}, {'A', "\"x\""}, {'R', "1"});
    sg_grammar_free(g);
    g = schema("{}");
    EXPECT(g, "any", {'A', "1"}, {'A', "[{}]"}, {'A', "\"s\""}, {'A', "false"});
    sg_grammar_free(g);
    schema_err("{\"type\":\"object\",\"patternProperties\":{}}", "'patternProperties'");
    schema_err("{\"type\":\"string\",\"format\":\"hostname\"}", "format 'hostname'");
    schema_err("{\"$ref\":\"http://example.com/s.json\"}", "$ref");
    schema_err("{\"type\":\"integer\",\"multipleOf\":2}", "'multipleOf'");
    schema_err("{\"properties\":{\"a\":{\"not\":{}}}}", "#/properties/a: unsupported keyword 'not'");
    schema_err("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "lookaround");
    schema_err("false", "matches nothing");
    schema_err("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", "oneOf");
    schema_err("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems");
    schema_err("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "bounds");
}

// ------------------------------------------------------------- registry --

static void test_registry(void) {
    struct sg_registry *r = sg_registry_create(2);
    json_t *a = json_loads("{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}", 0, NULL);
    json_t *a2 = json_loads("{\"properties\":{\"x\":{\"type\":\"integer\"}},\"type\":\"object\"}", 0, NULL);
    json_t *re = json_string("[0-9]+"), *bad = json_string("(");
    struct sg_grammar *g1, *g2, *g3, *g4;
    CHECK(sg_registry_get(r, SG_SPEC_JSON_SCHEMA, a, &g1) == 0);
    CHECK(sg_registry_get(r, SG_SPEC_JSON_SCHEMA, a2, &g2) == 0 && g1 == g2); // keys in another order: one grammar
    CHECK(sg_registry_get(r, SG_SPEC_REGEX, re, &g3) == 0 && g3 != g1 && verdict(g3, "12") == 'A');
    CHECK(sg_registry_get(r, SG_SPEC_JSON_OBJECT, NULL, &g4) == 0 && verdict(g4, "{}") == 'A'); // evicts the schema
    struct sg_grammar *g5;
    CHECK(sg_registry_get(r, SG_SPEC_JSON_SCHEMA, a, &g5) == 0 && g5 != g1); // compiled again
    CHECK(verdict(g1, "{\"x\": 1}") == 'A'); // the evicted grammar lives on by its references
    sg_grammar_free(g1), sg_grammar_free(g2), sg_grammar_free(g3), sg_grammar_free(g4), sg_grammar_free(g5);
    struct sg_grammar *none = (struct sg_grammar *)1;
    expect_err(sg_registry_get(r, SG_SPEC_REGEX, bad, &none), "missing ')'", "registry error");
    CHECK(none == NULL);
    sg_registry_free(r); // frees the grammars it still holds (ASan: no leak)
    json_decref(a), json_decref(a2), json_decref(re), json_decref(bad);
}

int main(void) {
    test_gbnf();
    test_registry();
    test_regex();
    test_choice_object();
    test_schema();
    return test_summary("test_sg_unit");
}
