// tok_load.c - reads tokenizer.json (+ tokenizer_config.json) into a
// struct tokenizer. Anything not implemented is VLLM_ERR_UNSUPPORTED naming it.
#include "core/common.h"
#include "core/json.h"
#include "tokenizer/tok_internal.h"

static int unsupported(const char *what, const char *type) {
    return vllm_err(VLLM_ERR_UNSUPPORTED, "tokenizer.json: %s type '%s' is not supported", what, type);
}

static const char *type_of(const json_t *j) {
    const char *s = json_string_value(json_object_get(j, "type"));
    return s ? s : "";
}

static int opt_bool(const json_t *j, const char *key, int dflt) {
    const json_t *v = json_object_get(j, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int opt_int(const json_t *j, const char *key, int dflt) {
    const json_t *v = json_object_get(j, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

// {"String": s} or {"Regex": r}
static int parse_pattern(const json_t *p, const char *what, struct tok_regex **re, const char **lit) {
    const json_t *s = json_object_get(p, "String"), *r = json_object_get(p, "Regex");
    if (json_is_string(s)) {
        if (lit) *lit = json_string_value(s);
        return tok_regex_compile(json_string_value(s), json_string_length(s), 1, re);
    }
    if (json_is_string(r)) {
        if (lit) *lit = NULL;
        return tok_regex_compile(json_string_value(r), json_string_length(r), 0, re);
    }
    return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: %s: pattern needs \"String\" or \"Regex\"", what);
}

static int one_char(const json_t *j, const char *key, const char *dflt, char out[8], uint32_t *cp) {
    const char *s = json_string_value(json_object_get(j, key));
    if (!s) s = dflt;
    size_t n = strlen(s);
    int bad, partial, k = n ? utf8_seq((const uint8_t *)s, n, &bad, &partial) : 0;
    if (!k || (size_t)k != n) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: '%s' must be one char", key);
    memcpy(out, s, n);
    out[n] = 0;
    if (cp) utf8_decode((const uint8_t *)s, cp);
    return VLLM_OK;
}

static int parse_scheme(const json_t *j, enum prepend_scheme *out) {
    const char *s = json_string_value(json_object_get(j, "prepend_scheme"));
    if (!s) { // older files: add_prefix_space
        *out = opt_bool(j, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
        return VLLM_OK;
    }
    if (!strcmp(s, "always")) *out = PREPEND_ALWAYS;
    else if (!strcmp(s, "never")) *out = PREPEND_NEVER;
    else if (!strcmp(s, "first")) *out = PREPEND_FIRST;
    else return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: prepend_scheme '%s'", s);
    return VLLM_OK;
}

// --------------------------------------------------------------- normalizer --

void tok_normalizer_free(struct normalizer *n) {
    if (!n) return;
    for (int i = 0; i < n->n_sub; i++) tok_normalizer_free(n->sub[i]);
    free(n->sub);
    free(n->str);
    tok_regex_free(n->re);
    free(n);
}

int tok_parse_normalizer(const json_t *j, struct normalizer **out) {
    *out = NULL;
    if (!json_is_object(j)) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: normalizer is not an object");
    const char *ty = type_of(j);
    struct normalizer *n = xcalloc(1, sizeof *n);
    int rc = VLLM_OK;
    if (!strcmp(ty, "NFC")) n->type = NORM_NFC;
    else if (!strcmp(ty, "NFKC")) n->type = NORM_NFKC;
    else if (!strcmp(ty, "NFD")) n->type = NORM_NFD;
    else if (!strcmp(ty, "NFKD")) n->type = NORM_NFKD;
    else if (!strcmp(ty, "Lowercase")) n->type = NORM_LOWER;
    else if (!strcmp(ty, "Strip")) {
        n->type = NORM_STRIP;
        n->left = opt_bool(j, "strip_left", 1);
        n->right = opt_bool(j, "strip_right", 1);
    } else if (!strcmp(ty, "Prepend")) {
        n->type = NORM_PREPEND;
        const char *p = json_string_value(json_object_get(j, "prepend"));
        if (!p) rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: Prepend needs \"prepend\"");
        else n->str = xstrdup(p);
    } else if (!strcmp(ty, "Replace")) {
        n->type = NORM_REPLACE;
        const char *c = json_string_value(json_object_get(j, "content"));
        if (!c) rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: Replace needs \"content\"");
        else {
            n->str = xstrdup(c);
            rc = parse_pattern(json_object_get(j, "pattern"), "Replace normalizer", &n->re, NULL);
        }
    } else if (!strcmp(ty, "Sequence")) {
        n->type = NORM_SEQ;
        const json_t *a = json_object_get(j, "normalizers");
        if (!json_is_array(a)) rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: Sequence needs \"normalizers\"");
        else {
            n->sub = xcalloc(json_array_size(a) + 1, sizeof *n->sub);
            for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
                rc = tok_parse_normalizer(json_array_get(a, i), &n->sub[i]);
                if (!rc) n->n_sub++;
            }
        }
    } else {
        rc = unsupported("normalizer", ty);
    }
    if (rc) {
        tok_normalizer_free(n);
        return rc;
    }
    *out = n;
    return VLLM_OK;
}

