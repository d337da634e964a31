/* LayerNorm over rows as PyTorch's CPU kernel computes it in float32 (ATen's RowwiseMoments, moments_utils.h, then
 * (x - mean) * rstd * gamma + beta), for a decode step's sublayers in C (sublayers.c): the same bits where
 * PyTorch's kernel runs 8 float lanes with fused multiply-adds, as its AVX2 and AVX-512 builds do. native.py
 * compares it with torch.native_layer_norm when it loads and uses it only where every bit agrees.
 *
 * The moments: Welford's update per lane over chunks of 16 vectors of 8 floats, each chunk merged into a stack
 * of partial moments pairwise (a cascade, as a binary counter), the stack merged, then the leftover floats one
 * at a time and the 8 lanes merged into them in order. Every fused multiply-add below is one of ATen's (explicit
 * there, or contracted by its compiler); every other operation rounds on its own (the library is built without
 * contraction). */
#include "beamserve.h"
#include <math.h>
#include <stdint.h>

#define VEC 8    /* floats a vector of PyTorch's kernel holds */
#define CHUNK 16 /* vectors per chunk (kChunkSize) */
#define MOST_DEPTH 64

/* Partial moments (count m0, mean m1, sum of squared deviations m2 per lane) merged into (*m0, m1, m2). */
static void merge_lanes(int64_t m0_add, const float *m1_add, const float *m2_add, int64_t *m0, float *m1, float *m2) {
    const int64_t n = *m0 + m0_add;
    const float c = n == 0 ? 0.0f : (float)m0_add / (float)n;
    for (int l = 0; l < VEC; l++) {
        const float delta = m1_add[l] - m1[l];
        const float sum = m2[l] + m2_add[l];
        const float c_delta = c * delta;
        const float m0_delta = delta * (float)*m0;
        m1[l] = m1[l] + c_delta;
        m2[l] = fmaf(m0_delta, c_delta, sum);
    }
    *m0 = n;
}

/* Mean and (biased) variance of X[0, N). */
static void moments(const float *X, int64_t N, float *mean, float *var) {
    const int64_t n = N / VEC, chunks = (n + CHUNK - 1) / CHUNK;
    const int64_t depth = chunks <= 2 ? 1 : 64 - __builtin_clzll((uint64_t)(chunks - 1)); /* ceil(log2(chunks)) */
    int64_t m0s[MOST_DEPTH] = {0};
    float m1s[MOST_DEPTH][VEC] = {{0}}, m2s[MOST_DEPTH][VEC] = {{0}};
    float inverse[CHUNK];
    for (int j = 0; j < CHUNK; j++) inverse[j] = 1.0f / (float)(j + 1);
    for (int64_t i = 0; i < chunks; i++) {
        const float *x = X + i * CHUNK * VEC;
        const int64_t count = n - i * CHUNK < CHUNK ? n - i * CHUNK : CHUNK;
        float m1[VEC] = {0}, m2[VEC] = {0};
        for (int64_t j = 0; j < count; j++)
            for (int l = 0; l < VEC; l++) {
                const float v = x[j * VEC + l], delta = v - m1[l];
                m1[l] = fmaf(inverse[j], delta, m1[l]);
                m2[l] = fmaf(delta, v - m1[l], m2[l]);
            }
        merge_lanes(count, m1, m2, &m0s[0], m1s[0], m2s[0]);
        int64_t mask = i + 1;
        for (int64_t j = 1; j < depth && (mask & 1) == 0; j++, mask >>= 1) {
            merge_lanes(m0s[j - 1], m1s[j - 1], m2s[j - 1], &m0s[j], m1s[j], m2s[j]);
            m0s[j - 1] = 0;
            for (int l = 0; l < VEC; l++) m1s[j - 1][l] = m2s[j - 1][l] = 0.0f;
        }
    }
    for (int64_t i = 1; i < depth; i++) merge_lanes(m0s[i], m1s[i], m2s[i], &m0s[0], m1s[0], m2s[0]);
    int64_t m0 = 0;
    float m1 = 0.0f, m2 = 0.0f;
    for (int64_t i = n * VEC; i < N; i++) {
        const float v = X[i], delta = v - m1;
        ++m0;
        m1 += delta / (float)m0;
        m2 = m2 + delta * (v - m1);
    }
    for (int l = 0; l < VEC; l++) {
        const int64_t total = m0 + n;
        const float c = total == 0 ? 0.0f : (float)n / (float)total;
        const float delta = m1s[0][l] - m1;
        m1 = fmaf(c, delta, m1);
        m2 = m2 + fmaf(delta * delta * c, (float)m0, m2s[0][l]);
        m0 = total;
    }
    *mean = m1;
    *var = m2 / (float)N;
}

/* y (rows, N) = LayerNorm of x (rows, N) with weight gamma and bias beta (N,), both given; y may be x. */
void beamserve_layer_norm(const float *x, int64_t rows, int64_t N, const float *gamma, const float *beta, float eps,
                          float *y) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * N;
        float *yr = y + r * N;
        float mean, var;
        moments(xr, N, &mean, &var);
        const float rstd = 1.0f / sqrtf(var + eps), shift = -mean;
        for (int64_t j = 0; j < N; j++) yr[j] = fmaf((xr[j] + shift) * rstd, gamma[j], beta[j]);
    }
}
