// Tests kernels/rope.h: known rotations, the backward against finite differences and as the exact
// inverse, in-place use, and pos_offset as a shift into a longer sequence.
#include "kernels/rope.h"

#include <cmath>

#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;

constexpr double kTheta = 10000.0;

TEST(Rope, PositionZeroIsIdentity) {
  auto x = HostTensor<double>::uniform({2, 1, 3, 8}, 1);
  HostTensor<double> y(x.shape());
  rope_forward(kCpu, y.t(), x.t(), 0, kTheta);
  EXPECT_EQ(testing::max_rel_error(y, x), 0.0);
}

TEST(Rope, HeadDimTwoRotatesByPosition) {
  // D = 2: the only frequency is theta^0 = 1, so position p rotates (x0, x1) by angle p.
  const int64_t T = 5;
  HostTensor<double> x({1, T, 1, 2}), y(x.shape());
  for (int64_t t = 0; t < T; ++t) {
    x[2 * t] = 1.0;
    x[2 * t + 1] = 0.5;
  }
  const int64_t offset = 3;
  rope_forward(kCpu, y.t(), x.t(), offset, kTheta);
  for (int64_t t = 0; t < T; ++t) {
    double a = static_cast<double>(offset + t);
    EXPECT_NEAR(y[2 * t], std::cos(a) - 0.5 * std::sin(a), 1e-14) << "t=" << t;
    EXPECT_NEAR(y[2 * t + 1], 0.5 * std::cos(a) + std::sin(a), 1e-14) << "t=" << t;
  }
}

TEST(Rope, SecondFrequencyUsesThetaPower) {
  // D = 4, position 7: pair (x[1], x[3]) rotates by 7 * theta^(-2/4) = 7 / 100.
  HostTensor<double> x({1, 1, 1, 4}), y(x.shape());
  x[1] = 1.0;
  rope_forward(kCpu, y.t(), x.t(), 7, kTheta);
  EXPECT_NEAR(y[1], std::cos(0.07), 1e-14);
  EXPECT_NEAR(y[3], std::sin(0.07), 1e-14);
  EXPECT_NEAR(y[0], 0.0, 1e-15);
  EXPECT_NEAR(y[2], 0.0, 1e-15);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  auto x = HostTensor<double>::uniform({2, 5, 3, 6}, 2);
  auto w = HostTensor<double>::uniform(x.shape(), 3);
  HostTensor<double> y(x.shape()), dx(x.shape());
  auto loss = [&] {
    rope_forward(kCpu, y.t(), x.t(), 4, kTheta);
    return testing::weighted_sum(y, w);
  };
  rope_backward(kCpu, dx.t(), w.t(), 4, kTheta);
  testing::expect_gradient_matches(loss, x, dx, "x", 1e-6, 1e-5, 1000);
}

TEST(Rope, BackwardInvertsForward) {
  // A rotation's transpose is its inverse; both are applied in double, so only rounding remains.
  auto x = HostTensor<double>::uniform({2, 9, 2, 10}, 4);
  HostTensor<double> y(x.shape()), back(x.shape());
  rope_forward(kCpu, y.t(), x.t(), 100, kTheta);
  rope_backward(kCpu, back.t(), y.t(), 100, kTheta);
  EXPECT_LT(testing::max_rel_error(back, x), 1e-14);
}

TEST(Rope, InPlaceEqualsOutOfPlace) {
  auto x = HostTensor<float>::uniform({2, 7, 3, 8}, 5);
  HostTensor<float> y(x.shape());
  rope_forward(kCpu, y.t(), x.t(), 2, kTheta);
  auto z = x;
  rope_forward(kCpu, z.t(), z.t(), 2, kTheta);
  EXPECT_EQ(testing::max_rel_error(z, y), 0.0);
  HostTensor<float> dx(x.shape());
  rope_backward(kCpu, dx.t(), y.t(), 2, kTheta);
  rope_backward(kCpu, y.t(), y.t(), 2, kTheta);
  EXPECT_EQ(testing::max_rel_error(y, dx), 0.0);
}

TEST(Rope, FloatMatchesDouble) {
  auto x = HostTensor<double>::uniform({2, 33, 2, 16}, 6);
  HostTensor<double> y(x.shape());
  rope_forward(kCpu, y.t(), x.t(), 1000, kTheta);
  auto xf = x.cast<float>();
  HostTensor<float> yf(x.shape());
  rope_forward(kCpu, yf.t(), xf.t(), 1000, kTheta);
  // Angles are computed in double and cos/sin rounded once to float; each output is two products
  // and a sum of float-rounded values: a few float ulps (eps = 6e-8) of the row's scale.
  EXPECT_LT(testing::max_rel_error(yf, y), 5e-7);
}

TEST(Rope, OffsetShiftsPositions) {
  // Rows 5.. of a 12-token sequence equal the 7-token chunk that starts at position 5.
  const int64_t B = 2, T = 12, H = 3, D = 8, offset = 5;
  auto full = HostTensor<double>::uniform({B, T, H, D}, 7);
  HostTensor<double> full_y(full.shape());
  rope_forward(kCpu, full_y.t(), full.t(), 0, kTheta);
  const int64_t Tc = T - offset, row = H * D;
  HostTensor<double> chunk({B, Tc, H, D}), chunk_y(chunk.shape());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tc * row; ++i) chunk[b * Tc * row + i] = full[(b * T + offset) * row + i];
  rope_forward(kCpu, chunk_y.t(), chunk.t(), offset, kTheta);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tc * row; ++i)
      ASSERT_EQ(chunk_y[b * Tc * row + i], full_y[(b * T + offset) * row + i]) << "b=" << b << " i=" << i;
}

TEST(Rope, RejectsOddHeadDim) {
  HostTensor<float> x({1, 2, 1, 3});
  EXPECT_THROW(rope_forward(kCpu, x.t(), x.t(), 0, kTheta), Error);
  HostTensor<float> y({1, 2, 1, 4}), z({1, 2, 2, 4});
  EXPECT_THROW(rope_forward(kCpu, y.t(), z.t(), 0, kTheta), Error);
}

}  // namespace tessera
