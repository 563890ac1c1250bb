// sg_internal.h - the pieces behind structured.h.
//
// Front ends (GBNF, regex, JSON schema, choice, tool calls) build an IR: named
// rules whose bodies are expression trees. sg_grammar_build compiles each rule
// to a byte automaton (determinized where it stays small) whose edges are byte
// ranges or calls of other rules; a matcher runs those automata with a stack
// of return nodes (a pushdown automaton over bytes). Masks come from a
// per-node cache (sg_mask.c).
#ifndef VLLM_SG_INTERNAL_H
#define VLLM_SG_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "structured/structured.h"

// ----------------------------------------------------------------------- IR --

enum sg_ek {
    SG_E_EMPTY, // matches ""
    SG_E_BYTES, // a literal byte string
    SG_E_CLASS, // one code point in ranges (UTF-8 encoded)
    SG_E_REF,   // another rule
    SG_E_SEQ,
    SG_E_ALT,
    SG_E_REP,   // sub[0]{min,max}; max -1 = unbounded
    SG_E_EXCL,  // any UTF-8 text that contains none of the (ASCII) strings
};

struct sg_expr {
    enum sg_ek kind;
    int n, cap;            // SEQ, ALT, REP (1), EXCL (strings)
    struct sg_expr **sub;  // SEQ, ALT, REP
    char *bytes;           // BYTES
    int len;               // BYTES
    uint32_t *ranges;      // CLASS: n pairs [lo, hi], sorted, disjoint
    char **strs;           // EXCL: n strings
    int rule;              // REF
    int min, max;          // REP
    struct sg_ir *ir;      // the owner (lists grow in its arena)
};

struct sg_ir {
    struct sg_arena *arena; // every expression and string
    char **names;
    struct sg_expr **body; // NULL until defined
    uint8_t *keep;         // never inline (its cache entries are worth sharing)
    int n_rules, cap;
};

struct sg_ir *sg_ir_create(void);
void sg_ir_free(struct sg_ir *ir);
// The rule named name (created undefined if new).
int sg_ir_rule(struct sg_ir *ir, const char *name);
// A new rule named after base with a unique suffix.
int sg_ir_fresh(struct sg_ir *ir, const char *base);
void sg_ir_define(struct sg_ir *ir, int rule, struct sg_expr *body);
void sg_ir_keep(struct sg_ir *ir, int rule);

struct sg_expr *sg_empty(struct sg_ir *ir);
struct sg_expr *sg_lit(struct sg_ir *ir, const char *s, size_t n);
struct sg_expr *sg_lits(struct sg_ir *ir, const char *s); // NUL-terminated
// ranges: n [lo, hi] pairs in any order; negate complements over Unicode
// scalar values (surrogates are never matched).
struct sg_expr *sg_class(struct sg_ir *ir, const uint32_t *ranges, int n, int negate);
struct sg_expr *sg_ref(struct sg_ir *ir, int rule);
struct sg_expr *sg_seq(struct sg_ir *ir);
struct sg_expr *sg_alt(struct sg_ir *ir);
struct sg_expr *sg_push(struct sg_expr *list, struct sg_expr *item); // returns list
struct sg_expr *sg_rep(struct sg_ir *ir, struct sg_expr *e, int min, int max);
struct sg_expr *sg_opt(struct sg_ir *ir, struct sg_expr *e);
struct sg_expr *sg_excl(struct sg_ir *ir, const char *const *strs, int n);
// Small builders: sg_seqv(ir, a, b, ..., NULL).
struct sg_expr *sg_seqv(struct sg_ir *ir, ...);
struct sg_expr *sg_altv(struct sg_ir *ir, ...);
char *sg_arena_strdup(struct sg_ir *ir, const char *s, size_t n);

