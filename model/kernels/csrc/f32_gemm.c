/* A float32 linear layer for a decode step's few rows, summing as oneDNN's packed matmul does (model/kernels/gemm.py):
 * each output is its products added in order of k with one rounding each (fused multiply-adds), from zero,
 * within blocks of K, the blocks' sums added in order, then the bias, then the residual. oneDNN's blocks depend
 * on the instructions it runs: with AVX-512 all of K up to 512, then blocks of 512 up to 1,024, then of 1,024;
 * with AVX2 all of K up to 1,024, then blocks of 1,024. Each build sums as oneDNN does on a CPU of its level, at
 * every row count; model/kernels/f32_gemm.py checks it against oneDNN for each weight shape and thread count
 * before the kernel is used, and keeps oneDNN where they differ (as where oneDNN is held to another level). oneDNN's call costs 40-50 us before any
 * arithmetic, most of a step's GEMM at batch 1; this one a few.
 *
 * The weight is packed once: panels of 16 columns, each K rows of 16 floats, so one load feeds one FMA for
 * 16 outputs (AVX2 with FMA: two loads, two FMAs of 8). Within a block each output's sum is the same sequence of
 * fused multiply-adds whatever the vector width, so both builds give the same bits wherever their blocks agree (K
 * up to 512 and past 1,024); builds without AVX2 and FMA report no kernel (-1) and oneDNN serves. */
#include "level.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#define PANEL 16
#define MR 6 /* rows a tile: 6 x 4 accumulators, 4 weight vectors and a broadcast in AVX-512's 32 registers */
#define NP 4

static int64_t panels(int64_t N) { return (N + PANEL - 1) / PANEL; }

/* K's blocks: each output's products summed in order within a block from zero, the blocks' sums added in order. */
int64_t beamserve_f32_block(int64_t K) {
#if defined(__AVX512F__)
    return K <= 512 ? K : K <= 1024 ? 512 : 1024;
#else
    return K <= 1024 ? K : 1024;
#endif
}

int64_t beamserve_f32_packed_floats(int64_t N, int64_t K) { return panels(N) * K * PANEL; }

/* w (N, K) contiguous -> packed: panel p holds K rows of its 16 columns (zeros past N). */
void beamserve_f32_pack(const float *w, int64_t N, int64_t K, float *packed) {
    memset(packed, 0, (size_t)beamserve_f32_packed_floats(N, K) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) packed[((n / PANEL) * K + k) * PANEL + n % PANEL] = w[n * K + k];
}

/* Whether this build has the kernel. */
int beamserve_f32_gemm(void) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    return 1;
#else
    return 0;
#endif
}

#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void tile(const float *x, int64_t ldx, int64_t k0, int64_t k1, const float *w,
                                                      int64_t K, int rows, int np, __m512 acc[MR][NP]) {
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < np; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; k++) {
        __m512 b[NP];
        for (int p = 0; p < np; p++) b[p] = _mm512_loadu_ps(w + (p * K + k) * PANEL);
        for (int r = 0; r < rows; r++) {
            const __m512 a = _mm512_set1_ps(x[r * ldx + k]);
            for (int p = 0; p < np; p++) acc[r][p] = _mm512_fmadd_ps(a, b[p], acc[r][p]);
        }
    }
}

/* y (M, N) with row stride ldy = x (M, K; row stride ldx) @ w^T, plus bias (N,) where given, plus res (M, N; row
 * stride ldr) where given: w as beamserve_f32_pack packed it. Returns 0; -1 where this build has no kernel. */
