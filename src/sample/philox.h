// philox.h - Philox4x32-10, the counter-based generator behind seeded
// sampling. Header-only so that the CPU reference and the CUDA kernels draw
// the very same numbers: uniform(seed, step, i) depends on nothing else.
#ifndef VLLM_SAMPLE_PHILOX_H
#define VLLM_SAMPLE_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define PHILOX_FN __host__ __device__ static inline
#else
#define PHILOX_FN static inline
#endif

PHILOX_FN void philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0], p1 = (uint64_t)0xCD9E8D57u * ctr[2];
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t c0 = hi1 ^ ctr[1] ^ k0, c2 = hi0 ^ ctr[3] ^ k1;
        ctr[0] = c0;
        ctr[1] = lo1;
        ctr[2] = c2;
        ctr[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// A uniform float in (0, 1) for token i of sampling step `step`.
PHILOX_FN float philox_uniform(uint32_t seed_lo, uint32_t seed_hi, uint32_t step, uint32_t i) {
    uint32_t c[4] = {i, step, 0x5a17u, 0};
    philox4x32_10(c, seed_lo, seed_hi);
    return ((float)(c[0] >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

#endif
