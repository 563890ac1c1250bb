// loader.c - checkpoint tensors to device weights.
#include <math.h>

#include "core/common.h"
#include "io/dtype.h"
#include "models/loader.h"
#include "models/model.h"
#include "models/quant.h"

int loader_open(struct loader *l, const char *dir, int dummy, uint64_t seed, enum wfmt fmt, struct backend *be) {
    memset(l, 0, sizeof *l);
    l->be = be;
    l->seed = seed;
    l->fmt = fmt;
    if (dummy) return VLLM_OK;
    return st_open_dir(dir, &l->st);
}

int loader_open_opts(struct loader *l, const char *dir, const struct model_load_opts *o, struct backend *be) {
    TRY(loader_open(l, dir, o->dummy, o->seed, o->weight_fmt, be));
    enum quant_mode m = (enum quant_mode)o->quantization;
    if (o->dummy) {
        l->dummy_quant = quant_mode_dummy_fmt(m, &l->dummy_qfmt);
        return VLLM_OK;
    }
    int rc = quant_cfg_read(dir, &l->quant);
    if (!rc) rc = quant_mode_check(m, l->quant);
    if (rc) loader_close(l);
    return rc;
}

void loader_close(struct loader *l) {
    quant_cfg_free(l->quant);
    l->quant = NULL;
    st_close(l->st);
    free(l->tmp);
    l->st = NULL;
    l->tmp = NULL;
}

int loader_has(const struct loader *l, const char *name) { return !l->st || st_find(l->st, name) != NULL; }

const char *loader_prefix(const struct loader *l, const char *a, const char *b, const char *probe) {
    char name[256];
    if (!l->st) return a;
    snprintf(name, sizeof name, "%s%s", a, probe);
    if (st_find(l->st, name)) return a;
    snprintf(name, sizeof name, "%s%s", b, probe);
    return st_find(l->st, name) ? b : a;
}

float *loader_tmp(struct loader *l, size_t n) {
    if (l->tmp_cap < n) {
        free(l->tmp);
        l->tmp = try_calloc(n, sizeof(float), "a host copy of a vector");
        l->tmp_cap = l->tmp ? n : 0;
    }
    return l->tmp;
}

struct span span_part(int64_t n, int tp, int r) {
    int64_t lo = n * r / tp, hi = n * (r + 1) / tp;
    return (struct span){lo, hi - lo};
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *name, uint64_t seed) {
    uint64_t s = seed;
    for (const char *p = name; *p; p++) s = s * 1099511628211ull + (unsigned char)*p;
    return s;
}

static void dummy_fill(const char *name, uint64_t seed, float *dst, int64_t n, enum dummy_init init, float arg) {
    uint64_t s = name_hash(name, seed);
    switch (init) {
    case DUMMY_CONST:
        for (int64_t i = 0; i < n; i++) dst[i] = arg;
        break;
    case DUMMY_ALOG:
        for (int64_t i = 0; i < n; i++) dst[i] = logf((float)(i + 1));
        break;
    case DUMMY_DTBIAS:
        for (int64_t i = 0; i < n; i++) {
            double u = (splitmix(&s) >> 11) * 0x1.0p-53, dt = exp(log(1e-3) + u * (log(0.1) - log(1e-3)));
            dst[i] = (float)(dt + log(-expm1(-dt)));
        }
        break;
    case DUMMY_NORMAL: { // uniform with the same std: cheap at billions of values
        float a = arg * 1.7320508f * 0x1.0p-31f;
        uint64_t x = splitmix(&s) | 1;
        for (int64_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            dst[i] = a * (float)((int32_t)(x >> 32));
        }
        break;
    }
    }
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *dims) {
    size_t k = snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++) k += snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

// The tensor `name` with shape dims (size-1 dims ignored), or an error naming
// it and the file.
static int find_shaped(struct loader *l, const char *name, int ndim, const int64_t *dims, const struct st_tensor **out) {
    const struct st_tensor *t = st_find(l->st, name);
    if (!t) return vllm_err(VLLM_ERR_FORMAT, "checkpoint has no tensor %s", name);
    int64_t a[8], b[8], numel = 1;
    int na = 0, nb = 0;
    for (int i = 0; i < ndim; i++) numel *= dims[i];
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] != 1) a[na++] = t->shape[i];
    for (int i = 0; i < ndim; i++)
        if (dims[i] != 1) b[nb++] = dims[i];
    int same = na == nb && t->numel == numel;
    for (int i = 0; same && i < na; i++) same = a[i] == b[i];
    if (!same) {
        char got[128], want[128];
        shape_str(got, sizeof got, t->ndim, t->shape);
        shape_str(want, sizeof want, ndim, dims);
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s has shape %s, the config implies %s",
                        st_file_path(l->st, t->file), name, got, want);
    }
    *out = t;
    return VLLM_OK;
}

