// loader.c - checkpoint tensors to device weights.
#include <math.h>

#include "core/common.h"
#include "io/dtype.h"
#include "models/loader.h"

int loader_open(struct loader *l, const char *dir, int dummy, uint64_t seed, struct backend *be) {
    memset(l, 0, sizeof *l);
    l->be = be;
    l->seed = seed;
    if (dummy) return VLLM_OK;
    return st_open_dir(dir, &l->st);
}

void loader_close(struct loader *l) {
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
        l->tmp = xmalloc(sizeof(float) * n);
        l->tmp_cap = n;
    }
    return l->tmp;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void dummy_fill(const char *name, uint64_t seed, float *dst, int64_t n, enum dummy_init init, float arg) {
    uint64_t s = seed;
    for (const char *p = name; *p; p++) s = s * 1099511628211ull + (unsigned char)*p;
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

int loader_read(struct loader *l, const char *name, int ndim, const int64_t *dims, float *dst, enum dummy_init init,
                float arg) {
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) numel *= dims[i];
    if (!l->st) {
        dummy_fill(name, l->seed, dst, numel, init, arg);
        return VLLM_OK;
    }
    const struct st_tensor *t = st_find(l->st, name);
    if (!t) return vllm_err(VLLM_ERR_FORMAT, "checkpoint has no tensor %s", name);
    // compare shapes with size-1 dims dropped ([C, 1, K] conv weights)
    int64_t a[8], b[8];
    int na = 0, nb = 0;
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
    TRY(st_read_f32(t, dst));
    size_t nl = strlen(name), kl = l->keep_fp32 ? strlen(l->keep_fp32) : 0;
    if (l->round_bf16 && !(kl && nl >= kl && !strcmp(name + nl - kl, l->keep_fp32)))
        for (int64_t i = 0; i < numel; i++) dst[i] = bf16_to_f32(f32_to_bf16(dst[i]));
    return VLLM_OK;
}

int loader_upload_matrix(struct loader *l, const float *src, int64_t rows, int64_t cols, enum dtype dt,
                         struct weight *w) {
    TRY(l->be->ops->weight_upload(l->be, w, src, rows, cols, dt));
    l->device_bytes += (int64_t)dtype_size(w->dtype) * rows * cols;
    return VLLM_OK;
}

int loader_upload_vector(struct loader *l, const float *src, int64_t n, float **dev) {
    *dev = l->be->ops->alloc(l->be, sizeof(float) * n);
    if (!*dev) return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate %lld floats on the device", (long long)n);
    l->be->ops->upload(l->be, *dev, src, sizeof(float) * n);
    l->device_bytes += sizeof(float) * n;
    return VLLM_OK;
}

static uint64_t name_seed(const char *name, uint64_t seed) {
    uint64_t s = seed ^ 0x5bd1e995u;
    for (const char *p = name; *p; p++) s = s * 1099511628211ull + (unsigned char)*p;
    return s;
}

int loader_matrix(struct loader *l, const char *name, int64_t rows, int64_t cols, enum dtype dt, struct weight *w,
                  float dummy_std) {
    if (!l->st) { // dummy: made on the device
        TRY(l->be->ops->weight_random(l->be, w, rows, cols, dt, name_seed(name, l->seed), dummy_std));
        l->device_bytes += (int64_t)dtype_size(w->dtype) * rows * cols;
        return VLLM_OK;
    }
    float *tmp = loader_tmp(l, rows * cols);
    TRY(loader_read(l, name, 2, (int64_t[]){rows, cols}, tmp, DUMMY_NORMAL, dummy_std));
    return loader_upload_matrix(l, tmp, rows, cols, dt, w);
}

int loader_vector(struct loader *l, const char *name, int64_t n, float **dev, enum dummy_init init, float arg) {
    float *tmp = loader_tmp(l, n);
    TRY(loader_read(l, name, 1, &n, tmp, init, arg));
    return loader_upload_vector(l, tmp, n, dev);
}

struct span span_part(int64_t n, int tp, int r) {
    int64_t lo = n * r / tp, hi = n * (r + 1) / tp;
    return (struct span){lo, hi - lo};
}

static int64_t shard_rows(const struct shard *s, int64_t rows) {
    if (!s->rows) return rows;
    int64_t n = 0;
    for (int i = 0; i < s->num_rows; i++) n += s->rows[i].len;
    return n;
}

static int64_t shard_cols(const struct shard *s, int64_t cols) { return s->c1 ? s->c1 - s->c0 : cols; }

// Every kept element moves to a lower or equal index (spans ascend, the kept
// width is at most cols), so one forward pass of memmove compacts in place.
int64_t shard_select(float *buf, int64_t rows, int64_t cols, const struct shard *s) {
    int64_t c0 = s->c1 ? s->c0 : 0, w = shard_cols(s, cols), k = 0;
    struct span all = {0, rows};
    const struct span *sp = s->rows ? s->rows : &all;
    int ns = s->rows ? s->num_rows : 1;
    for (int i = 0; i < ns; i++)
        for (int64_t r = sp[i].off; r < sp[i].off + sp[i].len; r++, k++)
            if (k != r || w != cols) memmove(buf + k * w, buf + r * cols + c0, sizeof(float) * w);
    return k;
}

int loader_matrix_part(struct loader *l, const char *name, int64_t rows, int64_t cols, const struct shard *s,
                       enum dtype dt, struct weight *w, float dummy_std) {
    int64_t kr = shard_rows(s, rows) + s->pad_rows, kc = shard_cols(s, cols);
    if (!l->st) { // dummy: made on the device at the part's shape, seeded by where the part starts
        uint64_t at = (uint64_t)(s->rows ? s->rows[0].off : 0) * 1000003u + (uint64_t)s->c0;
        TRY(l->be->ops->weight_random(l->be, w, kr, kc, dt, name_seed(name, l->seed) ^ at, dummy_std));
        l->device_bytes += (int64_t)dtype_size(w->dtype) * kr * kc;
        return VLLM_OK;
    }
    float *tmp = loader_tmp(l, (size_t)MAX(rows, kr) * cols);
    TRY(loader_read(l, name, 2, (int64_t[]){rows, cols}, tmp, DUMMY_NORMAL, dummy_std));
    int64_t n = shard_select(tmp, rows, cols, s);
    memset(tmp + n * kc, 0, sizeof(float) * s->pad_rows * kc);
    return loader_upload_matrix(l, tmp, kr, kc, dt, w);
}

int loader_vector_part(struct loader *l, const char *name, int64_t n, const struct shard *s, float **dev,
                       enum dummy_init init, float arg) {
    float *tmp = loader_tmp(l, n);
    TRY(loader_read(l, name, 1, &n, tmp, init, arg));
    return loader_upload_vector(l, tmp, shard_select(tmp, n, 1, s), dev);
}
