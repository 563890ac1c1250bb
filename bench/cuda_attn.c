// cuda_attn.c - device time of decode attention alone (attn_decode: the
// split-KV kernel and its merge) at real shapes: Qwen3-8B (32 query heads,
// 8 KV heads of 128) and Nemotron-3-Nano 30B-A3B (32 / 2 of 128), S
// sequences of one token after a context of L tokens, bf16 and fp8 caches
// (blocks of 16, each sequence's blocks scattered over the pool). Calls are
// recorded into a CUDA graph as a decode step runs them (fixed shapes,
// max_model_len L), cycling over copies of the cache larger than the L2 so
// that every call reads from HBM. Prints per shape the microseconds of one
// call (a layer), the KV bytes it must read and that as GB/s and as a
// fraction of the device's measured copy bandwidth. The program uses the
// op's interface only, so it builds against an older tree (copy it and
// bench_dev.h in) to time the old kernel the same way.
//
// Usage: build-cuda/cuda_attn [LENS... (1024 8192 32768)]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/common.h"
#include "bench_dev.h"

#ifdef VLLM_HAVE_CUDA
#define L2_BYTES (256LL << 20) // cycle over at least this much (H200 L2: 50 MB)
#define MAXC 64
#define BS 16

static struct backend *be;
static double bw_peak;

// A device cache of n bytes of valid values: bf16 of magnitude < 2, or e4m3
// codes without the NaN ones.
static void *dev_cache(size_t n, enum dtype kv) {
    size_t chunk = (size_t)16 << 20;
    uint8_t *h = xmalloc(chunk);
    srand(3);
    for (size_t i = 0; i < chunk; i++) h[i] = (uint8_t)rand();
    if (kv == DT_FP8)
        for (size_t i = 0; i < chunk; i++) h[i] &= 0xf7; // exponent below 15: never 0x7f / 0xff
    else
        for (size_t i = 1; i < chunk; i += 2) h[i] = (h[i] & 0x80) | 0x3f; // high byte: sign, exponent near 0
    uint8_t *d = be->ops->alloc(be, n);
    for (size_t o = 0; o < n; o += chunk) be->ops->upload(be, d + o, h, n - o < chunk ? n - o : chunk);
    free(h);
    return d;
}

static int64_t gcd64(int64_t a, int64_t b) { return b ? gcd64(b, a % b) : a; }

struct dec_ctx {
    const struct batch *b; // [copies]
    const struct attn_dims *d;
    void *kc, *vc;
    float *qkv, *out;
    int ld, copies;
};
static void dec_call(void *p, int i) {
    struct dec_ctx *c = p;
    static const struct attn_prep none; // the decode rows' k and v written as kv_write would
    be->ops->attn_decode(be, c->out, c->qkv, c->ld, &none, c->kc, c->vc, &c->b[i % c->copies], c->d);
}

