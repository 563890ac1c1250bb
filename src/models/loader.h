// loader.h - reads named checkpoint tensors (with shape checks) onto a
// backend, or makes dummy ones at the same shapes (--load-format dummy).
#ifndef VLLM_MODELS_LOADER_H
#define VLLM_MODELS_LOADER_H

#include "backend/backend.h"
#include "io/safetensors.h"

enum dummy_init {
    DUMMY_NORMAL, // N(0, arg^2)
    DUMMY_CONST,  // arg
    DUMMY_ALOG,   // log(1..n), Mamba's A_log init
    DUMMY_DTBIAS, // softplus^-1 of dt in [1e-3, 0.1]
};

struct loader {
    struct st_set *st; // NULL with dummy weights
    struct backend *be;
    uint64_t seed;
    int64_t device_bytes; // uploaded so far
    int round_bf16;       // bf16 model: every parameter read is rounded to bf16 precision
    const char *keep_fp32; // name suffix exempt from rounding (e.g. e_score_correction_bias)
    float *tmp;
    size_t tmp_cap;
};

int loader_open(struct loader *l, const char *dir, int dummy, uint64_t seed, struct backend *be);
void loader_close(struct loader *l);
// The first of two spellings of a checkpoint prefix present (e.g. "backbone"
// vs "model"), probing with `probe` appended; returns a or b.
const char *loader_prefix(const struct loader *l, const char *a, const char *b, const char *probe);
int loader_has(const struct loader *l, const char *name);

// Reads tensor `name` as fp32 into dst (host), checking that its shape is
// dims[0..ndim) (size-1 dims ignored). Dummy: fills with `init`.
int loader_read(struct loader *l, const char *name, int ndim, const int64_t *dims, float *dst,
                enum dummy_init init, float arg);
// A [rows, cols] weight on the device, of dtype dt.
int loader_matrix(struct loader *l, const char *name, int64_t rows, int64_t cols, enum dtype dt,
                  struct weight *w, float dummy_std);
// A vector of n fp32 on the device.
int loader_vector(struct loader *l, const char *name, int64_t n, float **dev, enum dummy_init init, float arg);
// Uploads host fp32 data as a vector / weight (for tensors assembled on the host).
int loader_upload_vector(struct loader *l, const float *src, int64_t n, float **dev);
int loader_upload_matrix(struct loader *l, const float *src, int64_t rows, int64_t cols, enum dtype dt,
                         struct weight *w);
// Host scratch of at least n floats, owned by the loader.
float *loader_tmp(struct loader *l, size_t n);

#endif
