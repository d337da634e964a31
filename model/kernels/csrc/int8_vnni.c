/* An int8 linear layer with AVX-512 VNNI (Intel since Cascade Lake, AMD since Zen 4): the activation rows
 * quantised, multiplied by a weight packed once at load, and scaled back, in one call (model/kernels/quant.py).
 *
 * vpdpbusd multiplies unsigned by signed bytes and adds each four products into a 32-bit lane without
 * saturating, so the activations are taken as x + 128 (1..255) and the weight's column sums times 128 are
 * taken off at the end: sum((x + 128) w) - 128 sum(w) = sum(x w), the exact int32 product, as
 * torch._int_mm gives it. The scale-back is int8_rows.c's formula in the same operations, so the result has
 * the bits of the other int8 paths whichever kernel a batch's size picks.
 *
 * The packed weight: panels of 16 output columns; in a panel, groups of 4 along K, each group 64 bytes (the
 * 4 values of column 0, then of column 1, ...), so one load feeds one vpdpbusd for 16 columns. Zeros pad N
 * to a whole panel and K to a whole group.
 *
 * Where the CPU has AVX2 and no VNNI, the entry points multiply the same packed weight with int8_avx2.c's kernel. */
#include "beamserve.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512BW__)
#include <immintrin.h>

#include "quantize.h"
#define HAS_VNNI 1
#define VNNI_FN static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define VNNI_ENTRY __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#else
#define HAS_VNNI 0
#endif
#if HAS_VNNI && defined(__x86_64__) && defined(__linux__) && (defined(__clang__) || __GNUC__ >= 11)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define HAS_AMX 1
#define AMX_FN static __attribute__((noinline, target("avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")))
#else
#define HAS_AMX 0
#endif

#define PANEL 16 /* output columns a panel: one vector of int32 sums */
#define MR 4     /* activation rows a tile */
#define NP 4     /* panels a tile: MR x NP sums in registers, NP weight loads feeding MR x NP products */

static int64_t groups(int64_t K) { return (K + 3) / 4; }
static int64_t panels(int64_t N) { return (N + PANEL - 1) / PANEL; }

