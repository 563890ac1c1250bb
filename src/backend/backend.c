// backend.c - picks a backend by device name; checks op tables.
#include <math.h>
#include <stddef.h>

#include "backend/backend.h"
#include "core/common.h"
#include "io/dtype.h"

size_t dtype_size(enum dtype d) {
    switch (d) {
    case DT_F32: return 4;
    case DT_BF16: return 2;
    case DT_F16: return 2;
    case DT_FP8: return 1;
    }
    return 4;
}

const char *dtype_name(enum dtype d) {
    switch (d) {
    case DT_F32: return "float32";
    case DT_BF16: return "bfloat16";
    case DT_F16: return "float16";
    case DT_FP8: return "fp8_e4m3";
    }
    return "?";
}

size_t wfmt_size(enum wfmt f) {
    switch (f) {
    case WF_F32: return 4;
    case WF_BF16: return 2;
    case WF_F16: return 2;
    case WF_FP8:
    case WF_FP8_B128: return 1;
    case WF_NVFP4: return 0; // half a byte: wfmt_bytes
    }
    return 4;
}

const char *wfmt_name(enum wfmt f) {
    switch (f) {
    case WF_F32: return "float32";
    case WF_BF16: return "bfloat16";
    case WF_F16: return "float16";
    case WF_FP8: return "fp8 (e4m3, per-row scales)";
    case WF_FP8_B128: return "fp8 (e4m3, 128x128 block scales)";
    case WF_NVFP4: return "nvfp4 (e2m1, 16-element block scales)";
    }
    return "?";
}

static float elem_f32(enum wfmt f, const void *src, int64_t i) {
    switch (f) {
    case WF_F32: return ((const float *)src)[i];
    case WF_BF16: return bf16_to_f32(((const uint16_t *)src)[i]);
    case WF_F16: return f16_to_f32(((const uint16_t *)src)[i]);
    case WF_FP8:
    case WF_FP8_B128:
    case WF_NVFP4: break; // scaled: wfmt_dequant (wfmt_convert copies them only as they are)
    }
    return NAN;
}

void wfmt_convert(enum wfmt dst_fmt, void *dst, enum wfmt src_fmt, const void *src, int64_t n) {
    if (dst_fmt == src_fmt) {
        memcpy(dst, src, wfmt_bytes(src_fmt, n));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float v = elem_f32(src_fmt, src, i);
        switch (dst_fmt) {
        case WF_F32: ((float *)dst)[i] = v; break;
        case WF_BF16: ((uint16_t *)dst)[i] = f32_to_bf16(v); break;
        case WF_F16: ((uint16_t *)dst)[i] = f32_to_f16(v); break;
        case WF_FP8:
        case WF_FP8_B128:
        case WF_NVFP4: break; // needs scales: the loader's quantized path, weight_random_quant
        }
    }
}

int weight_from_f32(struct backend *be, struct weight *w, enum wfmt fmt, const float *src, int64_t rows, int64_t cols) {
    TRY(be->ops->weight_alloc(be, w, fmt, rows, cols));
    return be->ops->weight_upload_raw(be, w, 0, rows, src, WF_F32, cols);
}

void backend_mlp(struct backend *be, float *y, const float *x, const struct weight *up, const struct weight *down,
                 int gated, enum act act, float *h, float *tmp, int n) {
    if (be->ops->mlp && be->ops->mlp(be, y, x, up, down, gated, act, h, tmp, n)) return;
    if (gated) // act(gate) * up in the gate | up product's epilogue where the backend can
        be->ops->matmul_act_mul(be, act, h, x, up, n, tmp);
    else // act(up x) likewise in the up product's epilogue
        be->ops->matmul_act(be, act, h, x, up, n);
    be->ops->matmul(be, y, h, down, n);
}

void moe_shared_fwd(struct backend *be, const struct moe_shared *s, const float *x, int n) {
    backend_mlp(be, s->y, x, &s->w->up, &s->w->down, s->w->gated, s->w->act, s->h, s->tmp, n);
}

// The decode rows are [0, num_decodes), one token each.
void backend_mamba_decode(struct backend *be, float *out, float *y, float *zxbcdt, int ld, const struct mamba_params *p,
                          float *conv_state, float *ssm_state, const struct batch *b, const struct mamba_dims *d) {
    const struct backend_ops *o = be->ops;
    int nd = b->num_decodes;
    if (nd <= 0) return;
    o->conv1d_update(be, zxbcdt, ld, p->conv_w, p->conv_b, conv_state, b, d);
    o->ssd_decode(be, y, zxbcdt, ld, p->dt_bias, p->A, p->D, ssm_state, b, d);
    o->gated_rmsnorm(be, out, y, zxbcdt, ld, p->norm_w, nd, d->heads * d->head_dim, p->norm_group, p->eps);
}

