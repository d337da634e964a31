/* beamserve's kernel API: every function the library exports, declared here once, and the structs they take.
 *
 * setup.py compiles every source for the baseline, for x86-64-v3 and for x86-64-v4 (BEAMSERVE_LEVEL 1, 3 and 4),
 * and links the builds into one library side by side: each name below is the kernel of the build's own level
 * (beamserve_attend is beamserve_attend_v4 in the x86-64-v4 build), so a build's kernels call their own level's.
 * dispatch.c says which level this CPU runs. model/kernels/bindings.py reads this file for the ctypes types of
 * each kernel (a pointer, int64_t, int or float each argument), so a kernel added here and defined in a source
 * is bound with nothing else to write; every source includes this file first, so the compiler holds each
 * definition to its declaration. */
#ifndef BEAMSERVE_H
#define BEAMSERVE_H
#ifndef BEAMSERVE_LEVEL
#error "setup.py compiles the kernels once per x86-64 level, with BEAMSERVE_LEVEL set"
#endif
#include <stdint.h>

#define BEAMSERVE_PASTE(name, level) name##_v##level
#define BEAMSERVE_AT(name, level) BEAMSERVE_PASTE(name, level)
#define BEAMSERVE_LEVELED(name) BEAMSERVE_AT(name, BEAMSERVE_LEVEL)

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

/* A beam search's state for `batch` sentences of K beams (model/decode/search.py's BeamState), updated in place:
 * run_scores (batch, K), run_tokens (batch, K, T), fin_scores (batch, K), fin_tokens (batch, K, T), fin_flags
 * (batch, K) and improvable (batch,), flags one byte each, all contiguous; max_lengths (batch,) each sentence's
 * length limit; eos the end token; early_stopping 0 or 1. */
typedef struct {
    float *run_scores;
    int64_t *run_tokens;
    float *fin_scores;
    int64_t *fin_tokens;
    uint8_t *fin_flags, *improvable;
    const int64_t *max_lengths;
    int64_t batch, K, T, eos, early_stopping;
} beamserve_beams;

/* search.constrain's rules for options shared by every row: the n_suppressed ids of suppressed never chosen, the
 * end token not before min_length, forced_bos first and forced_eos last where >= 0. */
typedef struct {
    const int64_t *suppressed;
    int64_t n_suppressed, min_length, forced_bos, forced_eos;
} beamserve_rules;

/* A beam step's answer: src_beam and token (batch, K), done (batch,), and rows (batch K,), the search row each
 * new row continues (beamserve_beam_advance's; beamserve_beam_step leaves it unwritten). */
typedef struct {
    int64_t *src_beam, *token;
    uint8_t *done;
    int64_t *rows;
} beamserve_beam_answer;

/* Where each row's source positions are (model/decode's CrossCache.row_map): row n attends to positions [0,
 * lengths[n]) of the encoder's keys and values, position t from row rows[n * rs + t * ts] (rN rows of rT). */
typedef struct {
    const int64_t *lengths, *rows;
    int64_t rs, ts, rN, rT;
} beamserve_source_map;

/* What a decoder step reads besides its rows (beamserve_decoder_layers' arguments and the embedding): the L
 * layers' structs and caches (own, shared lineage in own[0]; source), the source map, the embedding (V, C) with its scale, and the output projection. */
typedef struct {
    const beamserve_layer_c *const *layers;
    const beamserve_kv *const *own;
    const beamserve_kv *const *source;
    int64_t L;
    beamserve_source_map map;
    const float *embed;
    int64_t V, C;
    float scale;
    const beamserve_linear_c *out;
} beamserve_decoder;

