/* The AVX-512 kernels with AVX512-BF16 as well: the same code as kernels_avx512.c, whose rounding to bf16 is
   then one vcvtneps2bf16 per 16 results (vectors holding a NaN or an fp32 subnormal keep the integer
   rounding, so the bits are the same). Only called on CPUs that have it (dispatch.c checks). */
#include "kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,bmi,bmi2,prfchw"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,bmi,bmi2,prfchw")
#endif
#include "simd_avx512.h"

#define FN(name) swiglu_##name##_avx512_bf16
#include "kernels.h"
#ifdef __clang__
#pragma clang attribute pop
#endif
#endif
