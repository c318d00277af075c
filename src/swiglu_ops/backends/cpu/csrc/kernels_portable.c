/* The kernels in portable C (GNU vector extensions), compiled for the build's baseline instruction set:
   SSE2 on x86-64, NEON on AArch64. */
#define SWIGLU_CALL_HEAVY
#include "kernel.h"
#include "simd_portable.h"

#define FN(name) swiglu_##name##_portable
#include "kernels.h"