/* What this CPU runs and what the caller allows (int8_rows.c, int8_vnni.c, int8_avx2.c, f32_gemm.c): 0 or a kind. */
#define beamserve_vectorised BEAMSERVE_LEVELED(beamserve_vectorised)
int beamserve_vectorised(void);
#define beamserve_cpu_level BEAMSERVE_LEVELED(beamserve_cpu_level)
int beamserve_cpu_level(void);
#define beamserve_vnni BEAMSERVE_LEVELED(beamserve_vnni)
int beamserve_vnni(void);
#define beamserve_avx_vnni BEAMSERVE_LEVELED(beamserve_avx_vnni)
int beamserve_avx_vnni(void);
#define beamserve_avx_vnni_allow BEAMSERVE_LEVELED(beamserve_avx_vnni_allow)
void beamserve_avx_vnni_allow(int allowed);
#define beamserve_vnni_amx BEAMSERVE_LEVELED(beamserve_vnni_amx)
int beamserve_vnni_amx(void);
#define beamserve_amx_allow BEAMSERVE_LEVELED(beamserve_amx_allow)
void beamserve_amx_allow(int allowed);
#define beamserve_f32_gemm BEAMSERVE_LEVELED(beamserve_f32_gemm)
int beamserve_f32_gemm(void);

/* int8 rows and GEMMs (int8_rows.c, int8_gemm.c, int8_vnni.c, int8_avx2.c): x (M, K) row stride ldx, weights
 * (N, K) packed once (vnni_pack), results y (M, N) row stride ldy; a residual res (M, N) row stride ldr or NULL. */
#define beamserve_quantize_rows BEAMSERVE_LEVELED(beamserve_quantize_rows)
void beamserve_quantize_rows(const float *x, int64_t rows, int64_t cols, int64_t ld, int8_t *q, float *scale);
#define beamserve_scale_back BEAMSERVE_LEVELED(beamserve_scale_back)
void beamserve_scale_back(const int32_t *acc, int64_t rows, int64_t cols, const float *col_scale,
                          const float *row_scale, const float *bias, float *y);
#define beamserve_int8_gemm BEAMSERVE_LEVELED(beamserve_int8_gemm)
void beamserve_int8_gemm(const int8_t *x, int64_t M, int64_t K, int64_t ldx, const int8_t *w, int64_t N, int32_t *y);
#define beamserve_vnni_packed_bytes BEAMSERVE_LEVELED(beamserve_vnni_packed_bytes)
int64_t beamserve_vnni_packed_bytes(int64_t N, int64_t K);
#define beamserve_vnni_pack BEAMSERVE_LEVELED(beamserve_vnni_pack)
void beamserve_vnni_pack(const int8_t *w, int64_t N, int64_t K, int8_t *packed, int32_t *comp);
#define beamserve_vnni_int8_gemm BEAMSERVE_LEVELED(beamserve_vnni_int8_gemm)
int beamserve_vnni_int8_gemm(const int8_t *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed,
                             const int32_t *comp, int64_t N, int32_t *y);
#define beamserve_vnni_linear BEAMSERVE_LEVELED(beamserve_vnni_linear)
int beamserve_vnni_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed,
                          const int32_t *comp, int64_t N, const float *col_scale, const float *bias, const float *res,
                          int64_t ldr, float *y, int64_t ldy);
#define beamserve_avx2_int8_gemm BEAMSERVE_LEVELED(beamserve_avx2_int8_gemm)
int beamserve_avx2_int8_gemm(const int8_t *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed,
                             const int32_t *comp, int64_t N, int32_t *y);
#define beamserve_avx2_linear BEAMSERVE_LEVELED(beamserve_avx2_linear)
int beamserve_avx2_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed,
                          const int32_t *comp, int64_t N, const float *col_scale, const float *bias, const float *res,
                          int64_t ldr, float *y, int64_t ldy);

