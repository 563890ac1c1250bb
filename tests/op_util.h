// op_util.h - what the op tests share: a seeded xorshift stream of floats,
// the largest relative error of a result, and a host batch of sequences
// (struct batch with its arrays), each test filling in its own layout.
#ifndef VLLM_TESTS_OP_UTIL_H
#define VLLM_TESTS_OP_UTIL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/batch.h"
#include "core/common.h"

static uint64_t test_rng = 0x9e3779b97f4a7c15ull; // a test may reseed it: its data stays its own

static inline float test_frand(void) { // uniform in [-1, 1)
    test_rng ^= test_rng << 13, test_rng ^= test_rng >> 7, test_rng ^= test_rng << 17;
    return (float)((test_rng >> 11) * 0x1.0p-53 * 2 - 1);
}
static inline void test_fill(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = s * test_frand();
}
static inline float *test_rnd(size_t n, float s) { // malloc'd, n scaled uniforms
    float *x = xmalloc(sizeof(float) * (n ? n : 1));
    test_fill(x, n, s);
    return x;
}
// max |a - b| over max |b|, over n values
static inline double test_max_rel(const float *a, const float *b, size_t n) {
    double m = 0, scale = 1e-6;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]) / scale);
    return m;
}

#define TB_SEQS 16
#define TB_TOKENS 1024
#define TB_CKPTS 64

// Up to TB_SEQS sequences, TB_TOKENS tokens; block tables and the slot
// mapping are the test's to fill (zeros: every token in block 0).
struct test_batch {
    struct batch b;
    int32_t qsl[TB_SEQS + 1], seq_lens[TB_SEQS], ctx[TB_SEQS], slots[TB_SEQS], src[TB_SEQS];
    int32_t pos[TB_TOKENS], slot_map[TB_TOKENS], btab[TB_SEQS * 64];
    int32_t ck_start[TB_SEQS + 1], ck_pos[TB_CKPTS], ck_slot[TB_CKPTS];
    int32_t ck_dst[TB_SEQS]; // decodes' checkpoint slots (batch.ckpt_dst): -1 unless a test sets one
};

// n sequences, sequence s: qlen[s] tokens after ctx[s], state in slot[s],
// read from src[s] (-1: zeros); the first nd decode.
static inline void test_batch_make(struct test_batch *h, int n, const int *qlen, const int *ctx, const int *slot,
                                   const int *src, int nd) {
    memset(h, 0, sizeof *h);
    int t = 0;
    for (int s = 0; s < n; s++) {
        h->qsl[s] = t, h->ctx[s] = ctx[s], h->seq_lens[s] = ctx[s] + qlen[s], h->slots[s] = slot[s], h->src[s] = src[s];
        for (int i = 0; i < qlen[s]; i++) h->pos[t++] = ctx[s] + i;
    }
    h->qsl[n] = t;
    for (int s = 0; s < TB_SEQS; s++) h->ck_dst[s] = -1;
    struct batch *b = &h->b;
    *b = (struct batch){.num_tokens = t, .num_seqs = n, .num_decodes = nd, .num_prefills = n - nd};
    b->query_start_loc = h->qsl, b->seq_lens = h->seq_lens, b->context_lens = h->ctx, b->positions = h->pos;
    b->state_slots = h->slots, b->state_src = h->src, b->ckpt_start = h->ck_start, b->ckpt_pos = h->ck_pos;
    b->ckpt_slot = h->ck_slot, b->ckpt_dst = h->ck_dst, b->slot_mapping = h->slot_map, b->block_tables = h->btab;
    b->h_query_start_loc = h->qsl, b->h_seq_lens = h->seq_lens, b->h_context_lens = h->ctx;
    b->h_state_slots = h->slots, b->h_state_src = h->src;
}

// Decode and prefill sequences in scattered slots (continued or from zeros)
// and scattered KV blocks of bs tokens, mb blocks a sequence (a pool of
// 16 * mb blocks; n * mb <= TB_SEQS * 64).
static inline void test_batch_blocks(struct test_batch *h, int n, const int *qlen, const int *ctx, const int *init,
                                     int nd, int bs, int mb) {
    int slot[TB_SEQS], src[TB_SEQS];
    for (int s = 0; s < n; s++) slot[s] = (s * 5 + 3) % 16, src[s] = init[s] ? slot[s] : -1;
    test_batch_make(h, n, qlen, ctx, slot, src, nd);
    h->b.max_blocks_per_seq = mb;
    for (int s = 0, t = 0; s < n; s++) {
        for (int j = 0; j < mb; j++) h->btab[s * mb + j] = (s * mb + j) * 7 % (16 * mb);
        for (int i = 0; i < qlen[s]; i++, t++) {
            int p = ctx[s] + i;
            h->slot_map[t] = h->btab[s * mb + p / bs] * bs + p % bs;
        }
    }
}
// The same with 64 blocks a sequence.
static inline void test_batch_paged(struct test_batch *h, int n, const int *qlen, const int *ctx, const int *init,
                                    int nd, int bs) {
    test_batch_blocks(h, n, qlen, ctx, init, nd, bs, 64);
}

#endif
