// args.c - parsing of the engine flags every subcommand takes.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "core/common.h"

const char *const cli_engine_help =
    "  --model DIR                  model directory (config.json, *.safetensors)\n"
    "  --device cpu|cuda            (default cpu)\n"
    "  --dtype auto|float32|bfloat16|float16  weight dtype (default auto: fp32 on cpu, bf16 on cuda)\n"
    "  --kv-cache-dtype auto|float32|bfloat16|fp8|fp8_e4m3  KV cache dtype (default auto: bf16\n"
    "                               on cuda with 16-bit weights, else fp32); fp8: e4m3 with the\n"
    "                               checkpoint's k_scale / v_scale (else 1), half bf16's bytes\n"
    "  --load-format auto|dummy     dummy: random weights from config.json alone\n"
    "  --quantization auto|none|fp8|nvfp4|fp8_block  quantized weights (default auto: the\n"
    "                               checkpoint's; with dummy weights, the linears made so)\n"
    "  --max-num-seqs N             running requests at most (default 64)\n"
    "  --max-num-batched-tokens N   token budget of one step (default 2048)\n"
    "  --max-model-len N            prompt + output at most (default: the config's)\n"
    "  --block-size N               tokens per KV block (default 16)\n"
    "  --num-blocks N               KV blocks in the pool (default: from --kv-cache-gb)\n"
    "  --kv-cache-gb X              KV pool budget in GiB (default 2)\n"
    "  --gpu-memory-utilization X   the fraction of the device's memory (RAM on cpu) to hold;\n"
    "                               the KV pool gets what the weights and state leave of it\n"
    "                               (default: --kv-cache-gb; serve and bench on cuda: 0.9)\n"
    "  --threads N                  CPU threads (default: all cores)\n"
    "  --seed N                     seed of dummy weights and unseeded sampling\n"
    "  --tensor-parallel-size N     ranks the model is split over (default 1): GPUs with\n"
    "                               cuda; with cpu, threads that test the split\n"
    "  --enable-prefix-caching      reuse the KV blocks and state checkpoints of shared prefixes\n"
    "  --no-enable-prefix-caching   (on by default for serve, off for generate and bench)\n"
    "  --async-scheduling           launch step N+1 before waiting for step N (default: on with\n"
    "  --no-async-scheduling        cuda; off on cpu, where it would send each token a step late)\n"
    "  --prefix-state-gb X          state checkpoint pool in GiB (default: a quarter of the KV budget)\n"
    "  --state-checkpoint-interval N  tokens between state checkpoints (default: the least common\n"
    "                               multiple of the block size and the SSD chunk size)\n";

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "vllm: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

// Digits only, optionally signed: no spaces, hex, or trailing junk.
static int plain_number(const char *v) {
    if (*v == '-' || *v == '+') v++;
    return *v >= '0' && *v <= '9';
}

