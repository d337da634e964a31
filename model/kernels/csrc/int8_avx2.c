/* The packed int8 linear layer (int8_vnni.c's weight layout and entry points) for CPUs with AVX2 and no VNNI: AMD's
 * Zen 2 and 3, Intel's before Cascade Lake, and AVX-512 CPUs without VNNI (Skylake-SP).
 *
 * AVX2 multiplies bytes only as unsigned by signed with vpmaddubsw, whose two-product sums saturate at 16 bits:
 * (x + 128) w would, as oneDNN's AVX2 kernel does. Here the signed activation's sign moves onto the weight instead
 * (vpsignb) and its magnitude is the unsigned operand: |x| <= 128 and |w| <= 127 (a weight holding -128 is not
 * packed for this kernel: native.VnniWeight), so a pair sums to at most 2 x 128 x 127 = 32,512 and never
 * saturates; vpmaddwd by ones then adds the pairs into 32 bits. The product is exact, so the bits are every other
 * int8 kernel's, and the scale-back is int8_rows.c's formula in the same operations.
 *
 * A group of 4 along K of a 16-column panel is 64 bytes: two vectors, columns 0-7 and 8-15, each four products of
 * a column per 32-bit lane after vpmaddwd.
 *
 * Where the CPU has AVX-VNNI (AVX-512 VNNI's vpdpbusd on 256-bit registers, without AVX-512: Intel's cores since
 * Alder Lake, its E-core Xeons), one vpdpbusd makes what those four instructions make, and the layer is
 * int8_vnni.c's form at half the width: x + 128 as unsigned bytes, the weight's column sums times 128 taken off. */
#include "beamserve.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__)
#include <cpuid.h>
#include <immintrin.h>

#include "quantize.h"

#define PANEL 16 /* output columns a panel, as int8_vnni.c packs them */
#define MR 4 /* activation rows a tile: each weight load feeds 4 rows */

static inline int64_t groups(int64_t K) { return (K + 3) / 4; }

static int avx_vnni_allowed = 1; /* native.py clears it for BEAMSERVE_NATIVE_KERNELS=x86-64-v3: AVX2 alone */
static int avx_vnni_cpu = -1;    /* -1: not asked yet (cpuid, which a virtual machine's host answers slowly) */

static int has_avx_vnni(void) {
    if (avx_vnni_cpu < 0) {
        unsigned a, b, c, d;
        avx_vnni_cpu = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
    }
    return avx_vnni_allowed && avx_vnni_cpu;
}

/* rows x one half of the panel at w (8 columns) of sums over every group: xs's signed rows and xa's magnitudes (row
 * stride 4 G bytes). Both halves at once would hold more sums than AVX2 has registers for. */
static inline __attribute__((always_inline)) void tile(const int8_t *xs, const uint8_t *xa, int64_t G,
                                                       const int8_t *w, int rows, __m256i acc[MR]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i c[MR]; /* the sums in a local array, which the compiler keeps in registers (acc[] it stores each g) */
    for (int r = 0; r < rows; r++) c[r] = _mm256_setzero_si256();
    for (int64_t g = 0; g < G; g++) {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(w + g * 4 * PANEL));
        for (int r = 0; r < rows; r++) {
            int32_t s4, a4;
            memcpy(&s4, xs + r * G * 4 + g * 4, 4);
            memcpy(&a4, xa + r * G * 4 + g * 4, 4);
            const __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi32(a4), _mm256_sign_epi8(b, _mm256_set1_epi32(s4)));
            c[r] = _mm256_add_epi32(c[r], _mm256_madd_epi16(p, ones));
        }
    }
    for (int r = 0; r < rows; r++) acc[r] = c[r];
}

/* Lanes [0, n) of 8 set (n <= 8), for the masked loads and stores of a panel's last columns. */
static inline __m256i first(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* One tile's sums (columns n of N onward, at most 8) as int32 (out_i32) or scaled back as int8_rows.c's
 * beamserve_scale_back does it: (float)acc * col_scale, then * row_scale + bias in one rounding, then + res. */
static inline void finish(__m256i acc[MR], int rows, int64_t n, int64_t N, const int32_t *comp,
                          const float *col_scale, const float *row_scale, const float *bias, const float *res,
                          int64_t ldr, int32_t *out_i32, float *out, int64_t ldy) {
    const __m256i m = first(N - n);
    if (comp) { /* AVX-VNNI's sums of x + 128: the column sums times 128 off */
        const __m256i cm = _mm256_maskload_epi32(comp + n, m);
        for (int r = 0; r < rows; r++) acc[r] = _mm256_sub_epi32(acc[r], cm);
    }
    __m256 cs = _mm256_setzero_ps(), bs = _mm256_setzero_ps();
    if (out) cs = _mm256_maskload_ps(col_scale + n, m);
    if (out && bias) bs = _mm256_maskload_ps(bias + n, m);
    for (int r = 0; r < rows; r++) {
        if (!out) {
            _mm256_maskstore_epi32(out_i32 + r * ldy + n, m, acc[r]);
            continue;
        }
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r]), cs);
        const __m256 rs = _mm256_set1_ps(row_scale[r]);
        __m256 y = bias ? _mm256_fmadd_ps(t, rs, bs) : _mm256_mul_ps(t, rs);
        if (res) y = _mm256_add_ps(_mm256_maskload_ps(res + r * ldr + n, m), y); /* its own rounding */
        _mm256_maskstore_ps(out + r * ldy + n, m, y);
    }
}