int beamserve_f32_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed, int64_t N,
                         const float *bias, const float *res, int64_t ldr, float *y, int64_t ldy) {
    const int64_t P = panels(N), kb = beamserve_f32_block(K);
    for (int64_t p0 = 0; p0 < P; p0 += NP) {
        const int np = P - p0 < NP ? (int)(P - p0) : NP;
        const float *w = packed + p0 * K * PANEL;
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int rows = M - m0 < MR ? (int)(M - m0) : MR;
            __m512 sum[MR][NP], acc[MR][NP];
            for (int64_t k0 = 0; k0 < K; k0 += kb) {
                const int64_t k1 = k0 + kb < K ? k0 + kb : K;
                const float *xr = x + m0 * ldx;
                if (np < NP) tile(xr, ldx, k0, k1, w, K, rows, np, acc);
                else if (rows == 6) tile(xr, ldx, k0, k1, w, K, 6, NP, acc);
                else if (rows == 5) tile(xr, ldx, k0, k1, w, K, 5, NP, acc);
                else if (rows == 4) tile(xr, ldx, k0, k1, w, K, 4, NP, acc);
                else if (rows == 3) tile(xr, ldx, k0, k1, w, K, 3, NP, acc);
                else if (rows == 2) tile(xr, ldx, k0, k1, w, K, 2, NP, acc);
                else tile(xr, ldx, k0, k1, w, K, 1, NP, acc);
                for (int r = 0; r < rows; r++)
                    for (int p = 0; p < np; p++) sum[r][p] = k0 ? _mm512_add_ps(sum[r][p], acc[r][p]) : acc[r][p];
            }
            for (int p = 0; p < np; p++) {
                const int64_t n = (p0 + p) * PANEL;
                const __mmask16 m = N - n >= PANEL ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n)) - 1);
                const __m512 bs = bias ? _mm512_maskz_loadu_ps(m, bias + n) : _mm512_setzero_ps();
                for (int r = 0; r < rows; r++) {
                    __m512 v = bias ? _mm512_add_ps(sum[r][p], bs) : sum[r][p];
                    if (res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, res + (m0 + r) * ldr + n));
                    _mm512_mask_storeu_ps(y + (m0 + r) * ldy + n, m, v);
                }
            }
        }
    }
    return 0;
}
#elif defined(__AVX2__) && defined(__FMA__)
/* A panel's 16 columns as two vectors of 8, MR rows a tile: 12 accumulators, 2 weight vectors and a broadcast in
 * AVX2's 16 registers. */
static inline __attribute__((always_inline)) void tile(const float *x, int64_t ldx, int64_t k0, int64_t k1, const float *w,
                                                      int rows, __m256 acc[MR][2]) {
    __m256 c[MR][2]; /* the sums in a local array, which the compiler keeps in registers (acc[] it stores each k) */
    for (int r = 0; r < rows; r++) c[r][0] = c[r][1] = _mm256_setzero_ps();
    for (int64_t k = k0; k < k1; k++) {
        const __m256 b0 = _mm256_loadu_ps(w + k * PANEL), b1 = _mm256_loadu_ps(w + k * PANEL + 8);
        for (int r = 0; r < rows; r++) {
            const __m256 a = _mm256_broadcast_ss(x + r * ldx + k);
            c[r][0] = _mm256_fmadd_ps(a, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(a, b1, c[r][1]);
        }
    }
    for (int r = 0; r < rows; r++) acc[r][0] = c[r][0], acc[r][1] = c[r][1];
}

int beamserve_f32_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed, int64_t N,
                         const float *bias, const float *res, int64_t ldr, float *y, int64_t ldy) {
    const int64_t P = panels(N), kb = beamserve_f32_block(K);
    for (int64_t p = 0; p < P; p++) {
        const float *w = packed + p * K * PANEL;
        const int64_t n = p * PANEL, cols = N - n < PANEL ? N - n : PANEL;
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int rows = M - m0 < MR ? (int)(M - m0) : MR;
            __m256 sum[MR][2], acc[MR][2];
            for (int64_t k0 = 0; k0 < K; k0 += kb) {
                const int64_t k1 = k0 + kb < K ? k0 + kb : K;
                const float *xr = x + m0 * ldx;
                if (rows == 6) tile(xr, ldx, k0, k1, w, 6, acc);
                else if (rows == 5) tile(xr, ldx, k0, k1, w, 5, acc);
                else if (rows == 4) tile(xr, ldx, k0, k1, w, 4, acc);
                else if (rows == 3) tile(xr, ldx, k0, k1, w, 3, acc);
                else if (rows == 2) tile(xr, ldx, k0, k1, w, 2, acc);
                else tile(xr, ldx, k0, k1, w, 1, acc);
                for (int r = 0; r < rows; r++)
                    for (int h = 0; h < 2; h++) sum[r][h] = k0 ? _mm256_add_ps(sum[r][h], acc[r][h]) : acc[r][h];
            }
            for (int h = 0; h < 2 && 8 * h < cols; h++) { /* the bias, then the residual: a rounding each */
                const int64_t c = n + 8 * h;
                const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(cols - 8 * h)),
                                                     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                const __m256 bs = bias ? _mm256_maskload_ps(bias + c, m) : _mm256_setzero_ps();
                for (int r = 0; r < rows; r++) {
                    __m256 v = bias ? _mm256_add_ps(sum[r][h], bs) : sum[r][h];
                    if (res) v = _mm256_add_ps(v, _mm256_maskload_ps(res + (m0 + r) * ldr + c, m));
                    _mm256_maskstore_ps(y + (m0 + r) * ldy + c, m, v);
                }
            }
        }
    }
    return 0;
}
#else
int beamserve_f32_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed, int64_t N,
                         const float *bias, const float *res, int64_t ldr, float *y, int64_t ldy) {
    (void)x, (void)M, (void)K, (void)ldx, (void)packed, (void)N, (void)bias, (void)res, (void)ldr, (void)y, (void)ldy;
    return -1;
}
#endif

