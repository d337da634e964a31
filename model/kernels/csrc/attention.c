/* Attention of a decode step on CPU: each hypothesis row's one query against its cached keys and values,
 * every head, in one pass over them (model/kernels/native.py, used by model/nn/transformer.py's decoder steps).
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
#include "beamserve.h"
#include <stdlib.h>
#include <string.h>

#include "vec16.h"

/* Lane j sums a[d] b[d] for d = j, j + 16, ... in order; the 16 lanes are then added as a fixed tree
 * (j and j + 8, then j + 4, j + 2, j + 1). */
ALWAYS_INLINE float dot(const v16 *q, const float *k, int64_t chunks, int64_t D) {
    v16 acc = splat(0.0f);
    for (int64_t c = 0; c < chunks; c++) acc = vadd(acc, vmul(q[c], load(k + c * LANES, D - c * LANES, 0.0f)));
    return lanes_sum(acc);
}

/* The head attended next, whose keys and values are fetched from memory while this one computes: a head's
 * positions are a few kilobytes apart from the next one's, too short a stream for the hardware's prefetcher. */
typedef struct {
    const float *k, *v; /* NULL: none */
    const int64_t *rows;
    int64_t row0, len;
} ahead;

/* Position t of a head whose positions live in cache rows `rows` (strided by ts), or all in row0. */
ALWAYS_INLINE const float *at(const float *head, const int64_t *rows, int64_t ts, int64_t row0, int64_t t, int64_t sN,
                              int64_t sT) {
    return head + (rows ? rows[t * ts] : row0) * sN + t * sT;
}

ALWAYS_INLINE void fetch(const float *p, int64_t D) {
    for (int64_t d = 0; d < D; d += 16) __builtin_prefetch(p + d); /* a 64-byte line a time */
}

/* One head of one row: `chunks` 16-float pieces of the head's D floats (a constant where D is 64). */
ALWAYS_INLINE void attend_head(const float *q, const float *k, const float *v, int64_t D, int64_t chunks, int64_t len,
                               const int64_t *rows, int64_t ts, int64_t row0, int64_t sN, int64_t sT, float scale,
                               ahead next, float *s, float *out) {
    v16 qc[16];
    for (int64_t c = 0; c < chunks; c++) qc[c] = load(q + c * LANES, D - c * LANES, 0.0f);
    for (int64_t t = 0; t < len; t++) {
        if (next.k && t < next.len) fetch(at(next.k, next.rows, ts, next.row0, t, sN, sT), D);
        s[t] = dot(qc, at(k, rows, ts, row0, t, sN, sT), chunks, D) * scale;
    }
    for (int64_t t = len; next.k && t < next.len; t++) /* a longer next row */
        fetch(at(next.k, next.rows, ts, next.row0, t, sN, sT), D);
    float m = s[0];
    for (int64_t t = 1; t < len; t++) m = s[t] > m ? s[t] : m;
    for (int64_t t = 0; t < len; t += LANES) store(s + t, exp_nonpositive(vsub(load(s + t, len - t, m), splat(m))), len - t);
    double sum = 0.0;
    for (int64_t t = 0; t < len; t++) sum += s[t];
    float total = (float)sum;
    for (int64_t t = 0; t < len; t++) s[t] = s[t] / total;
    v16 acc[16];
    for (int64_t c = 0; c < chunks; c++) acc[c] = splat(0.0f);
    for (int64_t t = 0; t < len; t++) {
        const float *vp = at(v, rows, ts, row0, t, sN, sT);
        if (next.k && t < next.len) fetch(at(next.v, next.rows, ts, next.row0, t, sN, sT), D);
        v16 w = splat(s[t]);
        for (int64_t c = 0; c < chunks; c++) acc[c] = vadd(acc[c], vmul(w, load(vp + c * LANES, D - c * LANES, 0.0f)));
    }
    for (int64_t t = len; next.k && t < next.len; t++)
        fetch(at(next.v, next.rows, ts, next.row0, t, sN, sT), D);
    for (int64_t c = 0; c < chunks; c++) store(out + c * LANES, acc[c], D - c * LANES);
}

/* Rows n of q (row stride sq, heads D apart) against their positions, as beamserve_attend describes, once every
 * index has been checked. */
