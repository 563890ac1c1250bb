// dtype.h - bf16 / f16 <-> fp32 conversions (host).
#ifndef VLLM_IO_DTYPE_H
#define VLLM_IO_DTYPE_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even; NaN stays NaN.
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) u = s;
        else { // subnormal: normalize
            e = 127 - 15 + 1;
            while (!(m & 0x400)) m <<= 1, e--;
            u = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 127 - 15) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even; overflow goes to inf, NaN stays NaN.
static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00);        // NaN
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00);       // rounds past 65504: inf
    if (a < 0x38800000u) {                                      // subnormal or zero in f16
        if (a <= 0x33000000u) return (uint16_t)s;               // half the smallest subnormal or less
        uint32_t m = (a & 0x7fffff) | 0x800000, e = a >> 23;    // 2^(e-127) * m / 2^23
        int sh = 126 - (int)e;                                  // m >> sh: units of 2^-24
        uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(s | q);
    }
    uint32_t r = a + 0xfff + ((a >> 13) & 1) - (112u << 23);   // rebias 127 -> 15, round
    return (uint16_t)(s | (r >> 13));
}

#endif
