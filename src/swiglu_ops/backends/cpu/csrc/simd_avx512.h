/* The SIMD layer on AVX-512 (F, BW, VL, DQ, plus F16C/FMA; AVX512-BF16 where the translation unit is
   built for it): 16 fp32 / 32-bit lanes per vector, 16-bit lane masks.

   Every function here has a twin of the same name and the same result bits in simd_portable.h; the kernels
   (numerics.h, glu.h, mx.h) are written once against this interface. */
#ifndef SWIGLU_SIMD_AVX512_H
#define SWIGLU_SIMD_AVX512_H

#include <immintrin.h>
#include <stdint.h>

#include "simd_x86.h"

#define SIMD_NAME "avx512"

typedef __m512 vf;    /* 16 x fp32 */
typedef __m512i vu;   /* 16 x 32-bit integer */
typedef __mmask16 vm; /* 16 lanes */

/* ------------------------------------------------------------------------------------------ masks */
INLINE vm m_all(void) { return (vm)0xFFFF; }
INLINE vm m_lanes(int64_t n) { return n >= 16 ? (vm)0xFFFF : (vm)((1u << (n > 0 ? n : 0)) - 1u); }
INLINE vm m_and(vm a, vm b) { return (vm)(a & b); }
INLINE vm m_or(vm a, vm b) { return (vm)(a | b); }
INLINE vm m_not(vm a) { return (vm)~a; }
INLINE int m_any(vm a) { return a != 0; }

