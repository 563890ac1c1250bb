// test_sg_mask.c - the mask property on the real qwen3 vocabulary (151k
// ids): a token is allowed iff appending its bytes keeps the text a viable
// prefix of the grammar (and EOS iff the text is complete). The brute force
// re-runs the grammar from the start on text + token bytes
// (sg_grammar_viable), with none of the mask's caches, compositions or trie
// walks. Checked on a sample of ids at every state of random walks through
// hand-written grammars, random GBNF grammars and JSON-schema grammars.
#include "sg_test_util.h"

static long comparisons;

static const char *FIXED[] = {
    // llama.cpp's json.gbnf shape: whitespace at rule ends (many stack-dependent tokens)
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n  \"{\" ws (\n            string \":\" ws value\n    (\",\" ws string \":\" ws value)*\n  )? \"}\" ws\n"
    "array  ::=\n  \"[\" ws (\n            value\n    (\",\" ws value)*\n  )? \"]\" ws\n"
    "string ::=\n  \"\\\"\" (\n    [^\"\\\\\\x7F\\x00-\\x1F] |\n    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})\n  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n",
    // arithmetic, recursive through parentheses
    "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= factor ((\"*\" | \"/\") factor)*\n"
    "factor ::= [0-9]+ | \"(\" expr \")\" | \"-\" factor\n",
    // Unicode classes and literals, a bounded repetition
    "root ::= (\"héllo\" | [\\u4e00-\\u9fff]{1,3} | [^a-z\\x00-\\x1f]) (\" \" root)?\n",
    // free text up to a stop word (negated classes), then a tail
    "root ::= [^<]* \"</end>\" [a-z]{0,4}\n",
    // right recursion (tail calls) and a nullable rule in a loop
    "root ::= item list\nlist ::= \",\" item list | \"\"\nitem ::= opt \"x\" | \"[\" root \"]\"\nopt ::= \"y\"?\n",
};

// ------------------------------------------------------------- random GBNF --

static const char *LITS[] = {"a", "b", "ab", "{", "}", ",", "\\\"", " ", "é", "中文", "x1", "\\n", "the", " the", "<", "12"};
static const char *CLASSES[] = {"[a-c]", "[^a]", "[0-9]", "[^\"\\\\]", "[a-zé]", "[\\u4e00-\\u9fff]", ".", "[ \\t]", "[^<>]"};

static void gen_alt(struct sg_buf *b, int rule, int nrules, int depth);

static void gen_item(struct sg_buf *b, int rule, int nrules, int depth, int *consumed) {
    int k = sgt_rand(depth >= 1 ? 3 : 4);
    if (k == 0) {
        sg_buf_addf(b, "\"%s\"", LITS[sgt_rand((int)(sizeof LITS / sizeof *LITS))]);
        *consumed = 1;
    } else if (k == 1) {
        const char *c = CLASSES[sgt_rand((int)(sizeof CLASSES / sizeof *CLASSES))];
        sg_buf_add(b, c, strlen(c));
        *consumed = 1;
    } else if (k == 2) { // a rule: later ones anywhere, earlier (or itself) only after a byte
        int j = rule + 1 + sgt_rand(nrules);
        if (j >= nrules) {
            if (!*consumed) {
                sg_buf_add(b, "\"q\" ", 4);
                *consumed = 1;
            }
            j = sgt_rand(rule + 1);
        }
        sg_buf_addf(b, "r%d", j);
    } else {
        sg_buf_addc(b, '(');
        gen_alt(b, rule, nrules, depth + 1);
        sg_buf_addc(b, ')');
        static const char *REP[] = {"?", "*", "+", "{2}", "{0,3}", "{1,}", ""};
        const char *r = REP[sgt_rand(7)];
        sg_buf_add(b, r, strlen(r));
    }
}

static void gen_alt(struct sg_buf *b, int rule, int nrules, int depth) {
    int na = 1 + sgt_rand(depth ? 2 : 3);
    for (int a = 0; a < na; a++) {
        if (a) sg_buf_add(b, " | ", 3);
        int consumed = 0, ni = 1 + sgt_rand(depth ? 2 : 3);
        for (int i = 0; i < ni; i++) {
            if (i) sg_buf_addc(b, ' ');
            gen_item(b, rule, nrules, depth, &consumed);
        }
    }
}

static char *gen_grammar(void) {
    struct sg_buf b = {0};
    int n = 1 + sgt_rand(3);
    sg_buf_add(&b, "root ::= r0\n", 12);
    for (int r = 0; r < n; r++) {
        sg_buf_addf(&b, "r%d ::= ", r);
        gen_alt(&b, r, n, 0);
        sg_buf_addc(&b, '\n');
    }
    return sg_buf_take(&b);
}

// ----------------------------------------------------------------- the check --

