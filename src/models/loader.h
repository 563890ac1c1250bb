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

// Tensor parallelism: the part of a [rows, cols] tensor one rank holds, as
// spans of whole rows (in increasing order) and the columns [c0, c1) of each.
// A rank's part is copied out of the full tensor on the host.
struct span {
    int64_t off, len;
};
struct shard {
    const struct span *rows; // NULL: every row
    int num_rows;            // spans in rows
    int64_t c0, c1;          // c1 == 0: every column
    int64_t pad_rows;        // zero rows appended (a last vocabulary shard made as long as the others)
};
// Rank r's part [off, off + len) of n things split over tp ranks.
struct span span_part(int64_t n, int tp, int r);
// Compacts the host matrix buf [rows, cols] in place to the part s selects;
// returns its row count (pad rows not included).
int64_t shard_select(float *buf, int64_t rows, int64_t cols, const struct shard *s);
// loader_matrix for the part s of tensor `name` [rows, cols]. Dummy weights
// are made at the part's shape (their values do not match an unsplit model's).
int loader_matrix_part(struct loader *l, const char *name, int64_t rows, int64_t cols, const struct shard *s,
                       enum dtype dt, struct weight *w, float dummy_std);
// loader_vector for the rows s selects of an n-vector.
int loader_vector_part(struct loader *l, const char *name, int64_t n, const struct shard *s, float **dev,
                       enum dummy_init init, float arg);

#endif
