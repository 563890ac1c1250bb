// jinja_internal.h - values, syntax tree and render context shared by the
// jinja_*.c files. Nothing here is used outside src/tokenizer/jinja*.c.
#ifndef VLLM_JINJA_INTERNAL_H
#define VLLM_JINJA_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>

#include "core/common.h"
#include "tokenizer/jinja.h"

// Containers nested deeper than this (in input JSON, or built by a template)
// are an error, so that printing, comparing and serializing recurse boundedly.
#define JINJA_MAX_NEST 512
// Parser recursion (nested expressions and blocks) and evaluation recursion.
#define JINJA_MAX_PARSE_DEPTH 200
#define JINJA_MAX_EVAL_DEPTH 1000
#define JINJA_MAX_SOURCE (16u << 20)

// ------------------------------------------------------------------ values --

enum jv_type { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_ARRAY, JV_OBJECT, JV_NS, JV_FUNC };
enum jf_kind { JF_MACRO, JF_CALLER, JF_BUILTIN, JF_METHOD };
enum jf_builtin { JB_NAMESPACE, JB_RANGE, JB_RAISE, JB_STRFTIME, JB_DICT };

struct jnode;
struct jscope;
struct jv;

struct jv_kv {
    struct jv *key; // JV_STR
    struct jv *val;
};

// A reference-counted value. Strings and arrays never change once built;
// objects change only while being built; namespaces are the one mutable kind.
// Every function returning a struct jv * returns a new reference (or NULL on
// error, with the error in the context); jv_release drops one.
struct jv {
    int refs; // < 0: immortal (undefined, none, true, false)
    uint8_t type;
    struct jv *next_free; // pending-destroy list (frees iterate, never recurse deeply)
    union {
        int b;
        int64_t i;
        double f;
        struct {
            size_t len;
            char *p; // NUL-terminated; may contain NUL
        } s;
        struct {
            struct jv **v;
            int n;
        } a;
        struct {
            struct jv_kv *kv;
            int n, cap;
            struct jv *reg_prev, *reg_next; // live-namespace registry (JV_NS)
            struct jctx *ctx;               // JV_NS: registry owner
        } o;
        struct {
            uint8_t kind;
            int id;                   // JF_BUILTIN
            const struct jnode *node; // JF_MACRO / JF_CALLER
            struct jscope *scope;     // JF_MACRO / JF_CALLER: where defined
            struct jv *self;          // JF_METHOD
            const char *name;         // JF_METHOD: a static method name
        } fn;
    } u;
};

extern struct jv jv_undef_v, jv_none_v, jv_true_v, jv_false_v;
#define JV_UNDEFINED (&jv_undef_v)
#define JV_NONEV (&jv_none_v)

struct jv *jv_retain(struct jv *v);
void jv_release(struct jv *v);
struct jv *jv_bool(int b);
struct jv *jv_int(int64_t i);
struct jv *jv_float(double f);
struct jv *jv_str(const char *p, size_t len);
struct jv *jv_strz(const char *p);
struct jv *jv_str_take(char *p, size_t len); // takes a malloc'd buffer of len+1
struct jv *jv_array_new(int n);              // n slots, filled by the caller
struct jv *jv_object_new(void);
// Appends key/value to an object being built (or sets a namespace member),
// replacing an existing key in place; takes both references.
void jv_object_put(struct jv *o, struct jv *key, struct jv *val);
struct jv *jv_object_get(const struct jv *o, const char *key, size_t len); // borrowed or NULL
struct jv *jv_func_builtin(int id);
struct jv *jv_method(struct jv *self, const char *name);

int jv_truthy(const struct jv *v);
const char *jv_type_name(const struct jv *v);
// Code points of a UTF-8 string (invalid bytes count one each).
size_t jv_utf8_count(const char *s, size_t len);
// Byte length of the code point at s (1 for an invalid byte), and its value.
int jv_utf8_next(const char *s, size_t len, uint32_t *cp);
size_t jv_utf8_put(char *out, uint32_t cp);
// Byte length of the Unicode whitespace code point at s, or 0.
int jv_ws_len(const char *s, size_t len);
// Python's float repr: "1.0", "0.1", "1e-05", "1.5e+16", "nan", "inf".
void jv_fmt_float(double f, char *buf, size_t cap);

