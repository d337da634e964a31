/* Attention of a decode step on CPU: each hypothesis row's one query against its cached keys and values,
 * every head, in one pass over them (model/native.py, used by model/transformer.py's decoder steps).
 *
 * In PyTorch's ops a step's attention is two batched matmuls around five softmax passes, and the query
 * matrix carries a zero row (layers.step_attention keeps its shapes canonical); here the keys and values
 * are read once, from wherever each position lives: `rows` names the cache row that holds position t of
 * hypothesis n, so a beam search need not copy a parent's cache into its children's rows (KVCache's
 * lineage) and cross-attention reads its sentence's keys from every beam.
 *
 * Every row is computed on its own, over its own length, in a fixed order: dot products in 16 partial
 * sums reduced as a fixed tree, the softmax sum in double in position order, the weighted values summed
 * in position order. Compiled without contraction (-ffp-contract=off) and with no reassociation, the
 * bits do not depend on the batch, on the vector width the compiler picks, or on the CPU.
 */
#include <stdint.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wpsabi" /* 64-byte vectors only pass between inlined functions */

/* 16 floats as one value: GCC lowers it to one AVX-512 register, two AVX2 ones or four SSE/NEON ones, the
 * same arithmetic lane by lane whatever the width. */
typedef float v16 __attribute__((vector_size(64)));
#define LANES 16
#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE v16 load(const float *p, int64_t n) { /* n <= 16 floats, zeros after them */
    v16 x = {0};
    memcpy(&x, p, (size_t)(n < LANES ? n : LANES) * sizeof(float));
    return x;
}

ALWAYS_INLINE void store(float *p, v16 x, int64_t n) { memcpy(p, &x, (size_t)(n < LANES ? n : LANES) * sizeof(float)); }

/* Lane j sums a[d] b[d] for d = j, j + 16, ... in order; the 16 lanes are then added as a fixed tree
 * (j and j + 8, then j + 4, j + 2, j + 1). */
ALWAYS_INLINE float dot(const v16 *q, const float *k, int64_t chunks, int64_t D) {
    v16 acc = {0};
    for (int64_t c = 0; c < chunks; c++) acc += q[c] * load(k + c * LANES, D - c * LANES);
    v16 t = acc + __builtin_shuffle(acc, (__attribute__((vector_size(64))) int32_t){8, 9, 10, 11, 12, 13, 14, 15});
    t = t + __builtin_shuffle(t, (__attribute__((vector_size(64))) int32_t){4, 5, 6, 7});
    t = t + __builtin_shuffle(t, (__attribute__((vector_size(64))) int32_t){2, 3});
    return t[0] + t[1];
}
/* exp(x) for x <= 0 (a score less the row's maximum), within 2 ulp: x = n ln2 + r, |r| <= ln2 / 2, a degree-6
 * polynomial for exp(r) (Cephes' expf), times 2^n built in the exponent bits. Below -87 it returns exp(-87)
 * (about 1.6e-38): such a weight adds nothing a float32 sum can hold. Plain arithmetic, so it vectorises. */
ALWAYS_INLINE float exp_nonpositive(float x) {
    x = x > -87.0f ? x : -87.0f;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } two_n;
    two_n.i = ((int32_t)n + 127) << 23;
    return p * two_n.f;
}

/* One head of one row: `chunks` 16-float pieces of the head's D floats (CHUNKS when the compiler knows it). */
ALWAYS_INLINE void attend_head(const float *q, const float *k, const float *v, int64_t D, int64_t chunks, int64_t len,
                               const int64_t *rows, int64_t ts, int64_t row0, int64_t sN, int64_t sT, float scale,
                               float *s, float *out) {
    v16 qc[16];
    for (int64_t c = 0; c < chunks; c++) qc[c] = load(q + c * LANES, D - c * LANES);
    for (int64_t t = 0; t < len; t++) {
        int64_t row = rows ? rows[t * ts] : row0;
        s[t] = dot(qc, k + row * sN + t * sT, chunks, D) * scale;
    }
    float m = s[0];
    for (int64_t t = 1; t < len; t++) m = s[t] > m ? s[t] : m;
    for (int64_t t = 0; t < len; t++) s[t] = exp_nonpositive(s[t] - m);
    double sum = 0.0;
    for (int64_t t = 0; t < len; t++) sum += s[t];
    float total = (float)sum;
    for (int64_t t = 0; t < len; t++) s[t] = s[t] / total;
    v16 acc[16] = {{0}};
    for (int64_t t = 0; t < len; t++) {
        int64_t row = rows ? rows[t * ts] : row0;
        const float *vp = v + row * sN + t * sT;
        v16 w = {0};
        w += s[t];
        for (int64_t c = 0; c < chunks; c++) acc[c] += w * load(vp + c * LANES, D - c * LANES);
    }
    for (int64_t c = 0; c < chunks; c++) store(out + c * LANES, acc[c], D - c * LANES);
}

/* q (N, H, D) float32 contiguous; k and v float32 with element strides sN (row), sH (head), sT (position) and
 * unit stride over D; out (N, H, D) contiguous. Row n attends over positions [0, len) with len = lengths[n],
 * or `length` for every row when lengths is NULL (rows with no positions get zeros). Position t of row n
 * is read from cache row rows[n * rs + t * ts], or from row n when rows is NULL. scratch: max len floats. */
#if defined(__x86_64__) && !defined(BEAMSERVE_ONE_TARGET) /* one build for the compiler's -march (tests) */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void beamserve_attend(const float *q, const float *k, const float *v, int64_t N, int64_t H, int64_t D, int64_t sN,
                      int64_t sH, int64_t sT, const int64_t *lengths, int64_t length, const int64_t *rows, int64_t rs,
                      int64_t ts, float scale, float *scratch, float *out) {
    for (int64_t n = 0; n < N; n++) {
        int64_t len = lengths ? lengths[n] : length;
        const int64_t *r = rows ? rows + n * rs : 0;
        for (int64_t h = 0; h < H; h++) {
            float *o = out + (n * H + h) * D;
            if (len <= 0) {
                for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
                continue;
            }
            const float *qh = q + (n * H + h) * D, *kh = k + h * sH, *vh = v + h * sH;
            if (D == 64) /* the common head size, its loops unrolled */
                attend_head(qh, kh, vh, 64, 4, len, r, ts, n, sN, sT, scale, scratch, o);
            else
                attend_head(qh, kh, vh, D, (D + LANES - 1) / LANES, len, r, ts, n, sN, sT, scale, scratch, o);
        }
    }
}
