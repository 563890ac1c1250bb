// structured.h - constrained decoding (grammars, a token mask per step),
// tool-call parsers and reasoning parsers. Engine-independent: the engine
// asks a matcher for a bitmask before sampling and feeds it the sampled id.
//
// Grammars are context-free over BYTES (a character class matches the UTF-8
// encoding of its code points). A compiled grammar is immutable and may be
// shared by threads; its per-vocabulary mask cache fills lazily and is
// thread-safe. A vocabulary is built once per tokenizer and shared read-only.
// A matcher is one request's state: one thread at a time.
//
// Errors: every int-returning function returns VLLM_OK or a status set with
// vllm_err(); an unsupported JSON-schema keyword or regex construct is
// VLLM_ERR_INVALID_ARGUMENT naming it (never a looser grammar).
#ifndef VLLM_STRUCTURED_H
#define VLLM_STRUCTURED_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct sg_grammar;
struct sg_vocab;
struct sg_matcher;

// ----------------------------------------------------------------- grammars --

// GBNF as llama.cpp writes it: `root ::= ...`, rule references, "literals"
// (\n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes), [classes] with ranges and
// ^ negation, `.` (any character), ( ), |, ?, *, +, {m}, {m,}, {m,n}, {,n},
// and # comments. The start rule is `root`.
int sg_compile_gbnf(const char *src, struct sg_grammar **out);
// A JSON value valid under the schema (docs: sg_json_schema.c's header lists
// the keywords). Whitespace policy, as llama.cpp's json-schema-to-grammar:
// between tokens at most one space, or one or two newlines and up to 20
// spaces/tabs (pretty-printed output fits; endless whitespace does not).
int sg_compile_json_schema(const json_t *schema, struct sg_grammar **out);
// OpenAI response_format json_object: any JSON object at the top level.
int sg_compile_json_object(struct sg_grammar **out);
// The whole output matches the regex (PCRE2 subset: literals, escapes \d \w
// \s \D \W \S \t \n \r \f \v \xHH \x{H..} \uHHHH, classes, `.`, groups incl.
// (?:...) and named ones, |, ? * + {m} {m,} {m,n} (lazy forms count as
// greedy: same strings), ^ and $ at the ends only).
int sg_compile_regex(const char *re, struct sg_grammar **out);
// Exactly one of the n strings.
int sg_compile_choice(const char *const *choices, int n, struct sg_grammar **out);
// Grammars are reference-counted: sg_grammar_free drops one reference.
struct sg_grammar *sg_grammar_ref(struct sg_grammar *g);
void sg_grammar_free(struct sg_grammar *g);
// Fills the grammar's whole mask cache for v now (otherwise each entry is
// computed on first use, inside some step's sg_matcher_fill_mask). For an
// engine that compiles off the step path, as vLLM does, before scheduling
// the request: then every step is a cache hit.
void sg_grammar_warm(const struct sg_grammar *g, const struct sg_vocab *v);

// Compiled grammars by request spec (agents send the same schemas and tools
// every turn): a registry compiles on a miss and hands out references; it
// keeps the `capacity` most recently used. Thread-safe.
enum sg_spec { SG_SPEC_JSON_SCHEMA, SG_SPEC_JSON_OBJECT, SG_SPEC_REGEX, SG_SPEC_CHOICE, SG_SPEC_GBNF };
struct sg_registry;
struct sg_registry *sg_registry_create(int capacity);
// spec: the schema; a JSON string (regex, GBNF); an array of strings
// (choice); ignored for json_object. *out is a new reference.
int sg_registry_get(struct sg_registry *r, enum sg_spec kind, const json_t *spec, struct sg_grammar **out);
void sg_registry_free(struct sg_registry *r);

// --------------------------------------------------------------- vocabulary --

// Every token's bytes (tok_token_bytes) in a byte trie. Special tokens are
// never allowed, except the EOS ids, which a mask allows exactly where the
// grammar accepts.
struct sg_vocab *sg_vocab_create(const struct tokenizer *t, const int32_t *eos_ids, int num_eos);
void sg_vocab_free(struct sg_vocab *v);
int sg_vocab_size(const struct sg_vocab *v); // V: a mask has CDIV(V, 32) words

// ------------------------------------------------------------------ matcher --

