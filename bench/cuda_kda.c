// cuda_kda.c - device time of the KDA ops alone at Kimi-Linear-48B's
// shapes: 32 heads of 128, a [128, 128] fp32 state per head.
//   prefill (kda_prefill): one sequence of N tokens from a zero state,
//   log-decays in [-0.2, 0] or [-20, 0] (depth 10: decay products
//   underflow), no checkpoints;
//   decode (kda_decode): 1, 16 and 64 sequences of one token, timed in a
//   graph of calls over copies of the state (a layer each, as a decode step
//   runs 20 of them: together past the L2), against the state's roofline:
//   its bytes read and written once at 4.28 TB/s (the H200's measured
//   bandwidth; bench/membw.c).
// The ops read only what the recurrence needs (proj rows q | k | v | b, g),
// so the program builds against any tree with them: tools/device_kdacuda.sh
// and tools/device_kdadec.sh copy it into the baseline's tree to time the
// old kernels the same way.
//
// Usage: build-cuda/cuda_kda [TOKENS... (1024 8192 32768)]  (0: decode only)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/common.h"
#include "bench_dev.h"

#ifdef VLLM_HAVE_CUDA
static struct backend *be;

// One sequence of T tokens in slot 0; median of 5 timed calls after a warm one.
static void bench_prefill(int T, float depth) {
    const int H = 32, K = 128, HK = H * K, ld = 3 * HK + H;
    struct kda_dims d = {H, K, 4, 64};
    int32_t arr[8] = {0, T, 0, 0, -1, 0, 0, 0}; // qsl[2], ctx, slot, src, ckpt_start[2], ckpt_pos
    int32_t *da = bench_upload(be, arr, sizeof arr);
    struct batch b;
    memset(&b, 0, sizeof b);
    b.num_tokens = T, b.num_seqs = 1, b.num_prefills = 1;
    b.query_start_loc = da, b.context_lens = da + 2, b.state_slots = da + 3, b.state_src = da + 4;
    b.ckpt_start = da + 5, b.ckpt_pos = da + 7, b.ckpt_slot = da + 7;
    b.h_query_start_loc = arr, b.h_context_lens = arr + 2, b.h_state_slots = arr + 3, b.h_state_src = arr + 4;
    float *proj = bench_uniform(be, (size_t)T * ld, -1.0f, 1.0f, 1);
    float *g = bench_uniform(be, (size_t)T * HK, 0.0f, -2 * depth, 2);
    float *st = bench_uniform(be, (size_t)HK * K, 0.0f, 0.0f, 3), *y = bench_uniform(be, (size_t)T * HK, 0.0f, 0.0f, 4);
    double t[5];
    be->ops->kda_prefill(be, y, proj, ld, g, st, &b, 0, 1, &d);
    for (int r = 0; r < 5; r++) {
        be->ops->sync(be);
        double t0 = now_s();
        be->ops->kda_prefill(be, y, proj, ld, g, st, &b, 0, 1, &d);
        be->ops->sync(be);
        t[r] = now_s() - t0;
    }
    double m = bench_median(t, 5);
    printf("  kda_prefill g>=%-5g %6d tokens  %10.3f ms  %8.3f us/token  %10.0f tok/s\n", -2 * depth, T, m * 1e3,
           m * 1e6 / T, T / m);
    void *all[] = {da, proj, g, st, y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->free(be, all[i]);
}

struct dec_ctx {
    struct backend *be;
    float *y, *proj, *g, **st;
    int ld, copies;
    struct batch *b;
    struct kda_dims *d;
};

static void dec_call(void *ctx, int i) {
    struct dec_ctx *c = ctx;
    c->be->ops->kda_decode(c->be, c->y, c->proj, c->ld, c->g, c->st[i % c->copies], c->b, c->d);
}

#define KDA_ROOF_TBS 4.28
// n decodes (slot s: sequence s), log-decays in [-0.2, 0].
static void bench_decode(int n) {
    const int H = 32, K = 128, HK = H * K, ld = 3 * HK + H;
    struct kda_dims d = {H, K, 4, 64};
    int32_t *arr = xcalloc((size_t)5 * n + 2, sizeof(int32_t)); // qsl[n+1] | ctx[n] | slot[n] | src[n] | ck_start[n+1]
    for (int s = 0; s <= n; s++) arr[s] = s;
    for (int s = 0; s < n; s++) arr[n + 1 + s] = 100 + s, arr[2 * n + 1 + s] = arr[3 * n + 1 + s] = s;
    int32_t *da = bench_upload(be, arr, sizeof(int32_t) * (5 * (size_t)n + 2));
    struct batch b;
    memset(&b, 0, sizeof b);
    b.num_tokens = n, b.num_seqs = n, b.num_decodes = n;
    b.query_start_loc = da, b.context_lens = da + n + 1, b.state_slots = da + 2 * n + 1, b.state_src = da + 3 * n + 1;
    b.ckpt_start = da + 4 * n + 1, b.ckpt_pos = b.ckpt_slot = da;
    b.h_query_start_loc = arr, b.h_context_lens = arr + n + 1, b.h_state_slots = arr + 2 * n + 1;
    b.h_state_src = arr + 3 * n + 1;
    size_t sbytes = sizeof(float) * (size_t)n * HK * K;
    int copies = (int)MAX(2, (256u << 20) / sbytes); // 256 MB of states: past the 50 MB L2
    float **st = xcalloc(copies, sizeof(float *));
    for (int i = 0; i < copies; i++) st[i] = bench_uniform(be, (size_t)n * HK * K, -0.3f, 0.3f, 10 + i);
    float *proj = bench_uniform(be, (size_t)n * ld, -1.0f, 1.0f, 1);
    float *g = bench_uniform(be, (size_t)n * HK, 0.0f, -0.2f, 2);
    float *y = bench_uniform(be, (size_t)n * HK, 0.0f, 0.0f, 4);
    struct dec_ctx c = {be, y, proj, g, st, ld, copies, &b, &d};
    double us = bench_graph_us(be, dec_call, &c, 4 * copies);
    double roof = 2.0 * sbytes / (KDA_ROOF_TBS * 1e12) * 1e6;
    printf("  kda_decode %3d seqs  %8.2f us/step  state %6.1f MB r+w: roofline %7.2f us (%4.1f%%)\n", n, us,
           2.0 * sbytes / 1e6, roof, 100 * roof / us);
    for (int i = 0; i < copies; i++) be->ops->free(be, st[i]);
    void *all[] = {da, proj, g, y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) be->ops->free(be, all[i]);
    free(st), free(arr);
}

int main(int argc, char **argv) {
    if (backend_cuda_create(DT_F32, &be)) {
        printf("cuda_kda: no GPU (%s)\n", vllm_last_error());
        return 0;
    }
    static const int nd[] = {1, 16, 64};
    for (size_t i = 0; i < sizeof nd / sizeof nd[0]; i++) bench_decode(nd[i]);
    static const int def[] = {1024, 8192, 32768};
    int n = argc > 1 ? argc - 1 : 3;
    for (int depth = 0; depth < 2; depth++)
        for (int i = 0; i < n; i++) {
            int T = argc > 1 ? atoi(argv[i + 1]) : def[i];
            if (T == 0) continue; // decode only
            if (T < 1 || T > (1 << 20)) {
                fprintf(stderr, "cuda_kda: tokens %s outside [0, 2^20]\n", argv[i + 1]);
                return 1;
            }
            bench_prefill(T, depth ? 10.0f : 0.1f);
        }
    backend_free(be);
    return 0;
}
#else
int main(void) {
    printf("cuda_kda: built without CUDA\n");
    return 0;
}
#endif
