// tok_internal.h - the pieces behind tokenizer.h: UTF-8 helpers, hash maps,
// regexes, and the component trees read from tokenizer.json. Each stage
// follows the Hugging Face tokenizers crate step for step; where that crate's
// behaviour is subtle the comment at the implementation says what it does.
#ifndef VLLM_TOK_INTERNAL_H
#define VLLM_TOK_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

// ------------------------------------------------------------------ UTF-8 --

// Length (1-4) of the valid UTF-8 sequence at s[0..n), or 0 when invalid; then
// *bad is the length of its maximal subpart (the bytes one U+FFFD replaces, as
// Rust's String::from_utf8_lossy and the WHATWG decoder do), and *partial is 1
// when those bytes are a valid sequence cut short by the end of the buffer.
int utf8_seq(const uint8_t *s, size_t n, int *bad, int *partial);
// Decodes the (valid) sequence at s; returns its length.
int utf8_decode(const uint8_t *s, uint32_t *cp);
int utf8_encode(uint32_t cp, char *out); // returns 1-4
int utf8_valid(const char *s, size_t n);
// s with every invalid sequence replaced by U+FFFD (from_utf8_lossy); malloc'd.
char *utf8_lossy(const char *s, size_t n, size_t *out_len);
int uni_is_whitespace(uint32_t cp);  // Rust char::is_whitespace
int uni_is_numeric(uint32_t cp);     // Rust char::is_numeric (Nd, Nl, No)
int uni_is_punctuation(uint32_t cp); // ASCII punctuation or Unicode P*

// ------------------------------------------------------------ growing buffer --

struct sbuf {
    char *p;
    size_t len, cap;
};
void sbuf_add(struct sbuf *b, const void *s, size_t n);
void sbuf_reserve(struct sbuf *b, size_t extra);

// -------------------------------------------------------------- hash maps --

uint64_t tok_hash(const void *s, size_t n);

// String -> id over strings kept by the owner (get(owner, id) gives them).
struct strmap {
    uint64_t *hash; // per slot; 0 = empty
    int32_t *id;
    uint32_t mask;
    int count;
};
void strmap_init(struct strmap *m, int expected);
void strmap_free(struct strmap *m);
typedef const char *(*strmap_key_fn)(const void *owner, int32_t id, size_t *len);
// Inserts id under its key, replacing an equal key. Returns the replaced id or -1.
int32_t strmap_put(struct strmap *m, const void *owner, strmap_key_fn key, int32_t id);
int32_t strmap_get(const struct strmap *m, const void *owner, strmap_key_fn key, const char *s,
                   size_t n);

// ----------------------------------------------------------------- regex --

struct tok_regex;
// pattern is Oniguruma syntax as tokenizer.json writes it (or a literal when
// literal != 0). VLLM_ERR_UNSUPPORTED when PCRE2 cannot express it the same way.
int tok_regex_compile(const char *pattern, size_t len, int literal, struct tok_regex **out);
void tok_regex_free(struct tok_regex *re);
// All non-overlapping matches in s[0..n) as [start, end) pairs appended to
// *m (2 ints each), with the regex crate's rule for empty matches.
int tok_regex_find_all(const struct tok_regex *re, const char *s, size_t n, int **m, int *num,
                       int *cap);

// ------------------------------------------------------------ components --

enum norm_type { NORM_SEQ, NORM_NFC, NORM_NFKC, NORM_NFD, NORM_NFKD, NORM_LOWER, NORM_STRIP,
                 NORM_PREPEND, NORM_REPLACE };
struct normalizer {
    enum norm_type type;
    int n_sub;
    struct normalizer **sub;
    int left, right;            // Strip
    char *str;                  // Prepend text, Replace content
    struct tok_regex *re;       // Replace pattern
};

enum split_behavior { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT,
                      SPLIT_CONTIGUOUS };
enum prepend_scheme { PREPEND_ALWAYS, PREPEND_NEVER, PREPEND_FIRST };
enum pretok_type { PT_SEQ, PT_BYTELEVEL, PT_SPLIT, PT_DIGITS, PT_METASPACE, PT_PUNCT,
                   PT_WHITESPACE, PT_WHITESPACE_SPLIT };
struct pretok {
    enum pretok_type type;
    int n_sub;
    struct pretok **sub;
    int add_prefix_space, use_regex; // ByteLevel
    struct tok_regex *re;            // Split, ByteLevel (use_regex), Whitespace
    enum split_behavior behavior;    // Split, Punctuation
    int invert;                      // Split
    int individual_digits;           // Digits
    char rep[8];                     // Metaspace replacement (UTF-8)
    uint32_t rep_cp;
    enum prepend_scheme scheme;      // Metaspace
    int split;                       // Metaspace
};

enum dec_type { DEC_SEQ, DEC_BYTELEVEL, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_REPLACE,
                DEC_METASPACE };
