/* The numeric rules every kernel uses, written once on the SIMD layer (simd_avx512.h / simd_portable.h),
   16 lanes at a time:

   - storage: loading bf16 / fp16 / fp32 elements as exact fp32 values, and rounding fp32 results back
     (round-to-nearest-even, overflow to inf, canonical NaNs so that every path gives the same bits);
   - exp: a Cody-Waite range reduction plus a degree-6 polynomial with fused multiply-adds, within ~1 ulp
     of the correctly rounded value over the whole fp32 range (the contract allows another exp than the
     reference's; this is the one every CPU path shares);
   - the activation functions of the GLU family (the transcendental part, a function of A alone): for
     16-bit inputs the kernels read them from a table of all 65,536 bit patterns built by these same
     functions (swiglu_act_table), so both give the same bits;
   - the MX rules: E8M0 scale codes (RCEIL and OCP), the element multiplier, FP8 and FP4 element codes
     (swiglu_ops/mx.py is the readable statement of the same rules; the tests compare them bit for bit).

   Every fp32 operation is one IEEE operation in the operator's order: the build passes -ffp-contract=off,
   so nothing is contracted into an FMA except the explicit v_fma of exp. */
#ifndef SWIGLU_NUMERICS_H
#define SWIGLU_NUMERICS_H

/* --------------------------------------------------------------------------------------- storage */

/* fp32 values of stored elements (bits zero-extended in 32-bit lanes). */
INLINE vf widen(vu bits, const int dt) {
    if (dt == SWIGLU_BF16) return v_from_bits(u_shl(bits, 16));
    if (dt == SWIGLU_FP16) return v_from_fp16(bits);
    return v_from_bits(bits);
}

/* Stored bits of fp32 values rounded to ``dt``: RNE, overflow to inf, NaN canonical (0x7FC0 / 0x7E00 /
   0x7FC00000): NaN payloads would otherwise depend on which operand order a compiler chose. */
INLINE vu narrow(vf v, const int dt) {
    if (dt == SWIGLU_BF16) return u_to_bf16(v);
    if (dt == SWIGLU_FP16) return u_to_fp16(v);
    return u_sel(v_isnan(v), u_set(0x7FC00000u), v_bits(v));
}

/* A grad_weight sum as stored: NaN canonical (0x7FC00000), as the stored values above, since a NaN's sign
   and payload would depend on each instruction set's order of the sum. */
INLINE float grad_weight_value(float sum) {
    if (sum != sum) return __builtin_nanf("");
    return 0.0f + sum;
}

/* The same for 32 results (lo: lanes 0-15, hi: 16-31) of a 16-bit ``dt``, as 16-bit lanes. */
INLINE vw narrow2(vf lo, vf hi, const int dt) {
    if (dt == SWIGLU_BF16) return w_to_bf16x2(lo, hi);
    return w_pack(u_to_fp16(lo), u_to_fp16(hi));
}

/* 16 stored elements from element ``i`` of ``base`` (masked lanes give 0). */
INLINE vu ld_bits(const void *base, int64_t i, const int dt, vm m) {
    if (dt == SWIGLU_FP32) return u_load32((const uint32_t *)base + i, m);
    return u_load16((const uint16_t *)base + i, m);
}
INLINE void st_bits(void *base, int64_t i, vu bits, const int dt, vm m) {
    if (dt == SWIGLU_FP32) u_store32((uint32_t *)base + i, bits, m);
    else u_store16((uint16_t *)base + i, bits, m);
}
INLINE vf ld(const void *base, int64_t i, const int dt, vm m) {
    if (dt == SWIGLU_FP16) return v_load_fp16((const uint16_t *)base + i, m); /* AVX2: converted from memory */
    return widen(ld_bits(base, i, dt, m), dt);
}
INLINE void st(void *base, int64_t i, vf v, const int dt, vm m) { st_bits(base, i, narrow(v, dt), dt, m); }

