/* SiLU in place with ATen's bits (torch.nn.functional.silu on CPU, float32): x / (1 + exp(-x)) lane by lane.
 * ATen's vectorised loop takes whole pairs of vectors (2 x 16 lanes with AVX-512, 2 x 8 with AVX2), with SLEEF's
 * expf of 1-ulp accuracy, and the lanes past the last pair one by one with the C library's expf; so does this
 * kernel, at the vector width of the level it is built for (beamserve.h). The exponential, step by step as SLEEF
 * computes it: q = the integer nearest x log2(e); s = x - q ln2, with ln2 in a high and a low part, each a fused
 * multiply-add; a degree-5 polynomial u in s; 1 + (s^2 u + s), scaled by 2^q in two halves (no overflow of the
 * exponent field); 0 below -104, infinity above 100.
 *
 * A model computes with it only where it gives torch's bits on the process's own ATen, whose vector width
 * ATEN_CPU_CAPABILITY may set apart from this library's: model/kernels/native.py's silu_exactly compares the two
 * over values from every binade and a tail of each length, and torch's op serves where they differ. */
#include "beamserve.h"
#include <math.h>
#include <stdint.h>
#include "vreg.h"

#define LOG2E 1.442695040888963407359924681001892137426645954152985934135449406931f
#define LN2_HI 0.693145751953125f
#define LN2_LO 1.428606765330187045e-06f
#define P5 0.000198527617612853646278381f
#define P4 0.00139304355252534151077271f
#define P3 0.00833336077630519866943359f
#define P2 0.0416664853692054748535156f
#define P1 0.166666671633720397949219f
#define P0 0.5f

/* 0 where d < -104, infinity where d > 100, u elsewhere */
#define CUT(u, d) WHERE(BELOW(SET1(100.0f), d), ZERO_WHERE(BELOW(d, SET1(-104.0f)), u), SET1(INFINITY))

#if defined(WIDE)
#define PAIR (2 * WIDE)
static inline vf pow2i(vi q) { return EXPONENT(INT_ADD(q, INT_SET1(0x7f))); }
static inline vf sleef_exp(vf d) {
    const vi q = TO_INT(MUL(d, SET1(LOG2E)));
    const vf qf = TO_FLOAT(q);
    vf s = FMA(qf, SET1(-LN2_HI), d);
    s = FMA(qf, SET1(-LN2_LO), s);
    vf u = SET1(P5);
    u = FMA(u, s, SET1(P4));
    u = FMA(u, s, SET1(P3));
    u = FMA(u, s, SET1(P2));
    u = FMA(u, s, SET1(P1));
    u = FMA(u, s, SET1(P0));
    u = ADD(SET1(1.0f), FMA(MUL(s, s), u, s));
    const vi half = HALF_OF(q);
    u = MUL(MUL(u, pow2i(half)), pow2i(INT_SUB(q, half)));
    return CUT(u, d);
}
static inline void silu_vectors(float *x) {
    for (int i = 0; i < PAIR; i += WIDE) {
        const vf v = LOADU(x + i);
        STOREU(x + i, DIV(v, ADD(SET1(1.0f), sleef_exp(NEGATE(v)))));
    }
}
#else
#define PAIR 0 /* ATen's generic vectors call the C library's expf lane by lane */
#endif

/* x (n floats) replaced by silu(x), as torch.nn.functional.silu(x, inplace=True) on a contiguous tensor with one
 * intra-op thread (one range). */
void beamserve_silu(float *x, int64_t n) {
    int64_t i = 0;
#if PAIR
    for (; i + PAIR <= n; i += PAIR) silu_vectors(x + i);
#endif
    for (; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}
