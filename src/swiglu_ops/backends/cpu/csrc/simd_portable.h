/* The SIMD layer in portable C: GNU vector extensions (GCC, Clang) of 16 lanes, which the compiler lowers
   to whatever the target has (SSE2 on x86-64, NEON on AArch64, scalar code elsewhere; AVX2 CPUs take
   simd_avx2.h).

   Every function gives the same result bits as its twins in simd_avx512.h and simd_avx2.h: IEEE operations are exact
   functions of their operands, the clamps are written as the same selects, the FMA is C's fmaf (one
   rounding: a single instruction where the target has FMA, glibc's exact software fmaf elsewhere), and the
   conversions are integer transcriptions of round-to-nearest-even with canonical NaNs. */
#ifndef SWIGLU_SIMD_PORTABLE_H
#define SWIGLU_SIMD_PORTABLE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define SIMD_NAME "portable"

typedef float vf __attribute__((vector_size(64)));    /* 16 x fp32 */
typedef uint32_t vu __attribute__((vector_size(64))); /* 16 x 32-bit integer */
typedef int32_t vs __attribute__((vector_size(64)));
typedef vs vm; /* 16 lanes: 0 or -1 */

#define LANES 16
#define FOR_LANES for (int i_ = 0; i_ < LANES; i_++)

/* Comparisons run on pieces of the target's native vector width (16 bytes: SSE2 / NEON). GCC lowers a compare of a wider-than-native vector lane by
   lane with scalar compares and branches; a native-width compare is one instruction. */
#define PORTABLE_NATIVE_BYTES 16
#define PIECES (64 / PORTABLE_NATIVE_BYTES)
typedef float vf_n __attribute__((vector_size(PORTABLE_NATIVE_BYTES)));
typedef uint32_t vu_n __attribute__((vector_size(PORTABLE_NATIVE_BYTES)));
typedef int32_t vs_n __attribute__((vector_size(PORTABLE_NATIVE_BYTES)));
#define CMP_PIECES_T(TN, RN, RT, a, b, op)                                                                    \
    __extension__({                                                                                          \
        TN a_[PIECES], b_[PIECES];                                                                           \
        RN r_[PIECES];                                                                                       \
        RT r;                                                                                                \
        memcpy(a_, &(a), sizeof a_);                                                                         \
        memcpy(b_, &(b), sizeof b_);                                                                         \
        for (int p_ = 0; p_ < PIECES; p_++) r_[p_] = (RN)(a_[p_] op b_[p_]);                                 \
        memcpy(&r, r_, sizeof r);                                                                            \
        r;                                                                                                   \
    })
#define CMP_PIECES(TN, a, b, op) CMP_PIECES_T(TN, vs_n, vm, a, b, op)

/* ------------------------------------------------------------------------------------------ masks */
INLINE vm m_all(void) { return (vm){0} == (vm){0}; }
INLINE vm m_lanes(int64_t n) {
    const vs idx = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const vs k = (vs){0} + (int32_t)(n > LANES ? LANES : n);
    return CMP_PIECES(vs_n, idx, k, <);
}
INLINE vm m_and(vm a, vm b) { return a & b; }
INLINE vm m_or(vm a, vm b) { return a | b; }
INLINE vm m_not(vm a) { return ~a; }
INLINE int m_any(vm a) {
    uint64_t w[LANES / 2]; /* eight 64-bit ORs instead of sixteen lane extractions */
    memcpy(w, &a, sizeof w);
    return (w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7]) != 0;
}

/* ----------------------------------------------------------------------------------------- floats */
/* A broadcast, bit for bit: ``(vf){0} + x`` would turn -0.0 into +0.0 (a routing weight of -0.0 must stay
   -0.0: +0.0 * negative = -0.0) and quieten a signalling NaN. */
