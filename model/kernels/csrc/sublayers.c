/* A decoder step's attention sublayers in one call each (model/nn/transformer.py): the projections (int8 with VNNI,
 * int8_vnni.c, or float32, f32_gemm.c), the attention (attention.c) and the residual, with nothing in between for
 * Python to do.
 *
 * Each call is the composition of the library's own kernels, in the order the step makes them one by one, so the
 * bits are theirs. A weight and a cache are handed over as structs built once (model/kernels/native.py), so a call
 * marshals a few pointers rather than thirty numbers. */
#include "beamserve.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int linear(const beamserve_linear_c *w, const float *x, int64_t M, const float *res, float *y) {
    if (w->kind == 1) return beamserve_f32_linear(x, M, w->K, w->K, w->packed, w->N, w->bias, res, w->N, y, w->N);
    return beamserve_vnni_linear(x, M, w->K, w->K, w->packed, w->comp, w->N, w->scale, w->bias, res, w->N, y, w->N);
}

/* y (N, C) = res + out(self-attention(qkv(x))) for a step's rows x (N, C) contiguous, each row's key and value
 * written into the cache at its position first (positions[n], or pos for every row where positions is NULL): as
 * beamserve_vnni_linear, beamserve_self_attend_step and beamserve_vnni_linear with the residual give it.
 * Returns 0; -2 where the shapes do not agree or an index lies outside the cache (nothing written to it); -1
 * without memory. */
int beamserve_self_sublayer(const float *x, const float *res, int64_t N, const beamserve_linear_c *qkv,
                            const beamserve_linear_c *out, const beamserve_kv *kv, const int64_t *positions,
                            int64_t pos, float *y) {
    const int64_t C = kv->H * kv->D;
    if (qkv->K != C || qkv->N != 3 * C || out->K != C || out->N != C) return -2;
    float *scratch = malloc((size_t)(N * 4 * C) * sizeof(float)); /* q, k, v rows, then the attention's */
    if (!scratch) return -1;
    float *att = scratch + N * 3 * C;
    int failed = linear(qkv, x, N, NULL, scratch);
    if (!failed)
        failed = beamserve_self_attend_step(scratch, 3 * C, N, kv->H, kv->D, kv->k, kv->v, kv->sN, kv->sH, kv->sT,
                                            kv->R, kv->T, positions, pos, kv->lineage, kv->lN, kv->lT, kv->rN,
                                            kv->rT, kv->scale, att);
    if (!failed) failed = linear(out, att, N, res, y);
    free(scratch);
    return failed;
}

/* y (N, C) = res + out(cross-attention(q(x))): row n's query against positions [0, lengths[n]) of the encoder's
 * keys and values, position t from row rows[n * rs + t * ts] (rN rows of rT positions), as beamserve_attend reads
 * them. Returns as beamserve_self_sublayer does. */
int beamserve_cross_sublayer(const float *x, const float *res, int64_t N, const beamserve_linear_c *q,
                             const beamserve_linear_c *out, const beamserve_kv *kv, const beamserve_source_map *map,
                             float *y) {
    const int64_t C = kv->H * kv->D;
    if (q->K != C || q->N != C || out->K != C || out->N != C) return -2;
    float *scratch = malloc((size_t)(N * 2 * C) * sizeof(float)); /* the queries, then the attention's rows */
    if (!scratch) return -1;
    float *att = scratch + N * C;
    int failed = linear(q, x, N, NULL, scratch);
    if (!failed)
        failed = beamserve_attend(scratch, kv->k, kv->v, N, kv->H, kv->D, kv->sN, kv->sH, kv->sT, kv->R, kv->T,
                                  map->lengths, 0, map->rows, map->rs, map->ts, map->rN, map->rT, kv->scale, att);
    if (!failed) failed = linear(out, att, N, res, y);
    free(scratch);
    return failed;
}

/* y (M, w->N) = x (M, w->K) @ w^T + bias, plus res (M, w->N) where given: beamserve_vnni_linear over a struct, all
 * contiguous. */