// v may be NULL for a matcher used on bytes only (sg_matcher_accept_bytes,
// sg_matcher_is_accepting).
struct sg_matcher *sg_matcher_create(const struct sg_grammar *g, const struct sg_vocab *v);
void sg_matcher_free(struct sg_matcher *m);
// Advances by one token. VLLM_ERR_INVALID_ARGUMENT (state unchanged) when the
// mask would not allow it. An EOS id ends the matcher (sg_matcher_is_done).
int sg_matcher_accept(struct sg_matcher *m, int32_t id);
// bitmask: CDIV(V, 32) words; bit (id % 32) of word (id / 32) = 1 when allowed.
// Ids >= V (a model's padded vocabulary) are the caller's to mask.
void sg_matcher_fill_mask(struct sg_matcher *m, uint32_t *bitmask);
int sg_matcher_is_accepting(const struct sg_matcher *m); // the text so far is complete
int sg_matcher_is_done(const struct sg_matcher *m);      // an EOS was accepted
// Back to the start (preemption by recompute replays the output ids).
void sg_matcher_reset(struct sg_matcher *m);
// Advances by raw bytes (tests, jump-forward); returns 1 if allowed (then the
// state moved), 0 if not (unchanged).
int sg_matcher_accept_bytes(struct sg_matcher *m, const char *s, size_t n);

// -------------------------------------------------------------- tool calls --

enum sg_tool_format { SG_TOOL_HERMES, SG_TOOL_QWEN3_CODER, SG_TOOL_LLAMA3_JSON };
// "hermes", "qwen3_coder", "llama3_json"; VLLM_ERR_INVALID_ARGUMENT otherwise.
int sg_tool_format_parse(const char *name, enum sg_tool_format *out);

// A parse: content (the text that is not a call; NULL when none) and
// tool_calls, an OpenAI array of {"id", "type": "function", "function":
// {"name", "arguments": JSON text}} (NULL when none). A malformed call stays
// in content: no text is lost. tools: the request's "tools" (types
// qwen3_coder's parameter values by their schema; may be NULL). Call ids are
// "chatcmpl-tool-" + 32 hex digits derived from id_seed and the call index.
struct sg_tool_result {
    char *content;
    json_t *tool_calls;
};
int sg_tool_parse(enum sg_tool_format f, const char *text, size_t len, const json_t *tools,
                  uint64_t id_seed, struct sg_tool_result *out);
void sg_tool_result_clear(struct sg_tool_result *r);

// Streaming: push each text delta; out->content is the content delta (NULL
// when none) and out->tool_calls the OpenAI delta array (NULL when none): a
// call starts with {"index", "id", "type", "function": {"name", "arguments":
// ""}} and continues with {"index", "function": {"arguments": fragment}}.
// Text that may still start a call is held back until it is decided.
struct sg_tool_stream;
struct sg_tool_stream *sg_tool_stream_create(enum sg_tool_format f, const json_t *tools,
                                             uint64_t id_seed);
int sg_tool_stream_push(struct sg_tool_stream *s, const char *delta, size_t len,
                        struct sg_tool_result *out);
// End of output: flushes what was held back.
int sg_tool_stream_finish(struct sg_tool_stream *s, struct sg_tool_result *out);
int sg_tool_stream_num_calls(const struct sg_tool_stream *s);
void sg_tool_stream_free(struct sg_tool_stream *s);

// A grammar whose every string is one valid call in the format (or one or
// more with parallel): tools as in the request; name NULL for tool_choice
// "required" (any of the tools), else the named function only.
int sg_compile_tool_call(enum sg_tool_format f, const json_t *tools, const char *name, int parallel,
                         struct sg_grammar **out);

// ---------------------------------------------------------------- reasoning --

enum sg_reasoning_format { SG_REASONING_DEEPSEEK_R1, SG_REASONING_QWEN3, SG_REASONING_NEMOTRON_V3 };
int sg_reasoning_format_parse(const char *name, enum sg_reasoning_format *out);

// Splits a whole output into reasoning and content (each NULL when absent).
// thinking: chat_template_kwargs.enable_thinking (1 unless the request set
// it false).
int sg_reasoning_split(enum sg_reasoning_format f, int thinking, const char *text, size_t len,
                       char **reasoning, char **content);
// Streaming: each push appends the reasoning and content deltas (NULL when
// none); text that may be part of a tag is held back until decided. Over a
// stream the deltas concatenate to sg_reasoning_split's result.
struct sg_reasoning_stream;
struct sg_reasoning_stream *sg_reasoning_stream_create(enum sg_reasoning_format f, int thinking);
int sg_reasoning_stream_push(struct sg_reasoning_stream *s, const char *delta, size_t len,
                             char **reasoning, char **content);
int sg_reasoning_stream_finish(struct sg_reasoning_stream *s, char **reasoning, char **content);
void sg_reasoning_stream_free(struct sg_reasoning_stream *s);

#endif
