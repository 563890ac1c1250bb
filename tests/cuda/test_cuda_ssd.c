// test_cuda_ssd.c - the CUDA SSD chunked-scan prefill (ssd_prefill, after
// ssd_decode for the batch's decode rows) against the CPU reference op, at
// Nemotron-3-Nano's shapes (64 heads of 64, 8 groups, state 128, chunk 128),
// in the fp32 mode (weight_dtype float32: relative error <= 1e-5) and the 16-bit
// mode (bf16 products: <= 2e-2), on y and on every state slot.
//
// One batch: 2 decodes, then 74 prefills of 1, 2 (a chunk boundary between
// the two tokens), 127, 128, 129, 1,000 and 2,048 tokens; fresh slots
// (state_src -1), prompts continued from their own slot or restored from
// another one at contexts that are not chunk-aligned, checkpoints at chunk
// ends inside the prompts. Decays are mild in some heads (dt A down to -5e-5
// a token), so states carry across many chunks. The batch has 169 chunks: at
// these shapes a pass of the CUDA op takes 65 chunks in fp32 and 101 in bf16
// (SSD_PASS_BYTES, cuda_mamba.cu), and the order below puts pass boundaries
// inside a 129-token prompt (chunk 65), a 1,000-token one (101) and a
// 2-token one (130), so a state also carries from one pass to the next. A
// second batch: one 1-token prompt and nothing else (seq0 0, one chunk).
// Exits 77 (skip) without a GPU.
#include <math.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "core/common.h"
#include "op_util.h"
#include "test.h"

enum { H = 64, P = 64, G = 8, N = 128, L = 128, I = H * P, CD = I + 2 * G * N, LD = I + CD + H, PN = P * N };
enum { MAXS = 80, MAXCK = 128 };

// A prompt: len tokens after ctx; src 0 fresh (-1), 1 its own slot, 2 a
// restored slot; checkpoints at its chunk ends while ck (every one).
struct prompt {
    int len, ctx, src, ck;
};

// Live slots 0..n-1, then restored and checkpoint slots as they come.
struct ssd_batch {
    int n, nd, T, slots, nck;
    int32_t qsl[MAXS + 1], ctx[MAXS], slot[MAXS], src[MAXS], ck_start[MAXS + 1], ck_pos[MAXCK], ck_slot[MAXCK];
    int32_t ck_dst[MAXS];
    int32_t *dev; // their device copy
    struct batch c, g;
};

static void add_seq(struct ssd_batch *b, struct prompt p) {
    int s = b->n++;
    if (!b->slots) b->slots = MAXS;
    b->qsl[s + 1] = b->qsl[s] + p.len;
    b->ctx[s] = p.ctx;
    b->slot[s] = s;
    b->src[s] = p.src == 0 ? -1 : p.src == 1 ? s : b->slots++;
    b->ck_dst[s] = -1;
    b->ck_start[s + 1] = b->ck_start[s];
    if (p.ck)
        for (int pos = (p.ctx / L + 1) * L; pos <= p.ctx + p.len && b->nck < MAXCK; pos += L) {
            b->ck_pos[b->nck] = pos;
            b->ck_slot[b->nck++] = b->slots++;
            b->ck_start[s + 1]++;
        }
}

// An array of n to the device at *at (advanced past it).
static int32_t *dev_copy(struct backend *gpu, int32_t **at, const int32_t *h, int n) {
    int32_t *p = *at;
    gpu->ops->upload(gpu, p, h, sizeof(int32_t) * n);
    *at += n;
    return p;
}