/* 16 pairs (elements 2i, 2i + 1, ...) from pair ``i`` of ``base``: the even and the odd elements. */
INLINE void ld_bits_pairs(const void *base, int64_t i, const int dt, vm m, vu *even, vu *odd) {
    if (dt == SWIGLU_FP32) {
        u_load32_pairs((const uint32_t *)base + 2 * i, m, even, odd);
    } else {
        const vu p = u_load16_pairs((const uint16_t *)base + 2 * i, m);
        *even = u_and(p, u_set(0xFFFF));
        *odd = u_shr(p, 16);
    }
}
INLINE void st_bits_pairs(void *base, int64_t i, vu even, vu odd, const int dt, vm m) {
    if (dt == SWIGLU_FP32) u_store32_pairs((uint32_t *)base + 2 * i, even, odd, m);
    else u_store16_pairs((uint16_t *)base + 2 * i, even, odd, m);
}

/* ------------------------------------------------------------------------------------------- exp */

#define EXP_OVERFLOW 0x1.62e430p+6f   /* 88.72283935546875: above it exp > FLT_MAX */
#define EXP_UNDERFLOW -0x1.a00000p+6f /* -104: below it exp < 2**-150 rounds to 0 */

INLINE vf pow2i(vu k) { return v_from_bits(u_shl(u_add(k, u_set(127)), 23)); } /* k in [-126, 127] */

/* exp(x): x = k ln2 + r with |r| <= ln2 / 2, exp(r) by a polynomial, times 2**k (as two factors, so that
   both stay normal down to 2**-150). NaN stays NaN. */
HEAVY vf v_exp(vf x) {
    const vf xc = v_maxc(v_minc(x, v_set(EXP_OVERFLOW)), v_set(EXP_UNDERFLOW));
    const vf magic = v_set(0x1.8p+23f); /* 1.5 * 2**23: t's low bits are round(x / ln2) */
    const vf t = v_fma(xc, v_set(0x1.715476p+0f), magic);
    const vf kf = v_sub(t, magic);
    const vu k = u_sub(v_bits(t), u_set(0x4B400000u));
    vf r = v_fma(kf, v_set(-0x1.62e4p-1f), xc); /* -ln2 in two parts */
    r = v_fma(kf, v_set(-0x1.7f7d1cp-20f), r);
    vf p = v_fma(v_set(0x1.a057b4p-13f), r, v_set(0x1.6d2d92p-10f));
    p = v_fma(p, r, v_set(0x1.11114cp-7f));
    p = v_fma(p, r, v_set(0x1.5554f4p-5f));
    p = v_fma(p, r, v_set(0x1.555556p-3f));
    p = v_fma(p, r, v_set(0.5f));
    p = v_add(v_fma(v_mul(r, r), p, r), v_set(1.0f));
    const vu h = s_sra(k, 1);
    vf y = v_mul(v_mul(p, pow2i(h)), pow2i(u_sub(k, h)));
    y = v_sel(v_gt(x, v_set(EXP_OVERFLOW)), v_set(INFINITY), y);
    return v_sel(v_lt(x, v_set(EXP_UNDERFLOW)), v_zero(), y);
}

/* ----------------------------------------------------------------------------- activation functions */

/* The transcendental part of each GLU variant, a function of the activated input ``a`` alone (with the
   operator's alpha and limit L; A~ = min(a, L), NaN kept):
     SWIGLU_ACT_SIGMOID   1 / (1 + exp(-A~))                  sigmoid (swiglu_group_grad: L = its clamp)
     SWIGLU_ACT_GLU       A~ / (exp(A~ * -alpha) + 1)         ClippedSwiglu's glu; alpha 1, L inf: SiLU
                                                              in SwigluMxQuantWithDualAxis's order
     SWIGLU_ACT_GLU_SIG   (A~ * 0 + 1) / (exp(A~ * -alpha) + 1)   ClippedSwigluGrad's s
     SWIGLU_ACT_SILU_MIN  min(a / (exp(a * -1) + 1), L)       ClippedSwiglu clamp_mode 1 */
HEAVY vf act_eval(vf a, int kind, float alpha, float limit) {
    const vf at = v_minc(a, v_set(limit));
    const vf one = v_set(1.0f);
    switch (kind) {
    case SWIGLU_ACT_SIGMOID:
        return v_div(one, v_add(one, v_exp(v_neg(at))));
    case SWIGLU_ACT_GLU:
        return v_div(at, v_add(v_exp(v_mul(at, v_set(-alpha))), one));
    case SWIGLU_ACT_GLU_SIG:
        return v_div(v_add(v_mul(at, v_zero()), one), v_add(v_exp(v_mul(at, v_set(-alpha))), one));
    default: /* SWIGLU_ACT_SILU_MIN */
        return v_minc(v_div(a, v_add(v_exp(v_mul(a, v_set(-1.0f))), one)), v_set(limit));
    }
}