static int has_vnni(void) {
#if HAS_VNNI && defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

/* Which kernel multiplies a packed weight here: 2 this file's (the build has it and this CPU runs AVX-512 VNNI),
 * 3 int8_avx2.c's with AVX-VNNI, 1 int8_avx2.c's with AVX2 alone, 0 none. */
int beamserve_vnni(void) {
    if (has_vnni()) return 2;
#if defined(__AVX2__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) return 0;
    return beamserve_avx_vnni() ? 3 : 1;
#else
    return 0;
#endif
}

/* Bytes of the packed form of an (N, K) weight. */
int64_t beamserve_vnni_packed_bytes(int64_t N, int64_t K) { return panels(N) * groups(K) * 4 * PANEL; }

/* w (N, K) int8 contiguous -> packed (beamserve_vnni_packed_bytes) and comp (N,): 128 times each row's sum. */
void beamserve_vnni_pack(const int8_t *w, int64_t N, int64_t K, int8_t *packed, int32_t *comp) {
    const int64_t G = groups(K);
    memset(packed, 0, (size_t)beamserve_vnni_packed_bytes(N, K));
    for (int64_t n = 0; n < N; n++) {
        int32_t sum = 0;
        int8_t *panel = packed + (n / PANEL) * G * 4 * PANEL + (n % PANEL) * 4;
        for (int64_t k = 0; k < K; k++) {
            panel[(k / 4) * 4 * PANEL + k % 4] = w[n * K + k];
            sum += w[n * K + k];
        }
        comp[n] = 128 * sum;
    }
}

#if HAS_VNNI
/* rows x np panels of sums over every group: xu's rows (row stride 4 G bytes) against the panels at w. */
VNNI_FN void tile(const uint8_t *xu, int64_t G, const int8_t *w, int rows, int np, __m512i acc[MR][NP]) {
    __m512i c[MR][NP]; /* the sums in a local array, which the compiler keeps in registers (acc[] it stores each g) */
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < np; p++) c[r][p] = _mm512_setzero_si512();
    for (int64_t g = 0; g < G; g++) {
        __m512i b[NP];
        for (int p = 0; p < np; p++) b[p] = _mm512_loadu_si512(w + (p * G + g) * 4 * PANEL);
        for (int r = 0; r < rows; r++) {
            int32_t four;
            memcpy(&four, xu + r * G * 4 + g * 4, 4);
            const __m512i a = _mm512_set1_epi32(four);
            for (int p = 0; p < np; p++) c[r][p] = _mm512_dpbusd_epi32(c[r][p], a, b[p]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < np; p++) acc[r][p] = c[r][p];
}

/* One tile's sums, less the compensation, as int32 (out_i32) or scaled back as int8_rows.c's
 * beamserve_scale_back does it: (float)acc * col_scale, then * row_scale + bias in one rounding. */
VNNI_FN void finish(__m512i acc[MR][NP], int rows, int np, int64_t n0, int64_t N, const int32_t *comp,
                    const float *col_scale, const float *row_scale, const float *bias, const float *res, int64_t ldr,
                    int32_t *out_i32, float *out, int64_t ldy) {
    for (int p = 0; p < np; p++) {
        const int64_t n = n0 + p * PANEL;
        const __mmask16 m = N - n >= PANEL ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n)) - 1);
        const __m512i c = _mm512_maskz_loadu_epi32(m, comp + n);
        __m512 cs = _mm512_setzero_ps(), bs = _mm512_setzero_ps();
        if (out) cs = _mm512_maskz_loadu_ps(m, col_scale + n);
        if (out && bias) bs = _mm512_maskz_loadu_ps(m, bias + n);
        for (int r = 0; r < rows; r++) {
            const __m512i exact = _mm512_sub_epi32(acc[r][p], c);
            if (!out) {
                _mm512_mask_storeu_epi32(out_i32 + r * ldy + n, m, exact);
                continue;
            }
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), cs);
            const __m512 rs = _mm512_set1_ps(row_scale[r]);
            __m512 y = bias ? _mm512_fmadd_ps(t, rs, bs) : _mm512_mul_ps(t, rs);
            if (res) y = _mm512_add_ps(_mm512_maskz_loadu_ps(m, res + r * ldr + n), y); /* the residual, its own rounding */
            _mm512_mask_storeu_ps(out + r * ldy + n, m, y);
        }
    }
}

#if HAS_AMX
/* AMX (Intel since Sapphire Rapids): tdpbusd multiplies 16 rows of 64 unsigned bytes by 64 x 16 signed bytes into
 * 16 x 16 int32 sums, the products a VNNI panel's vpdpbusd makes, summed exactly; its B operand is 16 of the packed
 * weight's 64-byte groups, so the weight is read as packed. Linux lends a process the tile registers once asked
 * (arch_prctl ARCH_REQ_XCOMP_PERM); where the CPU, the OS or the call says no, the VNNI loop serves. */
static int amx_state = -1; /* -1: not asked yet */
static int amx_allowed = 1; /* native.py clears it for BEAMSERVE_NATIVE_KERNELS=x86-64-v4: VNNI alone */

static int amx_ready(void) {
    if (!amx_allowed) return 0;
    if (amx_state < 0) {
        unsigned a, b, c, d, lo, hi;
        int ok = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 25 & 1); /* AMX-TILE, AMX-INT8 */
        if (ok) {
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            ok = (lo >> 17 & 3) == 3 && syscall(SYS_arch_prctl, 0x1023, 18) == 0; /* XTILECFG, XTILEDATA */
        }
        amx_state = ok;
    }
    return amx_state;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* gemm() for xu's first M16 rows (a multiple of 16; G a multiple of 16): each 32 x 32 block of sums made by the
 * tiles and finished at once, while it is in cache. Tiles 0-1: two blocks of 16 rows; 2-3: two panels; 4-7: their
 * four products. The caller's tile configuration (oneDNN's, on this thread) is put back after. */