/* float32 GEMMs summing as oneDNN's packed matmul does (f32_gemm.c), the same layouts as the int8 ones. */
#define beamserve_f32_block BEAMSERVE_LEVELED(beamserve_f32_block)
int64_t beamserve_f32_block(int64_t K);
#define beamserve_f32_packed_floats BEAMSERVE_LEVELED(beamserve_f32_packed_floats)
int64_t beamserve_f32_packed_floats(int64_t N, int64_t K);
#define beamserve_f32_pack BEAMSERVE_LEVELED(beamserve_f32_pack)
void beamserve_f32_pack(const float *w, int64_t N, int64_t K, float *packed);
#define beamserve_f32_linear BEAMSERVE_LEVELED(beamserve_f32_linear)
int beamserve_f32_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed, int64_t N,
                         const float *bias, const float *res, int64_t ldr, float *y, int64_t ldy);
#define beamserve_f32_swish BEAMSERVE_LEVELED(beamserve_f32_swish)
int beamserve_f32_swish(float *x, int64_t n);

/* Row passes with ATen's bits (layer_norm.c, silu.c, search.c): rows x cols, row stride ld where given. */
#define beamserve_layer_norm BEAMSERVE_LEVELED(beamserve_layer_norm)
void beamserve_layer_norm(const float *x, int64_t rows, int64_t N, const float *gamma, const float *beta, float eps,
                          float *y);
#define beamserve_silu BEAMSERVE_LEVELED(beamserve_silu)
void beamserve_silu(float *x, int64_t n);
#define beamserve_log_softmax BEAMSERVE_LEVELED(beamserve_log_softmax)
void beamserve_log_softmax(float *x, int64_t rows, int64_t cols, int64_t ld);
#define beamserve_scale_back_log_softmax BEAMSERVE_LEVELED(beamserve_scale_back_log_softmax)
void beamserve_scale_back_log_softmax(const int32_t *acc, int64_t rows, int64_t cols, const float *col_scale,
                                      const float *row_scale, const float *bias, float *y);
#define beamserve_rescale_log_softmax BEAMSERVE_LEVELED(beamserve_rescale_log_softmax)
void beamserve_rescale_log_softmax(float *y, int64_t rows, int64_t cols, const float *row_scale, const float *bias);

/* A decode step's attention (attention.c): queries (N, H, D) against keys and values of R rows of H heads of T
 * positions (strides sN, sH, sT); the source rows each query reads through rows (rN, rT strides) or its own. */
#define beamserve_attend BEAMSERVE_LEVELED(beamserve_attend)
int beamserve_attend(const float *q, const float *k, const float *v, int64_t N, int64_t H, int64_t D, int64_t sN,
                     int64_t sH, int64_t sT, int64_t R, int64_t T, const int64_t *lengths, int64_t length,
                     const int64_t *rows, int64_t rs, int64_t ts, int64_t rN, int64_t rT, float scale, float *out);
#define beamserve_self_attend_step BEAMSERVE_LEVELED(beamserve_self_attend_step)
int beamserve_self_attend_step(const float *qkv, int64_t sq, int64_t N, int64_t H, int64_t D, float *k, float *v,
                               int64_t sN, int64_t sH, int64_t sT, int64_t R, int64_t T, const int64_t *positions,
                               int64_t pos, int64_t *lineage, int64_t lN, int64_t lT, int64_t rN, int64_t rT,
                               float scale, float *out);
#define beamserve_follow BEAMSERVE_LEVELED(beamserve_follow)
int beamserve_follow(int64_t *lineage, int64_t rN, int64_t rT, int64_t lN, int64_t t, const int64_t *rows, int64_t n);
#define beamserve_copy_rows BEAMSERVE_LEVELED(beamserve_copy_rows)
int beamserve_copy_rows(float *k, float *v, int64_t L, int64_t R, int64_t H, int64_t T, int64_t D, int64_t sL,
                        int64_t sN, int64_t sH, int64_t t, const int64_t *dest, const int64_t *src, int64_t n);

/* The beam search's passes (search.c): log-probabilities lp (batch * K, V) of K beams a sentence. */
#define beamserve_top_candidates BEAMSERVE_LEVELED(beamserve_top_candidates)
int beamserve_top_candidates(const float *lp, const float *run, int64_t batch, int64_t K, int64_t V, int64_t n,
                             float *scores, int64_t *beam, int64_t *token);
