// Float math that vectorizes: glibc's expf is an opaque scalar call (its SIMD variants are only
// declared under -ffast-math), so the softmax and SiLU loops use this plain-arithmetic exp instead.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace tessera::cpu {

// e^x to within ~2 ulp for finite results; +inf above ln(FLT_MAX), 0 below ln(FLT_MIN) (denormal
// results are flushed), NaN stays NaN. Method: x = k ln2 + r with |r| <= ln2 / 2 (ln2 split in
// two so k ln2 is exact), e^r by its Taylor series to r^7 (truncation 0.35^8 / 8! = 5e-9), then
// scaled by 2^k built in the exponent bits (two factors, so 2^128 and 2^-126 stay representable).
inline float exp_polynomial(float x) {
  constexpr float kMax = 88.7228394f;   // ln(FLT_MAX)
  constexpr float kMin = -87.3365448f;  // ln(FLT_MIN)
  constexpr float kLog2e = 1.44269504f;
  constexpr float kLn2Hi = 0.693359375f;     // 8 significant bits: k * kLn2Hi is exact for |k| <= 128
  constexpr float kLn2Lo = -2.12194440e-4f;  // ln2 - kLn2Hi
  constexpr float kRound = 12582912.0f;      // 1.5 * 2^23: adding it rounds to an integer in the low bits
  float xc = std::min(std::max(x, kMin), kMax);
  float t = xc * kLog2e + kRound;
  float k = t - kRound;  // round(xc / ln2), in [-126, 128]
  float r = (xc - k * kLn2Hi) - k * kLn2Lo;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t ki = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);  // k as an integer
  int32_t half = ki >> 1;
  float s1 = std::bit_cast<float>((half + 127) << 23), s2 = std::bit_cast<float>((ki - half + 127) << 23);
  float y = p * s1 * s2;
  y = x > kMax ? std::numeric_limits<float>::infinity() : y;
  return x < kMin ? 0.0f : y;
}

// tanh(x) through exp_polynomial: with t = e^(-2|x|) in (0, 1], tanh|x| = (1 - t) / (1 + t), sign
// restored. Absolute error ~1e-7 (relative error grows as |x| -> 0, where 1 - t cancels); what
// uses it (GELU's 1 + tanh, 1 - tanh^2) needs the absolute error only. NaN stays NaN.
inline float tanh_polynomial(float x) {
  const float t = exp_polynomial(-2.0f * std::abs(x));
  const float y = (1.0f - t) / (1.0f + t);
  return x < 0.0f ? -y : (x != x ? x : y);
}

}  // namespace tessera::cpu
