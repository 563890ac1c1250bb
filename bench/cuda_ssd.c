// cuda_ssd.c - device time of the Mamba2 SSD chunked-scan prefill alone
// (ssd_prefill: one Mamba layer's scan) at Nemotron-3-Nano 30B-A3B's shapes:
// 64 heads of 64, 8 groups, state 128, chunk 128. Batches of SEQS fresh
// prompts of TOKENS tokens each (state_src -1, no checkpoints), in the fp32
// mode (weight_dtype float32) and the 16-bit one (bf16 products).
// Prints per batch the microseconds of one call (a layer) and the tokens per
// second of that layer alone. The program uses the op's interface only, so
// it builds against an older tree (copy it in) to time the old kernels the
// same way.
//
// Usage: build-cuda/cuda_ssd [SEQS TOKENS]... (default: 1 8192 64 128)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/common.h"
#include "bench_dev.h"

#ifdef VLLM_HAVE_CUDA
enum { H = 64, P = 64, G = 8, N = 128, CHUNK = 128, I = H * P, CD = I + 2 * G * N, LD = I + CD + H };

// S prompts of T tokens, slot s each; median of 5 timed calls after a warm one.
static void bench_prefill(struct backend *be, int S, int T) {
    struct mamba_dims d = {H, P, G, N, 4, CHUNK, CD, 0.0f, INFINITY};
    int n = S * T;
    // qsl [S+1] | ctx [S] | slots [S] | src [S] | ckpt_start [S+1] | ckpt_pos, ckpt_slot [1]
    int32_t *arr = xcalloc((size_t)5 * S + 4, sizeof(int32_t));
    int32_t *qsl = arr, *ctx = qsl + S + 1, *slot = ctx + S, *src = slot + S, *cks = src + S;
    for (int s = 0; s <= S; s++) qsl[s] = s * T;
    for (int s = 0; s < S; s++) slot[s] = s, src[s] = -1;
    int32_t *da = bench_upload(be, arr, sizeof(int32_t) * ((size_t)5 * S + 4));
    struct batch b;
    memset(&b, 0, sizeof b);
    b.num_tokens = n, b.num_seqs = S, b.num_prefills = S, b.max_query_len = T, b.max_seq_len = T;
    b.query_start_loc = da, b.context_lens = da + (ctx - arr), b.state_slots = da + (slot - arr);
    b.state_src = da + (src - arr), b.ckpt_start = da + (cks - arr);
    b.ckpt_pos = b.ckpt_slot = b.ckpt_start + S + 1; // none
    b.h_query_start_loc = qsl, b.h_context_lens = ctx, b.h_state_slots = slot, b.h_state_src = src;
    float *zx = bench_uniform(be, (size_t)n * LD, -1.0f, 1.0f, 1), *y = bench_uniform(be, (size_t)n * I, 0, 0, 2);
    float *st = bench_uniform(be, (size_t)S * H * P * N, 0, 0, 3), *A = bench_uniform(be, H, -1.0f, -0.05f, 4);
    float *Dv = bench_uniform(be, H, -1.0f, 1.0f, 5), *dtb = bench_uniform(be, H, -6.0f, -2.0f, 6);
    double t[5];
    be->ops->ssd_prefill(be, y, zx, LD, dtb, A, Dv, st, &b, 0, S, &d); // warm: scratch sized
    for (int r = 0; r < 5; r++) {
        be->ops->sync(be);
        double t0 = now_s();
        be->ops->ssd_prefill(be, y, zx, LD, dtb, A, Dv, st, &b, 0, S, &d);
        be->ops->sync(be);
        t[r] = now_s() - t0;
    }
    double m = bench_median(t, 5);
    printf("  ssd_prefill %-4s %3d x %-6d %10.1f us per layer  %12.0f tok/s\n",
           be->weight_dtype == WF_F32 ? "fp32" : "bf16", S, T, m * 1e6, n / m);
    void *all[] = {da, zx, y, st, A, Dv, dtb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->free(be, all[i]);
    free(arr);
}

int main(int argc, char **argv) {
    static const int def[] = {1, 8192, 64, 128};
    int np = argc > 1 ? (argc - 1) / 2 : 2;
    if (argc > 1 && (argc - 1) % 2) {
        fprintf(stderr, "usage: cuda_ssd [SEQS TOKENS]...\n");
        return 1;
    }
    for (int mode = 0; mode < 2; mode++) {
        struct backend *be;
        if (backend_cuda_create(mode ? DT_BF16 : DT_F32, &be)) {
            printf("cuda_ssd: no GPU (%s)\n", vllm_last_error());
            return 0;
        }
        be->weight_dtype = mode ? WF_BF16 : WF_F32; // the compute mode
        for (int i = 0; i < np; i++) {
            int S = argc > 1 ? atoi(argv[1 + 2 * i]) : def[2 * i];
            int T = argc > 1 ? atoi(argv[2 + 2 * i]) : def[2 * i + 1];
            if (S < 1 || T < 1 || (int64_t)S * T > (1 << 20)) {
                fprintf(stderr, "cuda_ssd: %d x %d tokens: each at least 1, together at most 2^20\n", S, T);
                return 1;
            }
            bench_prefill(be, S, T);
        }
        backend_free(be);
    }
    return 0;
}
#else
int main(void) {
    printf("cuda_ssd: built without CUDA\n");
    return 0;
}
#endif