#define beamserve_beam_step BEAMSERVE_LEVELED(beamserve_beam_step)
int beamserve_beam_step(const float *lp, int64_t V, const beamserve_beams *beams, const int64_t *pos,
                        const float *norm, beamserve_beam_answer *answer);
#define beamserve_beam_advance BEAMSERVE_LEVELED(beamserve_beam_advance)
int beamserve_beam_advance(float *lp, int64_t V, const beamserve_beams *beams, const beamserve_rules *rules,
                           const int64_t *positions, int64_t pos, const float *norms, float norm,
                           beamserve_beam_answer *answer);

/* Sublayers, layers and steps in one call (sublayers.c, beam_steps.c), over the structs above. */
#define beamserve_linear_forward BEAMSERVE_LEVELED(beamserve_linear_forward)
int beamserve_linear_forward(const beamserve_linear_c *w, const float *x, int64_t M, const float *res, float *y);
#define beamserve_self_sublayer BEAMSERVE_LEVELED(beamserve_self_sublayer)
int beamserve_self_sublayer(const float *x, const float *res, int64_t N, const beamserve_linear_c *qkv,
                            const beamserve_linear_c *out, const beamserve_kv *kv, const int64_t *positions,
                            int64_t pos, float *y);
#define beamserve_cross_sublayer BEAMSERVE_LEVELED(beamserve_cross_sublayer)
int beamserve_cross_sublayer(const float *x, const float *res, int64_t N, const beamserve_linear_c *q,
                             const beamserve_linear_c *out, const beamserve_kv *kv, const beamserve_source_map *map,
                             float *y);
#define beamserve_decoder_segment BEAMSERVE_LEVELED(beamserve_decoder_segment)
int beamserve_decoder_segment(const beamserve_layer_c *ending, const float *h, const beamserve_layer_c *layer,
                              const beamserve_kv *own, const beamserve_kv *source, const int64_t *positions,
                              int64_t pos, const beamserve_source_map *map, int64_t N, int64_t C, float *x, float *u,
                              float *f);
#define beamserve_decoder_layers BEAMSERVE_LEVELED(beamserve_decoder_layers)
int beamserve_decoder_layers(const beamserve_layer_c *const *layers, const beamserve_kv *const *own,
                             const beamserve_kv *const *source, int64_t L, const int64_t *positions, int64_t pos,
                             const beamserve_source_map *map, int64_t N, int64_t C, float *x,
                             const beamserve_linear_c *out, float *logp);
#define beamserve_encoder_segment BEAMSERVE_LEVELED(beamserve_encoder_segment)
int beamserve_encoder_segment(const beamserve_layer_c *ending, const float *h, const beamserve_layer_c *layer,
                              int64_t B, int64_t S, int64_t H, const beamserve_source_map *map, float scale, int64_t N,
                              int64_t C, float *x, float *u, float *f);
#define beamserve_encoder_layers BEAMSERVE_LEVELED(beamserve_encoder_layers)
int beamserve_encoder_layers(const beamserve_layer_c *const *layers, int64_t L, int64_t H, int64_t B, int64_t S,
                             const beamserve_source_map *map, float scale, int64_t N, int64_t C, float *x);
#define beamserve_embed BEAMSERVE_LEVELED(beamserve_embed)
int beamserve_embed(const int64_t *tokens, int64_t N, const float *weight, int64_t V, int64_t C, float scale,
                    const float *at, int64_t at_stride, float *x);
#define beamserve_beam_steps BEAMSERVE_LEVELED(beamserve_beam_steps)
int beamserve_beam_steps(const beamserve_decoder *decoder, const beamserve_beams *beams, const beamserve_rules *rules,
                         const float *at, const float *norms, int64_t *tokens, int64_t pos0, int64_t steps, float *x,
                         float *logp, beamserve_beam_answer *answer, int64_t *ran);
#endif
