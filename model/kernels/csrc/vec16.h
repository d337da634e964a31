/* 16 floats as one value, for the decode-step kernels (attention.c, search.c), held in as many of the
 * build's vector registers as they take: one AVX-512 register, two AVX2 ones, four SSE/NEON ones. Every
 * operation is lane by lane, and the reductions pair lanes in one fixed tree, so code written over it
 * gives the same bits at every width (compiled without contraction).
 *
 * The library is built once per x86-64 level (setup.py), so the width is known here. A 64-byte vector
 * type of GCC's own would do on AVX-512 only: narrower targets keep it in memory and scalarise its
 * comparisons. */
#ifndef BEAMSERVE_VEC16_H
#define BEAMSERVE_VEC16_H

#include <stdint.h>
#include <string.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define WIDTH 16
#elif defined(__AVX__)
#define WIDTH 8
#else
#define WIDTH 4
#endif
#define LANES 16
#define PIECES (LANES / WIDTH)
#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef float vn __attribute__((vector_size(WIDTH * 4))); /* one register */
typedef int32_t vni __attribute__((vector_size(WIDTH * 4)));
typedef struct {
    vn p[PIECES]; /* lanes [i * WIDTH, (i + 1) * WIDTH) in p[i] */
} v16;

/* a > b ? a : b lane by lane (b where either is NaN or both are zeros): x86's maxps exactly. */
ALWAYS_INLINE vn max_n(vn a, vn b) {
#if defined(__AVX512F__)
    return (vn)_mm512_max_ps((__m512)a, (__m512)b);
#elif defined(__AVX__)
    return (vn)_mm256_max_ps((__m256)a, (__m256)b);
#elif defined(__SSE__)
    return (vn)_mm_max_ps((__m128)a, (__m128)b);
#else
    vni m = a > b;
    return (vn)((m & (vni)a) | (~m & (vni)b));
#endif
}

/* x's lanes permuted by constant indices, one per lane (GCC's and clang's builtins take them differently). */
#if defined(__clang__)
#define SHUFFLE(x, ...) __builtin_shufflevector(x, x, __VA_ARGS__)
#else
#define SHUFFLE(x, ...) __builtin_shuffle(x, (vni){__VA_ARGS__})
#endif

/* One register's lanes folded onto lane 0: lane j with lane j + WIDTH / 2, then j + WIDTH / 4, ... (the
 * lanes no later fold reads take lane 0). */
#if WIDTH == 16
#define FOLD(x, op)                                                                           \
    x = op(x, SHUFFLE(x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0));            \
    x = op(x, SHUFFLE(x, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));                   \
    x = op(x, SHUFFLE(x, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
#elif WIDTH == 8
#define FOLD(x, op)                                        \
    x = op(x, SHUFFLE(x, 4, 5, 6, 7, 0, 0, 0, 0));        \
    x = op(x, SHUFFLE(x, 2, 3, 0, 0, 0, 0, 0, 0))
#else
#define FOLD(x, op) x = op(x, SHUFFLE(x, 2, 3, 0, 0))
#endif

ALWAYS_INLINE vn add_n(vn a, vn b) { return a + b; }

ALWAYS_INLINE v16 splat(float s) {
    v16 x;
    for (int i = 0; i < PIECES; i++) x.p[i] = (vn){0} + s;
    return x;
}

#define LANEWISE(name, expr)                                \
    ALWAYS_INLINE v16 name(v16 a, v16 b) {                  \
        for (int i = 0; i < PIECES; i++) a.p[i] = (expr);   \
        return a;                                           \
    }
LANEWISE(vadd, a.p[i] + b.p[i])
LANEWISE(vsub, a.p[i] - b.p[i])
LANEWISE(vmul, a.p[i] * b.p[i])
LANEWISE(vmax, max_n(a.p[i], b.p[i]))

ALWAYS_INLINE v16 load16(const float *p) { /* 16 floats, a register at a time (a wider copy would be split */
    v16 x;                                     /* into narrower stores that the loads could not forward) */
    for (int i = 0; i < PIECES; i++) memcpy(&x.p[i], p + i * WIDTH, sizeof x.p[i]);
    return x;
}

ALWAYS_INLINE v16 load(const float *p, int64_t n, float fill) { /* n floats (none if n <= 0), `fill` after */
    if (n >= LANES) return load16(p);
    float f[LANES];
    for (int j = 0; j < LANES; j++) f[j] = j < n ? p[j] : fill;
    return load16(f);
}

ALWAYS_INLINE void store(float *p, v16 x, int64_t n) { /* the first n lanes (at most 16) */
    if (n >= LANES)
        for (int i = 0; i < PIECES; i++) memcpy(p + i * WIDTH, &x.p[i], sizeof x.p[i]);
    else if (n > 0)
        memcpy(p, &x, (size_t)n * sizeof(float));
}

/* The 16 lanes added as a fixed tree: j and j + 8, then j + 4, j + 2, j + 1. */
ALWAYS_INLINE float lanes_sum(v16 x) {
    for (int n = PIECES / 2; n >= 1; n /= 2)
        for (int i = 0; i < n; i++) x.p[i] = x.p[i] + x.p[i + n];
    vn y = x.p[0];
    FOLD(y, add_n);
    return y[0] + y[1];
}

/* The largest of the 16 lanes (as vmax picks it, in the same tree). */
ALWAYS_INLINE float lanes_max(v16 x) {
    for (int n = PIECES / 2; n >= 1; n /= 2)
        for (int i = 0; i < n; i++) x.p[i] = max_n(x.p[i], x.p[i + n]);
    vn y = x.p[0];
    FOLD(y, max_n);
    return y[0] > y[1] ? y[0] : y[1];
}

/* Whether any lane of x + b exceeds t (each sum rounded as float): as max over lanes of x, plus b, against t,
 * since rounding is monotonic, without the reduction. */
ALWAYS_INLINE int any_above(v16 x, float b, float t) {
    int any = 0;
    for (int i = 0; i < PIECES; i++) {
        vn s = x.p[i] + b;
#if defined(__AVX512F__)
        any |= _mm512_cmp_ps_mask((__m512)s, _mm512_set1_ps(t), _CMP_GT_OQ) != 0;
#elif defined(__AVX__)
        any |= _mm256_movemask_ps(_mm256_cmp_ps((__m256)s, _mm256_set1_ps(t), _CMP_GT_OQ));
#elif defined(__SSE__)
        any |= _mm_movemask_ps(_mm_cmpgt_ps((__m128)s, _mm_set1_ps(t)));
#else
        for (int j = 0; j < WIDTH; j++) any |= s[j] > t;
#endif
    }
    return any;
}

/* exp(x) lane by lane for x <= 0 (a score less its row's maximum), within 2 ulp: x = n ln2 + r with
 * |r| <= ln2 / 2, a degree-6 polynomial for exp(r) (Cephes' expf), times 2^n built in the exponent bits.
 * Below -87 it returns exp(-87), about 1.6e-38: such a weight adds nothing a float32 sum can hold. */
ALWAYS_INLINE vn exp_n(vn x) {
    x = max_n(x, (vn){0} - 87.0f);
    vn n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    vn r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vn p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vni e = (__builtin_convertvector(n, vni) + 127) << 23;
    return p * (vn)e;
}

ALWAYS_INLINE v16 exp_nonpositive(v16 x) {
    for (int i = 0; i < PIECES; i++) x.p[i] = exp_n(x.p[i]);
    return x;
}

#endif