AMX_FN void amx_gemm(const uint8_t *xu, int64_t M16, int64_t G, const int8_t *packed, const int32_t *comp, int64_t N,
                     const float *col_scale, const float *row_scale, const float *bias, const float *res, int64_t ldr,
                     int32_t *out_i32, float *out, int64_t ldy) {
    const int64_t P = panels(N);
    int32_t c[32 * 32]; /* a block's sums: 32 rows of two panels */
    tile_config saved, config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) config.rows[t] = 16, config.colsb[t] = 64;
    _tile_storeconfig(&saved);
    _tile_loadconfig(&config);
    const int64_t lda = 4 * G;
    for (int64_t p = 0; p < P; p += 2) { /* two panels' weight (8 KB at K = 256) stay in cache over every row */
        const int two_p = p + 1 < P;
        const int8_t *w0 = packed + p * G * 64, *w1 = w0 + G * 64;
        for (int64_t m = 0; m < M16; m += 32) {
            const int two_m = m + 16 < M16;
            const uint8_t *x0 = xu + m * lda, *x1 = x0 + 16 * lda;
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            _tile_zero(7);
            for (int64_t g = 0; g < G; g += 16) {
                _tile_loadd(0, x0 + 4 * g, lda);
                _tile_loadd(2, w0 + g * 64, 64);
                _tile_dpbusd(4, 0, 2);
                if (two_p) {
                    _tile_loadd(3, w1 + g * 64, 64);
                    _tile_dpbusd(5, 0, 3);
                }
                if (two_m) {
                    _tile_loadd(1, x1 + 4 * g, lda);
                    _tile_dpbusd(6, 1, 2);
                    if (two_p) _tile_dpbusd(7, 1, 3);
                }
            }
            _tile_stored(4, c, 128);
            _tile_stored(5, c + 16, 128);
            _tile_stored(6, c + 512, 128);
            _tile_stored(7, c + 512 + 16, 128);
            for (int64_t r0 = 0; r0 < (two_m ? 32 : 16); r0 += MR) {
                const int64_t m0 = m + r0;
                __m512i acc[MR][NP];
                for (int r = 0; r < MR; r++)
                    for (int q = 0; q < 2; q++) acc[r][q] = _mm512_loadu_si512(c + (r0 + r) * 32 + q * 16);
                finish(acc, MR, two_p ? 2 : 1, p * PANEL, N, comp, col_scale, row_scale ? row_scale + m0 : NULL, bias,
                       res ? res + m0 * ldr : NULL, ldr, out_i32 ? out_i32 + m0 * ldy : NULL,
                       out ? out + m0 * ldy : NULL, ldy);
            }
        }
    }
    if (saved.palette)
        _tile_loadconfig(&saved);
    else
        _tile_release();
}
#endif
#endif

/* Whether the kernels multiply whole blocks of 16 rows with AMX here (the CPU has it, Linux lends its tiles and
 * beamserve_amx_allow has not turned it off). */
int beamserve_vnni_amx(void) {
#if HAS_AMX
    return has_vnni() && amx_ready();
#else
    return 0;
#endif
}

/* Whether AMX may serve (1, the default) or VNNI's vpdpbusd alone (0: what a CPU without AMX computes). */
void beamserve_amx_allow(int allowed) {
#if HAS_AMX
    amx_allowed = allowed;
#else
    (void)allowed;
#endif
}

#if HAS_VNNI
/* xu (M, 4 G) unsigned bytes against the packed weight: y (M, N) with row stride ldy, as finish() writes. A
 * block of NP panels (16 KB of weight at K = 256) stays in cache while every row tile passes it. With AMX, the
 * whole blocks of 16 rows go to amx_gemm, the rest (fewer than 16) through the VNNI tiles. */
