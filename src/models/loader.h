// loader.h - checkpoint tensors onto a backend (with shape checks), or dummy
// ones at the same shapes (--load-format dummy).
//
// The weight-format seam: a model asks for a weight by name and shape; the
// loader picks its format (the model's weight format, from --dtype, or fp32
// where a layer needs it) and has the backend upload the checkpoint's bytes
// as they are (weight_upload_raw), converted only when the formats differ.
// Small parameters (norms, biases, conv taps) are read to fp32 on the host.
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
    enum wfmt fmt;         // the model's weight format
    int64_t device_bytes;  // uploaded so far
    const char *keep_fp32; // name suffix of vectors kept exact (e.g. e_score_correction_bias)
    float *tmp;
    size_t tmp_cap;
    struct quant_cfg *quant; // the checkpoint's quantization (quant.h), NULL: none
    int dummy_quant;         // dummy linears in dummy_qfmt (--quantization with --load-format dummy)
    enum wfmt dummy_qfmt;
};
struct quant_cfg;
struct model_load_opts;

// fmt: the weight format of the model's linears (bf16 models: vectors are
// rounded to bf16 values too, as when a model is cast to bf16).
int loader_open(struct loader *l, const char *dir, int dummy, uint64_t seed, enum wfmt fmt, struct backend *be);
// The same with o's options, --quantization among them (o->quantization,
// held to the checkpoint's quantization config).
int loader_open_opts(struct loader *l, const char *dir, const struct model_load_opts *o, struct backend *be);
void loader_close(struct loader *l);
// The first of two spellings of a checkpoint prefix present (e.g. "backbone"
// vs "model"), probing with `probe` appended; returns a or b.
const char *loader_prefix(const struct loader *l, const char *a, const char *b, const char *probe);
int loader_has(const struct loader *l, const char *name);

// Rows [off, off + len) of something split in parts.
struct span {
    int64_t off, len;
};
// Rank r's part of n things split over tp ranks.
struct span span_part(int64_t n, int tp, int r);

// One piece of an assembled weight: rows `rows` of tensor `name`, whose
// shape is dims[0..ndim) (size-1 dims ignored; all but the last flattened
// into rows). Pieces are stacked in order.
struct wpiece {
    const char *name;
    int ndim;
    int64_t dims[4];
    struct span rows;
};
#define WL_F32 1u   // keep this weight in fp32 whatever the model's format (routers)
#define WL_EMBED 3u // an embedding table: fp32, and dummy values of unit scale
#define WL_NOQUANT 4u // never quantized by --quantization with dummy weights (lm_head)

// A weight of the pieces' rows (plus pad_rows zero rows), columns [c0, c1)
// of the tensors' last dim (c1 == 0: all). Dummy: one random weight of that
// shape, seeded by the first piece's name and offsets.
int loader_weight(struct loader *l, const struct wpiece *pieces, int n, int64_t c0, int64_t c1, int64_t pad_rows,
                  unsigned flags, struct weight *w);
// The common case: rows [r.off, +len) and columns [c0, c1) of a 2D tensor [rows, cols].
int loader_matrix(struct loader *l, const char *name, int64_t rows, int64_t cols, struct span r, int64_t c0,
                  int64_t c1, unsigned flags, struct weight *w);

// Reads tensor `name` as fp32 into dst (host), checking that its shape is
// dims[0..ndim) (size-1 dims ignored); rounded to bf16 values in a bf16
// model. Dummy: fills with `init`.
int loader_read(struct loader *l, const char *name, int ndim, const int64_t *dims, float *dst,
                enum dummy_init init, float arg);
// Elements [s.off, +len) of an n-vector, in fp32 on the device.
int loader_vector(struct loader *l, const char *name, int64_t n, struct span s, float **dev, enum dummy_init init,
                  float arg);
// The fp8 KV cache's per-tensor scales of the attention layer under prefix p
// ("model.layers.0.self_attn."), by vLLM's names: ModelOpt's p + "k_proj.k_scale"
// / "v_proj.v_scale", compressed-tensors' p + "k_scale" / "v_scale", or the
// deprecated p + "kv_scale" for both; one alone serves both; none (or dummy
// weights): 1. A scale that is not a positive finite float scalar is an error
// naming the tensor.
int loader_kv_scales(struct loader *l, const char *p, float *k, float *v);
// Uploads host fp32 data as a device vector (for tensors assembled on the host).
int loader_upload_vector(struct loader *l, const float *src, int64_t n, float **dev);
// Host scratch of at least n floats, owned by the loader.
float *loader_tmp(struct loader *l, size_t n); // NULL (the error set) when it cannot be allocated

// loader_quant.c: a weight whose pieces are stored quantized (F8_E4M3 or U8
// codes), in the checkpoint config's format with its scales; the shapes of
// codes and scales checked against the config's, each error naming the
// tensor. Called by loader_weight when the first piece's dtype says so.
int loader_weight_quant(struct loader *l, const struct wpiece *pieces, int n, int64_t c0, int64_t c1, int64_t pad_rows,
                        unsigned flags, struct weight *w);
// Whether tensor t holds quantized codes (F8_E4M3, or U8 in an NVFP4 checkpoint).
int loader_is_quantized(const struct loader *l, const struct st_tensor *t);

#endif
