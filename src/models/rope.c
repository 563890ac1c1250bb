// rope.c - rope parameters and tables, computed as transformers does
// (modeling_rope_utils.py): inverse frequencies in fp32, the angle of a
// position one fp32 product, cos and sin of it, times the attention factor.
#include <math.h>

#include "core/common.h"
#include "models/rope.h"

static int type_of(const struct cfg_reader *r, const char *s, enum rope_type *t) {
    if (!s || !strcmp(s, "default")) *t = ROPE_DEFAULT;
    else if (!strcmp(s, "linear")) *t = ROPE_LINEAR;
    else if (!strcmp(s, "llama3")) *t = ROPE_LLAMA3;
    else if (!strcmp(s, "yarn")) *t = ROPE_YARN;
    else
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: rope type \"%s\" is not supported (default, linear, llama3, yarn)",
                        r->what, s);
    return VLLM_OK;
}

// The rope dict: rope_parameters (transformers 5, rope_theta inside) or
// rope_scaling (the Hub's, beside a top-level rope_theta); null or absent:
// default rope.
int rope_parse(const struct cfg_reader *top, int head_dim, int max_position, struct rope *p) {
    memset(p, 0, sizeof *p);
    p->head_dim = head_dim;
    p->factor = 1.0;
    p->truncate = 1;
    if (head_dim < 2 || head_dim % 2)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: rope needs an even head_dim, not %d", top->what, head_dim);
    const json_t *d = cfg_get(top, CFG_KEYS("rope_parameters"));
    int tf5 = d && json_is_object(d);
    if (!tf5) d = cfg_get(top, CFG_KEYS("rope_scaling"));
    if (d && !json_is_null(d) && !json_is_object(d))
        return vllm_err(VLLM_ERR_FORMAT, "%s: \"%s\" must be an object", top->what, tf5 ? "rope_parameters" : "rope_scaling");
    struct cfg_reader r = {d && json_is_object(d) ? d : NULL, top->what};
    const struct cfg_reader *th = tf5 ? &r : top;
    float f;
    // theta: required (a default would silently pick a different model)
    TRY(cfg_float(th, CFG_KEYS("rope_theta"), CFG_POSITIVE(1e12), &f));
    p->theta = f;
    if (!r.j) return VLLM_OK;
    const char *ty = NULL;
    TRY(cfg_str_opt(&r, CFG_KEYS("rope_type", "type"), &ty));
    TRY(type_of(top, ty, &p->type));
    float prf;
    TRY(cfg_float_opt(&r, CFG_KEYS("partial_rotary_factor"), CFG_POSITIVE(1), 1.0f, &prf));
    if (prf != 1.0f)
        return vllm_err(VLLM_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported", top->what, prf);
    switch (p->type) {
    case ROPE_DEFAULT: return VLLM_OK;
    case ROPE_LINEAR:
        TRY(cfg_float(&r, CFG_KEYS("factor"), CFG_POSITIVE(1e6), &f));
        p->factor = f;
        return VLLM_OK;
    case ROPE_LLAMA3: {
        float lo, hi;
        TRY(cfg_float(&r, CFG_KEYS("factor"), CFG_POSITIVE(1e6), &f));
        TRY(cfg_float(&r, CFG_KEYS("low_freq_factor"), CFG_POSITIVE(1e6), &lo));
        TRY(cfg_float(&r, CFG_KEYS("high_freq_factor"), CFG_POSITIVE(1e6), &hi));
        if (hi <= lo)
            return vllm_err(VLLM_ERR_FORMAT, "%s: llama3 rope needs high_freq_factor > low_freq_factor", top->what);
        p->factor = f, p->low_freq_factor = lo, p->high_freq_factor = hi;
        const struct cfg_reader *om = cfg_get(&r, CFG_KEYS("original_max_position_embeddings")) ? &r : top;
        return cfg_int(om, CFG_KEYS("original_max_position_embeddings"), 1, CFG_MAX_POSITION, &p->original_max);
    }
    case ROPE_YARN: {
        const struct cfg_reader *om = cfg_get(&r, CFG_KEYS("original_max_position_embeddings")) ? &r : top;
        TRY(cfg_int(om, CFG_KEYS("original_max_position_embeddings"), 1, CFG_MAX_POSITION, &p->original_max));
        TRY(cfg_float_opt(&r, CFG_KEYS("factor"), CFG_POSITIVE(1e6),
                          max_position > 0 ? (float)max_position / p->original_max : 1.0f, &f));
        p->factor = f;
        float bf, bs, af, ms, msa;
        TRY(cfg_float_opt(&r, CFG_KEYS("beta_fast"), CFG_POSITIVE(1e6), 32.0f, &bf));
        TRY(cfg_float_opt(&r, CFG_KEYS("beta_slow"), CFG_POSITIVE(1e6), 1.0f, &bs));
        TRY(cfg_float_opt(&r, CFG_KEYS("mscale"), CFG_CLOSED(0, 1e6), 0.0f, &ms));
        TRY(cfg_float_opt(&r, CFG_KEYS("mscale_all_dim"), CFG_CLOSED(0, 1e6), 0.0f, &msa));
        TRY(cfg_bool_opt(&r, CFG_KEYS("truncate"), 1, &p->truncate));
        p->beta_fast = bf, p->beta_slow = bs;
        double fac = p->factor;
#define MSCALE(s, m) ((s) <= 1 ? 1.0 : 0.1 * (m) * log(s) + 1.0)
        double dflt = ms && msa ? MSCALE(fac, ms) / MSCALE(fac, msa) : MSCALE(fac, 1.0);
#undef MSCALE
        TRY(cfg_float_opt(&r, CFG_KEYS("attention_factor"), CFG_POSITIVE(1e6), (float)dflt, &af));
        p->attention_factor = af;
        return VLLM_OK;
    }
    }
    return VLLM_OK;
}

// The dimension at which a frequency makes num_rot rotations over max_pos positions.
static double correction_dim(double num_rot, int dim, double base, int max_pos) {
    return (dim * log(max_pos / (num_rot * 2 * M_PI))) / (2 * log(base));
}

static void inv_freqs(const struct rope *p, float *inv) {
    int dim = p->head_dim, h = dim / 2;
    float base = (float)p->theta, fac = (float)p->factor;
    for (int i = 0; i < h; i++) {
        float pos_freq = powf(base, (float)(2 * i) / (float)dim);
        inv[i] = 1.0f / pos_freq;
        switch (p->type) {
        case ROPE_DEFAULT: break;
        case ROPE_LINEAR: inv[i] /= fac; break;
        case ROPE_LLAMA3: {
            float wavelen = 6.2831855f / inv[i], lo_wl = (float)p->original_max / (float)p->low_freq_factor,
                  hi_wl = (float)p->original_max / (float)p->high_freq_factor;
            float il = wavelen > lo_wl ? inv[i] / fac : inv[i];
            float sf = ((float)p->original_max / wavelen - (float)p->low_freq_factor) /
                       (float)(p->high_freq_factor - p->low_freq_factor);
            float smooth = (1 - sf) * il / fac + sf * il;
            inv[i] = !(wavelen < hi_wl) && !(wavelen > lo_wl) ? smooth : il;
            break;
        }
        case ROPE_YARN: {
            double lo = correction_dim(p->beta_fast, dim, p->theta, p->original_max),
                   hi = correction_dim(p->beta_slow, dim, p->theta, p->original_max);
            if (p->truncate) lo = floor(lo), hi = ceil(hi);
            lo = fmax(lo, 0), hi = fmin(hi, dim - 1);
            if (lo == hi) hi += 0.001;
            float ramp = ((float)i - (float)lo) / (float)(hi - lo);
            ramp = fminf(fmaxf(ramp, 0.0f), 1.0f);
            float extra = 1 - ramp, inter = 1.0f / (fac * pos_freq);
            inv[i] = inter * (1 - extra) + inv[i] * extra;
            break;
        }
        }
    }
}

void rope_table(const struct rope *p, int max_pos, float *out) {
    int h = p->head_dim / 2;
    float *inv = xmalloc(sizeof(float) * h), scale = p->type == ROPE_YARN ? (float)p->attention_factor : 1.0f;
    inv_freqs(p, inv);
    for (int t = 0; t < max_pos; t++) {
        float *row = out + (int64_t)t * p->head_dim;
        for (int i = 0; i < h; i++) {
            float a = inv[i] * (float)t; // one fp32 product, as torch's inv_freq @ positions
            row[i] = (float)cos((double)a) * scale;
            row[h + i] = (float)sin((double)a) * scale;
        }
    }
    free(inv);
}

int rope_upload(struct rope *p, struct loader *l, int max_pos) {
    p->max_pos = max_pos;
    // t: [max_pos, head_dim] fp32; max_pos is the model length (a config or
    // --max-model-len), so a long one fails here with a message, not an abort.
    float *t = try_calloc((size_t)max_pos * p->head_dim, sizeof(float), "the RoPE table");
    if (!t)
        return vllm_err(VLLM_ERR_OUT_OF_MEMORY, "cannot allocate the RoPE table [max_seq_len %d, head_dim %d] "
                        "(%lld bytes of host memory): lower --max-model-len", max_pos, p->head_dim,
                        (long long)max_pos * p->head_dim * 4);
    rope_table(p, max_pos, t);
    int rc = loader_upload_vector(l, t, (int64_t)max_pos * p->head_dim, &p->table);
    free(t);
    return rc;
}
