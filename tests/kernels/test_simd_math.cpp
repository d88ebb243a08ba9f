// Tests kernels/cpu/simd_math.h: the polynomial exp against double-precision exp over the whole
// float range, and its overflow, underflow, infinity and NaN behaviour.
#include <cmath>
#include <limits>

#include "kernels/cpu/simd_math.h"
#include "testing.h"

namespace tessera {

TEST(SimdMath, ExpWithinTwoUlpOverTheFloatRange) {
  // About 100k points from ln(FLT_MIN) to ln(FLT_MAX), plus the small arguments the softmax and
  // SiLU use most. Two ulp of float is at most 2 * 2^-23 = 2.4e-7 relative.
  double worst = 0;
  auto probe = [&](float x) {
    double ref = std::exp(double(x));
    worst = std::max(worst, std::abs(double(cpu::exp_polynomial(x)) - ref) / ref);
  };
  for (float x = -87.33f; x < 88.72f; x += 0.0017f) probe(x);
  for (float x = -1.0f; x < 1.0f; x += 1e-4f) probe(x);
  EXPECT_LT(worst, 2.4e-7);
  EXPECT_EQ(cpu::exp_polynomial(0.0f), 1.0f);
}

TEST(SimdMath, ExpSaturatesAndPropagatesNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cpu::exp_polynomial(88.8f), inf);
  EXPECT_EQ(cpu::exp_polynomial(1e30f), inf);
  EXPECT_EQ(cpu::exp_polynomial(inf), inf);
  EXPECT_EQ(cpu::exp_polynomial(-87.4f), 0.0f);  // a denormal result is flushed to 0
  EXPECT_EQ(cpu::exp_polynomial(-1e30f), 0.0f);
  EXPECT_EQ(cpu::exp_polynomial(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::exp_polynomial(std::numeric_limits<float>::quiet_NaN())));
  // The largest and smallest finite results need the scalings 2^128 and 2^-126.
  EXPECT_NEAR(cpu::exp_polynomial(88.72f) / std::exp(double(88.72f)), 1.0, 2.4e-7);
  EXPECT_NEAR(cpu::exp_polynomial(-87.33f) / std::exp(double(-87.33f)), 1.0, 2.4e-7);
}

TEST(SimdMath, TanhWithinAbsolute2e7) {
  double worst = 0;
  for (float x = -12.0f; x <= 12.0f; x += 0.00037f)
    worst = std::max(worst, std::abs(double(cpu::tanh_polynomial(x)) - std::tanh(double(x))));
  EXPECT_LT(worst, 2e-7);
  EXPECT_EQ(cpu::tanh_polynomial(100.0f), 1.0f);
  EXPECT_EQ(cpu::tanh_polynomial(-100.0f), -1.0f);
  EXPECT_EQ(cpu::tanh_polynomial(0.0f), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::tanh_polynomial(std::numeric_limits<float>::quiet_NaN())));
}

}  // namespace tessera
