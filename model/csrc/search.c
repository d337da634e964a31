/* A beam search step's passes over the logits on CPU (model/native.py, used by model/search.py): the
 * log-softmax of each row written over it, and the best candidates of each sentence over all its beams'
 * tokens, each in one pass over the rows instead of PyTorch's several.
 *
 * The log-softmax computes its own bits, the same on every CPU and vector width (16 fixed lanes, fixed
 * reduction trees, no contraction, its own exp and log). The candidate ranking gives exactly
 * search.top_candidates's answer: the same float additions, and equal scores ranked by beam, then token.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi" /* 64-byte vectors only pass between inlined functions */

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));
#define LANES 16
#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE v16 load(const float *p, int64_t n, float fill) { /* n floats, `fill` after them */
    v16 x;
    for (int j = 0; j < LANES; j++) x[j] = fill;
    memcpy(&x, p, (size_t)(n < LANES ? n : LANES) * sizeof(float));
    return x;
}

ALWAYS_INLINE v16 select(i16 mask, v16 a, v16 b) { return (v16)((mask & (i16)a) | (~mask & (i16)b)); }

ALWAYS_INLINE v16 vmax(v16 a, v16 b) { return select(a > b, a, b); }

/* exp(x) lane by lane for x <= 0, as csrc/attention.c's: Cephes' expf polynomial, exp(-87) below -87. */
ALWAYS_INLINE v16 exp_nonpositive(v16 x) {
    x = vmax(x, (v16){0} - 87.0f);
    v16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
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

/* log(s) for s >= 1 in double: s = m 2^e with m in [1, 2), log m = 2 atanh((m - 1) / (m + 1)) by its series
 * (|z| <= 1/3: 20 terms reach double precision). Plain double arithmetic, so it is the same everywhere. */
static double log_at_least_one(double s) {
    int e;
    double m = frexp(s, &e) * 2.0; /* exact */
    e -= 1;
    double z = (m - 1.0) / (m + 1.0), z2 = z * z, term = z, sum = 0.0;
    for (int i = 1; i < 40; i += 2) {
        sum += term / i;
        term *= z2;
    }
    return 2.0 * sum + e * 0.69314718055994530942;
}

/* x (rows, cols) float32 with row stride ld: each row's log-softmax, x - max - log(sum(exp(x - max))),
 * written over it. The sum runs in 16 lanes (j, j + 16, ... in order), then a fixed tree; in float. */
#if defined(__x86_64__) && !defined(BEAMSERVE_ONE_TARGET)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void beamserve_log_softmax(float *x, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * ld;
        v16 mx = load(row, cols, -INFINITY);
        for (int64_t c = LANES; c < cols; c += LANES) mx = vmax(mx, load(row + c, cols - c, -INFINITY));
        float m = mx[0];
        for (int j = 1; j < LANES; j++) m = mx[j] > m ? mx[j] : m;
        v16 acc = {0};
        for (int64_t c = 0; c < cols; c += LANES) {
            v16 e = exp_nonpositive(load(row + c, cols - c, m) - m);
            if (cols - c < LANES) /* lanes past the row add nothing */
                for (int j = (int)(cols - c); j < LANES; j++) e[j] = 0.0f;
            acc += e;
        }
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int j = 0; j < w; j++) acc[j] += acc[j + w];
        float lse = (float)log_at_least_one((double)acc[0]); /* acc[0] >= 1: the maximum's own exp(0) */
        for (int64_t c = 0; c < cols; c++) row[c] = (row[c] - m) - lse;
    }
}

/* The n best of run[b, k] + lp[b, k, v] over every beam k and token v of each of `batch` sentences, best
 * first, equal scores by beam, then token, lower first (search.top_indices): scores (batch, n), beam and
 * token (batch, n) int64. lp (batch, K, V) contiguous, run (batch, K) contiguous; n <= K * V, n <= 64. */
#if defined(__x86_64__) && !defined(BEAMSERVE_ONE_TARGET)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void beamserve_top_candidates(const float *lp, const float *run, int64_t batch, int64_t K, int64_t V, int64_t n,
                              float *scores, int64_t *beam, int64_t *token) {
    for (int64_t b = 0; b < batch; b++) {
        float best[64];
        int64_t at[64];
        int64_t held = 0;
        for (int64_t k = 0; k < K; k++) {
            const float *row = lp + (b * K + k) * V;
            const float base = run[b * K + k];
            for (int64_t c = 0; c < V; c += LANES) {
                int64_t width = V - c < LANES ? V - c : LANES;
                if (held == n) { /* only lanes above the n-th best can enter */
                    v16 s = load(row + c, width, -INFINITY) + base;
                    i16 above = s > best[n - 1];
                    int any = 0;
                    for (int j = 0; j < LANES; j++) any |= above[j];
                    if (!any) continue;
                }
                for (int64_t j = 0; j < width; j++) {
                    float s = row[c + j] + base;
                    if (held == n && !(s > best[n - 1])) continue; /* not better: an equal one came first */
                    int64_t p = held < n ? held : n - 1;       /* the place it takes: after every score >= it */
                    while (p > 0 && best[p - 1] < s) {
                        best[p] = best[p - 1];
                        at[p] = at[p - 1];
                        p--;
                    }
                    best[p] = s;
                    at[p] = k * V + c + j;
                    if (held < n) held++;
                }
            }
        }
        for (int64_t i = 0; i < n; i++) {
            scores[b * n + i] = best[i];
            beam[b * n + i] = at[i] / V;
            token[b * n + i] = at[i] % V;
        }
    }
}