int beamserve_linear_forward(const beamserve_linear_c *w, const float *x, int64_t M, const float *res, float *y) {
    return linear(w, x, M, res, y);
}

/* x (N, C) = LayerNorm(x + sub) (post-norm), or x + sub (pre-norm; sub already taken of the normed x), sub (N, C). */
static void close_sublayer(const beamserve_layer_c *l, int which, float *x, const float *sub, int64_t N, int64_t C) {
    if (l->pre)
        for (int64_t i = 0; i < N * C; i++) x[i] = sub[i];
    else
        beamserve_layer_norm(sub, N, C, l->norm_weight[which], l->norm_bias[which], l->eps[which], x);
}

/* A sublayer's input: x itself (post-norm), or its norm `which` written to normed (pre-norm). */
static const float *sublayer_input(const beamserve_layer_c *l, int which, const float *x, float *normed, int64_t N,
                                   int64_t C) {
    if (!l->pre) return x;
    beamserve_layer_norm(x, N, C, l->norm_weight[which], l->norm_bias[which], l->eps[which], normed);
    return normed;
}

/* Layer l's feed-forward closed over h, its activated hidden rows: x = norm(x + fc2(h)) or x + fc2(h). */
static int close_feed_forward(const beamserve_layer_c *l, const float *h, float *x, float *sub, int64_t N, int64_t C) {
    int failed = l->fc2.N != C ? -2 : linear(&l->fc2, h, N, x, sub);
    if (!failed) close_sublayer(l, 2, x, sub, N, C);
    return failed;
}

/* Layer l's feed-forward input u (its norm of x, or x), and f = fc1(u) where fc1 is in C. */
static int open_feed_forward(const beamserve_layer_c *l, const float *x, float *u, float *f, int64_t N, int64_t C) {
    if (l->pre)
        beamserve_layer_norm(x, N, C, l->norm_weight[2], l->norm_bias[2], l->eps[2], u);
    else
        memcpy(u, x, (size_t)(N * C) * sizeof(float));
    return !l->fc1.packed ? 0 : l->fc1.K != C ? -2 : linear(&l->fc1, u, N, NULL, f);
}

/* A decode step's decoder layers between two feed-forward activations, in one call: the feed-forward of layer
 * `ending` closed (fc2 over h, its activated hidden rows (N, ending->fc2.K), with the residual, then its norm),
 * then the two attention sublayers of `layer` and the input of its feed-forward: u (N, C), and f (N, fc1.N) =
 * fc1(u) before the activation where fc1 is in C. Either layer may be NULL (the step's first and last calls).
 * x (N, C) is the residual stream, updated in place. Post-norm: x = LayerNorm(x + f(x)); pre-norm: x = x +
 * f(LayerNorm(x)). The operations and their order are DecoderLayer.sublayers', through the same kernels as
 * beamserve_self_sublayer, beamserve_cross_sublayer and beamserve_linear_forward one by one, and LayerNorm with
 * PyTorch's bits (layer_norm.c), so the bits are the step's layer by layer. own and source: the layer's keys and
 * values; positions, pos and the source map as those calls take them. Returns as beamserve_self_sublayer. */
int beamserve_decoder_segment(const beamserve_layer_c *ending, const float *h, const beamserve_layer_c *layer,
                              const beamserve_kv *own, const beamserve_kv *source, const int64_t *positions,
                              int64_t pos, const beamserve_source_map *map, int64_t N, int64_t C, float *x, float *u,
                              float *f) {
    float *sub = malloc((size_t)(2 * N * C) * sizeof(float)); /* a sublayer's output, then a normed input */
    if (!sub) return -1;
    float *normed = sub + N * C;
    int failed = ending ? close_feed_forward(ending, h, x, sub, N, C) : 0;
    if (layer && !failed) {
        const float *in = sublayer_input(layer, 0, x, normed, N, C);
        failed = beamserve_self_sublayer(in, x, N, &layer->self_in, &layer->self_out, own, positions, pos, sub);
        if (!failed) {
            close_sublayer(layer, 0, x, sub, N, C);
            in = sublayer_input(layer, 1, x, normed, N, C);
            failed = beamserve_cross_sublayer(in, x, N, &layer->cross_in, &layer->cross_out, source, map, sub);
        }
        if (!failed) {
            close_sublayer(layer, 1, x, sub, N, C);
            failed = open_feed_forward(layer, x, u, f, N, C);
        }
    }
    free(sub);
    return failed;
}