// The batch over the host arrays (the CPU's, and the mirrors), and over their device copies.
static void upload_batch(struct backend *gpu, struct ssd_batch *b) {
    int n = b->n;
    b->T = b->qsl[n];
    int32_t *at = b->dev = gpu->ops->alloc(gpu, sizeof(int32_t) * (6 * MAXS + 2 * MAXCK + 2));
    struct batch *c = &b->c, *g = &b->g;
    memset(c, 0, sizeof *c);
    c->num_tokens = b->T, c->num_seqs = n, c->num_decodes = b->nd, c->num_prefills = n - b->nd;
    c->query_start_loc = b->qsl, c->context_lens = b->ctx, c->state_slots = b->slot, c->state_src = b->src;
    c->ckpt_start = b->ck_start, c->ckpt_pos = b->ck_pos, c->ckpt_slot = b->ck_slot, c->ckpt_dst = b->ck_dst;
    c->h_query_start_loc = b->qsl, c->h_context_lens = b->ctx, c->h_state_slots = b->slot, c->h_state_src = b->src;
    *g = *c;
    g->query_start_loc = dev_copy(gpu, &at, b->qsl, n + 1), g->context_lens = dev_copy(gpu, &at, b->ctx, n);
    g->state_slots = dev_copy(gpu, &at, b->slot, n), g->state_src = dev_copy(gpu, &at, b->src, n);
    g->ckpt_start = dev_copy(gpu, &at, b->ck_start, n + 1), g->ckpt_dst = dev_copy(gpu, &at, b->ck_dst, n);
    g->ckpt_pos = dev_copy(gpu, &at, b->ck_pos, MAXCK), g->ckpt_slot = dev_copy(gpu, &at, b->ck_slot, MAXCK);
}

static int chunks_of(const struct ssd_batch *b) {
    int nc = 0;
    for (int s = b->nd; s < b->n; s++) {
        int len = b->qsl[s + 1] - b->qsl[s];
        nc += (b->ctx[s] + len - 1) / L - b->ctx[s] / L + 1;
    }
    return nc;
}