/* x (n floats) replaced by swish(x) = x * logistic(x) as oneDNN's swish post-op computes it in the epilogue of its
 * matmul (its JIT eltwise injector, alpha 1), 16 lanes at a time: logistic of -|x| as e / (e + 1), e = exp(-|x|),
 * and 1 - that for positive x; exp(y) as 2 * 2^(n - 1) * p(r) with n = floor(y log2(e) + 1/2), r = y - n ln2 (one
 * fused multiply-add), p a degree-5 polynomial evaluated by fused multiply-adds, 0 below ln(FLT_MIN). With the C
 * GEMM's sums (beamserve_f32_linear) it gives oneDNN's fused linear-and-swish, which model/kernels/f32_gemm.py
 * checks before it serves a shape (AVX2 with FMA: 8 lanes at a time). Returns 0; -1 where this build has no
 * kernel. */
int beamserve_f32_swish(float *x, int64_t n) {
#if defined(__AVX512F__)
    const __m512 ln_min = _mm512_castsi512_ps(_mm512_set1_epi32(0xc2aeac50)), ln_max = _mm512_castsi512_ps(_mm512_set1_epi32(0x42b0c0a5));
    const __m512 log2e = _mm512_castsi512_ps(_mm512_set1_epi32(0x3fb8aa3b)), ln2 = _mm512_castsi512_ps(_mm512_set1_epi32(0x3f317218));
    const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f), two = _mm512_set1_ps(2.0f);
    const __m512 p1 = _mm512_castsi512_ps(_mm512_set1_epi32(0x3f7ffffb)), p2 = _mm512_castsi512_ps(_mm512_set1_epi32(0x3efffee3));
    const __m512 p3 = _mm512_castsi512_ps(_mm512_set1_epi32(0x3e2aad40)), p4 = _mm512_castsi512_ps(_mm512_set1_epi32(0x3d2b9d0d));
    const __m512 p5 = _mm512_castsi512_ps(_mm512_set1_epi32(0x3c07cfce));
    const __m512i sign = _mm512_set1_epi32((int)0x80000000);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        const __mmask16 negative = _mm512_test_epi32_mask(_mm512_castps_si512(v), sign);
        __m512 y = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign)); /* -|x| */
        const __mmask16 tiny = _mm512_cmp_ps_mask(y, ln_min, _CMP_LT_OS);
        y = _mm512_max_ps(_mm512_min_ps(y, ln_max), ln_min);
        __m512 fx = _mm512_floor_ps(_mm512_add_ps(_mm512_mul_ps(y, log2e), half));
        const __m512 r = _mm512_fnmadd_ps(fx, ln2, y);
        fx = _mm512_sub_ps(fx, one);
        __m512i e2 = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
        e2 = _mm512_maskz_mov_epi32((__mmask16)~tiny, e2);
        __m512 p = _mm512_fmadd_ps(p5, r, p4);
        p = _mm512_fmadd_ps(p, r, p3);
        p = _mm512_fmadd_ps(p, r, p2);
        p = _mm512_fmadd_ps(p, r, p1);
        p = _mm512_fmadd_ps(p, r, one);
        const __m512 e = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_castsi512_ps(e2)), two);
        const __m512 l = _mm512_div_ps(e, _mm512_add_ps(e, one));
        const __m512 logistic = _mm512_mask_blend_ps(negative, _mm512_sub_ps(one, l), l);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(logistic, v));
    }
    return 0;
