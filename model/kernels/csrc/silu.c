/* SiLU in place with ATen's bits (torch.nn.functional.silu on CPU, float32): x / (1 + exp(-x)) lane by lane.
 * ATen's vectorised loop takes whole pairs of vectors (2 x 16 lanes with AVX-512, 2 x 8 with AVX2), with SLEEF's
 * expf of 1-ulp accuracy, and the lanes past the last pair one by one with the C library's expf; so does this
 * kernel, at the vector width of the level it is built for (level.h). The exponential, step by step as SLEEF
 * computes it: q = the integer nearest x log2(e); s = x - q ln2, with ln2 in a high and a low part, each a fused
 * multiply-add; a degree-5 polynomial u in s; 1 + (s^2 u + s), scaled by 2^q in two halves (no overflow of the
 * exponent field); 0 below -104, infinity above 100.
 *
 * A model computes with it only where it gives torch's bits on the process's own ATen, whose vector width
 * ATEN_CPU_CAPABILITY may set apart from this library's: model/kernels/native.py's silu_exactly compares the two
 * over values from every binade and a tail of each length, and torch's op serves where they differ. */
#include "level.h"
#include <math.h>
#include <stdint.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define LOG2E 1.442695040888963407359924681001892137426645954152985934135449406931f
#define LN2_HI 0.693145751953125f
#define LN2_LO 1.428606765330187045e-06f
#define P5 0.000198527617612853646278381f
#define P4 0.00139304355252534151077271f
#define P3 0.00833336077630519866943359f
#define P2 0.0416664853692054748535156f
#define P1 0.166666671633720397949219f
#define P0 0.5f

#if defined(__AVX512F__)
#define PAIR 32
static inline __m512 pow2i(__m512i q) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(q, _mm512_set1_epi32(0x7f)), 23)); }
static inline __m512 sleef_exp(__m512 d) {
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(d, _mm512_set1_ps(LOG2E)));
    const __m512 qf = _mm512_cvtepi32_ps(q);
    __m512 s = _mm512_fmadd_ps(qf, _mm512_set1_ps(-LN2_HI), d);
    s = _mm512_fmadd_ps(qf, _mm512_set1_ps(-LN2_LO), s);
    __m512 u = _mm512_set1_ps(P5);
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(P4));
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(P3));
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(P2));
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(P1));
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(P0));
    u = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_mul_ps(s, s), u, s));
    const __m512i half = _mm512_srai_epi32(q, 1);
    u = _mm512_mul_ps(_mm512_mul_ps(u, pow2i(half)), pow2i(_mm512_sub_epi32(q, half)));
    u = _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(d, _mm512_set1_ps(-104.0f), _CMP_LT_OQ), u);
    return _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(_mm512_set1_ps(100.0f), d, _CMP_LT_OQ), _mm512_set1_ps(INFINITY));
}
static inline void silu_vectors(float *x) {
    for (int i = 0; i < PAIR; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 e = sleef_exp(_mm512_xor_ps(v, _mm512_set1_ps(-0.0f)));
        _mm512_storeu_ps(x + i, _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
#define PAIR 16
static inline __m256 pow2i(__m256i q) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(q, _mm256_set1_epi32(0x7f)), 23)); }
static inline __m256 sleef_exp(__m256 d) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(d, _mm256_set1_ps(LOG2E)));
    const __m256 qf = _mm256_cvtepi32_ps(q);
    __m256 s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-LN2_HI), d);
    s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-LN2_LO), s);
    __m256 u = _mm256_set1_ps(P5);
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(P4));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(P3));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(P2));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(P1));
    u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(P0));
    u = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_mul_ps(s, s), u, s));
    const __m256i half = _mm256_srai_epi32(q, 1);
    u = _mm256_mul_ps(_mm256_mul_ps(u, pow2i(half)), pow2i(_mm256_sub_epi32(q, half)));
    u = _mm256_andnot_ps(_mm256_cmp_ps(d, _mm256_set1_ps(-104.0f), _CMP_LT_OQ), u);
    return _mm256_blendv_ps(u, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(_mm256_set1_ps(100.0f), d, _CMP_LT_OQ));
}
static inline void silu_vectors(float *x) {
    for (int i = 0; i < PAIR; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 e = sleef_exp(_mm256_xor_ps(v, _mm256_set1_ps(-0.0f)));
        _mm256_storeu_ps(x + i, _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
}
#else
#define PAIR 0 /* ATen's generic vectors call the C library's expf lane by lane */
#endif

/* x (n floats) replaced by silu(x), as torch.nn.functional.silu(x, inplace=True) on a contiguous tensor with one
 * intra-op thread (one range). */
void beamserve_silu(float *x, int64_t n) {
    int64_t i = 0;
#if PAIR
    for (; i + PAIR <= n; i += PAIR) silu_vectors(x + i);
#endif
    for (; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}