/* swiglu_group_grad's functions of its gate g (the clamp already applied; swiglu_group_grad.md 3), from
   s = sigmoid(g): f = silu(g) = g * s, 0 at g = -inf (not -inf * 0 = NaN), and silu'(g) = (s + f) - f * s,
   exactly s at g = +-inf (1 and 0). SWIGLU_ACT_SILU_DERIV tables hold (f, silu') of every 16-bit g. */
INLINE void silu_deriv(vf g, vf s, vf *f, vf *sp) {
    const vm ninf = v_eq(g, v_set(-INFINITY));
    const vm inf = m_or(ninf, v_eq(g, v_set(INFINITY)));
    *f = v_sel(ninf, v_zero(), v_mul(g, s));
    *sp = v_sel(inf, s, v_sub(v_add(s, *f), v_mul(*f, s)));
}

/* An activation of stored inputs: from the table for 16-bit dtypes (indexed by the input's bits), computed
   for fp32. */
typedef struct {
    const float *table;
    int kind;
    float alpha, limit;
} act_fn;

/* Where the table indices of 16 inputs (their stored bits) are: ``bits`` in the lanes, and for whole steps of
   16-bit inputs also in memory, ``src[i * stride]`` (NULL: not given), which the x86 layers read instead. */
typedef struct {
    vu bits;
    const uint16_t *src;
    int stride;
} act_idx;

/* The act_idx of 16 inputs whose stored bits are ``bits``, the first of them at ``a0`` (``inter``: every
   other element): memory indices only for a whole step (``full``) of a 16-bit dtype, and not where the
   layer gathers from the lanes (SIMD_GATHER) and ``gather`` (swiglu_glu.gather) asks it to. */
INLINE act_idx act_idx_at(vu bits, const uint16_t *a0, const int inter, const int full, const int dt, int gather) {
    return (act_idx){bits, full && dt != SWIGLU_FP32 && !(SIMD_GATHER && gather) ? a0 : NULL, inter ? 2 : 1};
}

/* table[ai] (one float per entry), and the two floats of the entries of two-float tables: the same values
   whichever way they are read. */
INLINE vf act_lookup(const float *table, act_idx ai) { return v_lookup(table, ai.bits, ai.src, ai.stride); }
INLINE void act_lookup2(const float *table, act_idx ai, vf *a, vf *b) {
    v_lookup2(table, ai.bits, ai.src, ai.stride, a, b);
}

INLINE vf act(const act_fn *f, vf a, act_idx ai, const int dt) {
    if (dt == SWIGLU_FP32) return act_eval(a, f->kind, f->alpha, f->limit);
    return act_lookup(f->table, ai);
}

/* ---------------------------------------------------------------------------------------------- MX */

INLINE vf v_abs(vf a) { return v_from_bits(u_and(v_bits(a), u_set(0x7FFFFFFF))); }

/* Round to an integer, ties away from zero: trunc(x) plus one step where |x - trunc(x)| >= 0.5 (exact). */
INLINE vf v_round_half_away(vf x) {
    const vf t = v_trunc(x);
    const vf step = v_from_bits(u_or(v_bits(v_set(1.0f)), u_and(v_bits(x), u_set(0x80000000))));
    return v_sel(v_ge(v_abs(v_sub(x, t)), v_set(0.5f)), v_add(t, step), t);
}

/* Integer values 0 <= x < 2**23 as 32-bit integers (exact: x + 2**23 puts x in the low mantissa bits). */
INLINE vu v_to_u_small(vf x) { return u_sub(v_bits(v_add(x, v_set(0x1p+23f))), u_set(0x4B000000u)); }

