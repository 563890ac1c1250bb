// fuzz_quant_load.c - libFuzzer harness: the input is a quantized checkpoint
// of a one-layer Qwen3 (hidden 32, 2 heads of 16, 1 KV head, intermediate 32,
// vocabulary 8): byte 0 picks the quantization config (ModelOpt FP8 / NVFP4,
// compressed-tensors FP8 per tensor / channel / 128x128 block, fp8 with
// weight_scale_inv), the rest is model.safetensors. The whole load runs on
// the CPU backend: the checkpoint is refused with an error that says why, or
// it loads, every code, scale and block scale read from inside the file
// (ASan in scripts/fuzz.sh catches a read past it).
// Seeds: tests/fuzz/corpus/quant_load/, one valid checkpoint per layout
// (made by tools/fuzz_quant_seeds.py) and broken variants.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/common.h"
#include "core/json.h"
#include "models/model.h"

static const char *config_json =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 32,"
    " \"intermediate_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"head_dim\": 16, \"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-06, \"vocab_size\": 8,"
    " \"max_position_embeddings\": 64, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
    " \"attention_bias\": false, \"eos_token_id\": 2, \"bos_token_id\": 1%s}";

// Per layout: hf_quant_config.json (ModelOpt) or config.json's quantization_config.
static const char *const layouts[][2] = {
    {"{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": {\"quant_algo\": \"FP8\","
     " \"exclude_modules\": [\"lm_head\", \"*o_proj\"]}}", NULL},
    {"{\"producer\": {\"name\": \"modelopt\"}, \"quantization\": {\"quant_algo\": \"NVFP4\", \"group_size\": 16,"
     " \"exclude_modules\": [\"lm_head\", \"*o_proj\"]}}", NULL},
    {NULL, "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"config_groups\": {\"g\":"
           " {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\"}}},"
           " \"ignore\": [\"lm_head\", \"re:.*o_proj$\"]}"},
    {NULL, "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"config_groups\": {\"g\":"
           " {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\"}}},"
           " \"ignore\": [\"lm_head\", \"re:.*o_proj$\"]}"},
    {NULL, "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", \"config_groups\": {\"g\":"
           " {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"block\","
           " \"block_structure\": [128, 128]}}}, \"ignore\": [\"lm_head\", \"re:.*o_proj$\"]}"},
    {NULL, "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"weight_block_size\": [128, 128],"
           " \"modules_to_not_convert\": [\"lm_head\", \"*o_proj\"]}"},
};
#define NUM_LAYOUTS (int)(sizeof layouts / sizeof layouts[0])

static void write_file(const char *dir, const char *name, const void *data, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) abort();
    fclose(f);
}

// Writes config.json (+ hf_quant_config.json) for layout L into dir.
static void write_configs(const char *dir, int L) {
    char extra[1024] = "", cfg[2048];
    if (layouts[L][1]) snprintf(extra, sizeof extra, ", \"quantization_config\": %s", layouts[L][1]);
    snprintf(cfg, sizeof cfg, config_json, extra);
    write_file(dir, "config.json", cfg, strlen(cfg));
    char hf[512];
    snprintf(hf, sizeof hf, "%s/hf_quant_config.json", dir);
    if (layouts[L][0]) write_file(dir, "hf_quant_config.json", layouts[L][0], strlen(layouts[L][0]));
    else unlink(hf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct backend *be;
    static char dir[64];
    static int last = -1;
    if (!be) {
        if (backend_cpu_create(1, DT_F32, &be)) abort();
        snprintf(dir, sizeof dir, "/tmp/fuzz_quant.XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    if (size < 1) return 0;
    int L = data[0] % NUM_LAYOUTS;
    if (L != last) write_configs(dir, L), last = L;
    write_file(dir, "model.safetensors", data + 1, size - 1);
    struct model_load_opts o = {.weight_fmt = WF_F32, .seed = 1, .max_tokens = 4, .max_logit_rows = 2,
                                .max_seq_len = 16};
    struct model *m = NULL;
    if (!model_load(dir, NULL, &o, be, &m)) model_free(m);
    else if (!vllm_last_error()[0]) abort(); // a refusal always says why
    return 0;
}
