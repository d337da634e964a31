/* The per-row passes around an int8 GEMM (model/kernels/quant.py), each one pass over memory instead of PyTorch's
 * three to eight: quantising activation rows, and scaling the int32 product back with the bias.
 *
 * Loaded with ctypes (model/kernels/native.py), not imported: no Python API, plain pointers. Each function gives
 * the same bits as model/kernels/quant.py's PyTorch ops: the same float division and round-half-to-even, and the
 * scale-back's product and sum in the order and with the single rounding of ATen's vectorised addcmul
 * (a fused multiply-add). So a sentence's translation does not depend on whether this library is built.
 */
#include "beamserve.h"
#include <math.h>
#include <stdint.h>

#include "quantize.h"

/* Which kernels this build runs vectorised: bit 0 beamserve_quantize_rows (AVX2 or AVX-512), bit 1 beamserve_scale_back
 * (a vector fused multiply-add; without one, fmaf is a library call a lane). model/kernels/native.py leaves the
 * others to PyTorch's vectorised operators. */
int beamserve_vectorised(void) {
#if defined(__AVX2__)
    const int quantises = 1;
#else
    const int quantises = 0;
#endif
#if defined(__FMA__) || defined(__aarch64__)
    return quantises | 2;
#else
    return quantises;
#endif
}

/* The best x86-64 level this CPU runs (4, 3, 2 or 1; 0 elsewhere): which of the library's builds to load. */
int beamserve_cpu_level(void) {
#if defined(__x86_64__)
    /* Feature by feature: GCC before 12 and clang know no level names here. Each flag is set only where the
     * OS also saves the registers it needs. */
    __builtin_cpu_init();
    const int v2 = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("ssse3") &&
                   __builtin_cpu_supports("popcnt");
    const int v3 = v2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
    const int v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("avx512vl");
    return v4 ? 4 : v3 ? 3 : v2 ? 2 : 1;
#else
    return 0;
#endif
}

/* x (rows, cols) float32 with row stride ld -> q (rows, cols) int8 and scale (rows,): each row on its own
 * scale, its largest magnitude / 127, q = round(x / scale). */
void beamserve_quantize_rows(const float *x, int64_t rows, int64_t cols, int64_t ld, int8_t *q, float *scale) {
    quantize_rows_padded(x, rows, cols, ld, q, cols, scale, 0);
}

/* y = acc * col_scale * row_scale (+ bias): acc (rows, cols) int32, y (rows, cols) float32, which may be acc's
 * own memory (each element is read before it is written). */
void beamserve_scale_back(const int32_t *acc, int64_t rows, int64_t cols, const float *col_scale,
                          const float *row_scale, const float *bias, float *y) {
    for (int64_t r = 0; r < rows; r++) {
        const int32_t *a = acc + r * cols;
        float *yr = y + r * cols;
        float rs = row_scale[r];
        if (bias)
            for (int64_t c = 0; c < cols; c++) yr[c] = fmaf((float)a[c] * col_scale[c], rs, bias[c]);
        else
            for (int64_t c = 0; c < cols; c++) yr[c] = ((float)a[c] * col_scale[c]) * rs;
    }
}
