// quant.h - a checkpoint's quantization config (docs/QUANTIZATION.md):
// hf_quant_config.json (ModelOpt) or config.json "quantization_config"
// (modelopt, compressed-tensors, fp8), and the --quantization option.
//
// Which weights are quantized is what the checkpoint stores: a linear whose
// weight is F8_E4M3 (FP8) or U8 (NVFP4 codes) loads in the config's format
// with its scale tensors; anything else loads as it is. The exclude / ignore
// list is held against that: an excluded module stored quantized, a
// quantized tensor without a config, or a config the loader cannot read is
// an error naming the tensor or the key, never a silent precision.
#ifndef VLLM_MODELS_QUANT_H
#define VLLM_MODELS_QUANT_H

#include "backend/backend.h"

// --quantization (vllm_engine_params.quantization)
enum quant_mode {
    QUANT_AUTO,      // the checkpoint's (dummy weights: none)
    QUANT_NONE,      // unquantized only (a quantized checkpoint is an error)
    QUANT_FP8,       // FP8 with per-tensor / per-channel scales (dummy: per-row)
    QUANT_NVFP4,     // NVFP4
    QUANT_FP8_BLOCK, // FP8 with 128x128 block scales
};
// "auto", "none", "fp8", "nvfp4", "fp8_block" (NULL: auto).
int quant_mode_parse(const char *s, enum quant_mode *out);
const char *quant_mode_name(enum quant_mode m);

// How a checkpoint's weight scales are laid out.
enum quant_scales {
    QS_TENSOR,  // weight_scale: one F32 (ModelOpt FP8, compressed-tensors "tensor")
    QS_CHANNEL, // weight_scale: [out, 1] (compressed-tensors "channel")
    QS_BLOCK,   // weight_scale(_inv): [ceil(out/128), ceil(in/128)]
    QS_NVFP4,   // weight_scale: F8_E4M3 [out, in/16]; weight_scale_2: one F32
};

struct quant_cfg {
    enum wfmt fmt;            // WF_FP8, WF_FP8_B128 or WF_NVFP4
    enum quant_scales scales;
    const char *scale_suffix; // after the module name: "weight_scale" or "weight_scale_inv"
    char desc[64];            // for messages: "modelopt FP8 (hf_quant_config.json)"
    char **ignore;            // module patterns kept unquantized: globs, or "re:" + a regex
    int num_ignore;
    void *re;                 // compiled "re:" patterns (PCRE2), parallel to ignore
};

// Reads dir's quantization config: *out NULL when the checkpoint has none.
// Errors name the file and the key (an unknown quant_algo / quant_method /
// strategy is named).
int quant_cfg_read(const char *dir, struct quant_cfg **out);
void quant_cfg_free(struct quant_cfg *q);
// Whether module (a tensor name without ".weight") is on the ignore list.
int quant_excluded(const struct quant_cfg *q, const char *module);
// Holds the mode to the checkpoint's config (q may be NULL): an error naming
// both when they differ.
int quant_mode_check(enum quant_mode m, const struct quant_cfg *q);
// Whether dummy linears are quantized in mode m, and in which format.
int quant_mode_dummy_fmt(enum quant_mode m, enum wfmt *fmt);

#endif
