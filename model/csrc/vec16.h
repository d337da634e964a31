/* 16 floats as one value, for the decode-step kernels (attention.c, search.c): GCC lowers it to one
 * AVX-512 register, two AVX2 ones or four SSE/NEON ones, the same arithmetic lane by lane whatever the
 * width, so code written over it gives the same bits on every CPU (compiled without contraction). */
#ifndef BEAMSERVE_VEC16_H
#define BEAMSERVE_VEC16_H

#include <stdint.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi" /* 64-byte vectors only pass between inlined functions */

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));
#define LANES 16
#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE v16 load16(const float *p) { /* one vector load */
    v16 x;
    memcpy(&x, p, sizeof x);
    return x;
}

ALWAYS_INLINE v16 load(const float *p, int64_t n, float fill) { /* n floats (none if n <= 0), `fill` after */
    v16 x;
    for (int j = 0; j < LANES; j++) x[j] = fill;
    if (n > 0) memcpy(&x, p, (size_t)(n < LANES ? n : LANES) * sizeof(float));
    return x;
}

ALWAYS_INLINE void store(float *p, v16 x, int64_t n) { /* the first n lanes (at most 16) */
    if (n > 0) memcpy(p, &x, (size_t)(n < LANES ? n : LANES) * sizeof(float));
}

ALWAYS_INLINE v16 select(i16 mask, v16 a, v16 b) { return (v16)((mask & (i16)a) | (~mask & (i16)b)); }

ALWAYS_INLINE v16 vmax(v16 a, v16 b) { return select(a > b, a, b); }

/* The 16 lanes added as a fixed tree: j and j + 8, then j + 4, j + 2, j + 1. */
ALWAYS_INLINE float lanes_sum(v16 x) {
    x = x + __builtin_shuffle(x, (i16){8, 9, 10, 11, 12, 13, 14, 15});
    x = x + __builtin_shuffle(x, (i16){4, 5, 6, 7});
    x = x + __builtin_shuffle(x, (i16){2, 3});
    return x[0] + x[1];
}

/* The largest of the 16 lanes (as vmax picks it, in the same tree). */
ALWAYS_INLINE float lanes_max(v16 x) {
    x = vmax(x, __builtin_shuffle(x, (i16){8, 9, 10, 11, 12, 13, 14, 15}));
    x = vmax(x, __builtin_shuffle(x, (i16){4, 5, 6, 7}));
    x = vmax(x, __builtin_shuffle(x, (i16){2, 3}));
    return x[0] > x[1] ? x[0] : x[1];
}

/* exp(x) lane by lane for x <= 0 (a score less its row's maximum), within 2 ulp: x = n ln2 + r with
 * |r| <= ln2 / 2, a degree-6 polynomial for exp(r) (Cephes' expf), times 2^n built in the exponent bits.
 * Below -87 it returns exp(-87), about 1.6e-38: such a weight adds nothing a float32 sum can hold. */
ALWAYS_INLINE v16 exp_nonpositive(v16 x) {
    x = vmax(x, (v16){0} - 87.0f);
    v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    v16 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v16 p = r * 0.0f + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    i16 e = (__builtin_convertvector(n, i16) + 127) << 23;
    return p * (v16)e;
}

#endif