INLINE vf v_set(float x) { return (vf){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
INLINE vf v_zero(void) { return (vf){0}; }
INLINE vf v_add(vf a, vf b) { return a + b; }
INLINE vf v_sub(vf a, vf b) { return a - b; }
INLINE vf v_mul(vf a, vf b) { return a * b; }
INLINE vf v_div(vf a, vf b) { return a / b; }
INLINE vf v_fma(vf a, vf b, vf c) {
    vf r;
    FOR_LANES r[i_] = fmaf(a[i_], b[i_], c[i_]);
    return r;
}
INLINE vf v_floor(vf a) {
    vf r;
    FOR_LANES r[i_] = floorf(a[i_]);
    return r;
}
INLINE vf v_trunc(vf a) {
    vf r;
    FOR_LANES r[i_] = truncf(a[i_]);
    return r;
}
INLINE vf v_rint(vf a) { /* to nearest, ties to even (the default rounding mode, which the kernels keep) */
    vf r;
    FOR_LANES r[i_] = nearbyintf(a[i_]);
    return r;
}
INLINE vu v_bits(vf a) { return (vu)a; }
INLINE vf v_from_bits(vu a) { return (vf)a; }
INLINE vf v_sel(vm m, vf a, vf b) { return (vf)(((vu)m & (vu)a) | (~(vu)m & (vu)b)); } /* m ? a : b */
INLINE vm v_lt(vf a, vf b) { return CMP_PIECES(vf_n, a, b, <); } /* ordered: false on NaN */
INLINE vm v_le(vf a, vf b) { return CMP_PIECES(vf_n, a, b, <=); }
INLINE vm v_gt(vf a, vf b) { return CMP_PIECES(vf_n, a, b, >); }
INLINE vm v_ge(vf a, vf b) { return CMP_PIECES(vf_n, a, b, >=); }
INLINE vm v_eq(vf a, vf b) { return CMP_PIECES(vf_n, a, b, ==); }
INLINE vm v_isnan(vf a) { return ~v_eq(a, a); }
/* (c < a) ? c : a and (c > a) ? c : a: a NaN ``a`` comes through (the clamps' NaN propagation). */
INLINE vf v_minc(vf a, vf c) { return v_sel(v_lt(c, a), c, a); }
INLINE vf v_maxc(vf a, vf c) { return v_sel(v_gt(c, a), c, a); }
INLINE vf v_neg(vf a) { return (vf)((vu)a ^ 0x80000000u); }

/* ---------------------------------------------------------------------------------------- integers */
INLINE vu u_set(uint32_t x) { return (vu){0} + x; }
INLINE vu u_zero(void) { return (vu){0}; }
INLINE vu u_iota(void) { return (vu){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}; }
INLINE vu u_add(vu a, vu b) { return a + b; }
INLINE vu u_sub(vu a, vu b) { return a - b; }
INLINE vu u_and(vu a, vu b) { return a & b; }
INLINE vu u_or(vu a, vu b) { return a | b; }
#define u_shl(a, n) ((vu)(a) << (n))
#define u_shr(a, n) ((vu)(a) >> (n))
#define s_sra(a, n) ((vu)((vs)(a) >> (n)))
INLINE vu u_sel(vm m, vu a, vu b) { return ((vu)m & a) | (~(vu)m & b); } /* m ? a : b */
INLINE vm u_eq(vu a, vu b) { return CMP_PIECES(vu_n, a, b, ==); }
INLINE vm u_lt(vu a, vu b) { return CMP_PIECES(vu_n, a, b, <); }
INLINE vm u_le(vu a, vu b) { return CMP_PIECES(vu_n, a, b, <=); }
INLINE vm u_gt(vu a, vu b) { return CMP_PIECES(vu_n, a, b, >); }
INLINE vm u_ge(vu a, vu b) { return CMP_PIECES(vu_n, a, b, >=); }
INLINE vm s_gt(vu a, vu b) { return CMP_PIECES(vs_n, a, b, >); }
INLINE vu u_shrv(vu a, vu n) { return u_sel(u_lt(n, u_set(32)), a >> (n & 31u), u_zero()); } /* 0 past 31 */
INLINE vu u_min(vu a, vu b) { return u_sel(u_lt(a, b), a, b); }
INLINE vu u_max(vu a, vu b) { return u_sel(u_gt(a, b), a, b); }
INLINE vu s_max(vu a, vu b) { return u_sel(s_gt(a, b), a, b); }
INLINE uint32_t u_hmax(vu a) {
    uint32_t r = 0;
    FOR_LANES r = a[i_] > r ? a[i_] : r;
    return r;
}

/* ------------------------------------------------------------------------------------------ memory */
/* Masked lanes read nothing (and give 0) and write nothing. Full vectors take one unconditional copy,
   which compilers turn into vector loads and stores; partial ones (row tails) a call. */
#define FULL(m) (!m_any(~(m)))
static __attribute__((noinline)) vu u_load16_part(const uint16_t *p, vm m) {
    vu r = u_zero();
    FOR_LANES if (m[i_]) r[i_] = p[i_];
    return r;
}
static __attribute__((noinline)) vu u_load32_part(const uint32_t *p, vm m) {
    vu r = u_zero();
    FOR_LANES if (m[i_]) r[i_] = p[i_];
    return r;
}
static __attribute__((noinline)) void u_store16_part(uint16_t *p, vu a, vm m) {
    FOR_LANES if (m[i_]) p[i_] = (uint16_t)a[i_];
}
static __attribute__((noinline)) void u_store32_part(uint32_t *p, vu a, vm m) {
    FOR_LANES if (m[i_]) p[i_] = a[i_];
}
static __attribute__((noinline)) void u_store8_part(uint8_t *p, vu a, vm m) {
    FOR_LANES if (m[i_]) p[i_] = (uint8_t)a[i_];
}
INLINE vu u_load16(const uint16_t *p, vm m) {
    if (!FULL(m)) return u_load16_part(p, m);
    uint16_t t[LANES];
    vu r;
    memcpy(t, p, sizeof t);
    FOR_LANES r[i_] = t[i_];
    return r;
}
INLINE vu u_load32(const uint32_t *p, vm m) {
    if (!FULL(m)) return u_load32_part(p, m);
    vu r;
    memcpy(&r, p, sizeof r);
    return r;
}
INLINE void u_store16(uint16_t *p, vu a, vm m) {
    if (!FULL(m)) {
        u_store16_part(p, a, m);
        return;
    }
    uint16_t t[LANES];
    FOR_LANES t[i_] = (uint16_t)a[i_];
    memcpy(p, t, sizeof t);
}
INLINE void u_store32(uint32_t *p, vu a, vm m) {
    if (!FULL(m)) u_store32_part(p, a, m);
    else memcpy(p, &a, sizeof a);
}
/* The low byte of lane k to p[2k] (the odd bytes are left alone). */
INLINE void u_store8_even(uint8_t *p, vu a, vm m) { FOR_LANES if (m[i_]) p[2 * i_] = (uint8_t)a[i_]; }
INLINE void u_store8(uint8_t *p, vu a, vm m) {
    if (!FULL(m)) {
        u_store8_part(p, a, m);
        return;
    }
    uint8_t t[LANES];
    FOR_LANES t[i_] = (uint8_t)a[i_];
    memcpy(p, t, sizeof t);
}
INLINE vf v_loadf(const float *p, vm m) { return v_from_bits(u_load32((const uint32_t *)p, m)); }
INLINE void v_storef(float *p, vf a, vm m) { u_store32((uint32_t *)p, v_bits(a), m); }
/* table[idx] in every lane (the activation tables). */
/* ``src``/``stride`` (the indices in memory) unused. */
HEAVY vf v_lookup(const float *table, vu idx, const uint16_t *src, const int stride) {
    (void)src, (void)stride;
    vf r;
    FOR_LANES r[i_] = table[idx[i_]];
    return r;
}
HEAVY void v_lookup2(const float *table, vu idx, const uint16_t *src, const int stride, vf *a, vf *b) {
    (void)src, (void)stride;
    vf x, y;
    FOR_LANES x[i_] = table[2 * (size_t)idx[i_]], y[i_] = table[2 * (size_t)idx[i_] + 1];
    *a = x;
    *b = y;
}
/* No 64-entry 16-bit table lookup (numerics.h fp8x32_code2 computes E2M1 codes by compares). */
#define SIMD_LUT64 0
HEAVY void u_load32_pairs(const uint32_t *p, vm m, vu *even, vu *odd) {
    vu e = u_zero(), o = u_zero();
    FOR_LANES if (m[i_]) {
        e[i_] = p[2 * i_];
        o[i_] = p[2 * i_ + 1];
    }
    *even = e;
    *odd = o;
}
HEAVY void u_store32_pairs(uint32_t *p, vu even, vu odd, vm m) {
    FOR_LANES if (m[i_]) {
        p[2 * i_] = even[i_];
        p[2 * i_ + 1] = odd[i_];
    }
}
HEAVY vu u_load16_pairs(const uint16_t *p, vm m) {
    vu r = u_zero();
    FOR_LANES if (m[i_]) r[i_] = (uint32_t)p[2 * i_] | ((uint32_t)p[2 * i_ + 1] << 16);
    return r;
}
HEAVY void u_store16_pairs(uint16_t *p, vu even, vu odd, vm m) {
    FOR_LANES if (m[i_]) {
        p[2 * i_] = (uint16_t)even[i_];
        p[2 * i_ + 1] = (uint16_t)odd[i_];
    }
}

/* 16 FP4 codes (nibbles in 32-bit lanes) packed two per byte, lane 2j in the low nibble: 8 bytes, ``m``
   selecting whole pairs of lanes. */
HEAVY void u_store_nibbles(uint8_t *p, vu codes, vm m) {
    for (int j = 0; j < LANES / 2; j++)
        if (m[2 * j]) p[j] = (uint8_t)((codes[2 * j] & 0xFu) | ((codes[2 * j + 1] & 0xFu) << 4));
}

/* The amax of each of ``nb`` <= 16 consecutive 32-element blocks, as their largest magnitude bits (lanes from
   nb on are 0); ``wide``: 32-bit values, else 16-bit. */
HEAVY vu u_block_amax(const void *v, int64_t nb, int wide) {
    vu r = u_zero();
    for (int64_t k = 0; k < nb; k++) {
        uint32_t m = 0;
        for (int j = 0; j < 32; j++) {
            const uint32_t x = wide ? ((const uint32_t *)v)[32 * k + j] & 0x7FFFFFFFu
                                    : ((const uint16_t *)v)[32 * k + j] & 0x7FFFu;
            m = x > m ? x : m;
        }
        r[k] = m;
    }
    return r;
}
INLINE vu u_block_amax16(const uint16_t *v, int64_t nb) { return u_block_amax(v, nb, 0); }
INLINE vu u_block_amax32(const uint32_t *v, int64_t nb) { return u_block_amax(v, nb, 1); }

/* ------------------------------------------------------------------------------- 32 x 16-bit lanes */
/* For the FP8 encoder of 16-bit values (numerics.h fp8x32_encode): 32 lanes per vector. */
typedef uint16_t vw __attribute__((vector_size(64)));
typedef int16_t vws __attribute__((vector_size(64)));
typedef vws vwm; /* 32 lanes: 0 or -1 */
typedef uint16_t vw_n __attribute__((vector_size(PORTABLE_NATIVE_BYTES)));
typedef int16_t vws_n __attribute__((vector_size(PORTABLE_NATIVE_BYTES)));
#define FOR_WLANES for (int i_ = 0; i_ < 32; i_++)
INLINE vw w_set(uint16_t x) { return (vw){0} + x; }
INLINE vw w_bcast(vu v, int k) { return w_set((uint16_t)v[k]); } /* the low 16 bits of lane k */
static __attribute__((noinline)) vw w_load_part(const uint16_t *p, vwm m) {
    vw r = {0};
    FOR_WLANES if (m[i_]) r[i_] = p[i_];
    return r;
}
INLINE int wm_all(vwm a, vwm m) {
    int16_t r = -1;
    FOR_WLANES r &= (int16_t)(a[i_] | ~m[i_]);
    return r == -1;
}
INLINE vwm w_lanes(int64_t n) {
    const vws idx = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                     16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
    const vws k = (vws){0} + (int16_t)(n > 32 ? 32 : n);
    return CMP_PIECES_T(vws_n, vws_n, vwm, idx, k, <);
}
INLINE vw w_load(const uint16_t *p, vwm m) {
    if (!wm_all(m, w_lanes(32))) return w_load_part(p, m);
    vw r;
    memcpy(&r, p, sizeof r);
    return r;
}
static __attribute__((noinline)) void w_store_part(uint16_t *p, vw a, vwm m) {
    FOR_WLANES if (m[i_]) p[i_] = a[i_];
}
INLINE void w_store(uint16_t *p, vw a, vwm m) {
    if (!wm_all(m, w_lanes(32))) w_store_part(p, a, m);
    else memcpy(p, &a, sizeof a);
}
/* 32 lanes below 256 (codes) as bytes. */
HEAVY void w_store8(uint8_t *p, vw a, vwm m) {
    FOR_WLANES if (m[i_]) p[i_] = (uint8_t)a[i_];
}
/* 32 FP4 codes (nibbles in 16-bit lanes) packed two per byte, lane 2j in the low nibble: 16 bytes, ``m``
   selecting whole pairs of lanes. */
HEAVY void w_store_nibbles(uint8_t *p, vw codes, vwm m) {
    for (int j = 0; j < 16; j++)
        if (m[2 * j]) p[j] = (uint8_t)((codes[2 * j] & 0xFu) | ((codes[2 * j + 1] & 0xFu) << 4));
}
INLINE vw w_add(vw a, vw b) { return a + b; }
INLINE vw w_sub(vw a, vw b) { return a - b; }
INLINE vw w_and(vw a, vw b) { return a & b; }
INLINE vw w_or(vw a, vw b) { return a | b; }
INLINE vw w_shr(vw a, int n) { return a >> n; }
INLINE vw w_shl(vw a, int n) { return a << n; }
INLINE vw w_sel(vwm m, vw a, vw b) { return ((vw)m & a) | (~(vw)m & b); } /* m ? a : b */
INLINE vwm w_lt_u(vw a, vw b) { return CMP_PIECES_T(vw_n, vws_n, vwm, a, b, <); }
INLINE vwm w_eq(vw a, vw b) { return CMP_PIECES_T(vw_n, vws_n, vwm, a, b, ==); }
INLINE vwm w_ge_s(vw a, vw b) { /* signed */
    const vws sa = (vws)a, sb = (vws)b;
    return CMP_PIECES_T(vws_n, vws_n, vwm, sa, sb, >=);
}
INLINE vwm w_ge_u(vw a, vw b) { return CMP_PIECES_T(vw_n, vws_n, vwm, a, b, >=); }
INLINE vw w_shrv(vw a, vw n) { return w_sel(w_lt_u(n, w_set(16)), a >> (n & 15), (vw){0}); } /* 0 for counts >= 16 */
INLINE vw w_shlv(vw a, vw n) { return w_sel(w_lt_u(n, w_set(16)), a << (n & 15), (vw){0}); }
INLINE vw w_sra(vw a, int n) { return (vw)((vws)a >> n); } /* signed */
INLINE vw w_min(vw a, vw b) { return w_sel(w_lt_u(a, b), a, b); }
INLINE vw w_minz(vwm m, vw a, vw b) { return (vw)m & w_min(a, b); } /* m ? min(a, b) : 0 */
INLINE vw w_max(vw a, vw b) { return w_sel(w_lt_u(a, b), b, a); }
/* The 32-bit lanes of lo (lanes 0-15) and hi (lanes 16-31), holding values < 65536, as 16-bit lanes. */
INLINE vw w_pack(vu lo, vu hi) {
    vw r;
    FOR_LANES {
        r[i_] = (uint16_t)lo[i_];
        r[i_ + 16] = (uint16_t)hi[i_];
    }
    return r;
}
/* Lanes 0-15 to the even lanes, 16-31 to the odd ones. */
INLINE vw w_interleave(vw a) {
    vw r;
    FOR_LANES {
        r[2 * i_] = a[i_];
        r[2 * i_ + 1] = a[i_ + 16];
    }
    return r;
}
INLINE vwm w_lt_s(vw a, vw b) { /* signed */
    const vws sa = (vws)a, sb = (vws)b;
    return CMP_PIECES_T(vws_n, vws_n, vwm, sa, sb, <);
}
INLINE vwm w_nz(vw a) { return ~w_eq(a, (vw){0}); } /* a != 0 */
INLINE int wm_any(vwm a) {
    uint64_t w[8]; /* eight 64-bit ORs instead of 32 lane extractions */
    memcpy(w, &a, sizeof w);
    return (w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7]) != 0;
}
INLINE vwm wm_or(vwm a, vwm b) { return a | b; }
INLINE vwm wm_and(vwm a, vwm b) { return a & b; }
INLINE vwm wm_not(vwm a) { return ~a; }

/* ------------------------------------------------------------------------- 16-bit float conversions */
/* fp16 bits (low 16 of each lane) -> fp32, exact. Exponent and mantissa move into place and are rebiased;
   inf/NaN get the top exponent; subnormals are renormalised by one exact fp32 subtraction
   (2**-14 * (1 + m/1024) - 2**-14 = m * 2**-24). NaN comes out quiet, as from vcvtph2ps. */
HEAVY vf v_from_fp16(vu bits) {
    const vu o = (bits & 0x7FFFu) << 13;
    const vu e = o & 0x0F800000u;
    vu r = o + 0x38000000u;
    r = u_sel(u_eq(e, u_set(0x0F800000u)), r + 0x38000000u, r);
    const vf sub = (vf)(r + 0x00800000u) - (vf)u_set(0x38800000u);
    r = u_sel(u_eq(e, u_zero()), (vu)sub, r);
    r |= (bits & 0x8000u) << 16;
    return (vf)u_sel(m_and(u_eq(e, u_set(0x0F800000u)), m_not(u_eq(bits & 0x3FFu, u_zero()))), r | 0x00400000u, r);
}
/* The fp32 values of 16 stored fp16 elements (masked lanes 0). */
INLINE vf v_load_fp16(const uint16_t *p, vm m) { return v_from_fp16(u_load16(p, m)); }
/* fp32 -> fp16 bits, RNE, overflow to inf, subnormals kept; NaN -> 0x7E00 (canonical). */
HEAVY vu u_to_fp16(vf v) {
    const vu u = (vu)v;
    const vu a = u & 0x7FFFFFFFu;
    const vu sign = (u >> 16) & 0x8000u;
    /* below 2**-14: the fp32 add of 0.5 rounds to a multiple of 2**-24 (RNE) */
    const vu sub = (vu)((vf)a + 0.5f) - 0x3F000000u;
    /* normal: rebias and round the 13 dropped mantissa bits to nearest even (a carry may reach inf) */
    const vu nrm = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    vu h = u_sel(u_lt(a, u_set(0x38800000u)), sub, nrm);
    h = u_sel(u_ge(a, u_set(0x47800000u)), u_set(0x7C00u), h); /* >= 65536 (or inf): inf */
    h |= sign;
    return u_sel(u_gt(a, u_set(0x7F800000u)), u_set(0x7E00u), h);
}

#endif