// GBNF text -> rules of ir (sg_gbnf.c).
int sg_gbnf_ir(struct sg_ir *ir, const char *src);
// Compiles the IR (root: the start rule) into *out. Errors name the rule: an
// undefined rule, left recursion, an empty language, or an automaton too big.
int sg_grammar_build(struct sg_ir *ir, int root, struct sg_grammar **out);

// Parses a regex into an expression of ir (pattern semantics for JSON-schema
// strings use the same parser through a character mapper: json_string).
int sg_regex_expr(struct sg_ir *ir, const char *re, int json_string, struct sg_expr **out);
// JSON-string encodings of one code point class (for patterns and formats):
// the class's characters written as JSON string content.
struct sg_expr *sg_json_class(struct sg_ir *ir, const uint32_t *ranges, int n);
// Schema -> expression in ir (tool-call grammars embed parameter schemas).
int sg_json_schema_expr(struct sg_ir *ir, const json_t *schema, struct sg_expr **out);
// JSON whitespace between tokens (the policy in structured.h).
struct sg_expr *sg_json_ws(struct sg_ir *ir);

// ---------------------------------------------------------------- automaton --

struct sg_edge {
    uint8_t lo, hi;
    int32_t to;
};
struct sg_call {
    int32_t rule, to;
};

enum {
    SG_N_ACCEPT = 1,     // the rule may end here
    SG_N_EPS_ACCEPT = 2, // ... or after nullable calls only
    SG_N_FINAL = 4,      // accepting with no edges and no calls
    SG_N_UNIFORM = 8,    // a uniform character position (sg_compile.c: set_uniform)
    SG_N_UNICODE = 16,   // ... whose characters include all of non-ASCII
    SG_N_UEXACT = 32,    // ... whose budget is exact
};

struct sg_node {
    int32_t edge0, n_edges; // sorted by lo; overlapping only in NFA fallback rules
    int32_t call0, n_calls;
    int32_t rule;
    uint32_t flags;
    uint32_t mincomp; // fewest bytes that complete the rule from here
    // SG_N_UNIFORM: the ASCII bytes going to utarget, and the character budget.
    // Inside a character of a uniform node: ubase = that node and the UTF-8
    // decoder state here (sg_vocab.c); a uniform node has ubase = itself, 0.
    uint64_t uset[2];
    int32_t utarget, ubase;
    uint8_t ustate;
    uint32_t ubudget;
};

struct sg_cache;

struct sg_grammar {
    struct sg_node *nodes;
    struct sg_edge *edges;
    struct sg_call *calls;
    int n_nodes, n_edges, n_calls;
    int32_t *rule_start; // [n_rules]; -1 for rules never used
    char **rule_names;
    int n_rules, root;
    uint64_t (*follow)[4]; // [n_rules] bytes that can come right after the rule ends
    _Atomic(struct sg_cache *) caches; // per vocabulary (sg_mask.c), a list
    _Atomic int refs;
};

void sg_caches_free(struct sg_grammar *g); // sg_mask.c

static inline int sg_node_final(const struct sg_grammar *g, int32_t n) {
    return (g->nodes[n].flags & SG_N_FINAL) != 0;
}

// ---------------------------------------------------------------- vocabulary --

// The trie in preorder: node i has byte[i] at depth[i]; its subtree is
// [i, end[i]); the tokens through it are sorted ids tok[lo[i], lo[end[i]]),
// those ending at i the first n_end[i] of them. Node 0 is the root.
struct sg_vocab {
    int vocab_size;
    int n_nodes;
    uint8_t *byte;
    uint16_t *depth;
    int32_t *end, *lo;
    uint16_t *n_end;
    uint64_t (*desc)[2];  // ASCII bytes below node i (not its own)
    uint8_t *desc_high;   // a byte >= 0x80 below node i
    uint8_t *clean;       // bit q: the bytes below i continue valid UTF-8 from decoder state q
    uint16_t *maxc;       // the most characters below node i (UTF-8 lead and ASCII bytes)
    uint16_t *pchars;     // characters on the path to node i
    uint16_t *chars;      // [vocab_size] each token's characters
    int32_t *tok;         // [n_tok] ids in byte order
    int n_tok;
    char **bytes;         // [vocab_size] each id's bytes (NULL: never allowed)
    uint16_t *len;        // [vocab_size]
    int max_len;
    int32_t *eos;
    int n_eos;
};