#elif defined(__AVX2__) && defined(__FMA__)
    /* The same steps 8 lanes at a time, masks as blends (oneDNN's AVX2 injector computes it so). */
    const __m256 ln_min = _mm256_castsi256_ps(_mm256_set1_epi32((int)0xc2aeac50)), ln_max = _mm256_castsi256_ps(_mm256_set1_epi32(0x42b0c0a5));
    const __m256 log2e = _mm256_castsi256_ps(_mm256_set1_epi32(0x3fb8aa3b)), ln2 = _mm256_castsi256_ps(_mm256_set1_epi32(0x3f317218));
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f), two = _mm256_set1_ps(2.0f);
    const __m256 p1 = _mm256_castsi256_ps(_mm256_set1_epi32(0x3f7ffffb)), p2 = _mm256_castsi256_ps(_mm256_set1_epi32(0x3efffee3));
    const __m256 p3 = _mm256_castsi256_ps(_mm256_set1_epi32(0x3e2aad40)), p4 = _mm256_castsi256_ps(_mm256_set1_epi32(0x3d2b9d0d));
    const __m256 p5 = _mm256_castsi256_ps(_mm256_set1_epi32(0x3c07cfce));
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000));
    for (int64_t i = 0; i < n; i += 8) {
        float lanes[8] = {0};
        const int64_t count = n - i < 8 ? n - i : 8;
        memcpy(lanes, x + i, (size_t)count * sizeof(float));
        const __m256 v = _mm256_loadu_ps(lanes);
        __m256 y = _mm256_or_ps(v, sign); /* -|x| */
        const __m256 tiny = _mm256_cmp_ps(y, ln_min, _CMP_LT_OS);
        y = _mm256_max_ps(_mm256_min_ps(y, ln_max), ln_min);
        __m256 fx = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(y, log2e), half));
        const __m256 r = _mm256_fnmadd_ps(fx, ln2, y);
        fx = _mm256_sub_ps(fx, one);
        __m256i e2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
        e2 = _mm256_andnot_si256(_mm256_castps_si256(tiny), e2);
        __m256 p = _mm256_fmadd_ps(p5, r, p4);
        p = _mm256_fmadd_ps(p, r, p3);
        p = _mm256_fmadd_ps(p, r, p2);
        p = _mm256_fmadd_ps(p, r, p1);
        p = _mm256_fmadd_ps(p, r, one);
        const __m256 e = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e2)), two);
        const __m256 l = _mm256_div_ps(e, _mm256_add_ps(e, one));
        const __m256 logistic = _mm256_blendv_ps(_mm256_sub_ps(one, l), l, v); /* l where x's sign bit is set */
        _mm256_storeu_ps(lanes, _mm256_mul_ps(logistic, v));
        memcpy(x + i, lanes, (size_t)count * sizeof(float));
    }
    return 0;
#else
    (void)x, (void)n;
    return -1;
#endif
}