/* Layer l's hidden rows f (N, fc1.N) through SiLU as the path one op at a time computes it after its fc1 (below). */
static int activate(const beamserve_layer_c *l, float *f, int64_t N) {
    if (l->fc1.kind == 1) return beamserve_f32_swish(f, N * l->fc1.N);
    beamserve_silu(f, N * l->fc1.N);
    return 0;
}

/* The widest feed-forward of L >= 1 layers over rows of C, each fc1 in C and fc2 reading its output; -1 else. */
static int64_t widest_hidden(const beamserve_layer_c *const *layers, int64_t L, int64_t C) {
    int64_t F = L < 1 ? -1 : 0;
    for (int64_t i = 0; i < L; i++) {
        const beamserve_layer_c *l = layers[i];
        if (!l->fc1.packed || l->fc1.K != C || l->fc2.K != l->fc1.N) return -1;
        F = l->fc1.N > F ? l->fc1.N : F;
    }
    return F;
}

/* A decode step's L decoder layers in one call: beamserve_decoder_segment over each layer in turn, each feed-forward's
 * hidden rows activated between two of them by SiLU, computed as the path one op at a time computes it: ATen's
 * (silu.c) after an int8 fc1, oneDNN's swish post-op (f32_gemm.c) after a float32 one, whose GEMM oneDNN would have
 * fused it into; so the bits are those of the segments one by one. Every layer's fc1 in C. own[i] and source[i]: layer
 * i's keys and values; the rest as beamserve_decoder_segment takes it. Where out is given, then the output
 * projection of x and each row's log-softmax into logp (N, out->N), as beamserve_vnni_linear (or
 * beamserve_f32_linear) and beamserve_log_softmax give them one after the other. Returns as
 * beamserve_decoder_segment does. */
int beamserve_decoder_layers(const beamserve_layer_c *const *layers, const beamserve_kv *const *own,
                             const beamserve_kv *const *source, int64_t L, const int64_t *positions, int64_t pos,
                             const beamserve_source_map *map, int64_t N, int64_t C, float *x,
                             const beamserve_linear_c *out, float *logp) {
    const int64_t F = widest_hidden(layers, L, C);
    if (F < 0 || (out && out->K != C)) return -2;
    float *u = malloc((size_t)(N * (C + F)) * sizeof(float)); /* a feed-forward's input, then its hidden rows */
    if (!u) return -1;
    float *f = u + N * C; /* layer i's hidden rows are layer i + 1's segment's h, read before it writes its own */
    int failed = 0;
    for (int64_t i = 0; i < L && !failed; i++) {
        failed = beamserve_decoder_segment(i ? layers[i - 1] : NULL, f, layers[i], own[i], source[i], positions, pos,
                                           map, N, C, x, u, f);
        if (!failed) failed = activate(layers[i], f, N);
    }
    if (!failed)
        failed = beamserve_decoder_segment(layers[L - 1], f, NULL, NULL, NULL, positions, pos, map, N, C, x, u, NULL);
    free(u);
    if (!failed && out) {
        failed = linear(out, x, N, NULL, logp);
        if (!failed) beamserve_log_softmax(logp, N, out->N, out->N);
    }
    return failed;
}

/* The encoder's layers between two feed-forward activations, in one call, as beamserve_decoder_segment does the
 * decoder's: the feed-forward of layer `ending` closed over h (fc2 with the residual, then its norm), then
 * `layer`'s self-attention sublayer (q, k and v as one projection, self_in; each of the N = B S rows, padded
 * ones too, attends to its sentence's first lengths[n] positions, sentence rows[n * rs] of B, as
 * beamserve_attend reads them; rN, rT the map's shape) and the input of its feed-forward: u (N, C), and f =
 * fc1(u) before the activation where fc1 is in C. The norms: norm_weight[0] after the attention, [2] after the
 * feed-forward. x (N, C) is the residual stream, updated in place. Returns as beamserve_self_sublayer. */