/* An element format and scale rule, with the constants the encoders use. */
typedef struct {
    int fp4;       /* 0: FP8; 1: FP4 (E2M1 or E1M2; codes are nibbles) */
    int e1m2;      /* FP4 E1M2 (quantum 0.25 everywhere) rather than E2M1 */
    int scale_alg; /* 1: RCEIL ("cuBLAS", FP8 only); 0: OCP floor */
    int round_mode; /* FP4: SWIGLU_ROUND_RINT / ROUND (half away from zero) / FLOOR; FP8: RINT */
    uint32_t emax;  /* exponent of the format's largest normal */
    float inv_max;  /* RCEIL: fp32(1 / max) */
    /* FP8 encoder: shift = 23 - mantissa bits, RNE bias, rebias, smallest normal, subnormal magic, max code */
    uint32_t shift, round_half, rebias, min_normal, sub_magic, max_code;
} mx_format;

/* The multiplier 2**(127 - code) of scale codes (mx.scale_reciprocal): 2**-127 for 254 (the only subnormal
   factor), NaN in the ``special`` lanes (code 0xFF: a NaN/inf block), 0 in the ``zero`` lanes (an all-zero
   block, code 0). */
INLINE vf scale_recip(vu code, vm zero, vm special) {
    vu r = u_shl(u_sub(u_set(254), code), 23);
    r = u_sel(u_ge(code, u_set(254)), u_set(0x00400000), r);
    r = u_sel(zero, u_zero(), r);
    return v_from_bits(u_sel(special, u_set(0x7FC00000), r));
}

/* E8M0 codes of 16 blocks from the fp32 bits of their amax magnitudes, and the factor applied to their
   elements: 2**(127 - code), 0 for a zero block, NaN for a NaN/inf block (code 0xFF), so that its
   elements encode as 0x00. (mx.scale_codes / mx.scale_reciprocal.) */
HEAVY vu scale_codes(const mx_format *f, vu amax, vf *recip) {
    vu code;
    vm zero;
    if (f->scale_alg == 1) { /* RCEIL: the exponent of amax * fp32(1/max), rounded up unless exact */
        const vu p = v_bits(v_mul(v_from_bits(amax), v_set(f->inv_max)));
        const vu e = u_shr(p, 23), mf = u_and(p, u_set(0x7FFFFF));
        const vm normal_up = m_and(m_and(u_gt(e, u_zero()), u_lt(e, u_set(254))), u_gt(mf, u_zero()));
        const vm sub_up = m_and(u_eq(e, u_zero()), u_gt(mf, u_set(0x400000)));
        code = u_sel(m_or(normal_up, sub_up), u_add(e, u_set(1)), e);
        zero = u_eq(amax, u_zero());
    } else { /* OCP floor: biased exponent of amax minus emax, at least 0; an fp32-subnormal amax is zero */
        const vu ef = u_shr(amax, 23);
        code = s_max(u_sub(ef, u_set(f->emax)), u_zero());
        zero = u_eq(ef, u_zero());
    }
    const vm special = u_ge(amax, u_set(0x7F800000));
    code = u_sel(zero, u_zero(), code);
    code = u_sel(special, u_set(0xFF), code);
    *recip = scale_recip(code, zero, special);
    return code;
}

/* FP8 codes of fp32 values: RNE, saturating, NaN -> 0x00, the sign of zero kept (mx.fp8_encode). */
HEAVY vu fp8_encode(const mx_format *f, vf value) {
    const vu u = v_bits(value);
    const vu a = u_and(u, u_set(0x7FFFFFFF));
    /* subnormal codes: adding 2**(emin - mbits + 23) rounds to the subnormal quantum (RNE) */
    const vu sub = u_sub(v_bits(v_add(v_from_bits(a), v_from_bits(u_set(f->sub_magic)))), u_set(f->sub_magic));
    /* normal codes: RNE on the dropped mantissa bits (a carry moves into the exponent), then rebias */
    const vu odd = u_and(u_shrv(a, u_set(f->shift)), u_set(1));
    const vu rounded = u_add(u_add(a, u_set(f->round_half)), odd);
    vu code = u_sub(u_shrv(rounded, u_set(f->shift)), u_set(f->rebias));
    code = u_sel(u_lt(a, u_set(f->min_normal)), sub, code);
    code = u_min(code, u_set(f->max_code));
    code = u_or(code, u_and(u_shr(u, 24), u_set(0x80)));
    return u_sel(u_le(a, u_set(0x7F800000)), code, u_zero()); /* NaN */
}

