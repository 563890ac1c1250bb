// util.h - helpers for tests that build model directories on the fly.
#ifndef VLLM_TESTS_UTIL_H
#define VLLM_TESTS_UTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

// A fresh directory under $TMPDIR (or /tmp); removed by tu_rmdir.
char *tu_tmpdir(void);
void tu_rmdir(const char *dir);
int tu_write(const char *dir, const char *name, const void *data, size_t len);
int tu_copy(const char *src_dir, const char *dst_dir, const char *name);
char *tu_fixture(const char *rel); // $VLLM_FIXTURES/rel (malloc'd)
json_t *tu_fixture_config(const char *fx); // fixture fx's config.json (NULL: unreadable)
json_t *tu_fixture_golden(const char *fx); // its golden.json (NULL: unreadable)

// The comma-separated fixture names in environment variable `env` (set by
// tests/CMakeLists.txt from its per-family lists): *names malloc'd (free
// with tu_list_free); 0 when unset (a test over zero fixtures must fail).
int tu_fixture_list(const char *env, char ***names);
void tu_list_free(char **names, int n);

// One tensor for tu_write_safetensors.
struct tu_tensor {
    const char *name;
    const char *dtype; // "F32", "BF16", ...
    int ndim;
    int64_t shape[4];
    const void *data;
    size_t nbytes;
};
// Writes a safetensors file; header_extra (may be NULL) is spliced into the
// JSON header as-is, for malformed cases.
int tu_write_safetensors(const char *path, const struct tu_tensor *t, int n);
// Writes raw header JSON + data bytes (for malformed files).
int tu_write_raw_safetensors(const char *path, const char *header, const void *data, size_t len);

// Copies a fixture model dir (config.json + model.safetensors) to a temp dir,
// applying edit(config) to config.json first when edit is not NULL.
char *tu_model_copy(const char *fixture, void (*edit)(json_t *cfg));
// A temp dir holding the config of a Mamba2ForCausalLM of 2 layers, 4 heads
// of 8, state 8, chunk 8 (load it with --load-format dummy); NULL on error.
char *tu_mamba2_dir(void);

#endif
