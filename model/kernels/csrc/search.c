/* A beam search step's passes over the logits on CPU (model/kernels/native.py, used by model/decode/search.py): the
 * log-softmax of each row written over it, and the best candidates of each sentence over all its beams'
 * tokens, each in one pass over the rows instead of PyTorch's several.
 *
 * The log-softmax computes its own bits, the same on every CPU and vector width (16 fixed lanes, fixed
 * reduction trees, no contraction, its own exp and log). The candidate ranking gives exactly
 * search.top_candidates's answer: the same float additions, and equal scores ranked by beam, then token.
 */
#include "beamserve.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vec16.h"

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
 * written over it. The sum runs in four 16-lane vectors (vector i of the row into partial i % 4, in
 * order), added as (0 + 1) + (2 + 3), then its lanes as a fixed tree; in float. Four partial maxima and
 * sums keep four independent chains in flight. */
static void log_softmax_row(float *row, int64_t cols) {
    const int64_t block = 4 * LANES, full = cols - cols % block; /* whole blocks of four vectors, then the rest */
    v16 mx[4];
    for (int i = 0; i < 4; i++) mx[i] = load(row + full + i * LANES, cols - full - i * LANES, -INFINITY);
    for (int64_t c = 0; c < full; c += block)
        for (int i = 0; i < 4; i++) mx[i] = vmax(mx[i], load16(row + c + i * LANES));
    const float m = lanes_max(vmax(vmax(mx[0], mx[1]), vmax(mx[2], mx[3])));
    const v16 vm = splat(m);
    v16 acc[4] = {splat(0.0f), splat(0.0f), splat(0.0f), splat(0.0f)};
    for (int64_t c = 0; c < full; c += block)
        for (int i = 0; i < 4; i++) acc[i] = vadd(acc[i], exp_nonpositive(vsub(load16(row + c + i * LANES), vm)));
    for (int i = 0; i < 4; i++) {
        int64_t left = cols - full - i * LANES; /* floats of the row in this tail vector */
        if (left <= 0) continue;
        float e[LANES]; /* lanes past the row add nothing */
        store(e, exp_nonpositive(vsub(load(row + full + i * LANES, left, m), vm)), LANES);
        for (int64_t j = left; j < LANES; j++) e[j] = 0.0f;
        acc[i] = vadd(acc[i], load16(e));
    }
    const float sum = lanes_sum(vadd(vadd(acc[0], acc[1]), vadd(acc[2], acc[3])));
    float lse = (float)log_at_least_one((double)sum); /* >= 1: the maximum's own exp(0) */
    for (int64_t c = 0; c < cols; c++) row[c] = (row[c] - m) - lse;
}

void beamserve_log_softmax(float *x, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t r = 0; r < rows; r++) log_softmax_row(x + r * ld, cols);
}

/* beamserve_scale_back, then beamserve_log_softmax, a row at a time: the same bits, with the row still in
 * cache for the log-softmax's passes (the int8 output projection's logits, model/kernels/quant.py). */
void beamserve_scale_back_log_softmax(const int32_t *acc, int64_t rows, int64_t cols, const float *col_scale,
                                      const float *row_scale, const float *bias, float *y) {
    for (int64_t r = 0; r < rows; r++) {
        beamserve_scale_back(acc + r * cols, 1, cols, col_scale, row_scale + r, bias, y + r * cols);
        if (r + 1 < rows) /* the next row from memory while this one's log-softmax computes */
            for (int64_t c = 0; c < cols; c += 16) __builtin_prefetch(acc + (r + 1) * cols + c);
        log_softmax_row(y + r * cols, cols);
    }
}

/* y (rows, cols) float32, a product already times its column scales (oneDNN's epilogue): y * row_scale + bias in
 * one rounding, as beamserve_scale_back and torch.addcmul make it, then the row's log-softmax, a row at a time with
 * the row still in cache: the same bits as those calls, in one pass fewer over the logits. */
void beamserve_rescale_log_softmax(float *y, int64_t rows, int64_t cols, const float *row_scale, const float *bias) {
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * cols;
        const float rs = row_scale[r];
        if (bias)
            for (int64_t c = 0; c < cols; c++) yr[c] = fmaf(yr[c], rs, bias[c]);
        else
            for (int64_t c = 0; c < cols; c++) yr[c] = yr[c] * rs;
        log_softmax_row(yr, cols);
    }
}

