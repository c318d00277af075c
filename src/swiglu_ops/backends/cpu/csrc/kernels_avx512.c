/* The kernels on the AVX-512 SIMD layer (F, BW, VL, DQ with FMA and F16C). Only called on CPUs that have
   them (dispatch.c checks). */
#include "kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,bmi,bmi2,prfchw"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,bmi,bmi2,prfchw")
#endif
#include "simd_avx512.h"

#define FN(name) swiglu_##name##_avx512
#include "kernels.h"
#ifdef __clang__
#pragma clang attribute pop
#endif
#endif
