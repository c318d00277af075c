/* The kernels on the AVX2 SIMD layer (x86-64-v3: AVX2, FMA, F16C). Only called on CPUs that have them
   (dispatch.c checks). */
#include "kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2,prfchw"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,prfchw")
#endif
#include "simd_avx2.h"

#define FN(name) swiglu_##name##_avx2
#include "kernels.h"
#ifdef __clang__
#pragma clang attribute pop
#endif
#endif