// ------------------------------------------------------------ pre-tokenizer --

void tok_pretok_free(struct pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_sub; i++) tok_pretok_free(p->sub[i]);
    free(p->sub);
    tok_regex_free(p->re);
    free(p);
}

static int parse_behavior(const json_t *j, enum split_behavior dflt, enum split_behavior *out) {
    const char *s = json_string_value(json_object_get(j, "behavior"));
    *out = dflt;
    if (!s) return VLLM_OK;
    if (!strcmp(s, "Removed")) *out = SPLIT_REMOVED;
    else if (!strcmp(s, "Isolated")) *out = SPLIT_ISOLATED;
    else if (!strcmp(s, "MergedWithPrevious")) *out = SPLIT_MERGED_PREV;
    else if (!strcmp(s, "MergedWithNext")) *out = SPLIT_MERGED_NEXT;
    else if (!strcmp(s, "Contiguous")) *out = SPLIT_CONTIGUOUS;
    else return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: split behavior '%s'", s);
    return VLLM_OK;
}

const char *tok_gpt2_regex(void);
const char *tok_ws_regex(void);

int tok_parse_pretok(const json_t *j, struct pretok **out) {
    *out = NULL;
    if (!json_is_object(j)) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: pre_tokenizer is not an object");
    const char *ty = type_of(j);
    struct pretok *p = xcalloc(1, sizeof *p);
    int rc = VLLM_OK;
    if (!strcmp(ty, "ByteLevel")) {
        p->type = PT_BYTELEVEL;
        p->add_prefix_space = opt_bool(j, "add_prefix_space", 1);
        p->use_regex = opt_bool(j, "use_regex", 1);
        if (p->use_regex) rc = tok_regex_compile(tok_gpt2_regex(), strlen(tok_gpt2_regex()), 0, &p->re);
    } else if (!strcmp(ty, "Split")) {
        p->type = PT_SPLIT;
        p->invert = opt_bool(j, "invert", 0);
        rc = parse_behavior(j, SPLIT_REMOVED, &p->behavior);
        if (!rc && !json_object_get(j, "behavior")) rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: Split needs \"behavior\"");
        if (!rc) rc = parse_pattern(json_object_get(j, "pattern"), "Split", &p->re, NULL);
    } else if (!strcmp(ty, "Digits")) {
        p->type = PT_DIGITS;
        p->individual_digits = opt_bool(j, "individual_digits", 0);
    } else if (!strcmp(ty, "Metaspace")) {
        p->type = PT_METASPACE;
        rc = one_char(j, "replacement", "\xE2\x96\x81", p->rep, &p->rep_cp);
        if (!rc) rc = parse_scheme(j, &p->scheme);
        p->split = opt_bool(j, "split", 1);
    } else if (!strcmp(ty, "Punctuation")) {
        p->type = PT_PUNCT;
        rc = parse_behavior(j, SPLIT_ISOLATED, &p->behavior);
    } else if (!strcmp(ty, "Whitespace")) {
        p->type = PT_WHITESPACE;
        rc = tok_regex_compile(tok_ws_regex(), strlen(tok_ws_regex()), 0, &p->re);
    } else if (!strcmp(ty, "WhitespaceSplit")) {
        p->type = PT_WHITESPACE_SPLIT;
    } else if (!strcmp(ty, "Sequence")) {
        p->type = PT_SEQ;
        const json_t *a = json_object_get(j, "pretokenizers");
        if (!json_is_array(a)) rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: Sequence needs \"pretokenizers\"");
        else {
            p->sub = xcalloc(json_array_size(a) + 1, sizeof *p->sub);
            for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
                rc = tok_parse_pretok(json_array_get(a, i), &p->sub[i]);
                if (!rc) p->n_sub++;
            }
        }
    } else {
        rc = unsupported("pre_tokenizer", ty);
    }
    if (rc) {
        tok_pretok_free(p);
        return rc;
    }
    *out = p;
    return VLLM_OK;
}

