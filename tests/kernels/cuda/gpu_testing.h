// What the GPU tests share: the skip where no GPU is visible (CTest then reports the test as
// skipped, never passed: SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt), and bf16 rounding.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cuda/runtime.h"
#include "testing.h"

// Ends the test as skipped, naming why, unless a CUDA device is visible.
#define TESSERA_REQUIRE_GPU()                                                             \
  do {                                                                                    \
    if (::tessera::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device is visible"; \
  } while (0)

namespace tessera::testing {

// x rounded to the nearest bf16 (ties to even), as a float; its bits, as bf16 stores them.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);  // finite inputs only (the tests draw O(1) values)
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_value(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace tessera::testing