int cli_int(const char *flag, const char *v, long min, long max, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!plain_number(v) || errno || *end || x < min || x > max) {
        fprintf(stderr, "vllm: %s: '%s' is not an integer in [%ld, %ld]\n", flag, v, min, max);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int cli_number(const char *flag, const char *v, double min, double max, int min_open, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    // strtod also reads " 1", "nan", "inf" and hex: a flag takes a finite decimal
    const char *d = v + (*v == '-' || *v == '+');
    int ok = ((*d >= '0' && *d <= '9') || *d == '.') && !strpbrk(v, "xX") && !errno && !*end && isfinite(x) &&
             (min_open ? x > min : x >= min) && x <= max;
    if (!ok) {
        fprintf(stderr, "vllm: %s: '%s' is not a number in %c%g, %g]\n", flag, v, min_open ? '(' : '[', min, max);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_float(const char *flag, const char *v, double min, double max, float *out) {
    double x;
    if (cli_number(flag, v, min, max, 0, &x)) return -1;
    *out = (float)x;
    return 0;
}

int cli_ids(const char *s, int32_t **ids) {
    int n = 0, cap = 0;
    *ids = NULL;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (!plain_number(p) || errno || end == p || x < -2147483647L || x > 2147483647L) {
            free(*ids);
            *ids = NULL;
            return -1;
        }
        xgrow((void **)ids, &cap, n + 1, sizeof(int32_t));
        (*ids)[n++] = (int32_t)x;
        p = end;
        if (*p == ',' && p[1]) p++;
        else if (*p) {
            free(*ids);
            *ids = NULL;
            return -1;
        }
    }
    return n;
}

void cli_device_memory_default(struct vllm_engine_params *p) {
    if (p->device && !strncmp(p->device, "cuda", 4) && !p->gpu_memory_utilization && !p->kv_cache_bytes &&
        !p->num_kv_blocks)
        p->gpu_memory_utilization = 0.9f;
}

int cli_engine_flag(int argc, char **argv, int *i, struct vllm_engine_params *p) {
    const char *f = argv[*i], *v;
    int x;
    double g;
#define VAL() if (!(v = cli_value(argc, argv, i))) return -1
    if (!strcmp(f, "--model")) { VAL(); p->model = v; }
    else if (!strcmp(f, "--device")) { VAL(); p->device = v; }
    else if (!strcmp(f, "--dtype")) { VAL(); p->dtype = v; }
    else if (!strcmp(f, "--load-format")) { VAL(); p->load_format = v; }
    else if (!strcmp(f, "--quantization")) { VAL(); p->quantization = v; }
    else if (!strcmp(f, "--kv-cache-dtype")) { VAL(); p->kv_cache_dtype = v; }
    else if (!strcmp(f, "--max-num-seqs")) { VAL(); if (cli_int(f, v, 1, 4096, &p->max_num_seqs)) return -1; }
    else if (!strcmp(f, "--max-num-batched-tokens")) { VAL(); if (cli_int(f, v, 1, 1 << 20, &p->max_num_batched_tokens)) return -1; }
    else if (!strcmp(f, "--max-model-len")) { VAL(); if (cli_int(f, v, 1, 1 << 24, &p->max_model_len)) return -1; }
    else if (!strcmp(f, "--block-size")) { VAL(); if (cli_int(f, v, 1, 1024, &p->block_size)) return -1; }
    else if (!strcmp(f, "--num-blocks")) { VAL(); if (cli_int(f, v, 1, 1 << 30, &p->num_kv_blocks)) return -1; }
    else if (!strcmp(f, "--kv-cache-gb")) { VAL(); if (cli_number(f, v, 0.001, 65536, 0, &g)) return -1; p->kv_cache_bytes = (int64_t)(g * (1 << 30)); }
    else if (!strcmp(f, "--gpu-memory-utilization")) { VAL(); if (cli_number(f, v, 0.001, 1, 0, &g)) return -1; p->gpu_memory_utilization = (float)g; }
    else if (!strcmp(f, "--threads")) { VAL(); if (cli_int(f, v, 1, 1024, &p->num_threads)) return -1; }
    else if (!strcmp(f, "--seed")) { VAL(); if (cli_int(f, v, 0, 2147483647, &x)) return -1; p->seed = (uint64_t)x; }
    else if (!strcmp(f, "--tensor-parallel-size")) { VAL(); if (cli_int(f, v, 1, 64, &p->tensor_parallel_size)) return -1; }
    else if (!strcmp(f, "--enable-prefix-caching")) p->enable_prefix_caching = 1;
    else if (!strcmp(f, "--no-enable-prefix-caching")) p->enable_prefix_caching = 0;
    else if (!strcmp(f, "--async-scheduling")) p->async_scheduling = 1;
    else if (!strcmp(f, "--no-async-scheduling")) p->async_scheduling = 0;
    else if (!strcmp(f, "--prefix-state-gb")) { VAL(); if (cli_number(f, v, 0.001, 65536, 0, &g)) return -1; p->prefix_state_bytes = (int64_t)(g * (1 << 30)); }
    else if (!strcmp(f, "--state-checkpoint-interval")) { VAL(); if (cli_int(f, v, 1, 1 << 24, &p->state_checkpoint_interval)) return -1; }
    else return 0;
#undef VAL
    return 1;
}