// ------------------------------------------------------------------ decoder --

void tok_decoder_free(struct decoder *d) {
    if (!d) return;
    for (int i = 0; i < d->n_sub; i++) tok_decoder_free(d->sub[i]);
    free(d->sub);
    free(d->pattern);
    free(d->content);
    free(d);
}

int tok_parse_decoder(const json_t *j, struct decoder **out) {
    *out = NULL;
    if (!json_is_object(j)) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: decoder is not an object");
    const char *ty = type_of(j);
    struct decoder *d = xcalloc(1, sizeof *d);
    int rc = VLLM_OK;
    if (!strcmp(ty, "ByteLevel")) d->type = DEC_BYTELEVEL;
    else if (!strcmp(ty, "ByteFallback")) d->type = DEC_BYTEFALLBACK;
    else if (!strcmp(ty, "Fuse")) d->type = DEC_FUSE;
    else if (!strcmp(ty, "Strip")) {
        d->type = DEC_STRIP;
        char c[8];
        rc = one_char(j, "content", " ", c, NULL);
        d->content = xstrdup(c);
        d->start = opt_int(j, "start", 0);
        d->stop = opt_int(j, "stop", 0);
    } else if (!strcmp(ty, "Replace")) {
        d->type = DEC_REPLACE;
        const json_t *pat = json_object_get(j, "pattern");
        const char *s = json_string_value(json_object_get(pat, "String"));
        const char *c = json_string_value(json_object_get(j, "content"));
        if (json_object_get(pat, "Regex")) rc = vllm_err(VLLM_ERR_UNSUPPORTED, "tokenizer.json: Replace decoder with a Regex pattern is not supported");
        else if (!s || !c) rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: Replace decoder needs pattern.String and content");
        else {
            d->pattern = xstrdup(s);
            d->content = xstrdup(c);
        }
    } else if (!strcmp(ty, "Metaspace")) {
        d->type = DEC_METASPACE;
        rc = one_char(j, "replacement", "\xE2\x96\x81", d->rep, NULL);
        if (!rc) rc = parse_scheme(j, &d->scheme);
    } else if (!strcmp(ty, "Sequence")) {
        d->type = DEC_SEQ;
        const json_t *a = json_object_get(j, "decoders");
        if (!json_is_array(a)) rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: Sequence needs \"decoders\"");
        else {
            d->sub = xcalloc(json_array_size(a) + 1, sizeof *d->sub);
            for (size_t i = 0; i < json_array_size(a) && !rc; i++) {
                rc = tok_parse_decoder(json_array_get(a, i), &d->sub[i]);
                if (!rc) d->n_sub++;
            }
        }
    } else {
        rc = unsupported("decoder", ty);
    }
    if (rc) {
        tok_decoder_free(d);
        return rc;
    }
    *out = d;
    return VLLM_OK;
}

// -------------------------------------------------------------------- model --

static const char *vocab_key(const void *owner, int32_t id, size_t *len) {
    const struct tokenizer *t = owner;
    *len = t->tok_len[id];
    return t->arena.p + t->tok_off[id];
}

static const char *added_key(const void *owner, int32_t i, size_t *len) {
    const struct tokenizer *t = owner;
    *len = t->added[i].len;
    return t->added[i].content;
}

#define MAX_VOCAB (1 << 26)

