// dtype.h - bf16 / f16 / fp8 (e4m3) / fp4 (e2m1) <-> fp32 conversions (host).
#ifndef VLLM_IO_DTYPE_H
#define VLLM_IO_DTYPE_H

#include <math.h>
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

// FP8 E4M3 (OCP "fn" variant, as torch.float8_e4m3fn): sign, 4-bit exponent
// of bias 7, 3-bit mantissa; no infinities, 0x7f / 0xff are NaN, max 448.
// Exponent 0 is subnormal: m/8 * 2^-6.
static inline float fp8e4m3_to_f32(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = (float)m * 0x1.0p-9f;
    else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return (b & 0x80) ? -v : v;
}

// Round to nearest even, saturating at +-448 (as torch's cast of a value
// clamped to the finite range first, which is what quantizers do); NaN -> 0x7f.
static inline uint8_t f32_to_fp8e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t s = (uint8_t)((u >> 24) & 0x80);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f;
    if (a >= 0x43e00000u) return s | 0x7e; // >= 448 (and inf): saturate
    if (a < 0x3c800000u) {                  // below 2^-6: subnormal codes, units of 2^-9
        float v;
        memcpy(&v, &a, 4);
        return (uint8_t)(s | (uint8_t)lrintf(v * 512.0f)); // 8 rounds up to code 8 = 2^-6, exact
    }
    // normal: keep 3 of the 23 mantissa bits, round to nearest even; a carry
    // into the exponent is right; rebias 127 -> 7
    uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1)) >> 20;
    r -= (127 - 7) << 3;
    if (r > 0x7e) r = 0x7e; // 464 and up rounded past 448
    return (uint8_t)(s | r);
}

// FP4 E2M1 (NVFP4's element): bit 3 the sign, magnitudes 0, 0.5, 1, 1.5, 2,
// 3, 4, 6 for codes 0..7.
static inline float e2m1_to_f32(uint8_t code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = mag[code & 7];
    return (code & 8) ? -v : v;
}

// Nearest code (ties to the even code), saturating at +-6.
static inline uint8_t f32_to_e2m1(float f) {
    float a = fabsf(f);
    uint8_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3 : a <= 2.5f ? 4 : a < 3.5f ? 5 : a <= 5.0f ? 6 : 7;
    return (uint8_t)((signbit(f) && c ? 8 : 0) | c);
}

#endif
