// loader_quant.c - quantized checkpoint tensors to quantized device weights
// (quant.h, docs/QUANTIZATION.md): codes uploaded as they are, scales
// expanded to one set per row (struct weight) so that pieces stack.
#include <math.h>

#include "core/common.h"
#include "models/loader.h"
#include "models/quant.h"

int loader_is_quantized(const struct loader *l, const struct st_tensor *t) {
    if (t->dtype == ST_F8_E4M3) return 1;
    return t->dtype == ST_U8 && l->quant && l->quant->fmt == WF_NVFP4;
}

// A piece's tensors: codes t, scale s (s2: NVFP4's weight_scale_2), checked.
struct qpiece {
    const struct st_tensor *t, *s, *s2;
    int64_t rows, cols; // of the logical [rows, cols] weight
};

static const char *path_of(const struct loader *l, const struct st_tensor *t) { return st_file_path(l->st, t->file); }

// The tensor `base` + suffix, or an error naming it.
static int find_scale(struct loader *l, const char *wname, const char *suffix, const struct st_tensor **out) {
    char name[512];
    size_t n = strlen(wname);
    if (n < 6 || strcmp(wname + n - 6, "weight"))
        return vllm_err(VLLM_ERR_FORMAT, "quantized tensor %s: its scales are named after a \"...weight\" tensor", wname);
    snprintf(name, sizeof name, "%.*s%s", (int)(n - 6), wname, suffix);
    *out = st_find(l->st, name);
    if (!*out)
        return vllm_err(VLLM_ERR_FORMAT, "%s: quantized tensor %s has no scale tensor %s (%s)", path_of(l, st_find(l->st, wname)),
                        wname, name, l->quant->desc);
    return VLLM_OK;
}

static int bad_shape(struct loader *l, const struct st_tensor *s, const char *want) {
    char got[128];
    size_t k = 0;
    got[0] = 0;
    for (int i = 0; i < s->ndim && k < sizeof got; i++) k += snprintf(got + k, sizeof got - k, "%s%lld", i ? ", " : "", (long long)s->shape[i]);
    return vllm_err(VLLM_ERR_FORMAT, "%s: scale tensor %s has shape [%s], its weight needs %s", path_of(l, s), s->name, got,
                    want);
}