static int attend_rows(const float *q, int64_t sq, const float *k, const float *v, int64_t N, int64_t H, int64_t D,
                       int64_t sN, int64_t sH, int64_t sT, const int64_t *lengths, int64_t length, const int64_t *rows,
                       int64_t rs, int64_t ts, float scale, float *out) {
    int64_t most = length;
    if (lengths)
        for (int64_t n = 0; n < N; n++) most = lengths[n] > most ? lengths[n] : most;
    float on_stack[1024], *scratch = most <= 1024 ? on_stack : malloc((size_t)most * sizeof(float));
    if (!scratch) return -1;
    for (int64_t n = 0; n < N; n++) {
        int64_t len = lengths ? lengths[n] : length;
        const int64_t *r = rows ? rows + n * rs : 0;
        for (int64_t h = 0; h < H; h++) {
            float *o = out + (n * H + h) * D;
            if (len <= 0) {
                for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
                continue;
            }
            ahead next = {0, 0, 0, 0, 0};
            if (h + 1 < H)
                next = (ahead){k + (h + 1) * sH, v + (h + 1) * sH, r, n, len};
            else if (n + 1 < N)
                next = (ahead){k, v, rows ? rows + (n + 1) * rs : 0, n + 1, lengths ? lengths[n + 1] : length};
            const float *qh = q + n * sq + h * D, *kh = k + h * sH, *vh = v + h * sH;
            if (D == 64) /* the common head size, its loops unrolled */
                attend_head(qh, kh, vh, 64, 4, len, r, ts, n, sN, sT, scale, next, scratch, o);
            else
                attend_head(qh, kh, vh, D, (D + LANES - 1) / LANES, len, r, ts, n, sN, sT, scale, next, scratch, o);
        }
    }
    if (scratch != on_stack) free(scratch);
    return 0;
}

/* q (N, H, D) float32 contiguous; k and v float32 with element strides sN (row), sH (head), sT (position) and
 * unit stride over D; out (N, H, D) contiguous. Row n attends over positions [0, len) with len = lengths[n],
 * or `length` for every row when lengths is NULL (rows with no positions get zeros). Position t of row n
 * is read from cache row rows[n * rs + t * ts] (rows holds rN rows of rT positions), or from row n when rows
 * is NULL. The cache holds R rows of T positions. Returns 0; -1 where the scores' scratch could not be
 * allocated; -2, having read nothing, where a position or a cache row would lie outside what holds it. */
int beamserve_attend(const float *q, const float *k, const float *v, int64_t N, int64_t H, int64_t D, int64_t sN,
                     int64_t sH, int64_t sT, int64_t R, int64_t T, const int64_t *lengths, int64_t length,
                     const int64_t *rows, int64_t rs, int64_t ts, int64_t rN, int64_t rT, float scale, float *out) {
    /* Every read below checked first: an index past the cache would read another tensor's memory, a head
     * wider than 16 x LANES past the query's registers. */
    if (D < 1 || D > 16 * LANES) return -2;
    if (rows && N > rN) return -2;
    for (int64_t n = 0; n < N; n++) {
        int64_t len = lengths ? lengths[n] : length;
        if (len > T || (rows && len > rT)) return -2;
        if (!rows) {
            if (len > 0 && n >= R) return -2;
            continue;
        }
        for (int64_t t = 0; t < len; t++) {
            int64_t row = rows[n * rs + t * ts];
            if (row < 0 || row >= R) return -2;
        }
    }
    return attend_rows(q, H * D, k, v, N, H, D, sN, sH, sT, lengths, length, rows, rs, ts, scale, out);
}

/* A decoder step's self-attention on the KVCache (model/nn/kv_cache.py): row n of qkv (row stride sq: its query,
 * key and value, H x D floats each, one after the other) writes its key and value at its position p(n) of cache
 * row n (k and v with strides sN, sH, sT, unit over D; R rows of T positions), then attends over positions
 * [0, p(n)] -> out (N, H, D) contiguous. p(n) is positions[n], or pos for every row where positions is NULL.
 * With a lineage (rN rows of rT positions, strides lN, lT) row n names itself at p(n) and reads position t from
 * cache row lineage[n, t]; without one, from its own row. Returns as beamserve_attend does, -2 having written
 * nothing. */