/* The FP8 encoder of 32 stored 16-bit values (bf16 or fp16) at once, in 16-bit lanes, with the same results
   as fp8_encode on the fp32 products. FP4 with round mode rint is the same rounding (RNE to the format's
   mantissa bits, a subnormal range, saturation: E2M1 and E1M2 are "FP8" formats of 1 and 2 mantissa bits,
   bias 1, largest code 7) and takes it too, with the sign in bit 3: the same codes as fp4_encode. For a normal source value v = mant * 2**(E - src_bias - src_mbits)
   (mant with its implicit bit) and the block multiplier 2**(127 - S):
   - a normal FP8 result is the source magnitude rounded (RNE) to the format's mantissa bits, ``r``, plus
     ``off = (k - S) << mbits`` with k = bias + 127 - src_bias: the exponent moves, the mantissa does not;
   - a subnormal FP8 result is RNE(mant / 2**(S - E - d)), d = (127 - src_bias) + bias + mbits - 1 - src_mbits
     (the product in units of the smallest subnormal, 2**(1 - bias - mbits)); it carries into the smallest
     normal code exactly as fp8_encode's does.
   Zeros are done too. Subnormal sources are not: the caller checks for them (fp8x32_subnormal_sources) and
   then encodes the 32 values that hold one with fp8_encode. The caller passes, per lane, the block's ``off``
   (fp8x32_block, computed once per block (y1) or column (y2)) and zeroes the lanes of a NaN/inf block with
   its ``keep`` (code 0x00), only where such a block exists. */
typedef struct {
    int sh, mbits, src_mbits;          /* src_mbits - mbits; the format's and the source's mantissa bits */
    int sign_shift;                    /* 8 (FP8: the sign is bit 7 of a code) or 12 (FP4: bit 3) */
    uint16_t rh, normal, max_code, kd; /* RNE bias; smallest normal code; saturation; k - d */
    uint16_t sub_max;                  /* the largest subnormal source magnitude (bits) */
    int16_t d;
    int lut;                           /* E2M1 codes by table (fp8x32_e2m1_lut; its own block offset) */
} fp8x32_format;

INLINE fp8x32_format fp8x32_of(const mx_format *f, const int dt) {
    const int mbits = 23 - (int)f->shift, src = dt == SWIGLU_BF16 ? 7 : 10;
    const int bias = 127 - (int)(f->rebias >> mbits), src_bias = dt == SWIGLU_BF16 ? 127 : 15;
    const int k = bias + 127 - src_bias, d = (127 - src_bias) + bias + mbits - 1 - src;
    const fp8x32_format c = {
        .sh = src - mbits,
        .mbits = mbits,
        .src_mbits = src,
        .sign_shift = f->fp4 ? 12 : 8,
        .rh = (uint16_t)((1 << (src - mbits - 1)) - 1),
        .normal = (uint16_t)(1 << mbits),
        .max_code = (uint16_t)f->max_code,
        .kd = (uint16_t)(k - d),
        .sub_max = (uint16_t)((1 << src) - 1),
        .d = (int16_t)d,
        .lut = SIMD_LUT64 && f->fp4 && mbits == 1,
    };
    return c;
}

/* The layout of the E2M1 code table (fp8x32_e2m1_lut): row e + E2M1_ROW0 for the exponent e, 2**E2M1_COLS
   columns (mantissa bits) a row. */
#define E2M1_ROW0 2
#define E2M1_COLS 3

/* Per block (or column) from its scale code S: off = (k - S) << mbits (16-bit; |k - S| < 256, so it fits and
   an arithmetic shift gives k - S back), or for the E2M1 table (``lut``) the index offset of its row,
   (k - S + E2M1_ROW0) << E2M1_COLS; and keep (0 for a NaN/inf block). */
INLINE vu fp8x32_block(const fp8x32_format *c, vu codes, vu *keep) {
    *keep = u_sel(u_eq(codes, u_set(0xFF)), u_zero(), u_set(0xFFFF));
    const vu q = u_sub(codes, u_set((uint32_t)(int32_t)c->d)); /* S - d */
    const vu k_s = u_sub(u_set(c->kd), q);                      /* k - S */
    if (c->lut) return u_and(u_shl(u_add(k_s, u_set(E2M1_ROW0)), E2M1_COLS), u_set(0xFFFF));
    return u_and(u_shl(k_s, c->mbits), u_set(0xFFFF));
}

