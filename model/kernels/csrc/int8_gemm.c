/* An exact int8 GEMM for CPUs where neither oneDNN's int8 matmul nor torch._int_mm serves: x86 CPUs without
 * VNNI or AMX (AMD's Zen 2 and 3, Intel's before Cascade Lake), where oneDNN multiplies with AVX2's
 * vpmaddubsw, whose 16-bit pair sums saturate, and torch._int_mm runs a loop 30x slower than a float32
 * GEMM of the same shape.
 *
 * Each int8 is widened to 16 bits and pairs of products summed into 32 bits (vpmaddwd): no product or
 * pair sum can saturate (2 x 127 x 127 < 2^31), and a row's sum of K products stays below 2^31 for any
 * K under 133,000, so the result is the exact integer product, in any order, batch and build. */
#include "beamserve.h"
#include <stdint.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* Weight rows per block: 4 rows of K = 2048 (8 KB) stay in L1 while every activation row passes them. */
#define NB 4

static inline int32_t dot(const int8_t *a, const int8_t *b, int64_t K) {
    int32_t s = 0;
    for (int64_t k = 0; k < K; k++) s += (int32_t)a[k] * (int32_t)b[k];
    return s;
}

#if defined(__AVX2__)
static inline __m256i widen(const int8_t *p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p)); }

static inline int32_t total(__m256i s) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}

/* Two activation rows against four weight rows: 8 sums held in registers, each load used 2 or 4 times. */
static void block_2x4(const int8_t *x0, const int8_t *x1, const int8_t *w, int64_t K, int32_t *y0, int32_t *y1) {
    __m256i s[2][NB];
    for (int j = 0; j < NB; j++) s[0][j] = s[1][j] = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m256i a0 = widen(x0 + k), a1 = widen(x1 + k);
        for (int j = 0; j < NB; j++) {
            const __m256i b = widen(w + j * K + k);
            s[0][j] = _mm256_add_epi32(s[0][j], _mm256_madd_epi16(a0, b));
            s[1][j] = _mm256_add_epi32(s[1][j], _mm256_madd_epi16(a1, b));
        }
    }
    for (int j = 0; j < NB; j++) {
        y0[j] = total(s[0][j]) + dot(x0 + k, w + j * K + k, K - k);
        y1[j] = total(s[1][j]) + dot(x1 + k, w + j * K + k, K - k);
    }
}

static int32_t dot_avx2(const int8_t *a, const int8_t *b, int64_t K) {
    __m256i s = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) s = _mm256_add_epi32(s, _mm256_madd_epi16(widen(a + k), widen(b + k)));
    return total(s) + dot(a + k, b + k, K - k);
}
#define DOT dot_avx2
#else
#define DOT dot
#endif

/* x (M, K) int8 with row stride ldx, w (N, K) int8 contiguous -> y (M, N) int32 contiguous: x @ w^T. */
void beamserve_int8_gemm(const int8_t *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, int64_t N,
                         int32_t *y) {
    for (int64_t n0 = 0; n0 < N; n0 += NB) {
        const int64_t nb = N - n0 < NB ? N - n0 : NB;
        int64_t m = 0;
#if defined(__AVX2__)
        if (nb == NB)
            for (; m + 2 <= M; m += 2)
                block_2x4(x + m * ldx, x + (m + 1) * ldx, w + n0 * K, K, y + m * N + n0, y + (m + 1) * N + n0);
#endif
        for (; m < M; m++)
            for (int64_t n = n0; n < n0 + nb; n++) y[m * N + n] = DOT(x + m * ldx, w + n * K, K);
    }
}