VNNI_FN void gemm(const uint8_t *xu, int64_t M, int64_t G, const int8_t *packed, const int32_t *comp, int64_t N,
                  const float *col_scale, const float *row_scale, const float *bias, const float *res, int64_t ldr,
                  int32_t *out_i32, float *out, int64_t ldy) {
    const int64_t P = panels(N);
    int64_t M16 = 0; /* rows AMX multiplied */
#if HAS_AMX
    if (M >= 16 && G % 16 == 0 && amx_ready()) {
        M16 = M / 16 * 16;
        amx_gemm(xu, M16, G, packed, comp, N, col_scale, row_scale, bias, res, ldr, out_i32, out, ldy);
    }
#endif
    for (int64_t p0 = 0; p0 < P; p0 += NP) {
        const int np = P - p0 < NP ? (int)(P - p0) : NP;
        const int8_t *w = packed + p0 * G * 4 * PANEL;
        for (int64_t m0 = M16; m0 < M; m0 += MR) {
            const int rows = M - m0 < MR ? (int)(M - m0) : MR;
            __m512i acc[MR][NP];
            const uint8_t *x = xu + m0 * G * 4;
            /* constant tile sizes wherever the panels are whole, so the compiler keeps the sums in registers */
            if (np < NP)
                tile(x, G, w, rows, np, acc);
            else if (rows == 4)
                tile(x, G, w, 4, NP, acc);
            else if (rows == 3)
                tile(x, G, w, 3, NP, acc);
            else if (rows == 2)
                tile(x, G, w, 2, NP, acc);
            else
                tile(x, G, w, 1, NP, acc);
            finish(acc, rows, np, p0 * PANEL, N, comp, col_scale, row_scale ? row_scale + m0 : NULL, bias,
                   res ? res + m0 * ldr : NULL, ldr, out_i32 ? out_i32 + m0 * ldy : NULL, out ? out + m0 * ldy : NULL,
                   ldy);
        }
    }
}
#endif

/* x (M, K) int8 with row stride ldx against the packed (N, K) weight -> y (M, N) int32 contiguous, the exact
 * product x @ w^T (as torch._int_mm). Returns 0; -1 where this build or CPU has no kernel, -2 without memory. */
#if HAS_VNNI
VNNI_ENTRY
#endif
int beamserve_vnni_int8_gemm(const int8_t *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed,
                             const int32_t *comp, int64_t N, int32_t *y) {
    if (!has_vnni()) return beamserve_avx2_int8_gemm(x, M, K, ldx, packed, comp, N, y);
#if HAS_VNNI
    const int64_t G = groups(K);
    uint8_t *xu = malloc((size_t)(M * G * 4 + 1));
    if (!xu) return -2;
    copy_rows_padded(x, M, K, ldx, (int8_t *)xu, G * 4, 0x80); /* x + 128 as unsigned bytes */
    gemm(xu, M, G, packed, comp, N, NULL, NULL, NULL, NULL, 0, y, NULL, N);
    free(xu);
    return 0;
#else
    (void)comp;
    return -1;
#endif
}

/* The int8 linear layer: x (M, K) float32 with row stride ldx, each row quantised on its own scale (as
 * int8_rows.c's beamserve_quantize_rows), multiplied by the packed (N, K) weight, and scaled back by the row's
 * scale and the columns' col_scale (N,), plus bias (N,) where given, then plus res (M, N; row stride ldr) where
 * given -> y (M, N) float32 with row stride ldy. The bits of beamserve_quantize_rows, an exact int8 GEMM,
 * beamserve_scale_back and a float addition in turn. Returns 0; -1 where this build or CPU has no kernel, -2
 * without memory. */
#if HAS_VNNI
VNNI_ENTRY
#endif
int beamserve_vnni_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const int8_t *packed,
                          const int32_t *comp, int64_t N, const float *col_scale, const float *bias, const float *res,
                          int64_t ldr, float *y, int64_t ldy) {
    if (!has_vnni()) return beamserve_avx2_linear(x, M, K, ldx, packed, comp, N, col_scale, bias, res, ldr, y, ldy);
#if HAS_VNNI
    const int64_t G = groups(K);
    uint8_t *xu = malloc((size_t)(M * G * 4 + (int64_t)sizeof(float) * M)); /* the rows, then their scales */
    if (!xu) return -2;
    float *row_scale = (float *)(xu + M * G * 4);
    quantize_rows_padded(x, M, K, ldx, (int8_t *)xu, G * 4, row_scale, 0x80); /* x + 128 as unsigned bytes */
    gemm(xu, M, G, packed, comp, N, col_scale, row_scale, bias, res, ldr, NULL, y, ldy);
    free(xu);
    return 0;
#else
    (void)comp;
    return -1;
#endif
}