/* What fp8x32_code2 needs of 32 values, whatever their block: computed once for both axes. */
typedef struct {
    vw a, r, sign;
    vwm nz;
} fp8x32_values;

INLINE fp8x32_values fp8x32_prepare(const fp8x32_format *c, vw v) {
    const vw a = w_and(v, w_set(0x7FFF));
    const fp8x32_values p = {
        .a = a,
        .r = w_shr(w_add(w_add(a, w_set(c->rh)), w_and(w_shr(a, c->sh), w_set(1))), c->sh),
        .sign = w_and(w_shr(v, c->sign_shift), w_set((uint16_t)(0x8000 >> c->sign_shift))),
        .nz = w_nz(a),
    };
    return p;
}

/* Subnormal sources among the values seen so far: ``acc`` starts at 0xFFFF in every lane and keeps the
   least a - 1 (a zero wraps to 0xFFFF), so a lane ends below sub_max iff one of its values was subnormal. */
INLINE vw fp8x32_track(const fp8x32_values *p, vw acc) { return w_min(acc, w_sub(p->a, w_set(1))); }
/* The same from the stored bits of 32 values (masked lanes 0: they count as zeros): their magnitudes only. */
INLINE vw fp8x32_track_bits(vw v, vw acc) {
    const fp8x32_values p = {.a = w_and(v, w_set(0x7FFF))};
    return fp8x32_track(&p, acc);
}
INLINE int fp8x32_subnormal_sources(const fp8x32_format *c, vw acc) { return wm_any(w_lt_u(acc, w_set(c->sub_max))); }

/* The shift of the values' subnormal results under a block offset off = (k - S) << mbits:
   s = S - E - d = (kd - E) - (k - S) in 16-bit arithmetic, kd - E formed once for both axes. */
INLINE vw fp8x32_kd_e(const fp8x32_format *c, const fp8x32_values *p) {
    return w_sub(w_set(c->kd), w_shr(p->a, c->src_mbits));
}
INLINE vw fp8x32_shift(const fp8x32_format *c, vw kd_e, vw off) { return w_sub(kd_e, w_sra(off, c->mbits)); }

/* The subnormal results under one block offset: RNE(mant / 2**s) (w_rne_shrv; s at most 16: the result is 0
   from there; the lanes that are subnormal results have s >= 1); ``kd_e`` from fp8x32_kd_e. */
INLINE vw fp8x32_subnormal(const fp8x32_format *c, const fp8x32_values *p, vw kd_e, vw off) {
    const vw mant = w_or(w_and(p->a, w_set(c->sub_max)), w_set((uint16_t)(c->sub_max + 1)));
    return w_rne_shrv(mant, w_min(fp8x32_shift(c, kd_e, off), w_set(16)));
}

/* The same for one mantissa bit (E2M1), under both offsets. There every value under the smallest normal, half
   of a typical block, is a subnormal result, and it is 0, 1 or 2, so compares and selects give it without
   the variable shifts (which AVX2 does not have for 16-bit lanes): s = src_mbits puts mant / 2**s in [1, 2),
   giving 1 + (frac >= half); one more, [0.5, 1), gives frac != 0 (0.5 ties to 0); larger s give 0 (smaller
   ones are normal results). */
INLINE void fp8x32_subnormal_e2m1(const fp8x32_format *c, const fp8x32_values *p, vw off1, vw off2, vw *r1, vw *r2) {
    const vw one = w_set(1), zero = w_set(0);
    const vw kd_e = fp8x32_kd_e(c, p);
    const vw frac = w_and(p->a, w_set(c->sub_max));
    const vw unit = w_sel(w_lt_u(frac, w_set((uint16_t)((c->sub_max + 1) / 2))), one, w_set(2));
    const vw half = w_sel(w_nz(frac), one, zero);
    const vw at = w_set((uint16_t)c->src_mbits), above = w_set((uint16_t)(c->src_mbits + 1));
    const vw s1 = fp8x32_shift(c, kd_e, off1), s2 = fp8x32_shift(c, kd_e, off2);
    *r1 = w_sel(w_eq(s1, at), unit, w_sel(w_eq(s1, above), half, zero));
    *r2 = w_sel(w_eq(s2, at), unit, w_sel(w_eq(s2, above), half, zero));
}

