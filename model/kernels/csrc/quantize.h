/* One activation row quantised on its own scale, as model/kernels/quant.py's quantize_rows computes it: the
 * row's largest magnitude / 127, then round(x / scale), the same float division and round-half-to-even. Shared
 * by the row pass (int8_rows.c) and the VNNI linear layer (int8_vnni.c), which takes the bytes shifted by 128. */
#ifndef BEAMSERVE_QUANTIZE_H
#define BEAMSERVE_QUANTIZE_H

#include <math.h>
#include <stdint.h>
#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

#define QMAX 127.0f

static inline float scale_of(float absmax) { return (absmax < 1e-12f ? 1e-12f : absmax) / QMAX; }

/* x (cols,) -> q (cols,) and its scale; each byte of q XORed with `flip` (0x80: q + 128 as an unsigned byte). */
static inline void quantize_row(const float *x, int64_t cols, int8_t *q, float *scale, uint8_t flip) {
#if defined(__AVX512BW__)
    /* Compilers do not vectorise the largest-magnitude reduction or the rounding conversion on their own. */
    __m512 m = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + c)));
    float mx = _mm512_reduce_max_ps(m);
    for (; c < cols; c++) {
        float a = fabsf(x[c]);
        mx = a > mx ? a : mx;
    }
    const float s = scale_of(mx);
    *scale = s;
    const __m512 vs = _mm512_set1_ps(s);
    const __m128i vflip = _mm_set1_epi8((char)flip);
    for (c = 0; c + 16 <= cols; c += 16) {
        /* the default rounding mode: to nearest, ties to even, as rintf and torch.round */
        __m512i i = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_loadu_ps(x + c), vs));
        _mm_storeu_si128((__m128i *)(q + c), _mm_xor_si128(_mm512_cvtsepi32_epi8(i), vflip));
    }
#else
    float mx = 0.0f;
    for (int64_t c = 0; c < cols; c++) {
        float a = fabsf(x[c]);
        mx = a > mx ? a : mx;
    }
    const float s = scale_of(mx);
    *scale = s;
    int64_t c = 0;
#endif
    for (; c < cols; c++) q[c] = (int8_t)((uint8_t)(int8_t)(int32_t)rintf(x[c] / s) ^ flip);
}

#endif
