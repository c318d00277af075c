/* Rules every SIMD layer shares, written once on the layer's primitives. Included by kernels.h after the
   layer (simd_<isa>.h) and before the numerics that use it; no layer includes it. A layer with a native
   rounding to bf16 that gives the same bits on the vectors it accepts defines SIMD_BF16_NATIVE and the hooks
   bf16_native_ok / bf16_native_ok2 / u_to_bf16_native / w_to_bf16x2_native (simd_avx512.h with AVX512-BF16);
   one without variable 16-bit shifts defines SIMD_RNE_SHRV and its own w_rne_shrv (simd_avx2.h). */
#ifndef SWIGLU_SIMD_SHARED_H
#define SWIGLU_SIMD_SHARED_H

/* fp32 -> bf16 bits, RNE, overflow to inf; NaN -> 0x7FC0 (canonical, PyTorch's), in integer arithmetic. */
INLINE vu u_to_bf16_int(vf v) {
    const vu u = v_bits(v);
    const vu r = u_shr(u_add(u_add(u, u_set(0x7FFF)), u_and(u_shr(u, 16), u_set(1))), 16);
    return u_sel(v_isnan(v), u_set(0x7FC0), r);
}

/* The same, through the layer's native instruction where it applies. */
INLINE vu u_to_bf16(vf v) {
#ifdef SIMD_BF16_NATIVE
    if (__builtin_expect(bf16_native_ok(v), 1)) return u_to_bf16_native(v);
#endif
    return u_to_bf16_int(v);
}

/* The same for 32 values (lo: lanes 0-15, hi: 16-31), as 16-bit lanes. */
INLINE vw w_to_bf16x2(vf lo, vf hi) {
#ifdef SIMD_BF16_NATIVE
    if (__builtin_expect(bf16_native_ok2(lo, hi), 1)) return w_to_bf16x2_native(lo, hi);
#endif
    return w_pack(u_to_bf16_int(lo), u_to_bf16_int(hi));
}

/* A layer whose v_lookup of lane indices (src NULL) is a hardware gather defines SIMD_GATHER 1. */
#ifndef SIMD_GATHER
#define SIMD_GATHER 0
#endif

/* RNE(x / 2**s) in 16-bit lanes, for x < 2**15 and s in [1, 16] (other lanes: any value): round half to even
   on the bits shifted out. */
#ifndef SIMD_RNE_SHRV
INLINE vw w_rne_shrv(vw x, vw s) {
    const vw one = w_set(1);
    const vw rh = w_sub(w_shlv(one, w_sub(s, one)), one); /* half an output unit, less one */
    return w_shrv(w_add(w_add(x, rh), w_and(w_shrv(x, s), one)), s);
}
#endif

#endif
