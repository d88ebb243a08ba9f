// bf16 on the host side of the emulator and the library twins (mma.cpp, include/cuda_bf16.h,
// cublaslt.cpp, nccl.cpp): widening is exact; narrowing rounds to nearest even as
// kernels/cpu/gemm_bf16.h's f32_to_bf16, bit for bit (kept separate so that the twins do not
// depend on the CPU backend's headers).
#pragma once

#include <cstdint>
#include <cstring>

namespace tessera::simt {

inline float bf16_to_f32(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; a NaN stays a quiet NaN of the same sign.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace tessera::simt