static int load_model(struct tokenizer *t, const json_t *m) {
    if (!json_is_object(m)) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: no \"model\" object");
    const char *ty = type_of(m);
    if (*ty && strcmp(ty, "BPE")) return unsupported("model", ty);
    const json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges))
        return *ty ? vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: BPE model needs \"vocab\" and \"merges\"")
                   : unsupported("model", "(untyped, not BPE)");
    const json_t *dropout = json_object_get(m, "dropout");
    double dv = 0;
    if (dropout && !json_is_null(dropout) && (json_as_double(dropout, &dv) || dv != 0.0))
        return vllm_err(VLLM_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
    const char *key;
    json_t *v;
    int max_id = -1;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_VOCAB)
            return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: vocab entry '%.80s' has a bad id", key);
        max_id = MAX(max_id, (int)json_integer_value(v));
    }
    t->n_ids = max_id + 1;
    // [n_ids + 1] each: the largest id sizes them, so a sparse vocab with a
    // huge id fails here with a message rather than aborting.
    t->tok_off = try_calloc((size_t)t->n_ids + 1, sizeof *t->tok_off, "tokenizer.json: the vocab's offsets");
    t->tok_len = t->tok_off ? try_calloc((size_t)t->n_ids + 1, sizeof *t->tok_len, "tokenizer.json: the vocab's lengths")
                            : NULL;
    if (!t->tok_len) return VLLM_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < t->n_ids; i++) t->tok_len[i] = UINT32_MAX;
    strmap_init(&t->vocab, (int)json_object_size(vocab));
    for (void *it = json_object_iter((json_t *)vocab); it; it = json_object_iter_next((json_t *)vocab, it)) {
        key = json_object_iter_key(it);
        int id = (int)json_integer_value(json_object_iter_value(it));
        size_t n = json_object_iter_key_len(it);
        t->tok_off[id] = (uint32_t)t->arena.len;
        t->tok_len[id] = (uint32_t)n;
        sbuf_add(&t->arena, key, n + 1);
        strmap_put(&t->vocab, t, vocab_key, id);
    }
    const json_t *unk = json_object_get(m, "unk_token");
    t->unk_id = -1;
    if (json_is_string(unk)) {
        t->unk_id = strmap_get(&t->vocab, t, vocab_key, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0)
            return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: unk_token '%.80s' is not in the vocab", json_string_value(unk));
    }
    const char *cp = json_string_value(json_object_get(m, "continuing_subword_prefix"));
    const char *es = json_string_value(json_object_get(m, "end_of_word_suffix"));
    if (cp && *cp) t->cont_prefix = xstrdup(cp);
    if (es && *es) t->eow_suffix = xstrdup(es);
    t->byte_fallback = opt_bool(m, "byte_fallback", 0);
    t->ignore_merges = opt_bool(m, "ignore_merges", 0);
    t->fuse_unk = opt_bool(m, "fuse_unk", 0);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_id[b] = strmap_get(&t->vocab, t, vocab_key, s, 6);
    }
    if (!t->cont_prefix && !t->eow_suffix) { // one-char tokens by code point, to skip hashing
        t->char_id = xmalloc(0x10000 * sizeof *t->char_id);
        for (int i = 0; i < 0x10000; i++) t->char_id[i] = -1;
        for (int id = 0; id < t->n_ids; id++) {
            uint32_t n = t->tok_len[id];
            if (n == UINT32_MAX || n == 0 || n > 3) continue;
            const uint8_t *s = (const uint8_t *)t->arena.p + t->tok_off[id];
            int bad, partial, k = utf8_seq(s, n, &bad, &partial);
            uint32_t c;
            if (k != (int)n) continue;
            utf8_decode(s, &c);
            if (strmap_get(&t->vocab, t, vocab_key, (const char *)s, n) == id) t->char_id[c] = id;
        }
    }
    return tok_merges_build(t, merges);
}

// ------------------------------------------------------------ added tokens --

static int32_t token_to_id(const struct tokenizer *t, const char *s, size_t n) {
    int32_t a = strmap_get(&t->added_map, t, added_key, s, n);
    if (a >= 0) return t->added[a].id;
    return strmap_get(&t->vocab, t, vocab_key, s, n);
}