/* xs, xa (M rows of 4 G bytes) against the packed weight: y (M, N) with row stride ldy, as finish() writes. A
 * panel's weight (16 KB at K = 1,024) stays in cache while every row tile passes it. */
static void gemm(const int8_t *xs, const uint8_t *xa, int64_t M, int64_t G, const int8_t *packed, int64_t N,
                 const float *col_scale, const float *row_scale, const float *bias, const float *res, int64_t ldr,
                 int32_t *out_i32, float *out, int64_t ldy) {
    for (int64_t n = 0; n < N; n += 8) { /* a half panel: its weight is every other 32 bytes of the panel's */
        const int8_t *w = packed + (n / PANEL) * G * 4 * PANEL + (n % PANEL) * 4;
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int rows = M - m0 < MR ? (int)(M - m0) : MR;
            __m256i acc[MR];
            const int8_t *s = xs + m0 * G * 4;
            const uint8_t *a = xa + m0 * G * 4;
            /* constant row counts, so the compiler keeps the sums in registers */
            if (rows == MR)
                tile(s, a, G, w, MR, acc);
            else if (rows == 3)
                tile(s, a, G, w, 3, acc);
            else if (rows == 2)
                tile(s, a, G, w, 2, acc);
            else
                tile(s, a, G, w, 1, acc);
            finish(acc, rows, n, N, NULL, col_scale, row_scale ? row_scale + m0 : NULL, bias,
                   res ? res + m0 * ldr : NULL, ldr, out_i32 ? out_i32 + m0 * ldy : NULL, out ? out + m0 * ldy : NULL,
                   ldy);
        }
    }
}

/* Each row's magnitudes beside its signed bytes (already padded with zeros to 4 G). */
static void magnitudes(const int8_t *xs, int64_t bytes, uint8_t *xa) {
    int64_t i = 0;
    for (; i + 32 <= bytes; i += 32)
        _mm256_storeu_si256((__m256i *)(xa + i), _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(xs + i))));
    for (; i < bytes; i++) xa[i] = (uint8_t)(xs[i] < 0 ? -xs[i] : xs[i]); /* -128 -> 128 */
}

#define AVX_VNNI_FN static inline __attribute__((always_inline, target("avxvnni")))

#define VP 4 /* panels a block: a tile of few rows spans several, so that enough sums are in flight */

/* rows x np whole panels from w (two vectors of 8 columns each) of sums over every group, xu's unsigned rows (row
 * stride 4 G bytes): a row's broadcast and a group's weight loads feed one vpdpbusd per vector. A vpdpbusd waits
 * for its sum's last one, so a tile keeps 6 to 8 sums going: 4 rows of one panel, 2 of two, 1 of four. */
AVX_VNNI_FN void vnni_tile(const uint8_t *xu, int64_t G, const int8_t *w, int rows, int np, __m256i acc[2 * VP][MR]) {
    __m256i c[2 * VP][MR]; /* in registers, as tile()'s */
    for (int v = 0; v < 2 * np; v++)
        for (int r = 0; r < rows; r++) c[v][r] = _mm256_setzero_si256();
    for (int64_t g = 0; g < G; g++) {
        __m256i b[2 * VP];
        for (int v = 0; v < 2 * np; v++)
            b[v] = _mm256_loadu_si256((const __m256i *)(w + ((v / 2) * G + g) * 4 * PANEL + (v % 2) * 32));
        for (int r = 0; r < rows; r++) {
            int32_t four;
            memcpy(&four, xu + r * G * 4 + g * 4, 4);
            const __m256i a = _mm256_set1_epi32(four);
            for (int v = 0; v < 2 * np; v++) c[v][r] = _mm256_dpbusd_avx_epi32(c[v][r], a, b[v]);
        }
    }
    for (int v = 0; v < 2 * np; v++)
        for (int r = 0; r < rows; r++) acc[v][r] = c[v][r];
}

/* gemm() with AVX-VNNI: xu (M rows of 4 G bytes, x + 128) against the packed weight and its column sums comp. A
 * block of VP panels (16 KB of weight at K = 256) stays in cache while every row tile passes it. */
