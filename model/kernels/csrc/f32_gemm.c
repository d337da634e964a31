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
#include "beamserve.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "vreg.h"

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
 * checks before it serves a shape (AVX2 with FMA: 8 lanes at a time, vreg.h's operations either way). Returns 0;
 * -1 where this build has no kernel. */
#if defined(WIDE)
static inline vf swish(vf v) {
    vf y = MINUS_ABS(v);
    const vcond tiny = BELOW(y, BITS(0xc2aeac50)); /* ln(FLT_MIN) */
    y = MAX(MIN(y, BITS(0x42b0c0a5)), BITS(0xc2aeac50));
    vf fx = FLOOR(ADD(MUL(y, BITS(0x3fb8aa3b)), SET1(0.5f))); /* log2(e) */
    const vf r = FNMA(fx, BITS(0x3f317218), y);                /* ln 2 */
    fx = SUB(fx, SET1(1.0f));
    const vf e2 = ZERO_WHERE(tiny, EXPONENT(INT_ADD(TO_INT(fx), INT_SET1(127))));
    vf p = FMA(BITS(0x3c07cfce), r, BITS(0x3d2b9d0d));
    p = FMA(p, r, BITS(0x3e2aad40));
    p = FMA(p, r, BITS(0x3efffee3));
    p = FMA(p, r, BITS(0x3f7ffffb));
    p = FMA(p, r, SET1(1.0f));
    const vf e = MUL(MUL(p, e2), SET1(2.0f));
    const vf l = DIV(e, ADD(e, SET1(1.0f)));
    return MUL(WHERE(SIGN_SET(v), SUB(SET1(1.0f), l), l), v); /* logistic: l where x < 0 */
}
#endif

int beamserve_f32_swish(float *x, int64_t n) {
#if defined(WIDE)
    int64_t i = 0;
    for (; i + WIDE <= n; i += WIDE) STOREU(x + i, swish(LOADU(x + i)));
    if (i < n) { /* the last lanes, zeros past n */
        float lanes[WIDE] = {0};
        memcpy(lanes, x + i, (size_t)(n - i) * sizeof(float));
        STOREU(lanes, swish(LOADU(lanes)));
        memcpy(x + i, lanes, (size_t)(n - i) * sizeof(float));
    }
    return 0;
#else
    (void)x, (void)n;
    return -1;
#endif
}
