/* The SIMD layer on AVX2 (with FMA and F16C: x86-64-v3): a 16-lane vector is two 256-bit registers (lanes
   0-7 and 8-15), a 16-lane mask two registers of 0 / -1 lanes.

   Every function here has a twin of the same name and the same result bits in simd_avx512.h and
   simd_portable.h; the kernels (numerics.h, glu.h, mx.h) are written once against this interface. Partial
   vectors (row tails) load and store lane by lane, in functions of their own; everything else is a few
   instructions per half, inlined. */
#ifndef SWIGLU_SIMD_AVX2_H
#define SWIGLU_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>

#include "simd_x86.h"

#define SIMD_NAME "avx2"

typedef struct {
    __m256 lo, hi;
} vf; /* 16 x fp32 */
typedef struct {
    __m256i lo, hi;
} vu; /* 16 x 32-bit integer */
typedef struct {
    __m256i lo, hi;
} vm; /* 16 lanes: 0 or -1 */

#define SPLAT8(x) _mm256_set1_epi32((int)(x)) /* 8 x 32-bit */
#define ONES _mm256_set1_epi32(-1)
#define CASTI(x) _mm256_castps_si256(x)
#define CASTF(x) _mm256_castsi256_ps(x)

/* ------------------------------------------------------------------------------------------ masks */
INLINE vm m_all(void) { return (vm){ONES, ONES}; }
INLINE vm m_lanes(int64_t n) {
    const __m256i k = SPLAT8(n > 16 ? 16 : (n < 0 ? 0 : n));
    return (vm){_mm256_cmpgt_epi32(k, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                _mm256_cmpgt_epi32(k, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15))};
}
INLINE vm m_and(vm a, vm b) { return (vm){_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
INLINE vm m_or(vm a, vm b) { return (vm){_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
INLINE vm m_not(vm a) { return (vm){_mm256_xor_si256(a.lo, ONES), _mm256_xor_si256(a.hi, ONES)}; }
INLINE int m_any(vm a) {
    const __m256i o = _mm256_or_si256(a.lo, a.hi);
    return !_mm256_testz_si256(o, o);
}
/* One bit per lane of a half (bit i: lane i). */
INLINE int m_bits8(__m256i m) { return _mm256_movemask_ps(CASTF(m)); }

/* ----------------------------------------------------------------------------------------- floats */
INLINE vf v_set(float x) { return (vf){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
INLINE vf v_zero(void) { return (vf){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
INLINE vf v_add(vf a, vf b) { return (vf){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
INLINE vf v_sub(vf a, vf b) { return (vf){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
INLINE vf v_mul(vf a, vf b) { return (vf){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
INLINE vf v_div(vf a, vf b) { return (vf){_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
INLINE vf v_fma(vf a, vf b, vf c) { /* one rounding */
    return (vf){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
/* (c < a) ? c : a and (c > a) ? c : a: a NaN ``a`` comes through (the clamps' NaN propagation). */
INLINE vf v_minc(vf a, vf c) { return (vf){_mm256_min_ps(c.lo, a.lo), _mm256_min_ps(c.hi, a.hi)}; }
INLINE vf v_maxc(vf a, vf c) { return (vf){_mm256_max_ps(c.lo, a.lo), _mm256_max_ps(c.hi, a.hi)}; }
#define V_CMP(a, b, pred) ((vm){CASTI(_mm256_cmp_ps((a).lo, (b).lo, pred)), CASTI(_mm256_cmp_ps((a).hi, (b).hi, pred))})
INLINE vm v_lt(vf a, vf b) { return V_CMP(a, b, _CMP_LT_OQ); }
INLINE vm v_le(vf a, vf b) { return V_CMP(a, b, _CMP_LE_OQ); }
INLINE vm v_gt(vf a, vf b) { return V_CMP(a, b, _CMP_GT_OQ); }
INLINE vm v_ge(vf a, vf b) { return V_CMP(a, b, _CMP_GE_OQ); }
INLINE vm v_eq(vf a, vf b) { return V_CMP(a, b, _CMP_EQ_OQ); }
INLINE vm v_isnan(vf a) { return V_CMP(a, a, _CMP_UNORD_Q); }
INLINE vf v_sel(vm m, vf a, vf b) { /* m ? a : b */
    return (vf){_mm256_blendv_ps(b.lo, a.lo, CASTF(m.lo)), _mm256_blendv_ps(b.hi, a.hi, CASTF(m.hi))};
}
INLINE vf v_neg(vf a) {
    const __m256 s = _mm256_set1_ps(-0.0f);
    return (vf){_mm256_xor_ps(a.lo, s), _mm256_xor_ps(a.hi, s)};
}
#define V_ROUND(a, mode) ((vf){_mm256_round_ps((a).lo, (mode) | _MM_FROUND_NO_EXC), _mm256_round_ps((a).hi, (mode) | _MM_FROUND_NO_EXC)})
INLINE vf v_floor(vf a) { return V_ROUND(a, _MM_FROUND_TO_NEG_INF); }
INLINE vf v_trunc(vf a) { return V_ROUND(a, _MM_FROUND_TO_ZERO); }
INLINE vf v_rint(vf a) { return V_ROUND(a, _MM_FROUND_TO_NEAREST_INT); }
INLINE vu v_bits(vf a) { return (vu){CASTI(a.lo), CASTI(a.hi)}; }
INLINE vf v_from_bits(vu a) { return (vf){CASTF(a.lo), CASTF(a.hi)}; }

/* ---------------------------------------------------------------------------------------- integers */
INLINE vu u_set(uint32_t x) { return (vu){SPLAT8(x), SPLAT8(x)}; }
INLINE vu u_zero(void) { return (vu){_mm256_setzero_si256(), _mm256_setzero_si256()}; }
INLINE vu u_iota(void) {
    return (vu){_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)};
}
INLINE vu u_add(vu a, vu b) { return (vu){_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
INLINE vu u_sub(vu a, vu b) { return (vu){_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }
INLINE vu u_and(vu a, vu b) { return (vu){_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
INLINE vu u_or(vu a, vu b) { return (vu){_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
INLINE vu u_shl(vu a, const int n) { return (vu){_mm256_slli_epi32(a.lo, n), _mm256_slli_epi32(a.hi, n)}; }
INLINE vu u_shr(vu a, const int n) { return (vu){_mm256_srli_epi32(a.lo, n), _mm256_srli_epi32(a.hi, n)}; }
INLINE vu s_sra(vu a, const int n) { return (vu){_mm256_srai_epi32(a.lo, n), _mm256_srai_epi32(a.hi, n)}; }
INLINE vu u_shrv(vu a, vu n) { return (vu){_mm256_srlv_epi32(a.lo, n.lo), _mm256_srlv_epi32(a.hi, n.hi)}; } /* 0 past 31 */
INLINE vu u_min(vu a, vu b) { return (vu){_mm256_min_epu32(a.lo, b.lo), _mm256_min_epu32(a.hi, b.hi)}; }
INLINE vu u_max(vu a, vu b) { return (vu){_mm256_max_epu32(a.lo, b.lo), _mm256_max_epu32(a.hi, b.hi)}; }
INLINE vu s_max(vu a, vu b) { return (vu){_mm256_max_epi32(a.lo, b.lo), _mm256_max_epi32(a.hi, b.hi)}; }
INLINE vm u_eq(vu a, vu b) { return (vm){_mm256_cmpeq_epi32(a.lo, b.lo), _mm256_cmpeq_epi32(a.hi, b.hi)}; }
/* Unsigned compares (AVX2 has signed ones only): a >= b iff max(a, b) == a, a <= b iff min(a, b) == a. */
INLINE vm u_ge(vu a, vu b) { return u_eq(u_max(a, b), a); }
INLINE vm u_le(vu a, vu b) { return u_eq(u_min(a, b), a); }
INLINE vm u_lt(vu a, vu b) { return m_not(u_ge(a, b)); }
INLINE vm u_gt(vu a, vu b) { return m_not(u_le(a, b)); }
INLINE vm s_gt(vu a, vu b) { return (vm){_mm256_cmpgt_epi32(a.lo, b.lo), _mm256_cmpgt_epi32(a.hi, b.hi)}; }
INLINE vu u_sel(vm m, vu a, vu b) { /* m ? a : b */
    return (vu){_mm256_blendv_epi8(b.lo, a.lo, m.lo), _mm256_blendv_epi8(b.hi, a.hi, m.hi)};
}
INLINE uint32_t u_hmax8(__m256i a) {
    __m128i x = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    x = _mm_max_epu32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm_max_epu32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(x);
}
INLINE uint32_t u_hmax(vu a) { return u_hmax8(_mm256_max_epu32(a.lo, a.hi)); }

/* ------------------------------------------------------------------------------------------ memory */
/* Masked lanes read nothing (and give 0) and write nothing. A full or empty half is one instruction (or
   none); a partial one (a row tail) goes lane by lane. */
INLINE __m256i lanes_in(const uint32_t t[8]) { return _mm256_loadu_si256((const __m256i *)t); }
INLINE void lanes_out(uint32_t t[8], __m256i a) { _mm256_storeu_si256((__m256i *)t, a); }
static __attribute__((noinline)) __m256i ld16_part(const uint16_t *p, int k) {
    uint32_t t[8] = {0};
    for (int i = 0; i < 8; i++)
        if (k >> i & 1) t[i] = p[i];
    return lanes_in(t);
}
static __attribute__((noinline)) void st16_part(uint16_t *p, __m256i a, int k) {
    uint32_t t[8];
    lanes_out(t, a);
    for (int i = 0; i < 8; i++)
        if (k >> i & 1) p[i] = (uint16_t)t[i];
}
static __attribute__((noinline)) void st8_part(uint8_t *p, __m256i a, int k, int stride) {
    uint32_t t[8];
    lanes_out(t, a);
    for (int i = 0; i < 8; i++)
        if (k >> i & 1) p[stride * i] = (uint8_t)t[i];
}
/* 8 32-bit lanes holding values < 65536, as 8 16-bit values. */
INLINE __m128i narrow16(__m256i a) {
    return _mm_packus_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
}
INLINE __m256i ld16_half(const uint16_t *p, __m256i m) {
    const int k = m_bits8(m);
    if (k == 0xFF) return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return k == 0 ? _mm256_setzero_si256() : ld16_part(p, k);
}
INLINE __m256i ld32_half(const uint32_t *p, __m256i m) {
    const int k = m_bits8(m);
    if (k == 0xFF) return _mm256_loadu_si256((const __m256i *)p);
    return k == 0 ? _mm256_setzero_si256() : _mm256_maskload_epi32((const int *)p, m);
}
INLINE void st16_half(uint16_t *p, __m256i a, __m256i m) {
    const int k = m_bits8(m);
    if (k == 0xFF) _mm_storeu_si128((__m128i *)p, narrow16(a));
    else if (k != 0) st16_part(p, a, k);
}
INLINE void st32_half(uint32_t *p, __m256i a, __m256i m) {
    const int k = m_bits8(m);
    if (k == 0xFF) _mm256_storeu_si256((__m256i *)p, a);
    else if (k != 0) _mm256_maskstore_epi32((int *)p, m, a);
}
INLINE vu u_load16(const uint16_t *p, vm m) { return (vu){ld16_half(p, m.lo), ld16_half(p + 8, m.hi)}; }
INLINE vu u_load32(const uint32_t *p, vm m) { return (vu){ld32_half(p, m.lo), ld32_half(p + 8, m.hi)}; }
/* 16 32-bit lanes holding values < 65536, as 16-bit values in order. */
INLINE __m256i pack16(vu a) {
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(a.lo, a.hi), _MM_SHUFFLE(3, 1, 2, 0));
}
/* Lanes hold 16-bit values (< 65536: the stored bits of every caller). */
INLINE void u_store16(uint16_t *p, vu a, vm m) {
    if ((m_bits8(m.lo) & m_bits8(m.hi)) == 0xFF) { /* one pack and one store for all 16 */
        _mm256_storeu_si256((__m256i *)p, pack16(a));
        return;
    }
    st16_half(p, a.lo, m.lo);
    st16_half(p + 8, a.hi, m.hi);
}
INLINE void u_store32(uint32_t *p, vu a, vm m) {
    st32_half(p, a.lo, m.lo);
    st32_half(p + 8, a.hi, m.hi);
}
INLINE void u_store8(uint8_t *p, vu a, vm m) {
    const int kl = m_bits8(m.lo), kh = m_bits8(m.hi);
    if ((kl & kh) == 0xFF) {
        const __m128i b = _mm_packus_epi16(narrow16(_mm256_and_si256(a.lo, SPLAT8(0xFF))),
                                           narrow16(_mm256_and_si256(a.hi, SPLAT8(0xFF))));
        _mm_storeu_si128((__m128i *)p, b);
        return;
    }
    if (kl != 0) st8_part(p, a.lo, kl, 1);
    if (kh != 0) st8_part(p + 8, a.hi, kh, 1);
}
/* The low byte of lane k to p[2k] (the odd bytes are left alone). */
INLINE void u_store8_even(uint8_t *p, vu a, vm m) {
    st8_part(p, a.lo, m_bits8(m.lo), 2);
    st8_part(p + 16, a.hi, m_bits8(m.hi), 2);
}
INLINE vf v_loadf(const float *p, vm m) { return v_from_bits(u_load32((const uint32_t *)p, m)); }
INLINE void v_storef(float *p, vf a, vm m) { u_store32((uint32_t *)p, v_bits(a), m); }
/* table[idx] in every lane (the activation tables: idx < 65536): eight scalar loads per 8 lanes, which beat
   vgatherdps where it is a long microcoded sequence (Zen 2/3). The indices: where ``src`` is given, the same
   16-bit values in memory (``src[i * stride]``), one scalar load each; else from ``idx``, written as a store
   that GCC turns into an extract per index (vpextrd, two uops), which measured faster for one-float entries
   than a real store and load back (store forwarding). */
INLINE void lookup_keys(__m256i idx, const uint16_t *src, const int stride, uint32_t k[8]) {
    if (src != NULL) {
        src_keys(src, stride, 8, k);
    } else {
        _mm256_store_si256((__m256i *)k, idx);
    }
}
INLINE __m256 lookup8(const float *t, __m256i idx, const uint16_t *src, const int stride) {
    _Alignas(32) uint32_t k[8];
    lookup_keys(idx, src, stride, k);
    const __m128 a = _mm_set_ps(t[k[3]], t[k[2]], t[k[1]], t[k[0]]);
    const __m128 b = _mm_set_ps(t[k[7]], t[k[6]], t[k[5]], t[k[4]]);
    return _mm256_insertf128_ps(_mm256_castps128_ps256(a), b, 1);
}
INLINE vf v_lookup(const float *table, vu idx, const uint16_t *src, const int stride) {
    return (vf){lookup8(table, idx.lo, src, stride), lookup8(table, idx.hi, src == NULL ? NULL : src + 8 * stride, stride)};
}
/* (table[2 idx], table[2 idx + 1]) in every lane (entries2x8). */
INLINE void lookup8x2(const float *t, __m256i idx, const uint16_t *src, const int stride, __m256 *a, __m256 *b) {
    _Alignas(32) uint32_t k[8];
    lookup_keys(idx, src, stride, k);
    /* without ``src``, the stored indices are read back as scalars: for these loads that beat the extracts */
    if (src == NULL) __asm__("" : "+m"(k));
    entries2x8(t, k, a, b);
}
INLINE void v_lookup2(const float *table, vu idx, const uint16_t *src, const int stride, vf *a, vf *b) {
    lookup8x2(table, idx.lo, src, stride, &a->lo, &b->lo);
    lookup8x2(table, idx.hi, src == NULL ? NULL : src + 8 * stride, stride, &a->hi, &b->hi);
}
/* No SIMD_GATHER: whole steps keep the scalar loads whatever swiglu_glu.gather says. 8-lane vgatherdps did
   not beat them even where the AVX-512 gather does (Sapphire-Rapids-class Xeon, 1 thread, M=8192, 2H=4096
   bf16, A/B in one process: MX forward 14.4 -> 14.6 ms, backward 36.6 -> 37.0, swiglu_group_grad 13.3 ->
   14.3). */
/* No 64-entry 16-bit table lookup (numerics.h fp8x32_code2 computes E2M1 codes by compares). */
#define SIMD_LUT64 0
/* 16 consecutive 32-bit elements (8 pairs) as their even and odd ones. */
INLINE void deinterleave8(__m256i x0, __m256i x1, __m256i *even, __m256i *odd) {
    const __m256 a = CASTF(x0), b = CASTF(x1);
    *even = _mm256_permute4x64_epi64(CASTI(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0));
    *odd = _mm256_permute4x64_epi64(CASTI(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0));
}
INLINE void interleave8(__m256i even, __m256i odd, __m256i *x0, __m256i *x1) {
    const __m256 l = _mm256_unpacklo_ps(CASTF(even), CASTF(odd)), h = _mm256_unpackhi_ps(CASTF(even), CASTF(odd));
    *x0 = CASTI(_mm256_permute2f128_ps(l, h, 0x20));
    *x1 = CASTI(_mm256_permute2f128_ps(l, h, 0x31));
}
static __attribute__((noinline)) void u_load32_pairs_part(const uint32_t *p, vm m, vu *even, vu *odd) {
    uint32_t k[16], e[16] = {0}, o[16] = {0};
    lanes_out(k, m.lo);
    lanes_out(k + 8, m.hi);
    for (int i = 0; i < 16; i++)
        if (k[i]) e[i] = p[2 * i], o[i] = p[2 * i + 1];
    *even = (vu){lanes_in(e), lanes_in(e + 8)};
    *odd = (vu){lanes_in(o), lanes_in(o + 8)};
}
/* 32 consecutive 32-bit elements (16 pairs, ``m`` selects pairs) as their even and odd ones: element 2i goes
   to lane i of *even, element 2i + 1 to lane i of *odd. */
INLINE void u_load32_pairs(const uint32_t *p, vm m, vu *even, vu *odd) {
    if ((m_bits8(m.lo) & m_bits8(m.hi)) != 0xFF) {
        u_load32_pairs_part(p, m, even, odd);
        return;
    }
    const __m256i *q = (const __m256i *)p;
    deinterleave8(_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1), &even->lo, &odd->lo);
    deinterleave8(_mm256_loadu_si256(q + 2), _mm256_loadu_si256(q + 3), &even->hi, &odd->hi);
}
INLINE void u_store32_pairs(uint32_t *p, vu even, vu odd, vm m) {
    __m256i x0, x1, x2, x3;
    interleave8(even.lo, odd.lo, &x0, &x1);
    interleave8(even.hi, odd.hi, &x2, &x3);
    const int kl = m_bits8(m.lo), kh = m_bits8(m.hi);
    if ((kl & kh) == 0xFF) {
        __m256i *q = (__m256i *)p;
        _mm256_storeu_si256(q, x0);
        _mm256_storeu_si256(q + 1, x1);
        _mm256_storeu_si256(q + 2, x2);
        _mm256_storeu_si256(q + 3, x3);
        return;
    }
    /* pair i is elements 2i, 2i + 1: the mask's lanes, doubled */
    const __m256i d0 = _mm256_permutevar8x32_epi32(m.lo, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256i d1 = _mm256_permutevar8x32_epi32(m.lo, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
    const __m256i d2 = _mm256_permutevar8x32_epi32(m.hi, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256i d3 = _mm256_permutevar8x32_epi32(m.hi, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
    _mm256_maskstore_epi32((int *)p, d0, x0);
    _mm256_maskstore_epi32((int *)p + 8, d1, x1);
    _mm256_maskstore_epi32((int *)p + 16, d2, x2);
    _mm256_maskstore_epi32((int *)p + 24, d3, x3);
}
/* 16 pairs of 16-bit elements, as one 32-bit lane per pair (element 2i in the low half). */
static __attribute__((noinline)) __m256i ld16_pairs_part(const uint16_t *p, int k) {
    uint32_t t[8] = {0};
    for (int i = 0; i < 8; i++)
        if (k >> i & 1) t[i] = (uint32_t)p[2 * i] | ((uint32_t)p[2 * i + 1] << 16);
    return lanes_in(t);
}
INLINE __m256i ld16_pairs_half(const uint16_t *p, __m256i m) {
    const int k = m_bits8(m);
    if (k == 0xFF) return _mm256_loadu_si256((const __m256i *)p);
    return k == 0 ? _mm256_setzero_si256() : ld16_pairs_part(p, k);
}
INLINE vu u_load16_pairs(const uint16_t *p, vm m) { return (vu){ld16_pairs_half(p, m.lo), ld16_pairs_half(p + 16, m.hi)}; }
static __attribute__((noinline)) void st16_pairs_part(uint16_t *p, __m256i a, int k) {
    uint32_t t[8];
    lanes_out(t, a);
    for (int i = 0; i < 8; i++)
        if (k >> i & 1) p[2 * i] = (uint16_t)t[i], p[2 * i + 1] = (uint16_t)(t[i] >> 16);
}
INLINE void st16_pairs_half(uint16_t *p, __m256i even, __m256i odd, __m256i m) {
    const __m256i a = _mm256_or_si256(_mm256_and_si256(even, SPLAT8(0xFFFF)), _mm256_slli_epi32(odd, 16));
    const int k = m_bits8(m);
    if (k == 0xFF) _mm256_storeu_si256((__m256i *)p, a);
    else if (k != 0) st16_pairs_part(p, a, k);
}
INLINE void u_store16_pairs(uint16_t *p, vu even, vu odd, vm m) {
    st16_pairs_half(p, even.lo, odd.lo, m.lo);
    st16_pairs_half(p + 16, even.hi, odd.hi, m.hi);
}

/* 16 FP4 codes (nibbles in 32-bit lanes) packed two per byte, lane 2j in the low nibble: 8 bytes, ``m``
   selecting whole pairs of lanes. */
static __attribute__((noinline)) void u_store_nibbles(uint8_t *p, vu codes, vm m) {
    uint32_t c[16], k[16];
    lanes_out(c, codes.lo);
    lanes_out(c + 8, codes.hi);
    lanes_out(k, m.lo);
    lanes_out(k + 8, m.hi);
    for (int j = 0; j < 8; j++)
        if (k[2 * j]) p[j] = (uint8_t)((c[2 * j] & 0xFu) | ((c[2 * j + 1] & 0xFu) << 4));
}

/* The amax of each of ``nb`` <= 16 consecutive 32-element blocks, as their largest magnitude bits (lanes from
   nb on are 0). The largest of 8 16-bit values is one phminposuw of their complements. */
INLINE vu u_block_amax16(const uint16_t *v, int64_t nb) {
    uint32_t r[16] = {0};
    const __m256i mag = _mm256_set1_epi16(0x7FFF);
    for (int64_t k = 0; k < nb; k++) {
        const __m256i a = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(v + 32 * k)), mag);
        const __m256i b = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(v + 32 * k + 16)), mag);
        const __m256i x = _mm256_max_epu16(a, b);
        const __m128i y = _mm_max_epu16(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
        r[k] = 0xFFFFu - (uint32_t)(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(y, _mm_set1_epi16(-1)))) & 0xFFFF);
    }
    return (vu){lanes_in(r), lanes_in(r + 8)};
}
INLINE vu u_block_amax32(const uint32_t *v, int64_t nb) {
    uint32_t r[16] = {0};
    const __m256i mag = SPLAT8(0x7FFFFFFF);
    for (int64_t k = 0; k < nb; k++) {
        const __m256i *q = (const __m256i *)(v + 32 * k);
        const __m256i a = _mm256_max_epu32(_mm256_and_si256(_mm256_loadu_si256(q), mag),
                                           _mm256_and_si256(_mm256_loadu_si256(q + 1), mag));
        const __m256i b = _mm256_max_epu32(_mm256_and_si256(_mm256_loadu_si256(q + 2), mag),
                                           _mm256_and_si256(_mm256_loadu_si256(q + 3), mag));
        r[k] = u_hmax8(_mm256_max_epu32(a, b));
    }
    return (vu){lanes_in(r), lanes_in(r + 8)};
}

/* ------------------------------------------------------------------------------- 32 x 16-bit lanes */
/* For the FP8 encoder of 16-bit values (numerics.h fp8x32_encode): 32 lanes per vector (lo: 0-15). */
typedef struct {
    __m256i lo, hi;
} vw;
typedef struct {
    __m256i lo, hi;
} vwm; /* 32 lanes: 0 or -1 */
#define W2(f, a, b) ((vw){f((a).lo, (b).lo), f((a).hi, (b).hi)})
#define WM2(f, a, b) ((vwm){f((a).lo, (b).lo), f((a).hi, (b).hi)})
INLINE vw w_set(uint16_t x) { return (vw){_mm256_set1_epi16((short)x), _mm256_set1_epi16((short)x)}; }
/* The low 16 bits of lane k of v in every lane (from registers: no store-to-load round trip). */
INLINE vw w_bcast(vu v, int k) {
    __m256i x = _mm256_permutevar8x32_epi32(k < 8 ? v.lo : v.hi, SPLAT8(k & 7));
    x = _mm256_and_si256(x, SPLAT8(0xFFFF));
    x = _mm256_or_si256(x, _mm256_slli_epi32(x, 16));
    return (vw){x, x};
}
INLINE vwm w_lanes(int64_t n) {
    const __m256i k = _mm256_set1_epi16((short)(n > 32 ? 32 : (n < 0 ? 0 : n)));
    const __m256i i0 = _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return (vwm){_mm256_cmpgt_epi16(k, i0), _mm256_cmpgt_epi16(k, _mm256_add_epi16(i0, _mm256_set1_epi16(16)))};
}
INLINE int wm_all(vwm a, vwm m) { return _mm256_testc_si256(a.lo, m.lo) && _mm256_testc_si256(a.hi, m.hi); }
INLINE int wm_any(vwm a) {
    const __m256i o = _mm256_or_si256(a.lo, a.hi);
    return !_mm256_testz_si256(o, o);
}
INLINE vwm wm_or(vwm a, vwm b) { return WM2(_mm256_or_si256, a, b); }
INLINE vwm wm_and(vwm a, vwm b) { return WM2(_mm256_and_si256, a, b); }
INLINE vwm wm_not(vwm a) { return (vwm){_mm256_xor_si256(a.lo, ONES), _mm256_xor_si256(a.hi, ONES)}; }
INLINE int wm_full(vwm m) { return (_mm256_movemask_epi8(m.lo) & _mm256_movemask_epi8(m.hi)) == -1; }
static __attribute__((noinline)) vw w_load_part(const uint16_t *p, vwm m) {
    uint16_t t[32] = {0}, k[32];
    _mm256_storeu_si256((__m256i *)k, m.lo);
    _mm256_storeu_si256((__m256i *)(k + 16), m.hi);
    for (int i = 0; i < 32; i++)
        if (k[i]) t[i] = p[i];
    return (vw){_mm256_loadu_si256((const __m256i *)t), _mm256_loadu_si256((const __m256i *)(t + 16))};
}
static __attribute__((noinline)) void w_store_part(uint8_t *p, vw a, vwm m, int bytes) {
    uint16_t t[32], k[32];
    _mm256_storeu_si256((__m256i *)t, a.lo);
    _mm256_storeu_si256((__m256i *)(t + 16), a.hi);
    _mm256_storeu_si256((__m256i *)k, m.lo);
    _mm256_storeu_si256((__m256i *)(k + 16), m.hi);
    for (int i = 0; i < 32; i++) {
        if (!k[i]) continue;
        if (bytes == 2) memcpy(p + 2 * i, &t[i], 2);
        else p[i] = (uint8_t)t[i];
    }
}
INLINE vw w_load(const uint16_t *p, vwm m) {
    if (!wm_full(m)) return w_load_part(p, m);
    return (vw){_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 16))};
}
INLINE void w_store(uint16_t *p, vw a, vwm m) {
    if (!wm_full(m)) {
        w_store_part((uint8_t *)p, a, m, 2);
        return;
    }
    _mm256_storeu_si256((__m256i *)p, a.lo);
    _mm256_storeu_si256((__m256i *)(p + 16), a.hi);
}
/* 32 lanes below 256 (codes) as bytes. */
INLINE void w_store8(uint8_t *p, vw a, vwm m) {
    if (!wm_full(m)) {
        w_store_part(p, a, m, 1);
        return;
    }
    _mm256_storeu_si256((__m256i *)p, _mm256_permute4x64_epi64(_mm256_packus_epi16(a.lo, a.hi), _MM_SHUFFLE(3, 1, 2, 0)));
}
/* 32 FP4 codes (nibbles in 16-bit lanes) packed two per byte, lane 2j in the low nibble: 16 bytes, ``m``
   selecting whole pairs of lanes. */
static __attribute__((noinline)) void w_store_nibbles_part(uint8_t *p, vw codes, vwm m) {
    uint16_t c[32], k[32];
    _mm256_storeu_si256((__m256i *)c, codes.lo);
    _mm256_storeu_si256((__m256i *)(c + 16), codes.hi);
    _mm256_storeu_si256((__m256i *)k, m.lo);
    _mm256_storeu_si256((__m256i *)(k + 16), m.hi);
    for (int j = 0; j < 16; j++)
        if (k[2 * j]) p[j] = (uint8_t)((c[2 * j] & 0xFu) | ((c[2 * j + 1] & 0xFu) << 4));
}
INLINE void w_store_nibbles(uint8_t *p, vw codes, vwm m) {
    if (!wm_full(m)) {
        w_store_nibbles_part(p, codes, m);
        return;
    }
    /* byte 0 of each 32-bit unit: its even lane's code | its odd lane's << 4 */
    const __m256i a = _mm256_and_si256(_mm256_or_si256(codes.lo, _mm256_srli_epi32(codes.lo, 12)), SPLAT8(0xFF));
    const __m256i b = _mm256_and_si256(_mm256_or_si256(codes.hi, _mm256_srli_epi32(codes.hi, 12)), SPLAT8(0xFF));
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), _MM_SHUFFLE(3, 1, 2, 0));
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}
INLINE vw w_add(vw a, vw b) { return W2(_mm256_add_epi16, a, b); }
INLINE vw w_sub(vw a, vw b) { return W2(_mm256_sub_epi16, a, b); }
INLINE vw w_and(vw a, vw b) { return W2(_mm256_and_si256, a, b); }
INLINE vw w_or(vw a, vw b) { return W2(_mm256_or_si256, a, b); }
INLINE vw w_shr(vw a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return (vw){_mm256_srl_epi16(a.lo, c), _mm256_srl_epi16(a.hi, c)};
}
INLINE vw w_shl(vw a, int n) {
    const __m128i c = _mm_cvtsi32_si128(n);
    return (vw){_mm256_sll_epi16(a.lo, c), _mm256_sll_epi16(a.hi, c)};
}
INLINE vw w_sra(vw a, int n) { /* signed */
    const __m128i c = _mm_cvtsi32_si128(n);
    return (vw){_mm256_sra_epi16(a.lo, c), _mm256_sra_epi16(a.hi, c)};
}
/* simd_shared.h's w_rne_shrv without variable shifts (AVX2 has none for 16-bit lanes: emulated on 32-bit
   ones, each took 8 operations), so this layer has no w_shrv / w_shlv: x * 2**(16 - s) in 32 bits by
   vpmullw / vpmulhuw, whose high half is x >> s and low half the bits shifted out, in units of 2**-16; it
   rounds up when those exceed half (0x8000), or equal it and the high half is odd. 2**(16 - s) comes from
   two byte tables by vpshufb (a byte index with bit 7 set gives 0). */
#define SIMD_RNE_SHRV 1
INLINE __m256i rne_shrv16(__m256i x, __m256i s) {
    const __m256i lo_bytes = _mm256_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 16,
                                              32, 64, -128, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256i hi_bytes = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, -128, 0, 0, 0, 0, 0, 0,
                                              0, 0, 1, 2, 4, 8, 16, 32, 64, -128);
    const __m256i n = _mm256_sub_epi16(_mm256_set1_epi16(16), s); /* 0-15 where it matters */
    const __m256i p = _mm256_or_si256(
        _mm256_shuffle_epi8(lo_bytes, _mm256_or_si256(n, _mm256_set1_epi16((short)0x8000))),
        _mm256_shuffle_epi8(hi_bytes, _mm256_or_si256(_mm256_slli_epi16(n, 8), _mm256_set1_epi16(0x80))));
    const __m256i hi = _mm256_mulhi_epu16(x, p), lo = _mm256_mullo_epi16(x, p);
    const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi16(1));
    /* lo - 0x8000 > -odd (signed): the dropped bits exceed half, or equal it with hi odd */
    const __m256i up = _mm256_cmpgt_epi16(_mm256_xor_si256(lo, _mm256_set1_epi16((short)0x8000)),
                                          _mm256_sub_epi16(_mm256_setzero_si256(), odd));
    return _mm256_sub_epi16(hi, up); /* up: -1 */
}
INLINE vw w_rne_shrv(vw x, vw s) { return W2(rne_shrv16, x, s); }
INLINE vw w_min(vw a, vw b) { return W2(_mm256_min_epu16, a, b); }
INLINE vw w_max(vw a, vw b) { return W2(_mm256_max_epu16, a, b); }
INLINE vw w_minz(vwm m, vw a, vw b) { /* m ? min(a, b) : 0 */
    const vw x = w_min(a, b);
    return (vw){_mm256_and_si256(m.lo, x.lo), _mm256_and_si256(m.hi, x.hi)};
}
/* The 32-bit lanes of lo (lanes 0-15) and hi (lanes 16-31), holding values < 65536, as 16-bit lanes. */
INLINE vw w_pack(vu lo, vu hi) { return (vw){pack16(lo), pack16(hi)}; }
/* Lanes 0-15 to the even lanes, 16-31 to the odd ones. */
INLINE vw w_interleave(vw a) {
    const __m256i l = _mm256_unpacklo_epi16(a.lo, a.hi), h = _mm256_unpackhi_epi16(a.lo, a.hi);
    return (vw){_mm256_permute2x128_si256(l, h, 0x20), _mm256_permute2x128_si256(l, h, 0x31)};
}
INLINE vw w_sel(vwm m, vw a, vw b) { /* m ? a : b */
    return (vw){_mm256_blendv_epi8(b.lo, a.lo, m.lo), _mm256_blendv_epi8(b.hi, a.hi, m.hi)};
}
INLINE vwm w_eq(vw a, vw b) { return WM2(_mm256_cmpeq_epi16, a, b); }
INLINE vwm w_lt_s(vw a, vw b) { return WM2(_mm256_cmpgt_epi16, b, a); } /* signed */
INLINE vwm w_ge_s(vw a, vw b) { return wm_not(w_lt_s(a, b)); }         /* signed */
INLINE vwm w_ge_u(vw a, vw b) { return w_eq(w_max(a, b), a); }
INLINE vwm w_lt_u(vw a, vw b) { return wm_not(w_ge_u(a, b)); }
INLINE vwm w_nz(vw a) { return wm_not(w_eq(a, w_set(0))); } /* a != 0 */

/* ------------------------------------------------------------------------- 16-bit float conversions */
/* fp16 bits (16-bit values in 32-bit lanes) -> fp32, exact (vcvtph2ps; NaN comes out quiet). */
INLINE vf v_from_fp16(vu bits) { return (vf){_mm256_cvtph_ps(narrow16(bits.lo)), _mm256_cvtph_ps(narrow16(bits.hi))}; }
/* The fp32 values of 16 stored fp16 elements (masked lanes 0): whole vectors converted from memory. */
INLINE vf v_load_fp16(const uint16_t *p, vm m) {
    if ((m_bits8(m.lo) & m_bits8(m.hi)) != 0xFF) return v_from_fp16(u_load16(p, m));
    return (vf){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
/* fp32 -> fp16 bits, RNE, overflow to inf; NaN -> 0x7E00 (canonical). */
INLINE vu u_to_fp16(vf v) {
    const int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const vu h = {_mm256_cvtepu16_epi32(_mm256_cvtps_ph(v.lo, rne)), _mm256_cvtepu16_epi32(_mm256_cvtps_ph(v.hi, rne))};
    return u_sel(v_isnan(v), u_set(0x7E00), h);
}

#undef W2
#undef WM2
#endif