#if SIMD_LUT64
/* E2M1 codes (magnitudes) by table: with e = E + k - S, the value's exponent in the format's bias, the code
   is a function of e and three mantissa bits (the top one, the half below it, the sticky rest): for e >= 1
   (normal) (e << 1 | top) rounded to nearest even and saturated at 7; e = 0: 1 + top (units of 0.5 in
   [1, 2), 1.5 ties to 2); e = -1: 1 unless the value is exactly 0.5 units (a tie to 0); e <= -2: 0. Row
   e + E2M1_ROW0 (clamped to 0-7) of the table, column (top, half, sticky). */
static const uint16_t e2m1_codes[8 << E2M1_COLS] = {
    0, 0, 0, 0, 0, 0, 0, 0, /* e <= -2 */
    0, 1, 1, 1, 1, 1, 1, 1, /* e = -1 */
    1, 1, 1, 1, 2, 2, 2, 2, /* e = 0 */
    2, 2, 2, 3, 3, 3, 4, 4, /* e = 1 */
    4, 4, 4, 5, 5, 5, 6, 6, /* e = 2 */
    6, 6, 6, 7, 7, 7, 7, 7, /* e = 3 */
    7, 7, 7, 7, 7, 7, 7, 7, /* e = 4 */
    7, 7, 7, 7, 7, 7, 7, 7, /* e >= 5 */
};

/* The E2M1 codes of 32 values under the row offsets ``off1``/``off2`` (fp8x32_block): index
   (E << E2M1_COLS | top, half, sticky) + off, clamped to the table (below 0: e <= -2; above 63: e >= 5),
   zeros 0. */
INLINE void fp8x32_e2m1_lut(const fp8x32_format *c, const fp8x32_values *p, vw off1, vw off2, vw *c1, vw *c2) {
    const vw lo = w_load(e2m1_codes, w_lanes(32)), hi = w_load(e2m1_codes + 32, w_lanes(32));
    const vw sticky = w_min(w_and(p->a, w_set((uint16_t)((1 << (c->src_mbits - E2M1_COLS + 1)) - 1))), w_set(1));
    const vw em = w_or(w_shr(p->a, c->src_mbits - E2M1_COLS), sticky); /* E, top, half, one more bit */
    *c1 = w_or(w_lut64z(p->nz, w_clamp_s(w_add(em, off1), 0, 63), lo, hi), p->sign);
    *c2 = w_or(w_lut64z(p->nz, w_clamp_s(w_add(em, off2), 0, 63), lo, hi), p->sign);
}
#endif

/* The codes of the same 32 values under two block offsets (the row block's, ``off1``, and the column's,
   ``off2``), sign included; the lanes of a NaN/inf block are the caller's (its ``keep``). Normal results
   are the rounded source plus the offset (zeros give 0); the subnormal ones are computed for every lane
   and selected. ``rare`` (the FP8 codes of both operators) skips them, by a branch, for the 32 values where
   no lane has one: at the bench shape (M=8192, 2H=4096 bf16) 11 % of the forward's 32-value steps and 19 %
   of the backward's (its gradients are products of three factors: more values near 0) hold one. Measured
   on the Intel host (cold caches, three alternating runs): backward 11.5 -> 11.0 ms, AVX2 16.7 -> 15.5;
   forward 6.8 -> 6.3 ms. (On the Zen 4 machine, before the code lines were prefetched for writing, the
   branch's mispredictions cost the backward more than the 20 operations: 13.9 -> 15.3 ms; the exhaustive
   check of swiglu_fp8_x32_check runs both forms.) E2M1 (``fp4``, a constant of the caller, and one
   mantissa bit: half of a typical block is subnormal) has its own, cheaper forms: the whole code by table
   where the SIMD layer has one (fp8x32_e2m1_lut), else its subnormal results by compares
   (fp8x32_subnormal_e2m1). */