// S decodes after L tokens of context, heads H / Hkv of 128.
static void bench_one(const char *model, int H, int Hkv, enum dtype kv, int S, int L) {
    const int D = 128, kvd = Hkv * D, mbps = (L + 1 + BS - 1) / BS, ld = (H + 2 * Hkv) * D;
    struct attn_dims d = {H, Hkv, D, BS, 0.0883883f, 1.0f, 1.0f}; // 1 / sqrt(128)
    double bytes = 2.0 * S * (L + 1) * kvd * dtype_size(kv);      // K and V rows read a call
    int copies = (int)MIN(MAXC, MAX(1, L2_BYTES / (int64_t)bytes + 1)), calls = MAX(copies, 8);
    size_t blocks = (size_t)copies * S * mbps, cbytes = blocks * BS * kvd * dtype_size(kv);
    be->kv_dtype = kv;
    struct op_query q = {.op = OP_ATTN, .max_tokens = S, .max_seq_len = mbps * BS, .attn = &d};
    if (be->ops->supports(be, &q)) { // sizes the scratch of the splits
        printf("  %s: %s\n", model, vllm_last_error());
        return;
    }
    void *kc = dev_cache(cbytes, kv), *vc = dev_cache(cbytes, kv);
    float *qkv = bench_uniform(be, (size_t)S * ld, -1.0f, 1.0f, 1), *out = bench_uniform(be, (size_t)S * H * D, 0, 0, 2);
    // per copy: qsl [S+1] | seq_lens [S] | ctx [S] | pos [S] | slots [S] | block tables [S, mbps]
    size_t na = (size_t)5 * S + 1 + (size_t)S * mbps;
    int32_t *arr = xcalloc(na * copies, sizeof(int32_t));
    struct batch b[MAXC];
    int32_t *da = NULL;
    int64_t mul = 7919; // block k of the pool order is k * mul % blocks: scattered, no block shared
    while (gcd64(mul, (int64_t)blocks) != 1) mul += 2;
    for (int c = 0; c < copies; c++) {
        int32_t *h = arr + na * c, *qsl = h, *sl = qsl + S + 1, *cx = sl + S, *pos = cx + S, *slot = pos + S;
        int32_t *bt = slot + S;
        for (int s = 0; s <= S; s++) qsl[s] = s;
        for (int s = 0; s < S; s++) {
            sl[s] = L + 1, cx[s] = L, pos[s] = L;
            for (int j = 0; j < mbps; j++) // scattered: block j of sequence s of copy c
                bt[s * mbps + j] = (int32_t)(((int64_t)(c * S + s) * mbps + j) * mul % (int64_t)blocks);
            slot[s] = bt[s * mbps + L / BS] * BS + L % BS;
        }
    }
    da = bench_upload(be, arr, sizeof(int32_t) * na * copies);
    for (int c = 0; c < copies; c++) {
        int32_t *g = da + na * c, *h = arr + na * c;
        memset(&b[c], 0, sizeof b[c]);
        b[c].num_tokens = S, b[c].num_seqs = S, b[c].num_decodes = S, b[c].max_blocks_per_seq = mbps;
        b[c].max_query_len = 1, b[c].max_seq_len = L + 1, b[c].fixed_shapes = 1, b[c].max_model_len = mbps * BS;
        b[c].query_start_loc = g, b[c].seq_lens = g + S + 1, b[c].context_lens = g + 2 * S + 1;
        b[c].positions = g + 3 * S + 1, b[c].slot_mapping = g + 4 * S + 1, b[c].block_tables = g + 5 * S + 1;
        b[c].h_query_start_loc = h, b[c].h_seq_lens = h + S + 1, b[c].h_context_lens = h + 2 * S + 1;
    }
    struct dec_ctx c = {b, &d, kc, vc, qkv, out, ld, copies};
    double us = bench_graph_us(be, dec_call, &c, calls), gbs = bytes / (us * 1e-6) / 1e9;
    printf("  attn_decode %-8s %2d/%d x%d %-4s %3d x %-6d %9.2f us  KV %8.2f MB  %6.0f GB/s  %5.1f%% of copy\n", model,
           H, Hkv, D, kv == DT_FP8 ? "fp8" : "bf16", S, L, us, bytes / 1e6, gbs, 100 * gbs * 1e9 / bw_peak);
    void *all[] = {kc, vc, qkv, out, da};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->free(be, all[i]);
    free(arr);
}

int main(int argc, char **argv) {
    if (backend_cuda_create(DT_BF16, &be)) {
        printf("cuda_attn: no GPU (%s)\n", vllm_last_error());
        return 0;
    }
    double fl;
    be->ops->peaks(be, &bw_peak, &fl);
    printf("cuda_attn: copy %.0f GB/s\n", bw_peak / 1e9);
    static const int def[] = {1024, 8192, 32768};
    static const int seqs[] = {1, 16};
    static const enum dtype kvs[] = {DT_BF16, DT_FP8};
    int n = argc > 1 ? argc - 1 : 3;
    for (int i = 0; i < n; i++) {
        int L = argc > 1 ? atoi(argv[i + 1]) : def[i];
        if (L < 1 || L > (1 << 20)) {
            fprintf(stderr, "cuda_attn: length %s outside [1, 2^20]\n", argv[i + 1]);
            return 1;
        }
        for (int k = 0; k < 2; k++)
            for (int s = 0; s < 2; s++) {
                bench_one("qwen3_8b", 32, 8, kvs[k], seqs[s], L);
                bench_one("nano30b", 32, 2, kvs[k], seqs[s], L);
            }
    }
    backend_free(be);
    return 0;
}
#else
int main(void) {
    printf("cuda_attn: built without CUDA\n");
    return 0;
}
#endif
