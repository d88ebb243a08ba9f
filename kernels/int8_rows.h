// Symmetric int8 quantization of one row with one fp32 scale (absmax / 127), the codec shared by
// the compressed saved activations (kernels/activation_compression.h) and the compressed
// tensor-parallel collectives (parallel/tp_compression.h). Round to nearest (even on ties), so
// each decoded value is within scale / 2 = max |x| / 254 of the input.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tessera {

inline constexpr float kInt8RowMax = 127.0f;

// max |x| over the row's n values.
inline float row_absmax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, std::fabs(x[j]));
  return m;
}

// q (n) = x / s rounded and clamped to [-127, 127], s = max |x| / 127 (0 for a zero row, whose
// values all become 0). Returns s.
inline float quantize_row_int8(const float* x, int64_t n, int8_t* q) {
  const float s = row_absmax(x, n) / kInt8RowMax;
  for (int64_t j = 0; j < n; ++j) {
    const double v = s > 0.0f ? std::nearbyint(static_cast<double>(x[j]) / s) : 0.0;
    q[j] = static_cast<int8_t>(std::clamp<double>(v, -kInt8RowMax, kInt8RowMax));
  }
  return s;
}

// y (n) = q s, or y += q s with accumulate.
inline void dequantize_row_int8(const int8_t* q, int64_t n, float s, float* y, bool accumulate = false) {
  for (int64_t j = 0; j < n; ++j) {
    const float v = static_cast<float>(q[j]) * s;
    y[j] = accumulate ? y[j] + v : v;
  }
}

}  // namespace tessera