static int check_piece(struct loader *l, const struct wpiece *p, struct qpiece *q) {
    const struct quant_cfg *c = l->quant;
    const struct st_tensor *t = st_find(l->st, p->name);
    if (!t) return vllm_err(VLLM_ERR_FORMAT, "checkpoint has no tensor %s", p->name);
    if (!c)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s is %s but the checkpoint has no quantization config", path_of(l, t),
                        p->name, st_dtype_name(t->dtype));
    int nv = c->fmt == WF_NVFP4;
    if (t->dtype != (nv ? ST_U8 : ST_F8_E4M3))
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s has dtype %s; a %s weight is %s", path_of(l, t), p->name,
                        st_dtype_name(t->dtype), c->desc, nv ? "U8" : "F8_E4M3");
    int64_t cols = p->dims[p->ndim - 1], rows = 1;
    for (int i = 0; i < p->ndim - 1; i++) rows *= p->dims[i];
    if (nv && cols % WF_NVFP4_GROUP)
        return vllm_err(VLLM_ERR_FORMAT, "tensor %s: nvfp4 needs a multiple of 16 columns, not %lld", p->name, (long long)cols);
    int64_t tc = t->ndim ? t->shape[t->ndim - 1] : 1, want = nv ? cols / 2 : cols;
    if (t->numel != rows * want || tc != want)
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s has %lld elements (last dim %lld); the config implies [%lld, %lld]%s",
                        path_of(l, t), p->name, (long long)t->numel, (long long)tc, (long long)rows, (long long)want,
                        nv ? " (two e2m1 codes a byte)" : "");
    size_t nl = strlen(p->name);
    char module[512];
    snprintf(module, sizeof module, "%.*s", (int)(nl > 7 && !strcmp(p->name + nl - 7, ".weight") ? nl - 7 : nl), p->name);
    if (c->num_ignore && quant_excluded(c, module))
        return vllm_err(VLLM_ERR_FORMAT, "%s: tensor %s is stored quantized but its module %s is on the config's exclude list",
                        path_of(l, t), p->name, module);
    const struct st_tensor *s, *s2 = NULL;
    TRY(find_scale(l, p->name, c->scale_suffix, &s));
    char want_s[96];
    switch (c->scales) {
    case QS_TENSOR:
        if (s->numel != 1) return bad_shape(l, s, "one value (a per-tensor scale)");
        break;
    case QS_CHANNEL:
        snprintf(want_s, sizeof want_s, "[%lld, 1] (a scale per output channel)", (long long)rows);
        if (s->numel != rows || (s->ndim == 2 && s->shape[1] != 1)) return bad_shape(l, s, want_s);
        break;
    case QS_BLOCK: {
        int64_t br = CDIV(rows, WF_B128), bc = CDIV(cols, WF_B128);
        snprintf(want_s, sizeof want_s, "[%lld, %lld] (128x128 blocks)", (long long)br, (long long)bc);
        if (p->ndim != 2 || s->ndim != 2 || s->shape[0] != br || s->shape[1] != bc) return bad_shape(l, s, want_s);
        break;
    }
    case QS_NVFP4:
        snprintf(want_s, sizeof want_s, "F8_E4M3 [%lld, %lld] (a scale per 16 elements)", (long long)rows,
                 (long long)(cols / WF_NVFP4_GROUP));
        if (s->dtype != ST_F8_E4M3 || s->numel != rows * (cols / WF_NVFP4_GROUP) || s->shape[s->ndim - 1] != cols / WF_NVFP4_GROUP)
            return bad_shape(l, s, want_s);
        TRY(find_scale(l, p->name, "weight_scale_2", &s2));
        if (s2->numel != 1) return bad_shape(l, s2, "one value (the global scale weight_scale_2)");
        break;
    }
    // input_scale (a static activation scale): checked where present; the
    // weight-only paths do not use it, so it may be absent
    char iname[540];
    snprintf(iname, sizeof iname, "%s.input_scale", module);
    const struct st_tensor *is = st_find(l->st, iname);
    if (is && is->numel != 1) return bad_shape(l, is, "one value (a static activation scale)");
    if (s->dtype != ST_F32 && s->dtype != ST_BF16 && s->dtype != ST_F16 && s->dtype != ST_F8_E4M3)
        return vllm_err(VLLM_ERR_FORMAT, "%s: scale tensor %s has dtype %s, not a float type", path_of(l, s), s->name,
                        st_dtype_name(s->dtype));
    if (s2 && s2->dtype != ST_F32 && s2->dtype != ST_BF16)
        return vllm_err(VLLM_ERR_FORMAT, "%s: scale tensor %s has dtype %s, not F32", path_of(l, s2), s2->name,
                        st_dtype_name(s2->dtype));
    *q = (struct qpiece){t, s, s2, rows, cols};
    return VLLM_OK;
}

