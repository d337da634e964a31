/* The structs a decode step's calls take (sublayers.c builds on them, beam_steps.c runs them), built once by
 * model/kernels/native.py, and the calls one file makes of another's. */
#ifndef BEAMSERVE_SUBLAYERS_H
#define BEAMSERVE_SUBLAYERS_H
#include <stdint.h>

/* A linear layer packed for one of the library's GEMMs, with its bias (NULL: none): N outputs of K. kind 0: int8
 * (int8_vnni.c: packed bytes, 128 x the column sums, the column scales); kind 1: float32 (f32_gemm.c: packed
 * floats; comp and scale unused). */
typedef struct {
    const void *packed;
    const int32_t *comp;
    const float *scale;
    const float *bias;
    int64_t N, K, kind;
} beamserve_linear_c;

/* One layer's keys and values: R rows of H heads of T positions of D floats, element strides sN, sH, sT (unit
 * over D); lineage (rN rows of rT positions, strides lN, lT) where a step's rows share positions, else NULL. */
typedef struct {
    float *k, *v;
    int64_t H, D, sN, sH, sT, R, T;
    int64_t *lineage;
    int64_t lN, lT, rN, rT;
    float scale; /* the attention's 1 / sqrt(D), as the caller computes it for every other path */
} beamserve_kv;

/* One decoder layer's weights for beamserve_decoder_segment: its sublayers' structs (fc1.packed NULL: fc1 is
 * computed outside, float32 with its activation fused in oneDNN's GEMM), its three LayerNorms (after the self-
 * attention, the cross-attention and the feed-forward), and whether each norm comes before its sublayer (pre). */
typedef struct {
    beamserve_linear_c self_in, self_out, cross_in, cross_out, fc1, fc2;
    const float *norm_weight[3], *norm_bias[3];
    float eps[3];
    int64_t pre;
} beamserve_layer_c;

int beamserve_decoder_layers(const beamserve_layer_c *const *layers, const beamserve_kv *const *own,
                             const beamserve_kv *const *source, int64_t L, const int64_t *positions, int64_t pos,
                             const int64_t *lengths, const int64_t *rows, int64_t rs, int64_t ts, int64_t rN,
                             int64_t rT, int64_t N, int64_t C, float *x, const beamserve_linear_c *out, float *logp);
int beamserve_embed(const int64_t *tokens, int64_t N, const float *weight, int64_t V, int64_t C, float scale,
                    const float *at, int64_t at_stride, float *x);
#endif