// Every op but the optional ones (graphs, collectives, bind) must be there.
int backend_check_ops(const struct backend_ops *o) {
#define REQ(f) {offsetof(struct backend_ops, f), #f}
    static const struct {
        size_t off;
        const char *name;
    } req[] = {REQ(destroy), REQ(alloc), REQ(free), REQ(upload), REQ(download), REQ(sync), REQ(host_alloc),
               REQ(host_free), REQ(download_async), REQ(fence), REQ(fence_wait), REQ(supports), REQ(weight_alloc),
               REQ(weight_upload_raw), REQ(weight_random), REQ(gather_ids), REQ(embed), REQ(rmsnorm),
               REQ(add_rmsnorm), REQ(matmul), REQ(gather_rows), REQ(add), REQ(act), REQ(act_mul), REQ(rope),
               REQ(head_rmsnorm), REQ(qk_norm_rope), REQ(matmul_act_mul), REQ(matmul_act), REQ(sum_sq),
               REQ(conv1d_fwd), REQ(conv1d_update), REQ(ssd_prefill), REQ(ssd_decode), REQ(gated_rmsnorm), REQ(mamba_decode),
               REQ(kv_write), REQ(attn_prefill), REQ(attn_decode), REQ(moe_route), REQ(moe_experts), REQ(mask_logits), REQ(bias_logits), REQ(mem_info),
               REQ(sample), REQ(token_logprobs)};
#undef REQ
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        void (*fn)(void);
        memcpy(&fn, (const char *)o + req[i].off, sizeof fn);
        if (!fn) return vllm_err(VLLM_ERR_INTERNAL, "backend %s has no op %s", o->name, req[i].name);
    }
    int graphs = !!o->graph_begin + !!o->graph_end + !!o->graph_launch + !!o->graph_free;
    if (graphs != 0 && graphs != 4) return vllm_err(VLLM_ERR_INTERNAL, "backend %s has part of the graph ops", o->name);
    if (!o->all_reduce != !o->all_gather)
        return vllm_err(VLLM_ERR_INTERNAL, "backend %s has one of all_reduce / all_gather", o->name);
    return VLLM_OK;
}

static int checked(int rc, struct backend **out, int n) {
    if (rc) return rc;
    for (int i = 0; i < n; i++) {
        int c = backend_check_ops(out[i]->ops);
        if (c) {
            for (int k = n - 1; k >= 0; k--) backend_free(out[k]);
            return c;
        }
    }
    return VLLM_OK;
}

int backend_create(const char *device, int num_threads, enum dtype kv_dtype, struct backend **out) {
    if (!device || !strcmp(device, "cpu")) return checked(backend_cpu_create(num_threads, kv_dtype, out), out, 1);
    if (!strcmp(device, "cuda")) {
#ifdef VLLM_HAVE_CUDA
        return checked(backend_cuda_create(kv_dtype, out), out, 1);
#else
        return vllm_err(VLLM_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (build with -DVLLM_CUDA=ON)");
#endif
    }
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown device '%s' (expected cpu or cuda)", device);
}

int backend_create_group(const char *device, int n, int num_threads, enum dtype kv_dtype, struct backend **out) {
    if (n < 1) return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "a tensor-parallel group of %d ranks", n);
    if (n == 1) return backend_create(device, num_threads, kv_dtype, out);
    if (!device || !strcmp(device, "cpu"))
        return checked(backend_cpu_create_group(n, num_threads, kv_dtype, out), out, n);
    if (!strcmp(device, "cuda")) {
#ifdef VLLM_HAVE_CUDA
        return checked(backend_cuda_create_group(n, kv_dtype, out), out, n);
#else
        return vllm_err(VLLM_ERR_UNSUPPORTED, "device cuda: this build has no CUDA backend (build with -DVLLM_CUDA=ON)");
#endif
    }
    return vllm_err(VLLM_ERR_INVALID_ARGUMENT, "unknown device '%s' (expected cpu or cuda)", device);
}

void backend_bind(struct backend *be) {
    if (be && be->ops->bind) be->ops->bind(be);
}

void backend_free(struct backend *be) {
    if (be) be->ops->destroy(be);
}
