/* One activation row quantised on its own scale, as model/kernels/quant.py's quantize_rows computes it: the
 * row's largest magnitude / 127, then round(x / scale), the same float division and round-half-to-even. Shared
 * by the row pass (int8_rows.c) and the packed linear layers (int8_vnni.c, which takes the bytes shifted by 128, and
 * int8_avx2.c). */
#ifndef BEAMSERVE_QUANTIZE_H
#define BEAMSERVE_QUANTIZE_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define QMAX 127.0f

static inline float scale_of(float absmax) { return (absmax < 1e-12f ? 1e-12f : absmax) / QMAX; }

/* x (cols,) -> q (cols,) and its scale; each byte of q XORed with `flip` (0x80: q + 128 as an unsigned byte). */
static inline void quantize_row(const float *x, int64_t cols, int8_t *q, float *scale, uint8_t flip) {
    /* Compilers do not vectorise the largest-magnitude reduction or the rounding conversion on their own. */
    int64_t c = 0;
    float mx = 0.0f;
#if defined(__AVX512BW__)
    __m512 m = _mm512_setzero_ps();
    for (; c + 16 <= cols; c += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + c)));
    mx = _mm512_reduce_max_ps(m);
#elif defined(__AVX2__)
    __m256 m = _mm256_setzero_ps();
    for (; c + 8 <= cols; c += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + c)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    mx = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
#endif
    for (; c < cols; c++) {
        float a = fabsf(x[c]);
        mx = a > mx ? a : mx;
    }
    const float s = scale_of(mx);
    *scale = s;
    c = 0;
    /* the default rounding mode: to nearest, ties to even, as rintf and torch.round */
#if defined(__AVX512BW__)
    const __m512 vs = _mm512_set1_ps(s);
    for (; c + 16 <= cols; c += 16) {
        __m512i i = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(x + c), vs));
        _mm_storeu_si128((__m128i *)(q + c), _mm_xor_si128(_mm512_cvtsepi32_epi8(i), _mm_set1_epi8((char)flip)));
    }
#elif defined(__AVX2__)
    const __m256 vs = _mm256_set1_ps(s);
    for (; c + 8 <= cols; c += 8) {
        const __m256i i = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + c), vs));
        const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
        _mm_storel_epi64((__m128i *)(q + c), _mm_xor_si128(_mm_packs_epi16(w, w), _mm_set1_epi8((char)flip)));
    }
#endif
    for (; c < cols; c++) q[c] = (int8_t)((uint8_t)(int8_t)(int32_t)rintf(x[c] / s) ^ flip);
}

/* M rows of x (row stride ldx), each quantised by quantize_row into q a row every `width` bytes: its K bytes, then
 * zeros to width (the packed kernels' whole groups of 4 along K); each row's scale into scale. */
static inline void quantize_rows_padded(const float *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, int64_t width,
                                        float *scale, uint8_t flip) {
    for (int64_t r = 0; r < M; r++) {
        quantize_row(x + r * ldx, K, q + r * width, scale + r, flip);
        memset(q + r * width + K, 0, (size_t)(width - K));
    }
}

/* M rows of int8 x (row stride ldx) laid out in q as quantize_rows_padded lays them, each byte XORed with flip. */
static inline void copy_rows_padded(const int8_t *x, int64_t M, int64_t K, int64_t ldx, int8_t *q, int64_t width,
                                    uint8_t flip) {
    for (int64_t r = 0; r < M; r++) {
        for (int64_t k = 0; k < K; k++) q[r * width + k] = (int8_t)((uint8_t)x[r * ldx + k] ^ flip);
        memset(q + r * width + K, 0, (size_t)(width - K));
    }
}

#endif
