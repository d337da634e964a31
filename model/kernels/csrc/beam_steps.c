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
 * beams continue (its first p + 1 positions) and tokens (N,) become the new ones. beams and rules are
 * beamserve_beam_advance's, decoder the layers' structs, the source map and the embedding (beamserve.h); answer
 * holds the last step's. Writes ran[0], the steps taken, and ran[1], how many sentences are done at the last. Returns
 * 0; -1 without memory; -2 as beamserve_decoder_layers (shapes, or a position outside the cache); -3 a token
 * outside the embedding's V rows; -4 the beam step's -2 (more candidates than the kernel ranks). */
int beamserve_beam_steps(const beamserve_decoder *decoder, const beamserve_beams *beams, const beamserve_rules *rules,
                         const float *at, const float *norms, int64_t *tokens, int64_t pos0, int64_t steps, float *x,
                         float *logp, beamserve_beam_answer *answer, int64_t *ran) {
    const beamserve_decoder *d = decoder;
    const int64_t batch = beams->batch, K = beams->K, L = d->L, C = d->C;
    const beamserve_kv *const *own = d->own;
    const beamserve_linear_c *out = d->out;
    const int64_t N = batch * K;
    const beamserve_kv *kv = L > 0 ? own[0] : NULL;
    ran[0] = ran[1] = 0;
    if (!kv || !kv->lineage || kv->lT != 1 || !out || pos0 < 1) return -2; /* step 0 has a row a sentence */
    for (int64_t s = 0; s < steps; s++) {
        const int64_t p = pos0 + s;
        if (beamserve_embed(tokens, N, d->embed, d->V, C, d->scale, at + s * C, 0, x)) return -3;
        int failed = beamserve_decoder_layers(d->layers, own, d->source, L, NULL, p, &d->map, N, C, x, out, logp);
        if (failed) return failed;
        const int ended = beamserve_beam_advance(logp, out->N, beams, rules, NULL, p, NULL, norms[s], answer);
        if (ended < 0) return ended == -2 ? -4 : ended;
        ran[0] = s + 1, ran[1] = ended;
        if (ended) return 0;
        failed = beamserve_follow(kv->lineage, kv->rN, kv->rT, kv->lN, p + 1, answer->rows, N);
        if (failed) return failed;
        memcpy(tokens, answer->token, (size_t)N * sizeof(int64_t));
    }
    return 0;
}