int beamserve_encoder_segment(const beamserve_layer_c *ending, const float *h, const beamserve_layer_c *layer,
                              int64_t B, int64_t S, int64_t H, const beamserve_source_map *map, float scale, int64_t N,
                              int64_t C, float *x, float *u, float *f) {
    const int64_t D = H > 0 ? C / H : 0;
    if (H < 1 || D * H != C || B * S != N) return -2;
    float *sub = malloc((size_t)(N * 6 * C) * sizeof(float)); /* a sublayer's output, a normed input, q k v, q */
    if (!sub) return -1;
    float *normed = sub + N * C, *qkv = normed + N * C, *q = qkv + 3 * N * C;
    int failed = ending ? close_feed_forward(ending, h, x, sub, N, C) : 0;
    if (layer && !failed) {
        const float *in = sublayer_input(layer, 0, x, normed, N, C);
        failed = layer->self_in.K != C || layer->self_in.N != 3 * C || layer->self_out.K != C
                     ? -2
                     : linear(&layer->self_in, in, N, NULL, qkv);
        if (!failed) {
            for (int64_t n = 0; n < N; n++) memcpy(q + n * C, qkv + n * 3 * C, (size_t)C * sizeof(float));
            failed = beamserve_attend(q, qkv + C, qkv + 2 * C, N, H, D, S * 3 * C, D, 3 * C, B, S, map->lengths, 0,
                                      map->rows, map->rs, map->ts, map->rN, map->rT, scale, normed);
        }
        if (!failed) failed = linear(&layer->self_out, normed, N, x, sub);
        if (!failed) {
            close_sublayer(layer, 0, x, sub, N, C);
            failed = open_feed_forward(layer, x, u, f, N, C);
        }
    }
    free(sub);
    return failed;
}

/* x (N, C) = weight[tokens[n]] * scale + at[n] (each float product rounded, then the sum: a decode step's
 * embedding as F.embedding(tokens, weight) * scale + at computes it), at's rows at stride at_stride (0: one row
 * for all). Returns 0, or -2 (nothing written) where a token lies outside the V rows of weight. */
int beamserve_embed(const int64_t *tokens, int64_t N, const float *weight, int64_t V, int64_t C, float scale,
                    const float *at, int64_t at_stride, float *x) {
    for (int64_t n = 0; n < N; n++)
        if (tokens[n] < 0 || tokens[n] >= V) return -2;
    for (int64_t n = 0; n < N; n++) {
        const float *e = weight + tokens[n] * C, *p = at + n * at_stride;
        for (int64_t c = 0; c < C; c++) x[n * C + c] = e[c] * scale + p[c];
    }
    return 0;
}

/* The encoder's L layers in one call, as beamserve_decoder_layers does the decoder's: beamserve_encoder_segment over
 * each layer in turn, each feed-forward's hidden rows activated between two of them as there; every layer of H
 * heads, its fc1 in C. The rest as beamserve_encoder_segment takes it. Returns as it does. */
int beamserve_encoder_layers(const beamserve_layer_c *const *layers, int64_t L, int64_t H, int64_t B, int64_t S,
                             const beamserve_source_map *map, float scale, int64_t N, int64_t C, float *x) {
    const int64_t F = widest_hidden(layers, L, C);
    if (F < 0) return -2;
    float *u = malloc((size_t)(N * (C + F)) * sizeof(float)); /* a feed-forward's input, then its hidden rows */
    if (!u) return -1;
    float *f = u + N * C;
    int failed = 0;
    for (int64_t i = 0; i < L && !failed; i++) {
        failed = beamserve_encoder_segment(i ? layers[i - 1] : NULL, f, layers[i], B, S, H, map, scale, N, C, x, u, f);
        if (!failed) failed = activate(layers[i], f, N);
    }
    if (!failed)
        failed = beamserve_encoder_segment(layers[L - 1], f, NULL, B, S, H, map, scale, N, C, x, u, NULL);
    free(u);
    return failed;
}