#define MOST_CANDIDATES 64 /* native.MOST_CANDIDATES */

/* The n best of run[b, k] + lp[b, k, v] over every beam k and token v of each of `batch` sentences, best
 * first, equal scores by beam, then token, lower first (search.top_indices): scores (batch, n), beam and
 * token (batch, n) int64. lp (batch, K, V) contiguous, run (batch, K) contiguous. Returns 0, or -2 (nothing
 * written) unless 1 <= n <= K * V and n <= MOST_CANDIDATES. */
int beamserve_top_candidates(const float *lp, const float *run, int64_t batch, int64_t K, int64_t V, int64_t n,
                             float *scores, int64_t *beam, int64_t *token) {
    if (n < 1 || n > MOST_CANDIDATES || n > K * V) return -2; /* the lists below hold MOST_CANDIDATES */
    for (int64_t b = 0; b < batch; b++) {
        float best[MOST_CANDIDATES];
        int64_t at[MOST_CANDIDATES];
        int64_t held = 0;
        for (int64_t k = 0; k < K; k++) {
            const float *row = lp + (b * K + k) * V;
            const float base = run[b * K + k];
            for (int64_t c = 0; c < V; c += 4 * LANES) {
                int64_t width = V - c < 4 * LANES ? V - c : 4 * LANES;
                if (b + 1 < batch) /* the next sentence's block from memory while this one is ranked */
                    for (int64_t j = 0; j < 4 * LANES; j += 16) __builtin_prefetch(row + K * V + c + j);
                if (held == n && width == 4 * LANES) { /* only a score above the n-th best can enter */
                    v16 top = vmax(vmax(load16(row + c), load16(row + c + LANES)),
                                   vmax(load16(row + c + 2 * LANES), load16(row + c + 3 * LANES)));
                    if (!any_above(top, base, best[n - 1])) continue;
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
    return 0;
}

#define NEG (-1.0e9f) /* search.NEG: "impossible" without the NaNs of -inf arithmetic */

/* The n best of s[0, m), best first, equal scores by place, lower first (search.top_indices), into at[0, n). */
static void top_places(const float *s, int64_t m, int64_t n, int64_t *at) {
    uint8_t taken[3 * MOST_CANDIDATES / 2] = {0}; /* m <= 3 K <= 3 MOST_CANDIDATES / 2 */
    for (int64_t i = 0; i < n; i++) {
        int64_t best = -1;
        for (int64_t j = 0; j < m; j++)
            if (!taken[j] && (best < 0 || s[j] > s[best])) best = j;
        taken[best] = 1;
        at[i] = best;
    }
}

/* Row `beam` of tokens (T positions) into out, with `token` written at pos (clamped to the last position). */
static void extended(const int64_t *tokens, int64_t beam, int64_t T, int64_t pos, int64_t token, int64_t *out) {
    memcpy(out, tokens + beam * T, (size_t)T * sizeof(int64_t));
    out[pos < T - 1 ? pos : T - 1] = token;
}

/* search.beam_step for `batch` sentences of K beams, with one length penalty and one early_stopping for all,
 * in place on the BeamState's tensors: run_scores (batch, K), run_tokens (batch, K, T), fin_scores (batch, K),
 * fin_tokens (batch, K, T), fin_flags (batch, K), improvable (batch,), all contiguous (flags one byte each).
 * lp (batch, K, V) the constrained log-probabilities, pos and max_lengths (batch,), norm (batch,) each
 * sentence's (pos + 1) ** length_penalty as PyTorch computes it. Writes src_beam and token (batch, K) and done
 * (batch,). The same float operations as search.beam_step, in its order, so the same bits. Returns 0; -2
 * (nothing written) unless 2 K <= MOST_CANDIDATES and 2 K <= K V; -1 without memory. */
int beamserve_beam_step(const float *lp, int64_t V, const beamserve_beams *beams, const int64_t *pos,
                        const float *norm, beamserve_beam_answer *answer) {
    const int64_t batch = beams->batch, K = beams->K, T = beams->T, eos = beams->eos;
    const int early_stopping = beams->early_stopping != 0;
    float *run_scores = beams->run_scores, *fin_scores = beams->fin_scores;
    int64_t *run_tokens = beams->run_tokens, *fin_tokens = beams->fin_tokens;
    uint8_t *fin_flags = beams->fin_flags, *improvable = beams->improvable;
    const int64_t *max_lengths = beams->max_lengths;
    int64_t *src_beam = answer->src_beam, *token = answer->token;
    uint8_t *done = answer->done;
    const int64_t n = 2 * K;
    if (n > MOST_CANDIDATES || n > K * V || K < 1 || T < 1) return -2;
    float *top = malloc((size_t)(batch * (n + K)) * sizeof(float)); /* candidates' scores, then kept running ones */
    int64_t *ids = malloc((size_t)(2 * batch * n) * sizeof(int64_t));
    /* the new running rows, then the candidates' rows, then a sentence's old finished rows */
    int64_t *rows = malloc((size_t)((batch * (K + n) + K) * T) * sizeof(int64_t));
    uint8_t *qualifies = malloc((size_t)(batch * n));
    if (!top || !ids || !rows || !qualifies) {
        free(top), free(ids), free(rows), free(qualifies);
        return -1;
    }
    float *kept = top + batch * n;
    int64_t *beam = ids, *tok = ids + batch * n, *seqs = rows + batch * K * T, *old = seqs + batch * n * T;
    beamserve_top_candidates(lp, run_scores, batch, K, V, n, top, beam, tok);
    int any = 0;
    for (int64_t b = 0; b < batch; b++) {
        const int at_limit = max_lengths[b] <= pos[b] + 1;
        int all_fin = 1;
        for (int64_t k = 0; k < K; k++) all_fin &= fin_flags[b * K + k] != 0;
        float running[MOST_CANDIDATES];
        for (int64_t j = 0; j < n; j++) {
            const int hit = tok[b * n + j] == eos || at_limit;
            running[j] = top[b * n + j] + (float)hit * NEG; /* the K best that did not end keep running */
            int q = hit && j < K && improvable[b];
            if (early_stopping) q = q && !all_fin;
            qualifies[b * n + j] = (uint8_t)q;
            any |= q;
        }
        int64_t keep[MOST_CANDIDATES / 2];
        top_places(running, n, K, keep);
        for (int64_t k = 0; k < K; k++) {
            src_beam[b * K + k] = beam[b * n + keep[k]];
            token[b * K + k] = tok[b * n + keep[k]];
            kept[b * K + k] = running[keep[k]];
            extended(run_tokens + b * K * T, src_beam[b * K + k], T, pos[b], token[b * K + k], rows + (b * K + k) * T);
        }
    }
    for (int64_t b = 0; b < batch && any; b++) { /* candidates ranked in the top K that ended may finish */
        float merged[3 * MOST_CANDIDATES / 2];
        uint8_t flags[3 * MOST_CANDIDATES / 2];
        int64_t best[MOST_CANDIDATES / 2];
        for (int64_t k = 0; k < K; k++) merged[k] = fin_scores[b * K + k], flags[k] = fin_flags[b * K + k];
        for (int64_t j = 0; j < n; j++) {
            merged[K + j] = top[b * n + j] / norm[b] + (float)!qualifies[b * n + j] * NEG;
            flags[K + j] = qualifies[b * n + j];
            extended(run_tokens + b * K * T, beam[b * n + j], T, pos[b], tok[b * n + j], seqs + (b * n + j) * T);
        }
        top_places(merged, K + n, K, best);
        int64_t *fin = fin_tokens + b * K * T;
        memcpy(old, fin, (size_t)(K * T) * sizeof(int64_t)); /* a finished row may take another's place */
        for (int64_t k = 0; k < K; k++) {
            fin_scores[b * K + k] = merged[best[k]];
            fin_flags[b * K + k] = flags[best[k]];
            const int64_t *from = best[k] < K ? old + best[k] * T : seqs + (b * n + best[k] - K) * T;
            memcpy(fin + k * T, from, (size_t)T * sizeof(int64_t));
        }
    }
    for (int64_t b = 0; b < batch; b++) {
        const int at_limit = max_lengths[b] <= pos[b] + 1;
        int all_fin = 1;
        float least = fin_scores[b * K];
        for (int64_t k = 0; k < K; k++) {
            all_fin &= fin_flags[b * K + k] != 0;
            least = fin_scores[b * K + k] < least ? fin_scores[b * K + k] : least;
        }
        for (int64_t k = 0; k < K; k++) run_scores[b * K + k] = kept[b * K + k];
        const float best_possible = run_scores[b * K] / norm[b];
        improvable[b] = improvable[b] && (!all_fin || best_possible > least);
        done[b] = !improvable[b] || at_limit || (early_stopping && all_fin);
    }
    memcpy(run_tokens, rows, (size_t)(batch * K * T) * sizeof(int64_t));
    free(top), free(ids), free(rows), free(qualifies);
    return 0;
}

/* search.constrain's rules for options shared by every row, applied to lp (batch, K, V) in place, then
 * beamserve_beam_step, for `batch` sentences, sentence b at step p(b) (positions[b], or pos for every sentence
 * where positions is NULL): the `n_suppressed` ids of `suppressed` -inf in every row; eos -inf while p(b) <
 * min_length; at p(b) = 0 with forced_bos >= 0, every token -inf but forced_bos at 0; the rows of a sentence
 * whose next token is its last (max_lengths[b] == p(b) + 1), with forced_eos >= 0, every token -inf but
 * forced_eos at 0. Sentence b's (p(b) + 1) ** length_penalty is norms[b], or norm for every sentence where norms
 * is NULL. Writes src_beam, token and done as beamserve_beam_step, and rows (batch, K), the search row each new
 * row continues (sentence b's row b where it had one row, at step 0; b K + src_beam after), for a step where no
 * sentence is done. Returns how many sentences are done, or beamserve_beam_step's -2 or -1. */
int beamserve_beam_advance(float *lp, int64_t V, const beamserve_beams *beams, const beamserve_rules *rules,
                           const int64_t *positions, int64_t pos, const float *norms, float norm,
                           beamserve_beam_answer *answer) {
    const int64_t batch = beams->batch, K = beams->K, eos = beams->eos;
    const int64_t *max_lengths = beams->max_lengths, *suppressed = rules->suppressed;
    const int64_t n_suppressed = rules->n_suppressed, min_length = rules->min_length;
    const int64_t forced_bos = rules->forced_bos, forced_eos = rules->forced_eos;
    int64_t *at = calloc((size_t)batch + 1, sizeof(int64_t)); /* each sentence's pos and norm, as beam_step reads */
    float *each = calloc((size_t)batch + 1, sizeof(float));
    if (!at || !each) {
        free(at), free(each);
        return -1;
    }
    for (int64_t b = 0; b < batch; b++) {
        at[b] = positions ? positions[b] : pos;
        each[b] = norms ? norms[b] : norm;
    }
    for (int64_t r = 0; r < batch * K; r++) {
        float *row = lp + r * V;
        const int64_t p = at[r / K];
        for (int64_t i = 0; i < n_suppressed; i++) row[suppressed[i]] = -INFINITY;
        if (p < min_length) row[eos] = -INFINITY;
        if (p == 0 && forced_bos >= 0)
            for (int64_t v = 0; v < V; v++) row[v] = v == forced_bos ? 0.0f : -INFINITY;
        if (forced_eos >= 0 && max_lengths[r / K] == p + 1)
            for (int64_t v = 0; v < V; v++) row[v] = v == forced_eos ? 0.0f : -INFINITY;
    }
    int failed = beamserve_beam_step(lp, V, beams, at, each, answer);
    free(each);
    if (failed) {
        free(at);
        return failed;
    }
    int ended = 0;
    for (int64_t b = 0; b < batch; b++) {
        ended += answer->done[b] != 0;
        for (int64_t k = 0; k < K; k++)
            answer->rows[b * K + k] = at[b] == 0 ? b : b * K + answer->src_beam[b * K + k];
    }
    free(at);
    return ended;
}
