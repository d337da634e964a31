/* One vector register of floats at the build's width (16 lanes with AVX-512, 8 with AVX2 and FMA; WIDE unset
 * elsewhere): its types and the lane-by-lane operations the elementwise kernels take (silu.c's SiLU, f32_gemm.c's
 * swish), so each is written once and computes, lane by lane, the same operations at either width. Unlike
 * vec16.h's 16-lane values, these follow the width a kernel must match (ATen's and oneDNN's vectors). */
#ifndef BEAMSERVE_VREG_H
#define BEAMSERVE_VREG_H

#if defined(__AVX512F__)
#include <immintrin.h>
#define WIDE 16
typedef __m512 vf;
typedef __m512i vi;
typedef __mmask16 vcond; /* a lane-by-lane condition */
#define SET1(c) _mm512_set1_ps(c)
#define BITS(u) _mm512_castsi512_ps(_mm512_set1_epi32((int)(u))) /* every lane the float with these bits */
#define ADD _mm512_add_ps
#define SUB _mm512_sub_ps
#define MUL _mm512_mul_ps
#define DIV _mm512_div_ps
#define MIN _mm512_min_ps
#define MAX _mm512_max_ps
#define FLOOR _mm512_floor_ps
#define FMA _mm512_fmadd_ps
#define FNMA _mm512_fnmadd_ps /* c - a b in one rounding */
#define TO_INT _mm512_cvtps_epi32
#define TO_FLOAT _mm512_cvtepi32_ps
#define INT_ADD _mm512_add_epi32
#define INT_SUB _mm512_sub_epi32
#define INT_SET1 _mm512_set1_epi32
#define HALF_OF(q) _mm512_srai_epi32(q, 1)
#define EXPONENT(q) _mm512_castsi512_ps(_mm512_slli_epi32(q, 23))
#define NEGATE(v) _mm512_xor_ps(v, _mm512_set1_ps(-0.0f))
#define MINUS_ABS(v) _mm512_or_ps(v, _mm512_set1_ps(-0.0f))
#define LOADU _mm512_loadu_ps
#define STOREU _mm512_storeu_ps
#define BELOW(a, b) _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)                              /* a < b */
#define SIGN_SET(v) _mm512_test_epi32_mask(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000))
#define WHERE(c, a, b) _mm512_mask_mov_ps(a, c, b)                                     /* b where c, a elsewhere */
#define ZERO_WHERE(c, a) _mm512_maskz_mov_ps((vcond)~(c), a)                            /* 0 where c, a elsewhere */
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define WIDE 8
typedef __m256 vf;
typedef __m256i vi;
typedef __m256 vcond; /* a lane-by-lane condition: all bits set where it holds */
#define SET1(c) _mm256_set1_ps(c)
#define BITS(u) _mm256_castsi256_ps(_mm256_set1_epi32((int)(u)))
#define ADD _mm256_add_ps
#define SUB _mm256_sub_ps
#define MUL _mm256_mul_ps
#define DIV _mm256_div_ps
#define MIN _mm256_min_ps
#define MAX _mm256_max_ps
#define FLOOR _mm256_floor_ps
#define FMA _mm256_fmadd_ps
#define FNMA _mm256_fnmadd_ps
#define TO_INT _mm256_cvtps_epi32
#define TO_FLOAT _mm256_cvtepi32_ps
#define INT_ADD _mm256_add_epi32
#define INT_SUB _mm256_sub_epi32
#define INT_SET1 _mm256_set1_epi32
#define HALF_OF(q) _mm256_srai_epi32(q, 1)
#define EXPONENT(q) _mm256_castsi256_ps(_mm256_slli_epi32(q, 23))
#define NEGATE(v) _mm256_xor_ps(v, _mm256_set1_ps(-0.0f))
#define MINUS_ABS(v) _mm256_or_ps(v, _mm256_set1_ps(-0.0f))
#define LOADU _mm256_loadu_ps
#define STOREU _mm256_storeu_ps
#define BELOW(a, b) _mm256_cmp_ps(a, b, _CMP_LT_OQ)
#define SIGN_SET(v) (v) /* blendv reads each lane's sign bit */
#define WHERE(c, a, b) _mm256_blendv_ps(a, b, c)
#define ZERO_WHERE(c, a) _mm256_andnot_ps(c, a)
#endif

#endif
