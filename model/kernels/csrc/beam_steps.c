/* A beam search's steps while every sentence goes on, in one call (model/decode/search.py's beam_search): each step
 * is the library's calls the step makes one at a time, in their order, so the bits are theirs: beamserve_embed of
 * the rows' tokens, beamserve_decoder_layers with the output projection and the log-softmax, beamserve_beam_advance,
 * then, where no sentence is done, beamserve_follow of the lineage and the new tokens. One sentence at a time a
 * step's Python and PyTorch calls around those cost as much as their arithmetic; here there are none. */
#include "beamserve.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Steps pos0 .. pos0 + steps - 1 of `batch` sentences of K beams (N = batch K rows, every row at the step's position,
 * the self-attention keys of own[0]'s lineage, which every layer shares), stopping after the first step at which a
 * sentence is done. Step p: x = embed[tokens] * scale + at[(p - pos0) C ..] (the position's sinusoid, one row for
 * every row), the decoder's L layers and `out` into logp (N, out->N), then the beam step over the search's state
 * with norms[p - pos0] its (p + 1) ** length_penalty; where no sentence is done, the lineage follows the rows the new
 * beams continue (its first p + 1 positions) and tokens (N,) become the new ones. The search's rules and state are
 * beamserve_beam_advance's arguments of the same names; src_beam, token (N,), done (batch,) and rows (N,) hold the
 * last step's answer. Writes ran[0], the steps taken, and ran[1], how many sentences are done at the last. Returns
 * 0; -1 without memory; -2 as beamserve_decoder_layers (shapes, or a position outside the cache); -3 a token
 * outside the embedding's V rows; -4 the beam step's -2 (more candidates than the kernel ranks). */
int beamserve_beam_steps(const beamserve_layer_c *const *layers, const beamserve_kv *const *own,
                         const beamserve_kv *const *source, int64_t L, const int64_t *lengths, const int64_t *rows_of,
                         int64_t rs, int64_t ts, int64_t rN, int64_t rT, int64_t C, const float *embed, int64_t V,
                         float scale, const float *at, const beamserve_linear_c *out, int64_t batch, int64_t K,
                         float *run_scores, int64_t *run_tokens, float *fin_scores, int64_t *fin_tokens,
                         uint8_t *fin_flags, uint8_t *improvable, int64_t T, const int64_t *max_lengths,
                         const float *norms, int64_t eos, int early_stopping, const int64_t *suppressed,
                         int64_t n_suppressed, int64_t min_length, int64_t forced_bos, int64_t forced_eos,
                         int64_t *tokens, int64_t pos0, int64_t steps, float *x, float *logp, int64_t *src_beam,
                         int64_t *token, uint8_t *done, int64_t *rows, int64_t *ran) {
    const int64_t N = batch * K;
    const beamserve_kv *kv = L > 0 ? own[0] : NULL;
    ran[0] = ran[1] = 0;
    if (!kv || !kv->lineage || kv->lT != 1 || !out || pos0 < 1) return -2; /* step 0 has a row a sentence */
    for (int64_t s = 0; s < steps; s++) {
        const int64_t p = pos0 + s;
        if (beamserve_embed(tokens, N, embed, V, C, scale, at + s * C, 0, x)) return -3;
        int failed = beamserve_decoder_layers(layers, own, source, L, NULL, p, lengths, rows_of, rs, ts, rN, rT, N, C,
                                              x, out, logp);
        if (failed) return failed;
        const int ended = beamserve_beam_advance(logp, batch, K, out->N, run_scores, run_tokens, fin_scores,
                                                 fin_tokens, fin_flags, improvable, T, NULL, p, max_lengths, NULL,
                                                 norms[s], eos, early_stopping, suppressed, n_suppressed, min_length,
                                                 forced_bos, forced_eos, src_beam, token, done, rows);
        if (ended < 0) return ended == -2 ? -4 : ended;
        ran[0] = s + 1, ran[1] = ended;
        if (ended) return 0;
        failed = beamserve_follow(kv->lineage, kv->rN, kv->rT, kv->lN, p + 1, rows, N);
        if (failed) return failed;
        memcpy(tokens, token, (size_t)N * sizeof(int64_t));
    }
    return 0;
}