// One random walk; at each state compares the mask with the brute force on
// a sample: random ids, random allowed ids, and ids next to allowed ones in
// byte order (sharing a prefix: the hard cases).
static void walk(const struct sg_grammar *g, const struct sg_vocab *v, const char *name) {
    int V = v->vocab_size, words = CDIV(V, 32);
    uint32_t *mask = xmalloc((size_t)words * sizeof *mask);
    int32_t *pos = NULL; // id -> index in v->tok
    static int32_t *pos_cache;
    if (!pos_cache) {
        pos_cache = xmalloc((size_t)V * sizeof *pos_cache);
        for (int i = 0; i < V; i++) pos_cache[i] = -1;
        for (int k = 0; k < v->n_tok; k++) pos_cache[v->tok[k]] = k;
    }
    pos = pos_cache;
    struct sg_matcher *m = sg_matcher_create(g, v);
    struct sg_buf text = {0};
    char *buf = xmalloc((size_t)v->max_len + 4096);
    for (int step = 0; step < 40; step++) {
        sg_matcher_fill_mask(m, mask);
        int n_allowed = sgt_count(mask, words);
        int acc;
        int viable = sg_grammar_viable(g, text.p ? text.p : "", text.len, &acc);
        CHECKF(viable, "%s: the walk left the grammar", name);
        for (int k = 0; k < v->n_eos; k++) {
            CHECKF(sgt_bit(mask, v->eos[k]) == acc, "%s step %d: EOS %d vs accepting %d", name, step, sgt_bit(mask, v->eos[k]), acc);
            comparisons++;
        }
        for (int s = 0; s < 240; s++) {
            int32_t id;
            if (s < 80 || !n_allowed) id = sgt_rand(V);
            else if (s < 160) id = sgt_nth(mask, words, sgt_rand(n_allowed));
            else {
                int32_t a = sgt_nth(mask, words, sgt_rand(n_allowed));
                int p = pos[a] < 0 ? sgt_rand(v->n_tok) : pos[a] + sgt_rand(33) - 16;
                id = v->tok[MIN(MAX(p, 0), v->n_tok - 1)];
            }
            if (sgt_is_eos(v, id)) continue;
            int want = 0;
            if (v->bytes[id] && text.len + v->len[id] < (size_t)v->max_len + 4096) {
                memcpy(buf, text.p ? text.p : "", text.len);
                memcpy(buf + text.len, v->bytes[id], v->len[id]);
                want = sg_grammar_viable(g, buf, text.len + v->len[id], NULL);
            }
            comparisons++;
            if (sgt_bit(mask, id) != want) {
                CHECKF(0, "%s step %d: token %d '%.*s' mask %d, brute force %d (text '%.*s')", name, step, id,
                       v->len[id], v->bytes[id] ? v->bytes[id] : "", sgt_bit(mask, id), want, (int)text.len, text.p);
                goto out;
            }
        }
        int32_t id = sgt_pick(m, v, mask, words, step, 14);
        if (id < 0 || sgt_is_eos(v, id)) break;
        CHECK(sg_matcher_accept(m, id) == VLLM_OK);
        sg_buf_add(&text, v->bytes[id], v->len[id]);
        if (text.len > 3000) break;
    }
out:
    free(text.p);
    free(buf);
    free(mask);
    sg_matcher_free(m);
}

static void check_gbnf(const char *src, const struct sg_vocab *v, const char *name, int walks) {
    struct sg_grammar *g;
    if (sg_compile_gbnf(src, &g)) {
        CHECKF(0, "%s: %s", name, vllm_last_error());
        return;
    }
    for (int w = 0; w < walks; w++) {
        if (w == walks - 1) sg_grammar_warm(g, v); // the last walk on a fully computed cache
        walk(g, v, name);
    }
    sg_grammar_free(g);
}

int main(int argc, char **argv) {
    struct tokenizer *tok;
    struct sg_vocab *v = sgt_vocab(&tok);
    int n_random = argc > 1 ? atoi(argv[1]) : 40;
    for (size_t i = 0; i < sizeof FIXED / sizeof *FIXED; i++) {
        char name[32];
        snprintf(name, sizeof name, "fixed %zu", i);
        check_gbnf(FIXED[i], v, name, 3);
    }
    int compiled = 0;
    for (int i = 0; i < n_random; i++) {
        char *src = gen_grammar();
        struct sg_grammar *g;
        if (sg_compile_gbnf(src, &g) == VLLM_OK) { // an empty language or left recursion: skipped
            char name[64];
            snprintf(name, sizeof name, "random %d", i);
            for (int w = 0; w < 2; w++) walk(g, v, name);
            if (test_failures) fprintf(stderr, "grammar:\n%s\n", src);
            sg_grammar_free(g);
            compiled++;
        }
        free(src);
        if (test_failures) break;
    }
    CHECKF(compiled > n_random / 2, "only %d of %d random grammars compiled", compiled, n_random);
    CHECKF(comparisons > 10000, "%ld comparisons", comparisons);
    printf("mask property: %ld comparisons, %d random grammars\n", comparisons, compiled);
    sg_vocab_free(v);
    tok_free(tok);
    return test_summary("test_sg_mask");
}