struct decoder {
    enum dec_type type;
    int n_sub;
    struct decoder **sub;
    char *pattern, *content; // Replace (literal pattern); Strip content char
    int start, stop;         // Strip
    char rep[8];             // Metaspace
    enum prepend_scheme scheme;
};

// One added token (tokenizer.json "added_tokens").
struct added_token {
    int32_t id;
    char *content;
    size_t len;
    char *piece; // its string for decoding: content, normalized when `normalized` (as HF)
    size_t piece_len;
    int special, lstrip, rstrip, single_word, normalized;
};

// Leftmost-longest matcher over added-token strings (a byte trie).
struct trie_node;
struct matcher {
    struct trie_node *nodes;
    int n_nodes, cap;
    uint8_t first[256]; // bytes that start some pattern
};

// BPE merges: (left id, right id) -> (rank, merged id).
struct merge_map {
    uint64_t *key; // (a << 32 | b) + 1; 0 = empty
    int32_t *rank, *new_id;
    uint32_t mask;
};

struct tokenizer {
    // Model vocabulary: id -> string (in arena), and string -> id.
    struct sbuf arena;
    uint32_t *tok_off, *tok_len; // [n_ids]; tok_len UINT32_MAX = hole
    int n_ids;                   // model ids span [0, n_ids)
    struct strmap vocab;
    struct merge_map merges;
    int byte_fallback, ignore_merges, fuse_unk;
    int32_t unk_id;            // -1 if none
    char *cont_prefix, *eow_suffix;
    int32_t byte_id[256];      // "<0xXX>" ids for byte_fallback (-1 missing)
    int32_t *char_id;          // [0x10000]: id of the one-char token, -1; NULL if prefix/suffix

    struct added_token *added;
    int n_added;
    int32_t *added_by_id;      // [vocab_size] -> index in added, -1
    struct strmap added_map;   // content -> index in added
    struct matcher match_raw;  // non-normalized added tokens, on the raw text
    struct matcher match_norm; // normalized ones, on normalized text
    int vocab_size;            // highest id + 1

    struct normalizer *normalizer;
    struct pretok *pretok;
    struct decoder *decoder;
    int32_t *pre_ids, *post_ids; // add_special: ids before / after the sequence
    int n_pre, n_post;
};

// Loading (tok_load.c). config may be NULL.
int tok_load_json(const json_t *tj, const json_t *config, struct tokenizer **out);
int tok_load_buffer(const char *data, size_t len, struct tokenizer **out);

int tok_parse_normalizer(const json_t *j, struct normalizer **out);
int tok_parse_pretok(const json_t *j, struct pretok **out);
int tok_parse_decoder(const json_t *j, struct decoder **out);
void tok_normalizer_free(struct normalizer *n);
void tok_pretok_free(struct pretok *p);
void tok_decoder_free(struct decoder *d);

// Normalizers (tok_normalize.c): s -> normalized text (malloc'd). *lead_cut is
// set when a Strip removed leading text (HF's offsets then no longer start at 0).
int tok_normalize(const struct normalizer *n, const char *s, size_t len, char **out,
                  size_t *out_len, int *lead_cut);

// Pre-tokenized splits of one piece: ranges into a text buffer.
struct split {
    uint32_t off, len;
    int first; // starts at original offset 0 (Metaspace prepend_scheme "first")
};
struct splits {
    struct split *v;
    int n, cap;
};
void splits_push(struct splits *s, uint32_t off, uint32_t len, int first);
int tok_pretokenize(const struct pretok *p, struct sbuf *text, struct splits *in,
                    struct splits *tmp);

// Byte-level alphabet (GPT-2's bytes_to_unicode).
extern const char *const tok_byte_char[256]; // UTF-8 of the char for each byte
int tok_char_byte(uint32_t cp);              // inverse; -1 if not in the alphabet

// BPE on one pre-token (tok_bpe.c); appends ids.
struct bpe_scratch;
struct bpe_scratch *bpe_scratch_new(void);
void bpe_scratch_free(struct bpe_scratch *s);
int tok_bpe_word(const struct tokenizer *t, struct bpe_scratch *s, const char *w, size_t n,
                 int32_t **ids, int *num, int *cap);
void tok_merges_free(struct merge_map *m);
int tok_merges_build(struct tokenizer *t, const json_t *merges);

// Added tokens (tok_added.c).
void matcher_init(struct matcher *m);
void matcher_add(struct matcher *m, const char *s, size_t n, int32_t value);
void matcher_free(struct matcher *m);
// Leftmost-longest match in s[from..n): returns 1 with [*ms, *me) and *value.
int matcher_find(const struct matcher *m, const char *s, size_t n, size_t from, size_t *ms,
                 size_t *me, int32_t *value);

// Decoding (tok_decode.c).
const char *tok_token_str(const struct tokenizer *t, int32_t id, size_t *len);

#endif