static double rel_err(struct backend *gpu, const float *ref, const float *dev, size_t n) {
    float *h = xmalloc(sizeof(float) * n);
    gpu->ops->download(gpu, h, dev, sizeof(float) * n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= !isfinite(h[i]);
    double e = bad ? INFINITY : test_max_rel(h, ref, n);
    free(h);
    return e;
}

// The CPU reference once, then the GPU in each mode from the same inputs.
static void run_case(struct backend *cpu, struct backend *gpu, struct ssd_batch *b, const char *what) {
    upload_batch(gpu, b);
    struct mamba_dims d = {H, P, G, N, 4, L, CD, 0.0f, INFINITY};
    size_t ny = (size_t)b->T * I, nst = (size_t)b->slots * H * PN;
    float *zx = test_rnd((size_t)b->T * LD, 1), *y0 = test_rnd(ny, 1), *st0 = test_rnd(nst, 1);
    float A[H], Dv[H], dtb[H];
    for (int h = 0; h < H; h++) { // dt A from about -5e-5 to -0.9 a token: some heads remember many chunks
        A[h] = -expf(-3.0f + 4.0f * (h % 16) / 15.0f + 0.1f * test_frand());
        dtb[h] = -6.0f + 4.0f * (h / 16) / 3.0f + 0.1f * test_frand(); // dt = softplus(x + dt_bias) in [0.001, 0.3]
        Dv[h] = test_frand();
    }
    float *cy = cpu->ops->alloc(cpu, sizeof(float) * ny), *cst = cpu->ops->alloc(cpu, sizeof(float) * nst);
    memcpy(cy, y0, sizeof(float) * ny);
    memcpy(cst, st0, sizeof(float) * nst);
    cpu->ops->ssd_decode(cpu, cy, zx, LD, dtb, A, Dv, cst, &b->c, &d);
    cpu->ops->ssd_prefill(cpu, cy, zx, LD, dtb, A, Dv, cst, &b->c, b->nd, b->n, &d);
    float *gzx = gpu->ops->alloc(gpu, sizeof(float) * b->T * LD), *gy = gpu->ops->alloc(gpu, sizeof(float) * ny);
    float *gst = gpu->ops->alloc(gpu, sizeof(float) * nst), *gp = gpu->ops->alloc(gpu, sizeof(float) * 3 * H);
    gpu->ops->upload(gpu, gzx, zx, sizeof(float) * b->T * LD);
    gpu->ops->upload(gpu, gp, A, sizeof A);
    gpu->ops->upload(gpu, gp + H, Dv, sizeof Dv);
    gpu->ops->upload(gpu, gp + 2 * H, dtb, sizeof dtb);
    printf("%s: %d decodes, %d prompts, %d tokens, %d chunks, %d checkpoints\n", what, b->nd, b->n - b->nd, b->T,
           chunks_of(b), b->nck);
    for (int mode = 0; mode < 2; mode++) {
        enum dtype kv = mode ? DT_BF16 : DT_F32;
        double tol = mode ? 2e-2 : 1e-5;
        gpu->kv_dtype = kv, gpu->weight_dtype = mode ? WF_BF16 : WF_F32; // the op's mode
        gpu->ops->upload(gpu, gy, y0, sizeof(float) * ny);
        gpu->ops->upload(gpu, gst, st0, sizeof(float) * nst);
        gpu->ops->ssd_decode(gpu, gy, gzx, LD, gp + 2 * H, gp, gp + H, gst, &b->g, &d);
        gpu->ops->ssd_prefill(gpu, gy, gzx, LD, gp + 2 * H, gp, gp + H, gst, &b->g, b->nd, b->n, &d);
        double ey = rel_err(gpu, cy, gy, ny), es = rel_err(gpu, cst, gst, nst);
        printf("  %-5s y rel err %.2e, states %.2e (tol %.0e) over %zu and %zu values\n", mode ? "bf16" : "fp32", ey,
               es, tol, ny, nst);
        CHECKF(ey <= tol && es <= tol, "%s %s: y %.3g, states %.3g > %.0g", what, mode ? "bf16" : "fp32", ey, es, tol);
    }
    gpu->kv_dtype = DT_F32, gpu->weight_dtype = WF_F32;
    void *gall[] = {gzx, gy, gst, gp, b->dev};
    for (size_t i = 0; i < sizeof gall / sizeof gall[0]; i++) gpu->ops->free(gpu, gall[i]);
    cpu->ops->free(cpu, cy), cpu->ops->free(cpu, cst);
    free(zx), free(y0), free(st0);
}

// k 2-token prompts, each across a chunk boundary (2 chunks): fresh, own
// slot or restored in turn, every other one checkpointed between its tokens
static void add_straddlers(struct ssd_batch *b, int k) {
    for (int i = 0; i < k; i++) add_seq(b, (struct prompt){2, L - 1 + L * (b->n % 5), b->n % 3, b->n % 2});
}

int main(void) {
#ifndef VLLM_HAVE_CUDA
    TEST_SKIP("built without CUDA");
#else
    struct backend *gpu, *cpu;
    if (backend_cuda_create(DT_F32, &gpu)) TEST_SKIP("no GPU: %s", vllm_last_error());
    if (cpu_backend_create(0, 1, -1, &cpu)) return 1; // the reference ops
    static struct ssd_batch b;
    memset(&b, 0, sizeof b);
    add_seq(&b, (struct prompt){1, 40, 1, 0}); // decodes: one token after 40 and 9
    add_seq(&b, (struct prompt){1, 9, 1, 0});
    b.nd = 2;
    add_straddlers(&b, 27);                        // chunks 0..53
    add_seq(&b, (struct prompt){1000, 0, 0, 1});   // 54..61, checkpoints at 128..896
    add_seq(&b, (struct prompt){1, 0, 0, 0});      // 62
    add_seq(&b, (struct prompt){127, 0, 0, 0});    // 63
    add_seq(&b, (struct prompt){129, 0, 0, 1});    // 64, 65: fp32's second pass starts inside it
    add_seq(&b, (struct prompt){128, 5, 2, 1});    // 66, 67, restored
    add_seq(&b, (struct prompt){2048, 300, 1, 1}); // 68..84, continued
    add_straddlers(&b, 7);                         // 85..98
    add_seq(&b, (struct prompt){1000, 77, 1, 1});  // 99..107: bf16's second pass starts inside it
    add_seq(&b, (struct prompt){1, 500, 1, 0});    // 108
    add_straddlers(&b, 30);                        // 109..168: fp32's third pass at 130
    CHECKF(b.n <= MAXS && b.nck < MAXCK && chunks_of(&b) == 169, "%d sequences, %d checkpoints, %d chunks", b.n, b.nck,
           chunks_of(&b));
    run_case(cpu, gpu, &b, "mixed batch");
    static struct ssd_batch one;
    memset(&one, 0, sizeof one);
    add_seq(&one, (struct prompt){1, 0, 0, 0});
    run_case(cpu, gpu, &one, "one 1-token prompt");
    backend_free(gpu);
    backend_free(cpu);
    return test_summary("gpu_ssd");
#endif
}
