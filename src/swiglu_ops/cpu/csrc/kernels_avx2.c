/* The portable kernels compiled for x86-64-v3 (AVX2, FMA, F16C): the same code as kernels_portable.c, which
   the compiler vectorises 8 lanes wide. Only called on CPUs that have them (dispatch.c checks). */
#define SWIGLU_CALL_HEAVY
#define PORTABLE_NATIVE_BYTES 32
#include "kernel.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi,bmi2"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#endif
#include "simd_portable.h"

#define FN(name) swiglu_##name##_avx2
#include "kernels.h"
#ifdef __clang__
#pragma clang attribute pop
#endif
#endif