// HF AddedVocabulary::add_tokens: an added token keeps the id of an equal
// vocab entry; otherwise it gets the next id after the vocab (or after the
// highest added id). The "id" written in the file is not used.
static int load_added(struct tokenizer *t, const json_t *arr) {
    size_t n = json_array_size(arr);
    t->added = xcalloc(n + 1, sizeof *t->added);
    strmap_init(&t->added_map, (int)n);
    int model_size = t->vocab.count;
    int32_t max_added = -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(arr, i);
        const json_t *c = json_object_get(a, "content");
        if (!json_is_string(c)) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] has no content", i);
        if (json_string_length(c) == 0) continue;
        struct added_token tk = {0};
        tk.content = xmalloc(json_string_length(c) + 1);
        memcpy(tk.content, json_string_value(c), json_string_length(c) + 1);
        tk.len = json_string_length(c);
        tk.special = opt_bool(a, "special", 0);
        tk.normalized = opt_bool(a, "normalized", !tk.special);
        tk.lstrip = opt_bool(a, "lstrip", 0);
        tk.rstrip = opt_bool(a, "rstrip", 0);
        tk.single_word = opt_bool(a, "single_word", 0);
        int32_t prev = strmap_get(&t->added_map, t, added_key, tk.content, tk.len);
        int32_t id = prev >= 0 ? t->added[prev].id : strmap_get(&t->vocab, t, vocab_key, tk.content, tk.len);
        if (id < 0) id = max_added < 0 ? model_size : (max_added >= model_size || model_size == 0 ? max_added + 1 : model_size);
        if (id >= MAX_VOCAB) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: too many added tokens");
        if (prev >= 0) { // the same content again: the later entry's flags win
            tk.special |= t->added[prev].special;
            free(t->added[prev].content);
            tk.id = id;
            t->added[prev] = tk;
        } else {
            tk.id = id;
            t->added[t->n_added] = tk;
            strmap_put(&t->added_map, t, added_key, t->n_added);
            t->n_added++;
        }
        max_added = MAX(max_added, id);
    }
    return VLLM_OK;
}

static int build_matchers(struct tokenizer *t) {
    matcher_init(&t->match_raw);
    matcher_init(&t->match_norm);
    // Special tokens first, then the others: the first of equal patterns wins.
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < t->n_added; i++) {
            const struct added_token *a = &t->added[i];
            if (a->special != (pass == 0)) continue;
            if (!a->normalized || !t->normalizer) {
                matcher_add(a->normalized ? &t->match_norm : &t->match_raw, a->content, a->len, i);
                continue;
            }
            char *ns;
            size_t nl;
            int cut = 0;
            TRY(tok_normalize(t->normalizer, a->content, a->len, &ns, &nl, &cut));
            matcher_add(&t->match_norm, ns, nl, i);
            t->added[i].piece = ns;
            t->added[i].piece_len = nl;
        }
    for (int i = 0; i < t->n_added; i++)
        if (!t->added[i].piece) {
            t->added[i].piece = xstrdup(t->added[i].content);
            t->added[i].piece_len = t->added[i].len;
        }
    t->vocab_size = t->n_ids;
    for (int i = 0; i < t->n_added; i++) t->vocab_size = MAX(t->vocab_size, t->added[i].id + 1);
    t->added_by_id = try_calloc((size_t)t->vocab_size, sizeof *t->added_by_id, "tokenizer.json: the added-token index");
    if (!t->added_by_id) return VLLM_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < t->vocab_size; i++) t->added_by_id[i] = -1;
    for (int i = 0; i < t->n_added; i++) t->added_by_id[t->added[i].id] = i;
    return VLLM_OK;
}

// ----------------------------------------------------------- post-processor --

struct ids {
    int32_t *v;
    int n;
};

static void ids_cat(struct ids *d, const int32_t *s, int n, int at_front) {
    if (n <= 0) return;
    d->v = xrealloc(d->v, (size_t)(d->n + n + 1) * sizeof *d->v);
    if (at_front) {
        memmove(d->v + n, d->v, (size_t)d->n * sizeof *d->v);
        memcpy(d->v, s, (size_t)n * sizeof *s);
    } else {
        memcpy(d->v + d->n, s, (size_t)n * sizeof *s);
    }
    d->n += n;
}