// ----------------------------------------------------------------- simulator --

// Stacks as interned frames: frame = (node, parent frame); frame 0 is the
// base (below the start rule at run time; below the rule being cached when
// computing a cache entry). A state is a set of frames (the tops).
struct sg_frames {
    int32_t *node, *parent;
    int n, cap;
    int32_t *slot; // hash of (node, parent) -> frame, -1 empty
    uint32_t mask;
    uint32_t *mark; // epoch marks for set building
    uint32_t epoch;
};
void sg_frames_init(struct sg_frames *f);
void sg_frames_clear(struct sg_frames *f);
void sg_frames_free(struct sg_frames *f);
int32_t sg_frame(struct sg_frames *f, int32_t node, int32_t parent);

// A growable set of frames.
struct sg_set {
    int32_t *v;
    int n, cap;
};
void sg_set_add(struct sg_set *s, int32_t x);
void sg_set_free(struct sg_set *s);

// Closure: calls pushed, accepting frames popped. *base is set to 1 when a
// frame over the base can end (the rule under the base pops, or the whole
// grammar accepts). `stop_rule` >= 0: frames of other rules are not expanded
// (their cache entry covers them) but still popped when they can end empty.
void sg_close(const struct sg_grammar *g, struct sg_frames *f, const struct sg_set *in,
              struct sg_set *out, int *base, int stop_rule);
// Byte step of a closed set: the frames after consuming b (not closed).
void sg_step(const struct sg_grammar *g, struct sg_frames *f, const struct sg_set *in, uint8_t b,
             struct sg_set *out);

// ---------------------------------------------------------------- mask cache --

struct sg_entry;
struct sg_cache_stats;
struct sg_cache *sg_cache_get(const struct sg_grammar *g, const struct sg_vocab *v);
struct sg_entry *sg_entry_get(struct sg_cache *c, const struct sg_grammar *g, int32_t node);
void sg_entry_or(const struct sg_entry *e, uint32_t *bits, int words);
int sg_entry_has_cands(const struct sg_entry *e);
// Appends to out the entry's candidates that the stack under `parent` accepts.
void sg_entry_resolve(const struct sg_entry *e, const struct sg_grammar *g, const struct sg_vocab *v,
                      struct sg_frames *f, int32_t parent, struct sg_set *out);
void sg_cache_stats(struct sg_cache *c, const struct sg_grammar *g, struct sg_cache_stats *st);

// ----------------------------------------------------------------------- misc --

uint64_t sg_hash64(uint64_t x);
// Appends s (n bytes) to a malloc'd buffer.
struct sg_buf {
    char *p;
    size_t len, cap;
};
void sg_buf_add(struct sg_buf *b, const char *s, size_t n);
void sg_buf_addc(struct sg_buf *b, char c);
void sg_buf_addf(struct sg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *sg_buf_take(struct sg_buf *b); // NUL-terminated, malloc'd; b is reset

// A copy of the matcher's state (memo included).
struct sg_matcher *sg_matcher_clone(const struct sg_matcher *m);
// For tests and benchmarks: the frames' fewest bytes to a complete text.
uint64_t sg_matcher_min_remaining(const struct sg_matcher *m);
// Cache statistics of a matcher's grammar for its vocabulary.
struct sg_cache_stats {
    int entries, walked;
    long candidates;
};
void sg_matcher_cache_stats(const struct sg_matcher *m, struct sg_cache_stats *st);
// The grammar's UTF-8 aware walk over raw bytes: 1 if s is a viable prefix.
int sg_grammar_viable(const struct sg_grammar *g, const char *s, size_t n, int *accepting);

#endif
