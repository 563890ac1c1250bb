// json.h - jansson, plus what Python's json module writes: bare Infinity,
// -Infinity and NaN, "Infinity" strings, and transformers 5's
// {"__float__": "Infinity"} objects.
#ifndef VLLM_CORE_JSON_H
#define VLLM_CORE_JSON_H

#include <jansson.h>
#include <stdint.h>

// Parses text (Python-flavoured JSON). On error: VLLM_ERR_FORMAT naming `what`
// and the line/column.
int json_parse_python(const char *text, size_t len, const char *what, json_t **out);
// The same with jansson decoding flags (e.g. JSON_REJECT_DUPLICATES).
int json_parse_python_flags(const char *text, size_t len, size_t flags, const char *what, json_t **out);
int json_load_path(const char *path, json_t **out);

// A number in any of the forms above. Returns 0 on success.
int json_as_double(const json_t *v, double *out);

// Typed getters: VLLM_ERR_FORMAT when the key is missing or has the wrong type,
// naming `what` (e.g. the config path) and the key.
int json_req_int(const json_t *obj, const char *key, const char *what, int64_t *out);
int json_req_double(const json_t *obj, const char *key, const char *what, double *out);
// The first of several aliases present (NULL-terminated list), or NULL.
json_t *json_get_alias(const json_t *obj, const char *const *keys);

#endif