__attribute__((noinline, target("avxvnni"))) static void vnni_gemm(
    const uint8_t *xu, int64_t M, int64_t G, const int8_t *packed, const int32_t *comp, int64_t N,
    const float *col_scale, const float *row_scale, const float *bias, const float *res, int64_t ldr,
    int32_t *out_i32, float *out, int64_t ldy) {
    const int64_t P = (N + PANEL - 1) / PANEL;
    for (int64_t p0 = 0; p0 < P; p0 += VP) {
        const int block = P - p0 < VP ? (int)(P - p0) : VP;
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int rows = M - m0 < MR ? (int)(M - m0) : MR;
            const int per = rows >= 3 ? 1 : rows == 2 ? 2 : 4; /* panels a tile */
            const uint8_t *x = xu + m0 * G * 4;
            for (int p = 0; p < block; p += per) {
                const int np = block - p < per ? block - p : per;
                const int8_t *w = packed + (p0 + p) * G * 4 * PANEL;
                __m256i acc[2 * VP][MR];
                /* constant shapes wherever the block is whole, so the compiler keeps the sums in registers */
                if (rows == 4 && np == 1)
                    vnni_tile(x, G, w, 4, 1, acc);
                else if (rows == 3 && np == 1)
                    vnni_tile(x, G, w, 3, 1, acc);
                else if (rows == 2 && np == 2)
                    vnni_tile(x, G, w, 2, 2, acc);
                else if (rows == 1 && np == 4)
                    vnni_tile(x, G, w, 1, 4, acc);
                else
                    vnni_tile(x, G, w, rows, np, acc);
                for (int v = 0; v < 2 * np; v++) {
                    const int64_t n = (p0 + p) * PANEL + 8 * v;
                    if (n >= N) break;
                    finish(acc[v], rows, n, N, comp, col_scale, row_scale ? row_scale + m0 : NULL, bias,
                           res ? res + m0 * ldr : NULL, ldr, out_i32 ? out_i32 + m0 * ldy : NULL,
                           out ? out + m0 * ldy : NULL, ldy);
                }
            }
        }
    }
}
#endif

/* 1 where the packed weight is multiplied with AVX-VNNI here (the build has AVX2, the CPU AVX-VNNI, and
 * beamserve_avx_vnni_allow has not turned it off), else 0. */
int beamserve_avx_vnni(void) {
#if defined(__AVX2__)
    return has_avx_vnni();
#else
    return 0;
#endif
}

/* Whether AVX-VNNI may serve (1, the default) or AVX2's products alone (0: what a CPU without it computes). */
void beamserve_avx_vnni_allow(int allowed) {
#if defined(__AVX2__)
    avx_vnni_allowed = allowed;
#else
    (void)allowed;
#endif
}

/* x (M, K) int8 with row stride ldx against the packed (N, K) weight -> y (M, N) int32 contiguous, the exact
 * product. Returns 0; -1 where this build has no AVX2, -2 without memory. */
int beamserve_avx2_int8_gemm(const int8_t *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed,
                             const int32_t *comp, int64_t N, int32_t *y) {
#if defined(__AVX2__)
    const int64_t G = groups(K);
    const int vnni = has_avx_vnni();
    int8_t *xs = malloc((size_t)(M * G * 8 + 1));
    if (!xs) return -2;
    copy_rows_padded(x, M, K, ldx, xs, G * 4, vnni ? 0x80 : 0); /* x + 128 as unsigned bytes for VNNI */
    if (vnni) {
        vnni_gemm((const uint8_t *)xs, M, G, packed, comp, N, NULL, NULL, NULL, NULL, 0, y, NULL, N);
        free(xs);
        return 0;
    }
    uint8_t *xa = (uint8_t *)xs + M * G * 4;
    magnitudes(xs, M * G * 4, xa);
    gemm(xs, xa, M, G, packed, N, NULL, NULL, NULL, NULL, 0, y, NULL, N);
    free(xs);
    return 0;
#else
    (void)x, (void)M, (void)K, (void)ldx, (void)packed, (void)comp, (void)N, (void)y;
    return -1;
#endif
}

/* The int8 linear layer of beamserve_vnni_linear (int8_vnni.c), the same arguments (the column sums serve AVX-VNNI's
 * shifted bytes), the same bits. Returns 0; -1 where this build has no AVX2, -2 without memory. */
int beamserve_avx2_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed,
                          const int32_t *comp, int64_t N, const float *col_scale, const float *bias, const float *res,
                          int64_t ldr, float *y, int64_t ldy) {
#if defined(__AVX2__)
    const int64_t G = groups(K);
    const int vnni = has_avx_vnni();
    int8_t *xs = malloc((size_t)(M * G * 8 + (int64_t)sizeof(float) * M)); /* the rows, magnitudes, scales */
    if (!xs) return -2;
    uint8_t *xa = (uint8_t *)xs + M * G * 4;
    float *row_scale = (float *)(xa + M * G * 4);
    quantize_rows_padded(x, M, K, ldx, xs, G * 4, row_scale, vnni ? 0x80 : 0); /* x + 128 for VNNI */
    if (vnni) {
        vnni_gemm((const uint8_t *)xs, M, G, packed, comp, N, col_scale, row_scale, bias, res, ldr, NULL, y, ldy);
        free(xs);
        return 0;
    }
    magnitudes(xs, M * G * 4, xa);
    gemm(xs, xa, M, G, packed, N, col_scale, row_scale, bias, res, ldr, NULL, y, ldy);
    free(xs);
    return 0;
#else
    (void)x, (void)M, (void)K, (void)ldx, (void)packed, (void)comp, (void)N, (void)col_scale, (void)bias, (void)res,
        (void)ldr, (void)y, (void)ldy;
    return -1;
#endif
}
