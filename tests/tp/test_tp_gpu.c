// test_tp_gpu.c - the CUDA backend's collectives (NCCL, and the kernel that
// lays out all-gathered columns) against their CPU reference (cpu_tp.c), on
// 2 and 4 GPUs when there are that many: every rank gets the same bits, sums
// match the CPU's within fp32 rounding (exactly for 2 ranks), gathers exactly.
#include <math.h>

#include "backend/backend.h"
#include "core/common.h"
#include "core/team.h"
#include "test.h"

#define N 1003 // all-reduce length: not a multiple of the rank count
#define ROWS 5
#define COLS 7 // per rank; the gathered width is cut 3 short of tp * COLS

struct ctx {
    struct backend **be;
    int tp;
    float x[4][N], out[4][ROWS * 4 * COLS], in[4][ROWS * COLS];
};

static void rank_fn(void *arg, int r) {
    struct ctx *c = arg;
    struct backend *be = c->be[r];
    const struct backend_ops *op = be->ops;
    int out_cols = c->tp * COLS - 3;
    backend_bind(be);
    float *x = op->alloc(be, sizeof c->x[r]), *in = op->alloc(be, sizeof c->in[r]), *out = op->alloc(be, sizeof c->out[r]);
    op->upload(be, x, c->x[r], sizeof c->x[r]);
    op->upload(be, in, c->in[r], sizeof c->in[r]);
    op->all_reduce(be, x, N);
    op->all_gather(be, out, out_cols, in, COLS, ROWS);
    op->download(be, c->x[r], x, sizeof c->x[r]);
    op->download(be, c->out[r], out, sizeof(float) * ROWS * out_cols);
    op->free(be, x), op->free(be, in), op->free(be, out);
}

static void fill(struct ctx *c) {
    uint64_t s = 12345;
    for (int r = 0; r < c->tp; r++) {
        for (int i = 0; i < N; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            c->x[r][i] = (float)((s >> 11) * 0x1.0p-53 * 2 - 1);
        }
        for (int i = 0; i < ROWS * COLS; i++) c->in[r][i] = (float)(r * 1000 + i);
    }
}

int main(void) {
    int ran = 0;
    for (int tp = 2; tp <= 4; tp *= 2) {
        struct backend *gpu[4] = {0}, *cpu[4] = {0};
        if (backend_create_group("cuda", tp, 1, DT_F32, gpu)) {
            fprintf(stderr, "tp %d on cuda: %s\n", tp, vllm_last_error());
            continue;
        }
        CHECK(backend_create_group("cpu", tp, tp, DT_F32, cpu) == 0);
        static struct ctx g, h;
        g.be = gpu, g.tp = tp, h.be = cpu, h.tp = tp;
        fill(&g), fill(&h);
        struct team *t = team_create(tp);
        team_run(t, rank_fn, &g);
        team_run(t, rank_fn, &h);
        team_free(t);
        int same = 1, gathered = 1, out_cols = tp * COLS - 3;
        double err = 0;
        for (int r = 0; r < tp; r++) {
            same &= !memcmp(g.x[r], g.x[0], sizeof g.x[0]);
            for (int i = 0; i < N; i++) err = fmax(err, fabs(g.x[r][i] - h.x[r][i]));
            gathered &= !memcmp(g.out[r], h.out[r], sizeof(float) * ROWS * out_cols);
        }
        CHECKF(same, "tp %d: ranks got different all-reduce bits", tp);
        CHECKF(tp == 2 ? err == 0 : err < 1e-6, "tp %d: all-reduce differs from the CPU's by %.2e", tp, err);
        CHECKF(gathered, "tp %d: all-gather differs from the CPU's", tp);
        printf("tp %d: all-reduce within %.1e of the CPU reference, same bits on every rank; all-gather exact\n", tp, err);
        for (int r = tp - 1; r >= 0; r--) backend_bind(gpu[r]), backend_free(gpu[r]), backend_free(cpu[r]);
        ran++;
    }
    if (!ran) TEST_SKIP("no group of 2 GPUs could be made");
    return test_summary("tp_gpu");
}