static int tensor_fmt(struct loader *l, const struct st_tensor *t, enum wfmt *f) {
    switch (t->dtype) {
    case ST_F32: *f = WF_F32; return VLLM_OK;
    case ST_BF16: *f = WF_BF16; return VLLM_OK;
    case ST_F16: *f = WF_F16; return VLLM_OK;
    case ST_I64:
    case ST_I32:
    case ST_U8:
    case ST_BOOL:
    case ST_F8_E4M3: break;
    }
    if (t->dtype == ST_F8_E4M3)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s is F8_E4M3 but %s", st_file_path(l->st, t->file), t->name,
                        l->quant ? "this layer is not quantized (it runs in fp32)"
                                 : "the checkpoint has no quantization config (hf_quant_config.json or quantization_config)");
    return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s has dtype %s, not a float type", st_file_path(l->st, t->file),
                    t->name, st_dtype_name(t->dtype));
}

// In a bf16 model every parameter holds a bf16 value (keep_fp32 excepted).
static void round_vector(struct loader *l, const char *name, float *v, int64_t n) {
    size_t nl = strlen(name), kl = l->keep_fp32 ? strlen(l->keep_fp32) : 0;
    if (l->fmt != WF_BF16 || (kl && nl >= kl && !strcmp(name + nl - kl, l->keep_fp32))) return;
    for (int64_t i = 0; i < n; i++) v[i] = bf16_to_f32(f32_to_bf16(v[i]));
}

int loader_read(struct loader *l, const char *name, int ndim, const int64_t *dims, float *dst, enum dummy_init init,
                float arg) {
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= dims[i];
    if (!l->st) {
        dummy_fill(name, l->seed, dst, numel, init, arg);
        return VLLM_OK;
    }
    const struct st_tensor *t;
    TRY(find_shaped(l, name, ndim, dims, &t));
    if (loader_is_quantized(l, t)) // its scales would be lost: never read as plain values
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s is stored quantized (%s), but this model reads it as a plain "
                        "tensor; dequantize it in the checkpoint or add it to the exclude list",
                        st_file_path(l->st, t->file), name, st_dtype_name(t->dtype));
    TRY(st_read_f32(t, dst));
    round_vector(l, name, dst, numel);
    return VLLM_OK;
}

// An fp32 weight of a 16-bit model holds 16-bit values, as when a model is
// cast (transformers' bf16 router and embedding): rows staged in the model's
// format, then uploaded from it (exact in fp32).
static int upload_rounded(struct loader *l, struct weight *w, int64_t row0, int64_t n, const char *src, enum wfmt sf,
                          int64_t ld) {
    int64_t cw = w->cols, per = MAX(1, (1 << 22) / MAX(cw, 1));
    size_t es = wfmt_size(sf), ms = wfmt_size(l->fmt);
    char *tmp = xmalloc((size_t)MIN(per, n) * cw * ms);
    int rc = VLLM_OK;
    for (int64_t r = 0; r < n && !rc; r += per) {
        int64_t m = MIN(per, n - r);
        for (int64_t i = 0; i < m; i++) wfmt_convert(l->fmt, tmp + (size_t)i * cw * ms, sf, src + (size_t)(r + i) * ld * es, cw);
        rc = l->be->ops->weight_upload_raw(l->be, w, row0 + r, m, tmp, l->fmt, cw);
    }
    free(tmp);
    return rc;
}