int beamserve_self_attend_step(const float *qkv, int64_t sq, int64_t N, int64_t H, int64_t D, float *k, float *v,
                               int64_t sN, int64_t sH, int64_t sT, int64_t R, int64_t T, const int64_t *positions,
                               int64_t pos, int64_t *lineage, int64_t lN, int64_t lT, int64_t rN, int64_t rT,
                               float scale, float *out) {
    if (D < 1 || D > 16 * LANES || N > R || sq < 3 * H * D || (lineage && N > rN)) return -2;
    for (int64_t n = 0; n < N; n++) {
        const int64_t p = positions ? positions[n] : pos;
        if (p < 0 || p >= T || (lineage && p >= rT)) return -2;
        for (int64_t t = 0; lineage && t < p; t++) {
            int64_t row = lineage[n * lN + t * lT];
            if (row < 0 || row >= R) return -2;
        }
    }
    int64_t on_stack[256], *lengths = NULL;
    if (positions) {
        lengths = N <= 256 ? on_stack : malloc((size_t)N * sizeof(int64_t));
        if (!lengths) return -1;
        for (int64_t n = 0; n < N; n++) lengths[n] = positions[n] + 1;
    }
    for (int64_t n = 0; n < N; n++) {
        const int64_t p = positions ? positions[n] : pos;
        const float *kn = qkv + n * sq + H * D, *vn = kn + H * D;
        for (int64_t h = 0; h < H; h++) {
            memcpy(k + n * sN + h * sH + p * sT, kn + h * D, (size_t)D * sizeof(float));
            memcpy(v + n * sN + h * sH + p * sT, vn + h * D, (size_t)D * sizeof(float));
        }
        if (lineage) lineage[n * lN + p * lT] = n;
    }
    int failed = attend_rows(qkv, sq, k, v, N, H, D, sN, sH, sT, lengths, pos + 1, lineage, lN, lT, scale, out);
    if (lengths && lengths != on_stack) free(lengths);
    return failed;
}

/* A lineage's reorder (KVCache.follow): rows i < n of the lineage (rN rows of rT positions, row stride lN, unit
 * column stride) take positions [0, t) of row rows[i], rows naming any rows, each other included: the n rows are
 * gathered first, then written. Returns 0; -2 (nothing written) where a row is outside the lineage or t past its
 * positions; -1 without memory. */
int beamserve_follow(int64_t *lineage, int64_t rN, int64_t rT, int64_t lN, int64_t t, const int64_t *rows, int64_t n) {
    if (n > rN || t < 0 || t > rT) return -2;
    for (int64_t i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= rN) return -2;
    int64_t on_stack[1024], *gathered = n * t <= 1024 ? on_stack : malloc((size_t)(n * t) * sizeof(int64_t));
    if (!gathered) return -1;
    for (int64_t i = 0; i < n; i++) memcpy(gathered + i * t, lineage + rows[i] * lN, (size_t)t * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) memcpy(lineage + i * lN, gathered + i * t, (size_t)t * sizeof(int64_t));
    if (gathered != on_stack) free(gathered);
    return 0;
}

/* Cache rows moved (KVCache.copy): for each i < n, row dest[i] takes positions [0, t) of row src[i], in every layer
 * and head, of k and v alike (each L layers x R rows x H heads x T positions x D, element strides sL, sN, sH, D
 * and 1: a head's positions one run of floats), with nothing gathered first: for rows moved into holes, where no
 * row is both written and read. Returns 0; having written nothing, -3 where a row is both (the caller gathers),
 * -2 where a row lies outside the R or t past T, -1 without memory for the check. */
int beamserve_copy_rows(float *k, float *v, int64_t L, int64_t R, int64_t H, int64_t T, int64_t D, int64_t sL,
                        int64_t sN, int64_t sH, int64_t t, const int64_t *dest, const int64_t *src, int64_t n) {
    if (t < 0 || t > T) return -2;
    unsigned char on_stack[1024], *written = R <= 1024 ? on_stack : calloc((size_t)R, 1);
    if (!written) return -1;
    if (written == on_stack) memset(on_stack, 0, (size_t)R);
    int failed = 0;
    for (int64_t i = 0; i < n && !failed; i++) {
        if (dest[i] < 0 || dest[i] >= R || src[i] < 0 || src[i] >= R) failed = -2;
        else written[dest[i]] = 1;
    }
    for (int64_t i = 0; i < n && !failed; i++)
        if (written[src[i]]) failed = -3;
    if (written != on_stack) free(written);
    if (failed) return failed;
    size_t bytes = (size_t)(t * D) * sizeof(float);
    for (int64_t l = 0; l < L; l++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < H; h++) {
                int64_t to = l * sL + dest[i] * sN + h * sH, from = l * sL + src[i] * sN + h * sH;
                memcpy(k + to, k + from, bytes);
                memcpy(v + to, v + from, bytes);
            }
    return 0;
}