INLINE void fp8x32_code2(const fp8x32_format *c, const fp8x32_values *p, vw off1, vw off2, vw *c1, vw *c2,
                         const int fp4, int rare) {
#if SIMD_LUT64
    if (fp4 && c->lut) {
        fp8x32_e2m1_lut(c, p, off1, off2, c1, c2);
        return;
    }
#endif
    const vw n1 = w_add(p->r, off1), n2 = w_add(p->r, off2), normal = w_set(c->normal);
    const vwm lt1 = w_lt_s(n1, normal), lt2 = w_lt_s(n2, normal);
    vw k1 = w_minz(p->nz, n1, w_set(c->max_code)), k2 = w_minz(p->nz, n2, w_set(c->max_code));
    vw r1, r2;
    if (fp4 && c->mbits == 1) {
        fp8x32_subnormal_e2m1(c, p, off1, off2, &r1, &r2);
    } else {
        if (rare && !wm_any(wm_and(p->nz, wm_or(lt1, lt2)))) {
            *c1 = w_or(k1, p->sign);
            *c2 = w_or(k2, p->sign);
            return;
        }
        const vw kd_e = fp8x32_kd_e(c, p);
        r1 = fp8x32_subnormal(c, p, kd_e, off1);
        r2 = fp8x32_subnormal(c, p, kd_e, off2);
    }
    k1 = w_sel(wm_and(p->nz, lt1), r1, k1);
    k2 = w_sel(wm_and(p->nz, lt2), r2, k2);
    *c1 = w_or(k1, p->sign);
    *c2 = w_or(k2, p->sign);
}

/* FP4 codes (nibbles) of the exact products v * m (spec swiglu_mx_quant.md 3.5, mx.encode): k = round(t / q)
   with the quantum q (E2M1: 2**(max(floor(log2|t|), 0) - 1); E1M2: 0.25), in the format's round mode (floor
   acts on the signed value), saturated to the largest magnitude; the sign bit is t's (a negative t that
   rounds to 0 gives -0, 0x8); NaN -> 0x0. The fp32 product is exact except where it underflows to zero,
   which only ``floor`` can tell from the exact value: a negative v then still gives -q (0x9), unless the
   block's multiplier is 0 (a zero block, all codes +-0). */
HEAVY vu fp4_encode(const mx_format *f, vf v, vf m) {
    const vf t = v_mul(v, m);
    const vu u = v_bits(t);
    const vu a = u_and(u, u_set(0x7FFFFFFF));
    /* q = 2**qe; the scaling t / q is exact (a power of two, |t| < 2**(emax + 1) by the scale rule) */
    vu qe;
    if (f->e1m2) qe = u_set((uint32_t)-2);
    else qe = u_sub(s_max(u_sub(u_shr(a, 23), u_set(127)), u_zero()), u_set(1));
    const vf x = v_mul(t, pow2i(u_sub(u_zero(), qe)));
    vf k;
    if (f->round_mode == SWIGLU_ROUND_FLOOR) {
        const vm underflow = m_and(m_and(v_eq(t, v_zero()), v_lt(v, v_zero())), v_gt(m, v_zero()));
        k = v_sel(underflow, v_set(-1.0f), v_floor(x));
    } else if (f->round_mode == SWIGLU_ROUND_RINT) {
        k = v_rint(x);
    } else {
        k = v_round_half_away(x);
    }
    /* |k| * q in units of the format's smallest step (E2M1: 0.5, E1M2: 0.25), saturated */
    vu units = v_to_u_small(v_mul(v_abs(k), pow2i(u_add(qe, u_set(f->e1m2 ? 2 : 1)))));
    vu code;
    if (f->e1m2) {
        code = u_min(units, u_set(7));
    } else { /* half-units {0, 1, 2, 3, 4, 6, 8, 12} -> codes 0..7; above 12: 6.0 */
        units = u_min(units, u_set(12));
        code = u_sel(u_le(units, u_set(4)), units, u_add(u_set(4), u_shr(units, 2)));
    }
    code = u_or(code, u_and(u_shr(u, 28), u_set(0x8)));
    return u_sel(u_le(a, u_set(0x7F800000)), code, u_zero()); /* NaN */
}

#endif