int loader_weight(struct loader *l, const struct wpiece *pieces, int n, int64_t c0, int64_t c1, int64_t pad_rows,
                  unsigned flags, struct weight *w) {
    struct backend *be = l->be;
    int64_t cols = pieces[0].dims[pieces[0].ndim - 1], rows = pad_rows;
    if (!c1) c0 = 0, c1 = cols;
    for (int i = 0; i < n; i++) rows += pieces[i].rows.len;
    enum wfmt fmt = (flags & WL_F32) ? WF_F32 : l->fmt;
    memset(w, 0, sizeof *w);
    const struct st_tensor *t;
    if (l->st && (t = st_find(l->st, pieces[0].name)) && loader_is_quantized(l, t))
        return loader_weight_quant(l, pieces, n, c0, c1, pad_rows, flags, w);
    if (!l->st && l->dummy_quant && !(flags & (WL_F32 | WL_NOQUANT))) fmt = l->dummy_qfmt;
    for (int i = 0; l->st && i < n; i++) // shapes against the file before anything is allocated
        TRY(find_shaped(l, pieces[i].name, pieces[i].ndim, pieces[i].dims, &t));
    int rc = be->ops->weight_alloc(be, w, fmt, rows, c1 - c0);
    if (rc) return vllm_err_prefix(rc, "%s", pieces[0].name); // the backend names the size, not the tensor
    l->device_bytes += wfmt_weight_bytes(fmt, rows, c1 - c0);
    if (!l->st) { // dummy: made on the device, seeded by the name and where the part starts
        uint64_t at = (uint64_t)pieces[0].rows.off * 1000003u + (uint64_t)c0;
        float std = (flags & WL_EMBED) == WL_EMBED ? 1.0f : 0.02f;
        return be->ops->weight_random(be, w, name_hash(pieces[0].name, l->seed ^ 0x5bd1e995u) ^ at, std);
    }
    int64_t dst = 0;
    for (int i = 0; i < n; i++) {
        const struct wpiece *p = &pieces[i];
        const struct st_tensor *t;
        enum wfmt src = WF_F32;
        TRY(find_shaped(l, p->name, p->ndim, p->dims, &t));
        TRY(tensor_fmt(l, t, &src));
        const char *base = (const char *)t->data + ((size_t)p->rows.off * cols + c0) * wfmt_size(src);
        if (fmt == WF_F32 && l->fmt != WF_F32 && src != l->fmt) TRY(upload_rounded(l, w, dst, p->rows.len, base, src, cols));
        else TRY(be->ops->weight_upload_raw(be, w, dst, p->rows.len, base, src, cols));
        dst += p->rows.len;
    }
    return VLLM_OK;
}

int loader_matrix(struct loader *l, const char *name, int64_t rows, int64_t cols, struct span r, int64_t c0,
                  int64_t c1, unsigned flags, struct weight *w) {
    struct wpiece p = {name, 2, {rows, cols}, r};
    return loader_weight(l, &p, 1, c0, c1, 0, flags, w);
}

int loader_upload_vector(struct loader *l, const float *src, int64_t n, float **dev) {
    *dev = l->be->ops->alloc(l->be, sizeof(float) * (size_t)MAX(n, 1));
    if (!*dev) return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %lld floats on the device", (long long)n);
    l->be->ops->upload(l->be, *dev, src, sizeof(float) * n);
    l->device_bytes += sizeof(float) * n;
    return VLLM_OK;
}

int loader_vector(struct loader *l, const char *name, int64_t n, struct span s, float **dev, enum dummy_init init,
                  float arg) {
    const struct st_tensor *t;
    if (l->st) TRY(find_shaped(l, name, 1, &n, &t)); // before the host copy is allocated
    float *tmp = loader_tmp(l, n);
    if (!tmp) return vllm_err_prefix(VLLM_ERR_OUT_OF_MEMORY, "%s", name);
    TRY(loader_read(l, name, 1, &n, tmp, init, arg));
    return loader_upload_vector(l, tmp + s.off, s.len, dev);
}

// One scale of an fp8 KV cache: a positive finite float scalar (shape [] or
// all ones), *found 0 when the checkpoint has no such tensor.
static int kv_scale(struct loader *l, const char *name, float *out, int *found) {
    const struct st_tensor *t = st_find(l->st, name);
    *found = t != NULL;
    if (!t) return VLLM_OK;
    const char *file = st_file_path(l->st, t->file);
    if (t->numel != 1) {
        char got[128];
        shape_str(got, sizeof got, t->ndim, t->shape);
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s (a KV cache scale) has shape %s, not a scalar (vLLM's fp8 KV "
                        "cache takes per-tensor scales only)", file, name, got);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s (a KV cache scale) has dtype %s, not F32, BF16 or F16", file,
                        name, st_dtype_name(t->dtype));
    TRY(st_read_f32(t, out));
    if (!(*out > 0 && isfinite(*out)))
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s (a KV cache scale) is %g, not a positive finite number", file,
                        name, *out);
    return VLLM_OK;
}

int loader_kv_scales(struct loader *l, const char *p, float *k, float *v) {
    *k = *v = 1.0f;
    if (!l->st) return VLLM_OK;
    static const char *const names[][2] = {{"k_proj.k_scale", "v_proj.v_scale"}, {"k_scale", "v_scale"},
                                           {"kv_scale", "kv_scale"}};
    char n[256];
    int fk = 0, fv = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !fk && !fv; i++) {
        snprintf(n, sizeof n, "%s%s", p, names[i][0]);
        TRY(kv_scale(l, n, k, &fk));
        snprintf(n, sizeof n, "%s%s", p, names[i][1]);
        TRY(kv_scale(l, n, v, &fv));
    }
    if (fk != fv) *(fk ? v : k) = fk ? *k : *v; // one of them: both (vLLM duplicates a lone scale)
    return VLLM_OK;
}