// ------------------------------------------------------ render context ----

struct jbuf {
    char *p;
    size_t len, cap;
};

struct jctx {
    const struct jinja_template *t;
    struct jinja_render_opts opts;
    int status;
    char msg[768];
    int64_t steps;
    int depth, call_depth;
    int ctl;        // CTL_BREAK / CTL_CONTINUE pending
    int loop_depth; // for loops open in the current macro body
    struct jscope *scopes;  // registry of live scopes (cycles through macros)
    struct jv *namespaces;  // registry of live namespaces (cycles through members)
};
enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

// Sets the context's error (the first one wins) at a node's source position;
// returns NULL so that `return jerr(...)` ends a value-returning path.
void *jerr(struct jctx *c, int status, const struct jnode *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int jbuf_add(struct jctx *c, struct jbuf *b, const char *s, size_t n);
int jbuf_addz(struct jctx *c, struct jbuf *b, const char *s);
// Counts work; errors when the step budget is spent. Returns 0 when ok.
int jctx_step(struct jctx *c, const struct jnode *at, int64_t n);
struct jv *jbuf_to_str(struct jbuf *b);

struct jv *jv_namespace_new(struct jctx *c);
struct jv *jv_from_json(struct jctx *c, const json_t *j, int depth);
// Appends how {{ v }} prints v.
int jv_display(struct jctx *c, struct jbuf *b, const struct jv *v, const struct jnode *at);
struct jv *jv_display_str(struct jctx *c, struct jv *v, const struct jnode *at);
struct jv_json_opts {
    int indent; // < 0: none
    int ensure_ascii, sort_keys;
    const char *item_sep, *key_sep; // NULL: Python's defaults
    int undefined_null;             // undefined as null (tojson) or "undefined" (printing)
};
int jv_tojson(struct jctx *c, struct jbuf *b, const struct jv *v, const struct jv_json_opts *o,
              int depth, const struct jnode *at);
int jv_equal(const struct jv *a, const struct jv *b, int depth);
// Three-way comparison for sort / dictsort (-2 on a type error, set in c).
int jv_compare(struct jctx *c, const struct jv *a, const struct jv *b, int case_sensitive,
               const struct jnode *at);

// --------------------------------------------------------------- scopes ----

struct jscope {
    int refs;
    struct jscope *parent;
    struct jv_kv *vars;
    int n, cap;
    struct jv *caller; // call-block scope: the caller() a macro sees
    struct jscope *reg_prev, *reg_next;
    struct jctx *ctx;
};
struct jscope *jscope_new(struct jctx *c, struct jscope *parent);
void jscope_release(struct jscope *s);
struct jscope *jscope_retain(struct jscope *s);
struct jv *jscope_lookup(const struct jscope *s, const char *name, size_t len); // borrowed
void jscope_set(struct jscope *s, const char *name, size_t len, struct jv *v); // takes v
// Breaks reference cycles left at the end of a render (scope <-> macro,
// namespace <-> member) so that everything is freed.
void jctx_collect(struct jctx *c);

// --------------------------------------------------------- syntax tree ----

enum jnode_type {
    N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK, N_BREAK, N_CONTINUE,
    N_INT, N_FLOAT, N_STR, N_IDENT, N_ARRAY, N_TUPLE, N_OBJECT, N_BINARY, N_UNARY, N_MEMBER,
    N_SLICE, N_CALL, N_FILTER, N_TEST, N_TERNARY, N_SELECT, N_KWARG, N_SPREAD, N_KWSPREAD,
};
enum jop {
    OP_ADD, OP_SUB, OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_EQ, OP_NE, OP_LT,
    OP_GT, OP_LE, OP_GE, OP_IN, OP_NOTIN, OP_AND, OP_OR, OP_NOT, OP_NEG, OP_POS,
};
// N_MACRO / N_CALLBLOCK flags: the body reads these special names.
enum { MF_CALLER = 1, MF_KWARGS = 2, MF_VARARGS = 4 };

struct jlist {
    struct jnode **v;
    int n;
};

// One node shape for all kinds; which fields mean what is listed per kind in
// jinja_parse.c. Nodes live in the template's arena.
struct jnode {
    uint8_t type, op, flag;
    uint32_t pos; // byte offset in the original source
    int64_t i;
    double f;
    const char *s; // text, string literal, identifier, name
    size_t len;
    struct jnode *a, *b, *c;
    struct jlist l1, l2;
};

struct jarena_chunk;
struct jinja_template {
    struct jarena_chunk *arena;
    struct jlist body;
    char *src; // original source, for line numbers in errors
    size_t len;
};

void *jarena_alloc(struct jinja_template *t, size_t n);
// Line and column (1-based) of a source offset.
void jinja_line_col(const struct jinja_template *t, uint32_t pos, int *line, int *col);

// ---------------------------------------------------------------- lexer ----

enum jtok_type {
    T_EOF, T_TEXT, T_NUM, T_STR, T_IDENT, T_EQUALS, T_LPAREN, T_RPAREN, T_OPEN_STMT, T_CLOSE_STMT,
    T_OPEN_EXPR, T_CLOSE_EXPR, T_LBRACKET, T_RBRACKET, T_LBRACE, T_RBRACE, T_COMMA, T_DOT, T_COLON,
    T_PIPE, T_ADD, T_MUL, T_POW, T_CMP, T_UNARY, T_COMMENT,
};
struct jtok {
    uint8_t type;
    uint32_t pos; // original source offset
    const char *s; // in the template arena (text, literals) or a static string (operators)
    size_t len;
};
// Tokenizes t->src (lstrip_blocks + trim_blocks). On error returns a status and
// fills msg / *err_pos.
int jinja_lex(struct jinja_template *t, struct jtok **toks, int *ntoks, char *msg, size_t msgcap,
              uint32_t *err_pos);

// ----------------------------------------------------------- evaluation ----

struct jv *jeval(struct jctx *c, const struct jnode *n, struct jscope *s);
int jrender_list(struct jctx *c, const struct jlist *l, struct jscope *s, struct jbuf *out);
// Positional arguments plus keyword arguments (an object, or NULL).
struct jargs {
    struct jv **pos;
    int npos;
    struct jv *kw;
};
int jeval_args(struct jctx *c, const struct jlist *args, struct jscope *s, struct jargs *out);
void jargs_free(struct jargs *a);
struct jv *jargs_get(const struct jargs *a, int i, const char *kw); // borrowed or NULL
// obj.prop / obj[prop]: dict keys, list and string indices, methods.
struct jv *jmember_get(struct jctx *c, struct jv *obj, struct jv *prop, const struct jnode *n);
struct jv *jcall(struct jctx *c, struct jv *fn, struct jargs *args, struct jv *caller,
                 const struct jnode *at);

// jinja_builtins.c
struct jv *jfilter_apply(struct jctx *c, struct jv *operand, const char *name, struct jargs *args,
                         const struct jnode *at);
// Returns 1 / 0, or -1 on error.
int jtest_apply(struct jctx *c, const char *name, struct jv *operand, struct jargs *args,
                const struct jnode *at);
int jtest_known(const char *name, size_t len, int *takes_arg);
struct jv *jmethod_call(struct jctx *c, struct jv *self, const char *name, struct jargs *args,
                        const struct jnode *at);
// A method name of self's type (a static string), or NULL.
const char *jmethod_lookup(const struct jv *self, const char *name, size_t len);
struct jv *jbuiltin_call(struct jctx *c, int id, struct jargs *args, const struct jnode *at);
struct jv *jattr_path(struct jv *item, const char *path, size_t len); // borrowed; dotted keys

#endif
