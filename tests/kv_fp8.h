// kv_fp8.h - what the fp8 KV cache tests share (CPU: tests/cpu/test_kv_fp8.c,
// CUDA: tests/cuda/test_cuda_kv_fp8.c): this file's own e4m3 decoder and
// encoder (independent of src/io/dtype.h's bit arithmetic: the nearest of
// every code by search), and rows of K / V values that reach every corner
// of the encoding.
#ifndef VLLM_TESTS_KV_FP8_H
#define VLLM_TESTS_KV_FP8_H

#include <math.h>
#include <stdint.h>

#include "op_util.h"

// The value of e4m3 code c (0x7f / 0xff NaN are never stored: the encoder saturates).
static inline float tk_val(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    double v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    return (float)((c & 0x80) ? -v : v);
}

// The code vLLM stores for x (an fp32 value already divided by its scale):
// the nearest finite e4m3 value, ties to the even code, saturating at +-448
// (infinities too), the sign kept (so -0 and negative underflows are 0x80).
static inline uint8_t tk_code(float x) {
    static double val[0x7f];
    if (val[1] == 0)
        for (int c = 0; c < 0x7f; c++) val[c] = tk_val((uint8_t)c);
    double a = fabs((double)x);
    uint8_t best = 0x7e;
    if (a < 448) {
        double bd = INFINITY;
        for (int c = 0; c <= 0x7e; c++) {
            double d = fabs(a - val[c]);
            if (d < bd || (d == bd && !(c & 1))) bd = d, best = (uint8_t)c;
        }
    }
    return (uint8_t)((signbit(x) ? 0x80 : 0) | best);
}

// n values: uniforms of magnitude `mag`, every 16th replaced by one of the
// encoding's corners (at scale 1: saturation at 448, past it and infinity,
// halfway between two codes in each binade and among the subnormals, an
// underflow to zero, negative zero).
static inline void tk_fill(float *x, size_t n, float mag) {
    static const float corner[] = {448.0f,    -460.0f,      1000.0f,   -INFINITY, 464.0f,    0.65625f,
                                   -0.71875f, -0.10546875f, 0x1.8p-9f, 0x1.4p-8f, 0x1.ep-7f, -0x1.0p-10f,
                                   1.0e-4f,   -0.0f,        3.0e-3f,   240.0f,    248.0f,    0x1.8p-8f};
    test_fill(x, n, mag);
    for (size_t i = 0; i < n; i += 16) x[i] = corner[(i / 16) % (sizeof corner / sizeof corner[0])];
}

#endif