// Rows [p->rows.off, +len) of one piece into w's rows [dst, +len), columns [c0, c1).
static int upload_piece(struct loader *l, const struct wpiece *p, const struct qpiece *q, int64_t c0, int64_t c1,
                        int64_t dst, struct weight *w) {
    struct backend *be = l->be;
    enum wfmt f = w->fmt;
    int64_t len = p->rows.len, off = p->rows.off, g = wfmt_scale_cols(f, c1 - c0);
    size_t rb = wfmt_bytes(f, q->cols);
    const uint8_t *codes = (const uint8_t *)q->t->data + (size_t)off * rb + wfmt_bytes(f, c0);
    TRY(be->ops->weight_upload_raw(be, w, dst, len, codes, f, q->cols));
    float *sv = xmalloc(sizeof(float) * (size_t)q->s->numel), *sc = xmalloc(sizeof(float) * (size_t)MAX(len * g, 1));
    int rc = st_read_f32(q->s, sv);
    float s2 = 1.0f;
    if (!rc && q->s2) rc = st_read_f32(q->s2, &s2);
    uint8_t *bs = NULL;
    for (int64_t r = 0; !rc && r < len; r++) {
        switch (l->quant->scales) {
        case QS_TENSOR: sc[r] = sv[0]; break;
        case QS_CHANNEL: sc[r] = sv[off + r]; break;
        case QS_BLOCK: // block (row / 128, column block); c0 is a multiple of 128
            for (int64_t k = 0; k < g; k++) sc[r * g + k] = sv[(off + r) / WF_B128 * q->s->shape[1] + c0 / WF_B128 + k];
            break;
        case QS_NVFP4: sc[r] = s2; break;
        }
    }
    if (!rc && f == WF_NVFP4) { // block scales as they are: rows off.., columns c0/16..
        int64_t nb = (c1 - c0) / WF_NVFP4_GROUP, ld = q->cols / WF_NVFP4_GROUP;
        bs = xmalloc((size_t)MAX(len * nb, 1));
        for (int64_t r = 0; r < len; r++)
            memcpy(bs + r * nb, (const uint8_t *)q->s->data + (off + r) * ld + c0 / WF_NVFP4_GROUP, (size_t)nb);
    }
    if (!rc) weight_upload_scales(be, w, dst, len, sc, bs);
    free(sv), free(sc), free(bs);
    return rc;
}

int loader_weight_quant(struct loader *l, const struct wpiece *pieces, int n, int64_t c0, int64_t c1, int64_t pad_rows,
                        unsigned flags, struct weight *w) {
    struct backend *be = l->be;
    memset(w, 0, sizeof *w);
    if (flags & WL_F32)
        return vllm_err(VLLM_ERR_FORMAT, "tensor %s is stored quantized, but this layer (a router or embedding) runs in fp32",
                        pieces[0].name);
    struct qpiece *q = xcalloc(n, sizeof *q);
    int rc = VLLM_OK;
    for (int i = 0; !rc && i < n; i++) {
        const struct st_tensor *t = st_find(l->st, pieces[i].name);
        if (t && !loader_is_quantized(l, t))
            rc = vllm_err(VLLM_ERR_FORMAT, "tensor %s is %s but %s, a part of the same weight, is quantized", pieces[i].name,
                          st_dtype_name(t->dtype), pieces[0].name);
        if (!rc) rc = check_piece(l, &pieces[i], &q[i]);
    }
    int64_t cols = n ? q[0].cols : 0, rows = pad_rows;
    if (!c1) c0 = 0, c1 = cols;
    for (int i = 0; i < n; i++) rows += pieces[i].rows.len;
    enum wfmt f = rc ? WF_FP8 : l->quant->fmt;
    int64_t align = f == WF_FP8_B128 ? WF_B128 : f == WF_NVFP4 ? WF_NVFP4_GROUP : 1;
    if (!rc && (c0 % align || (c1 % align && c1 != cols)))
        rc = vllm_err(VLLM_ERR_UNSUPPORTED, "tensor %s: a split at column %lld is not on a %lld-column scale block (%s)",
                      pieces[0].name, (long long)(c0 % align ? c0 : c1), (long long)align, l->quant->desc);
    if (!rc) rc = be->ops->weight_alloc(be, w, f, rows, c1 - c0);
    if (!rc) l->device_bytes += wfmt_weight_bytes(f, rows, c1 - c0);
    for (int64_t i = 0, dst = 0; !rc && i < n; dst += pieces[i].rows.len, i++)
        rc = upload_piece(l, &pieces[i], &q[i], c0, c1, dst, w);
    free(q);
    return rc;
}
