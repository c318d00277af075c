/* Rules every SIMD layer shares, written once on the layer's own primitives (each simd_<isa>.h includes
   this after defining them). */
#ifndef SWIGLU_SIMD_SHARED_H
#define SWIGLU_SIMD_SHARED_H

/* fp32 -> bf16 bits, RNE, overflow to inf; NaN -> 0x7FC0 (canonical, PyTorch's). The layers' u_to_bf16
   (AVX512-BF16: vcvtneps2bf16 where it gives the same bits). */
INLINE vu u_to_bf16_int(vf v) {
    const vu u = v_bits(v);
    const vu r = u_shr(u_add(u_add(u, u_set(0x7FFF)), u_and(u_shr(u, 16), u_set(1))), 16);
    return u_sel(v_isnan(v), u_set(0x7FC0), r);
}

#endif
