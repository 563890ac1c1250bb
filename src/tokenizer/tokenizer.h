// tokenizer.h - Hugging Face tokenizer.json, streaming detokenizer, stop
// strings, and chat templates. This is the interface the engine uses.
#ifndef VLLM_TOKENIZER_H
#define VLLM_TOKENIZER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;

// Loads tokenizer.json (+ tokenizer_config.json if present) from model_dir.
// VLLM_ERR_IO when there is no tokenizer.json; VLLM_ERR_UNSUPPORTED naming the
// component for anything not implemented; VLLM_ERR_FORMAT for malformed files.
int tok_load(const char *model_dir, struct tokenizer **out);
void tok_free(struct tokenizer *t);

// text -> ids. add_special: run the post-processor (BOS/EOS templates,
// add_bos_token / add_eos_token). *ids is malloc'd.
int tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_special,
               int32_t **ids, int *num_ids);
// ids -> text (NUL-terminated, malloc'd). Out-of-range ids are an error.
int tok_decode(const struct tokenizer *t, const int32_t *ids, int num_ids, int skip_special,
               char **text, size_t *len);
int tok_vocab_size(const struct tokenizer *t); // highest id + 1, added tokens included
// The token's string in the vocabulary (not decoded), or NULL.
const char *tok_id_to_piece(const struct tokenizer *t, int32_t id);
int tok_is_special(const struct tokenizer *t, int32_t id);
// The raw bytes id adds to a decoded text that precedes it (constrained
// decoding matches grammars over these): written to buf up to cap bytes; returns
// the full length (possibly more than cap, possibly invalid UTF-8: a token can
// hold part of a character), or -1 for an id outside the vocabulary.
int tok_token_bytes(const struct tokenizer *t, int32_t id, char *buf, int cap);

// Streaming detokenizer + stop strings for one request. Each push returns the
// text that can be shown now: never a partial UTF-8 sequence, and never text
// that could still be the start of a stop string. Over a whole stream (pushes
// then flush, no stop hit) the pieces concatenate to tok_decode(all ids).
// With prompt ids, its last few ids are decoding context: the text is what the
// pushed ids add after the prompt's text (a continuation keeps its leading
// space). Ids outside the vocabulary are ignored.
struct text_stream;
struct text_stream *text_stream_create(const struct tokenizer *t, const int32_t *prompt_ids,
                                       int num_prompt, int skip_special,
                                       const char *const *stop, int num_stop, int include_stop);
// Appends to *out (malloc'd or NULL, *out_len bytes). Returns 1 when a stop
// string completed: the text before it (and it, with include_stop) was
// emitted and nothing after it will be; else 0.
int text_stream_push(struct text_stream *s, int32_t id, char **out, size_t *out_len);
// End of stream without a stop string: emits everything held back.
void text_stream_flush(struct text_stream *s, char **out, size_t *out_len);
void text_stream_free(struct text_stream *s);
// The stop string that ended the stream, or NULL.
const char *text_stream_stop(const struct text_stream *s);

// Chat templates (tokenizer_config.json "chat_template", or chat_template.jinja).
struct chat_template;
// VLLM_ERR_IO when the model directory has no chat template.
int chat_template_load(const char *model_dir, struct chat_template **out);
// request: {"messages": [...], "add_generation_prompt": bool, "tools": [...], ...}
// plus bos_token / eos_token from tokenizer_config.json. *out malloc'd.
// A template that cannot be rendered is VLLM_ERR_UNSUPPORTED (or
// VLLM_ERR_INVALID_ARGUMENT for raise_exception) naming the construct.
int chat_template_render(const struct chat_template *ct, const json_t *request, char **out);
// A template from its Jinja source (a per-request or --chat-template one),
// with base's bos_token / eos_token (base may be NULL).
int chat_template_from_source(const char *src, const struct chat_template *base, struct chat_template **out);
void chat_template_free(struct chat_template *ct);

#endif