static int special_ids(const json_t *specials, const char *name, struct ids *out) {
    const json_t *ids = json_object_get(json_object_get(specials, name), "ids");
    if (!json_is_array(ids))
        return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: TemplateProcessing special token '%.80s' has no ids", name);
    out->n = 0;
    for (size_t i = 0; i < json_array_size(ids); i++) {
        const json_t *x = json_array_get(ids, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= MAX_VOCAB)
            return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: TemplateProcessing: bad id for '%.80s'", name);
        int32_t id = (int32_t)json_integer_value(x);
        ids_cat(out, &id, 1, 0);
    }
    return VLLM_OK;
}

// Post-processors wrap the sequence: pre + seq + post. A Sequence applies
// them in order, each wrapping the result of the previous one.
static int parse_post(const json_t *j, struct ids *pre, struct ids *post) {
    if (!j || json_is_null(j)) return VLLM_OK;
    const char *ty = type_of(j);
    if (!strcmp(ty, "ByteLevel")) return VLLM_OK; // offsets only
    if (!strcmp(ty, "Sequence")) {
        const json_t *a = json_object_get(j, "processors");
        for (size_t i = 0; i < json_array_size(a); i++) TRY(parse_post(json_array_get(a, i), pre, post));
        return VLLM_OK;
    }
    struct ids p = {0}, q = {0}, tmp = {0};
    int rc = VLLM_OK;
    if (!strcmp(ty, "TemplateProcessing")) {
        const json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
        int seen_a = 0;
        for (size_t i = 0; i < json_array_size(single) && !rc; i++) {
            const json_t *e = json_array_get(single, i);
            const json_t *st = json_object_get(e, "SpecialToken");
            if (json_object_get(e, "Sequence")) {
                if (seen_a++) rc = vllm_err(VLLM_ERR_UNSUPPORTED, "tokenizer.json: TemplateProcessing repeats the sequence");
            } else if (json_is_string(json_object_get(st, "id"))) {
                rc = special_ids(specials, json_string_value(json_object_get(st, "id")), &tmp);
                if (!rc) ids_cat(seen_a ? &q : &p, tmp.v, tmp.n, 0);
            } else {
                rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: TemplateProcessing: bad piece in \"single\"");
            }
        }
        if (!rc && !seen_a) rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: TemplateProcessing \"single\" has no sequence");
    } else if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        const json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        if (!json_is_integer(json_array_get(cls, 1)) || !json_is_integer(json_array_get(sep, 1)))
            rc = vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: %s needs cls and sep", ty);
        else {
            int32_t c = (int32_t)json_integer_value(json_array_get(cls, 1));
            int32_t s = (int32_t)json_integer_value(json_array_get(sep, 1));
            ids_cat(&p, &c, 1, 0);
            ids_cat(&q, &s, 1, 0);
        }
    } else {
        rc = unsupported("post_processor", ty);
    }
    if (!rc) {
        ids_cat(pre, p.v, p.n, 1);
        ids_cat(post, q.v, q.n, 0);
    }
    free(p.v);
    free(q.v);
    free(tmp.v);
    return rc;
}

static const char *config_token(const json_t *config, const char *key) {
    const json_t *v = json_object_get(config, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

// add_bos_token / add_eos_token in tokenizer_config.json, when present,
// decide the special tokens around a sequence (transformers rebuilds the
// post-processor from them as "bos $A eos").
static int config_post(const struct tokenizer *t, const json_t *config, struct ids *pre, struct ids *post,
                       int *used) {
    const json_t *ab = json_object_get(config, "add_bos_token"), *ae = json_object_get(config, "add_eos_token");
    *used = json_is_boolean(ab) || json_is_boolean(ae);
    if (!*used) return VLLM_OK;
    const char *keys[2] = {"bos_token", "eos_token"};
    for (int k = 0; k < 2; k++) {
        if (!json_is_true(k ? ae : ab)) continue;
        const char *s = config_token(config, keys[k]);
        int32_t id = s ? token_to_id(t, s, strlen(s)) : -1;
        if (id < 0)
            return vllm_err(VLLM_ERR_FORMAT, "tokenizer_config.json: add_%s is true but %s '%s' is not a token",
                            keys[k], keys[k], s ? s : "(none)");
        ids_cat(k ? post : pre, &id, 1, 0);
    }
    return VLLM_OK;
}

// -------------------------------------------------------------------- load --

void tok_free(struct tokenizer *t) {
    if (!t) return;
    free(t->arena.p);
    free(t->tok_off);
    free(t->tok_len);
    strmap_free(&t->vocab);
    tok_merges_free(&t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    free(t->char_id);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].piece);
    }
    free(t->added);
    free(t->added_by_id);
    strmap_free(&t->added_map);
    matcher_free(&t->match_raw);
    matcher_free(&t->match_norm);
    tok_normalizer_free(t->normalizer);
    tok_pretok_free(t->pretok);
    tok_decoder_free(t->decoder);
    free(t->pre_ids);
    free(t->post_ids);
    free(t);
}

