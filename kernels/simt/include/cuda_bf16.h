// SIMT stand-in for CUDA's <cuda_bf16.h> (-DTESSERA_SIMT=ON only): __nv_bfloat16 and the
// conversions tessera's kernels use, with CUDA's rounding: float -> bf16 to nearest, ties to even,
// a NaN becoming the canonical 0x7fff (as cuda_bf16.hpp's host path and cvt.rn.bf16.f32 do).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/simt/device.h"
#include "kernels/simt/host_bf16.h"

namespace tessera::simt {
// CUDA's rounding is the twins' (kernels/simt/host_bf16.h, the CPU's f32_to_bf16) but for a NaN,
// which CUDA makes the canonical 0x7fff where the CPU keeps its sign and payload.
inline uint16_t float_to_bf16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return (u & 0x7fffffffu) > 0x7f800000u ? uint16_t(0x7fffu) : f32_to_bf16(f);
}
}  // namespace tessera::simt

struct __nv_bfloat16 {
  uint16_t __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(::tessera::simt::float_to_bf16_rn(f)) {}
  __nv_bfloat16(double d) : __nv_bfloat16(static_cast<float>(d)) {}
  operator float() const { return ::tessera::simt::bf16_to_f32(__x); }
};
static_assert(sizeof(__nv_bfloat16) == 2);

struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;  // x in the low 16 bits
};
static_assert(sizeof(__nv_bfloat162) == 4);

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline float __low2float(__nv_bfloat162 v) { return static_cast<float>(v.x); }
inline float __high2float(__nv_bfloat162 v) { return static_cast<float>(v.y); }
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) { return __nv_bfloat162{__nv_bfloat16(lo), __nv_bfloat16(hi)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) { return __floats2bfloat162_rn(f.x, f.y); }