/* ----------------------------------------------------------------------------------------- floats */
INLINE vf v_set(float x) { return _mm512_set1_ps(x); }
INLINE vf v_zero(void) { return _mm512_setzero_ps(); }
INLINE vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
INLINE vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
INLINE vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
INLINE vf v_div(vf a, vf b) { return _mm512_div_ps(a, b); }
INLINE vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); } /* one rounding */
/* (c < a) ? c : a and (c > a) ? c : a: a NaN ``a`` comes through (the clamps' NaN propagation). */
INLINE vf v_minc(vf a, vf c) { return _mm512_min_ps(c, a); }
INLINE vf v_maxc(vf a, vf c) { return _mm512_max_ps(c, a); }
INLINE vm v_lt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
INLINE vm v_le(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
INLINE vm v_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
INLINE vm v_ge(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
INLINE vm v_eq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
INLINE vm v_isnan(vf a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
INLINE vf v_sel(vm m, vf a, vf b) { return _mm512_mask_mov_ps(b, m, a); } /* m ? a : b */
INLINE vf v_neg(vf a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
INLINE vf v_floor(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
INLINE vf v_trunc(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC); }
INLINE vf v_rint(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
INLINE vu v_bits(vf a) { return _mm512_castps_si512(a); }
INLINE vf v_from_bits(vu a) { return _mm512_castsi512_ps(a); }

/* ---------------------------------------------------------------------------------------- integers */
INLINE vu u_set(uint32_t x) { return _mm512_set1_epi32((int)x); }
INLINE vu u_zero(void) { return _mm512_setzero_si512(); }
INLINE vu u_iota(void) { return _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0); }
INLINE vu u_add(vu a, vu b) { return _mm512_add_epi32(a, b); }
INLINE vu u_sub(vu a, vu b) { return _mm512_sub_epi32(a, b); }
INLINE vu u_and(vu a, vu b) { return _mm512_and_si512(a, b); }
INLINE vu u_or(vu a, vu b) { return _mm512_or_si512(a, b); }
#define u_shl(a, n) _mm512_slli_epi32((a), (n))
#define u_shr(a, n) _mm512_srli_epi32((a), (n))
#define s_sra(a, n) _mm512_srai_epi32((a), (n))
INLINE vu u_shrv(vu a, vu n) { return _mm512_srlv_epi32(a, n); }
INLINE vu u_min(vu a, vu b) { return _mm512_min_epu32(a, b); }
INLINE vu u_max(vu a, vu b) { return _mm512_max_epu32(a, b); }
INLINE vu s_max(vu a, vu b) { return _mm512_max_epi32(a, b); }
INLINE vm u_eq(vu a, vu b) { return _mm512_cmpeq_epi32_mask(a, b); }
INLINE vm u_lt(vu a, vu b) { return _mm512_cmplt_epu32_mask(a, b); }
INLINE vm u_le(vu a, vu b) { return _mm512_cmple_epu32_mask(a, b); }
INLINE vm u_gt(vu a, vu b) { return _mm512_cmpgt_epu32_mask(a, b); }
INLINE vm u_ge(vu a, vu b) { return _mm512_cmpge_epu32_mask(a, b); }
INLINE vm s_gt(vu a, vu b) { return _mm512_cmpgt_epi32_mask(a, b); }
INLINE vu u_sel(vm m, vu a, vu b) { return _mm512_mask_mov_epi32(b, m, a); } /* m ? a : b */
INLINE uint32_t u_hmax(vu a) { return (uint32_t)_mm512_reduce_max_epu32(a); }

/* ------------------------------------------------------------------------------------------ memory */
/* Masked lanes read nothing (and give 0) and write nothing. */
/* A constant full mask compiles to a plain load / store: masked ones cannot forward to later loads. */
#define FULL16(m) (__builtin_constant_p(m) && (m) == 0xFFFF)
INLINE vu u_load16(const uint16_t *p, vm m) {
    if (FULL16(m)) return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
}
INLINE vu u_load32(const uint32_t *p, vm m) {
    return FULL16(m) ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(m, p);
}
INLINE void u_store16(uint16_t *p, vu a, vm m) {
    if (FULL16(m)) _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(a));
    else _mm512_mask_cvtepi32_storeu_epi16(p, m, a);
}
INLINE void u_store32(uint32_t *p, vu a, vm m) {
    if (FULL16(m)) _mm512_storeu_si512(p, a);
    else _mm512_mask_storeu_epi32(p, m, a);
}
INLINE void u_store8(uint8_t *p, vu a, vm m) {
    if (FULL16(m)) _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(a));
    else _mm512_mask_cvtepi32_storeu_epi8(p, m, a);
}
/* The low byte of lane k to p[2k] (the odd bytes are left alone). */
INLINE void u_store8_even(uint8_t *p, vu a, vm m) {
    _mm256_mask_storeu_epi8(p, (__mmask32)_pdep_u32(m, 0x55555555u), _mm512_cvtepi32_epi16(a));
}
INLINE vf v_loadf(const float *p, vm m) { return FULL16(m) ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p); }
INLINE void v_storef(float *p, vf a, vm m) {
    if (FULL16(m)) _mm512_storeu_ps(p, a);
    else _mm512_mask_storeu_ps(p, m, a);
}
/* Indices in the lanes (src NULL) are read by the hardware gather: a whole step takes that path too where
   swiglu_glu.gather asks for it (numerics.h act_idx_at). */
#define SIMD_GATHER 1
/* table[idx] in every lane (the activation tables). Where the indices are in memory (``src[i * stride]``,
   a whole step), sixteen scalar loads, as on AVX2, else the gather. Which is faster depends on the CPU:
   vgatherdps is microcoded on AMD and slowed by the gather-data-sampling mitigation on the Intel cores that
   have it (Zen 4, M=8192, 2H=4096 bf16, 2 threads, A/B in one process: MX forward 8.0 -> 7.1 ms with the
   scalar loads, backward 11.7 -> 10.8), while an Intel core without it gathers faster (the loader's choice,
   swiglu_glu.gather; docs/cpu_backend.md). */
INLINE vf v_lookup(const float *table, vu idx, const uint16_t *src, const int stride) {
    if (src == NULL) return _mm512_i32gather_ps(idx, table, 4);
    uint32_t k[16];
    src_keys(src, stride, 16, k);
    __m128 q[4];
    for (int j = 0; j < 4; j++)
        q[j] = _mm_set_ps(table[k[4 * j + 3]], table[k[4 * j + 2]], table[k[4 * j + 1]], table[k[4 * j]]);
    const __m256 lo = _mm256_insertf128_ps(_mm256_castps128_ps256(q[0]), q[1], 1);
    const __m256 hi = _mm256_insertf128_ps(_mm256_castps128_ps256(q[2]), q[3], 1);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
/* (table[2 idx], table[2 idx + 1]) in every lane (swiglu_group_grad's (silu, silu') table): where the indices
   are in memory, one 8-byte load per lane (entries2x8), as on AVX2, else two gathers. Against the sigmoid
   table and the arithmetic that forms silu and silu' from it (bf16 group_grad, M=8192, 2H=4096, Zen 4, A/B
   in one process): one thread 16.2 -> 14.6 ms, two 7.5 -> 7.3. */
INLINE void v_lookup2(const float *table, vu idx, const uint16_t *src, const int stride, vf *a, vf *b) {
    if (src == NULL) {
        *a = _mm512_i32gather_ps(idx, table, 8);
        *b = _mm512_i32gather_ps(idx, table + 1, 8);
        return;
    }
    uint32_t k[16];
    src_keys(src, stride, 16, k);
    __m256 a0, b0, a1, b1;
    entries2x8(table, k, &a0, &b0);
    entries2x8(table, k + 8, &a1, &b1);
    *a = _mm512_insertf32x8(_mm512_castps256_ps512(a0), a1, 1);
    *b = _mm512_insertf32x8(_mm512_castps256_ps512(b0), b1, 1);
}
/* Lanes of pairs -> lanes of elements: bit i of the 8-bit ``m`` becomes bits 2i and 2i + 1. */
INLINE vm m_pairs(unsigned m) {
    m &= 0xFF;
    m = (m | (m << 4)) & 0x0F0F;
    m = (m | (m << 2)) & 0x3333;
    m = (m | (m << 1)) & 0x5555;
    return (vm)(m | (m << 1));
}
/* 32 consecutive 32-bit elements (16 pairs, ``m`` selects pairs) as their even and odd ones: element 2i goes
   to lane i of *even, element 2i + 1 to lane i of *odd. */
INLINE void u_load32_pairs(const uint32_t *p, vm m, vu *even, vu *odd) {
    const vu lo = _mm512_maskz_loadu_epi32(m_pairs(m), p);
    const vu hi = _mm512_maskz_loadu_epi32(m_pairs(m >> 8), p + 16);
    const vu ie = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    *even = _mm512_permutex2var_epi32(lo, ie, hi);
    *odd = _mm512_permutex2var_epi32(lo, _mm512_add_epi32(ie, _mm512_set1_epi32(1)), hi);
}
INLINE void u_store32_pairs(uint32_t *p, vu even, vu odd, vm m) {
    const vu il = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const vu ih = _mm512_add_epi32(il, _mm512_set1_epi32(8));
    _mm512_mask_storeu_epi32(p, m_pairs(m), _mm512_permutex2var_epi32(even, il, odd));
    _mm512_mask_storeu_epi32(p + 16, m_pairs(m >> 8), _mm512_permutex2var_epi32(even, ih, odd));
}
/* 16 pairs of 16-bit elements, as one 32-bit lane per pair (element 2i in the low half). */
INLINE vu u_load16_pairs(const uint16_t *p, vm m) { return _mm512_maskz_loadu_epi32(m, p); }
INLINE void u_store16_pairs(uint16_t *p, vu even, vu odd, vm m) {
    _mm512_mask_storeu_epi32(p, m, _mm512_or_si512(_mm512_and_si512(even, _mm512_set1_epi32(0xFFFF)),
                                                   _mm512_slli_epi32(odd, 16)));
}

/* 16 FP4 codes (nibbles in 32-bit lanes) packed two per byte, lane 2j in the low nibble: 8 bytes, ``m``
   selecting whole pairs of lanes. */
INLINE void u_store_nibbles(uint8_t *p, vu codes, vm m) {
    unsigned x = m & 0x5555u; /* one bit per pair */
    x = (x | (x >> 1)) & 0x3333u;
    x = (x | (x >> 2)) & 0x0F0Fu;
    x = (x | (x >> 4)) & 0x00FFu;
    _mm512_mask_cvtepi64_storeu_epi8(p, (__mmask8)x, _mm512_or_si512(codes, _mm512_srli_epi64(codes, 28)));
}

/* The amax of each of ``nb`` <= 16 consecutive 32-element blocks, as their largest magnitude bits (lanes from
   nb on are 0). A transposed reduction tree instead of 16 horizontal ones: each level halves the 32-bit
   units per block with one max of two permutations, until every unit holds one block's candidates. */
static const int32_t amax_tree_idx[4][2][16] = {
    {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
     {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
    {{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
     {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}},
    {{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
     {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31}},
    {{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
     {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}},
};

/* r[k]: block k's magnitudes as 16 32-bit units (two 16-bit values each when ``sixteen``); returns r[0]. */
INLINE __m512i amax_tree(__m512i r[16], const int sixteen) {
    for (int level = 0, n = 8; level < 4; level++, n /= 2) {
        const __m512i lo = _mm512_loadu_si512(amax_tree_idx[level][0]);
        const __m512i hi = _mm512_loadu_si512(amax_tree_idx[level][1]);
        for (int k = 0; k < n; k++) {
            const __m512i a = _mm512_permutex2var_epi32(r[2 * k], lo, r[2 * k + 1]);
            const __m512i b = _mm512_permutex2var_epi32(r[2 * k], hi, r[2 * k + 1]);
            r[k] = sixteen ? _mm512_max_epu16(a, b) : _mm512_max_epu32(a, b);
        }
    }
    return r[0];
}

/* Stored 16-bit values: 32 per vector, one block per vector; each unit ends with two candidates. */
INLINE vu u_block_amax16(const uint16_t *v, int64_t nb) {
    const __m512i mag = _mm512_set1_epi16(0x7FFF);
    __m512i r[16];
    for (int k = 0; k < 16; k++)
        r[k] = k < nb ? _mm512_and_si512(_mm512_loadu_si512(v + 32 * k), mag) : _mm512_setzero_si512();
    const __m512i t = amax_tree(r, 1);
    return _mm512_max_epu32(_mm512_and_si512(t, _mm512_set1_epi32(0xFFFF)), _mm512_srli_epi32(t, 16));
}

/* 32-bit values: the two halves of each block first, then the tree. */
INLINE vu u_block_amax32(const uint32_t *v, int64_t nb) {
    const __m512i mag = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i r[16];
    for (int k = 0; k < 16; k++)
        r[k] = k < nb ? _mm512_max_epu32(_mm512_and_si512(_mm512_loadu_si512(v + 32 * k), mag),
                                         _mm512_and_si512(_mm512_loadu_si512(v + 32 * k + 16), mag))
                      : _mm512_setzero_si512();
    return amax_tree(r, 0);
}

/* ------------------------------------------------------------------------------- 32 x 16-bit lanes */
/* For the FP8 encoder of 16-bit values (numerics.h fp8x32_encode): 32 lanes per vector. */
typedef __m512i vw;
typedef __mmask32 vwm;
INLINE vw w_set(uint16_t x) { return _mm512_set1_epi16((short)x); }
/* The low 16 bits of lane k of v in every lane (from registers: no store-to-load round trip). */
INLINE vw w_bcast(vu v, int k) { return _mm512_permutexvar_epi16(_mm512_set1_epi16((short)(2 * k)), v); }
#define FULL32(m) (__builtin_constant_p(m) && (m) == 0xFFFFFFFFu)
INLINE vw w_load(const uint16_t *p, vwm m) { return FULL32(m) ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p); }
INLINE void w_store(uint16_t *p, vw a, vwm m) {
    if (FULL32(m)) _mm512_storeu_si512(p, a);
    else _mm512_mask_storeu_epi16(p, m, a);
}
/* 32 lanes below 256 (codes) as bytes. */
INLINE void w_store8(uint8_t *p, vw a, vwm m) {
    if (FULL32(m)) _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi16_epi8(a));
    else _mm512_mask_cvtepi16_storeu_epi8(p, m, a);
}
/* 32 FP4 codes (nibbles in 16-bit lanes) packed two per byte, lane 2j in the low nibble: 16 bytes, ``m``
   selecting whole pairs of lanes. */
INLINE void w_store_nibbles(uint8_t *p, vw codes, vwm m) {
    const __m512i packed = _mm512_or_si512(codes, _mm512_srli_epi32(codes, 12)); /* byte 0 of each 32-bit lane */
    _mm512_mask_cvtepi32_storeu_epi8(p, (__mmask16)_pext_u32(m, 0x55555555u), packed);
}
INLINE vw w_add(vw a, vw b) { return _mm512_add_epi16(a, b); }
INLINE vw w_sub(vw a, vw b) { return _mm512_sub_epi16(a, b); }
INLINE vw w_and(vw a, vw b) { return _mm512_and_si512(a, b); }
INLINE vw w_or(vw a, vw b) { return _mm512_or_si512(a, b); }
INLINE vw w_shr(vw a, int n) { return _mm512_srl_epi16(a, _mm_cvtsi32_si128(n)); }
INLINE vw w_shl(vw a, int n) { return _mm512_sll_epi16(a, _mm_cvtsi32_si128(n)); }
INLINE vw w_shrv(vw a, vw n) { return _mm512_srlv_epi16(a, n); } /* 0 for counts >= 16 */
INLINE vw w_shlv(vw a, vw n) { return _mm512_sllv_epi16(a, n); }
INLINE vw w_sra(vw a, int n) { return _mm512_sra_epi16(a, _mm_cvtsi32_si128(n)); } /* signed */
INLINE vw w_min(vw a, vw b) { return _mm512_min_epu16(a, b); }
INLINE vw w_minz(vwm m, vw a, vw b) { return _mm512_maskz_min_epu16(m, a, b); } /* m ? min(a, b) : 0 */
INLINE vw w_max(vw a, vw b) { return _mm512_max_epu16(a, b); }
/* Signed lanes clamped to [lo, hi]. */
INLINE vw w_clamp_s(vw a, int16_t lo, int16_t hi) {
    return _mm512_min_epi16(_mm512_max_epi16(a, _mm512_set1_epi16(lo)), _mm512_set1_epi16(hi));
}
/* A 64-entry table of 16-bit values (``lo``: entries 0-31, ``hi``: 32-63) at the indices ``idx`` (0-63),
   lanes outside ``m`` 0: one vpermi2w. The layers without it (SIMD_LUT64 0) take another form. */
#define SIMD_LUT64 1
INLINE vw w_lut64z(vwm m, vw idx, vw lo, vw hi) { return _mm512_maskz_permutex2var_epi16(m, lo, idx, hi); }
/* The 32-bit lanes of lo (lanes 0-15) and hi (lanes 16-31), holding values < 65536, as 16-bit lanes. */
INLINE vw w_pack(vu lo, vu hi) {
    const __m512i idx = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28,
                                         26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    return _mm512_permutex2var_epi16(lo, idx, hi);
}
/* Lanes 0-15 to the even lanes, 16-31 to the odd ones. */
INLINE vw w_interleave(vw a) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                         6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, a);
}
INLINE vw w_sel(vwm m, vw a, vw b) { return _mm512_mask_mov_epi16(b, m, a); } /* m ? a : b */
INLINE vwm w_eq(vw a, vw b) { return _mm512_cmpeq_epi16_mask(a, b); }
INLINE vwm w_ge_s(vw a, vw b) { return _mm512_cmpge_epi16_mask(a, b); } /* signed */
INLINE vwm w_lt_s(vw a, vw b) { return _mm512_cmplt_epi16_mask(a, b); } /* signed */
INLINE vwm w_lt_u(vw a, vw b) { return _mm512_cmplt_epu16_mask(a, b); }
INLINE vwm w_nz(vw a) { return _mm512_test_epi16_mask(a, a); } /* a != 0 */
INLINE vwm w_ge_u(vw a, vw b) { return _mm512_cmpge_epu16_mask(a, b); }
INLINE vwm w_lanes(int64_t n) { return n >= 32 ? (vwm)0xFFFFFFFFu : (vwm)((1u << (n > 0 ? n : 0)) - 1u); }
INLINE vwm wm_or(vwm a, vwm b) { return a | b; }
INLINE vwm wm_and(vwm a, vwm b) { return a & b; }
INLINE vwm wm_not(vwm a) { return ~a; }
INLINE int wm_all(vwm a, vwm m) { return (a & m) == m; }
INLINE int wm_any(vwm a) { return a != 0; }

/* ------------------------------------------------------------------------- 16-bit float conversions */
/* fp16 bits (low 16 of each lane) -> fp32, exact (vcvtph2ps; NaN comes out quiet). */
INLINE vf v_from_fp16(vu bits) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(bits)); }
/* The fp32 values of 16 stored fp16 elements (masked lanes 0). */
INLINE vf v_load_fp16(const uint16_t *p, vm m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
/* fp32 -> fp16 bits, RNE, overflow to inf; NaN -> 0x7E00 (canonical). */
INLINE vu u_to_fp16(vf v) {
    const vu h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return _mm512_mask_mov_epi32(h, v_isnan(v), _mm512_set1_epi32(0x7E00));
}
#ifdef __AVX512BF16__
/* The native rounding to bf16 (simd_shared.h's hook): vcvtneps2bf16 rounds like the integer path except for
   NaN (payload kept) and fp32 subnormals (flushed), so vectors holding one of those take the integer path. */
#define SIMD_BF16_NATIVE 1
#define BF16_SLOW(v) _mm512_fpclass_ps_mask((v), 0xA1) /* QNaN | SNaN | denormal */
INLINE int bf16_native_ok(vf v) { return BF16_SLOW(v) == 0; }
INLINE int bf16_native_ok2(vf lo, vf hi) { return _kortestz_mask16_u8(BF16_SLOW(lo), BF16_SLOW(hi)); }
INLINE vu u_to_bf16_native(vf v) { return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)); }
INLINE vw w_to_bf16x2_native(vf lo, vf hi) { return (vw)_mm512_cvtne2ps_pbh(hi, lo); } /* one vcvtne2ps2bf16 */
#endif

#endif
