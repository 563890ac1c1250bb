// jinja.h - a Jinja interpreter for the subset that chat templates use.
//
// The reference is @huggingface/jinja (the oracle of tests/chat): its lexer
// (lstrip_blocks + trim_blocks, {%- -%} whitespace control), grammar and
// operator precedence, and its runtime where it defines a result. Where the
// oracle's result is an artifact of JavaScript, or ignores an argument that
// Python's Jinja2 honours, we follow Python's Jinja2 (what transformers and
// vLLM run):
//   - strip/lstrip/rstrip(chars) strip only chars (the oracle ignores chars);
//   - floats stay floats: 1.0 prints and serializes as "1.0", Python's repr
//     rules for exponents, NaN / Infinity in tojson, tojson(indent=0) indents;
//     division by zero is an error, not Infinity;
//   - string length, indexing and slicing count code points, not UTF-16 units;
//   - == is Python's (none != undefined, "" != 0, lists compare by value);
//     % and // follow Python's signs; sort_keys sorts by code point;
//   - ~ and join print lists and dicts as JSON (the oracle prints
//     JavaScript's "1,2" / "[object Map]"), and string + list is an error;
//     "12abc"|int is 0, not 12;
//   - whitespace (trim, strip, split(), {%- -%}) is Python's str.isspace set;
//   - upper/lower: utf8proc's simple case mapping plus ß -> SS, the Latin
//     ligatures, İ and final sigma (not the rarer multi-character casings);
//   - a for-else block runs only when the loop has no items.
// Where the oracle raises an error we may render as Python's Jinja2 does
// (iterating a string or undefined, string comparison, "ab" * 2, tests with
// arguments, round, map('filter')). Anything else that neither supports is
// VLLM_ERR_UNSUPPORTED naming the construct and its line.
#ifndef VLLM_JINJA_H
#define VLLM_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct jinja_template;
struct chat_template;

// Bounds that keep any template, however hostile, finite.
struct jinja_render_opts {
    int64_t now;          // unix seconds for strftime_now (0: the current time)
    size_t max_output;    // bytes of output, and of any one string (default 64 MiB)
    int64_t max_steps;    // evaluation steps: nodes, loop items, bytes / 64 (default 50M)
    int max_call_depth;   // nested macro calls (default 64)
};
void jinja_render_opts_default(struct jinja_render_opts *o);

// Parses template source (any bytes). VLLM_ERR_FORMAT for a syntax error,
// VLLM_ERR_UNSUPPORTED for a statement this interpreter does not have; both
// name the line and column.
int jinja_parse(const char *src, size_t len, struct jinja_template **out);
void jinja_free(struct jinja_template *t);

// Renders with the members of vars (a JSON object, or NULL) as variables.
// *out is malloc'd and NUL-terminated, *out_len (optional) its length.
// raise_exception(msg) is VLLM_ERR_INVALID_ARGUMENT with msg; a value of the
// wrong type for an operation is VLLM_ERR_INVALID_ARGUMENT; an unknown filter,
// test, method or function is VLLM_ERR_UNSUPPORTED; a bound exceeded is
// VLLM_ERR_TOO_LONG.
int jinja_render(const struct jinja_template *t, const json_t *vars,
                 const struct jinja_render_opts *opts, char **out, size_t *out_len);

// chat_template_render with explicit bounds (tests fix the clock with it).
int chat_template_render_opts(const struct chat_template *ct, const json_t *request,
                              const struct jinja_render_opts *opts, char **out);

#endif