static int load(struct tokenizer *t, const json_t *tj, const json_t *config) {
    if (!json_is_object(tj)) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: not a JSON object");
    const json_t *x;
    if ((x = json_object_get(tj, "normalizer")) && !json_is_null(x)) TRY(tok_parse_normalizer(x, &t->normalizer));
    if ((x = json_object_get(tj, "pre_tokenizer")) && !json_is_null(x)) TRY(tok_parse_pretok(x, &t->pretok));
    if ((x = json_object_get(tj, "decoder")) && !json_is_null(x)) TRY(tok_parse_decoder(x, &t->decoder));
    TRY(load_model(t, json_object_get(tj, "model")));
    x = json_object_get(tj, "added_tokens");
    if (x && !json_is_null(x) && !json_is_array(x)) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: added_tokens is not an array");
    TRY(load_added(t, x));
    TRY(build_matchers(t));
    struct ids pre = {0}, post = {0};
    int used = 0, rc = config ? config_post(t, config, &pre, &post, &used) : VLLM_OK;
    if (!rc && !used) rc = parse_post(json_object_get(tj, "post_processor"), &pre, &post);
    t->pre_ids = pre.v;
    t->n_pre = pre.n;
    t->post_ids = post.v;
    t->n_post = post.n;
    if (rc) return rc;
    for (int i = 0; i < pre.n; i++)
        if (pre.v[i] >= t->vocab_size) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: post-processor id %d out of range", pre.v[i]);
    for (int i = 0; i < post.n; i++)
        if (post.v[i] >= t->vocab_size) return vllm_err(VLLM_ERR_FORMAT, "tokenizer.json: post-processor id %d out of range", post.v[i]);
    return VLLM_OK;
}

int tok_load_json(const json_t *tj, const json_t *config, struct tokenizer **out) {
    *out = NULL;
    struct tokenizer *t = xcalloc(1, sizeof *t);
    int rc = load(t, tj, config);
    if (rc) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return VLLM_OK;
}

int tok_load_buffer(const char *data, size_t len, struct tokenizer **out) {
    json_t *j;
    *out = NULL;
    TRY(json_parse_python(data, len, "tokenizer.json", &j));
    int rc = tok_load_json(j, NULL, out);
    json_decref(j);
    return rc;
}

// tokenizer_config.json often holds integers past 64 bits (model_max_length
// = 1e30 written as an int), which jansson refuses as ints: read numbers as
// doubles; anything else malformed gets json_load_path's error.
static int load_config(const char *path, json_t **out) {
    char *data;
    size_t len;
    TRY(read_file(path, &data, &len));
    *out = json_loadb(data, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, NULL);
    free(data);
    return *out ? VLLM_OK : json_load_path(path, out);
}

int tok_load(const char *model_dir, struct tokenizer **out) {
    *out = NULL;
    char *path = path_join(model_dir, "tokenizer.json");
    if (!file_exists(path)) {
        int rc = vllm_err(VLLM_ERR_IO, "%s: no tokenizer.json", model_dir);
        free(path);
        return rc;
    }
    json_t *tj = NULL, *config = NULL;
    int rc = json_load_path(path, &tj);
    free(path);
    if (rc) return rc;
    path = path_join(model_dir, "tokenizer_config.json");
    if (file_exists(path)) rc = load_config(path, &config);
    free(path);
    if (!rc) rc = tok_load_json(tj, config, out);
    json_decref(tj);
    json_decref(config);
    return rc;
}
