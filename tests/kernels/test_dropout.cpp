// Tests kernels/dropout.h: the mask's keep rate within statistical bounds, the mask a pure function
// of the coordinates (the same twice, another for another step, sample, position, layer; a column
// or row split of the tensor draws the same elements), values x / (1 - p) or 0, p = 0 the
// identity, and the backward against central differences with the mask fixed.
#include "kernels/dropout.h"

#include <cmath>
#include <numeric>

#include "error_testing.h"
#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;
namespace {

DropoutCoords coords(int64_t T, uint64_t step = 3, int64_t sample0 = 5, int64_t feature0 = 0, int64_t first_pos = 0) {
  DropoutCoords c;
  c.key = philox::make_key(1337, "blocks.2.attn.q.lora_dropout");
  c.step = step;
  c.sample0 = sample0;
  c.positions.resize(static_cast<size_t>(T));
  std::iota(c.positions.begin(), c.positions.end(), first_pos);
  c.feature0 = feature0;
  return c;
}

// Kept elements of dropout(ones) over (N, C): the count of nonzero outputs.
int64_t kept(const HostTensor<double>& y) {
  int64_t k = 0;
  for (double v : y.vec()) k += v != 0.0;
  return k;
}

TEST(Dropout, KeepRateWithinStatisticalBounds) {
  const int64_t T = 64, B = 4, C = 97;  // C not a multiple of 4: the last Philox call is partial
  const HostTensor<double> ones({B * T, C}, 1.0);
  for (double p : {0.05, 0.1, 0.5, 0.9}) {
    HostTensor<double> y({B * T, C});
    dropout_forward(kCpu, y.t(), ones.t(), p, coords(T));
    const double n = static_cast<double>(B * T * C), rate = 1.0 - static_cast<double>(kept(y)) / n;
    // Binomial: 5 standard deviations (a false failure about once in 3.5 million).
    EXPECT_LT(std::abs(rate - p), 5.0 * std::sqrt(p * (1 - p) / n)) << "p = " << p << " rate " << rate;
    for (double v : y.vec()) EXPECT_TRUE(v == 0.0 || v == 1.0 / (1.0 - p)) << v;
  }
}

TEST(Dropout, MaskIsAPureFunctionOfTheCoordinates) {
  const int64_t T = 8, B = 3, C = 13;
  const double p = 0.3;
  const auto x = HostTensor<double>::uniform({B * T, C}, 2);
  HostTensor<double> a({B * T, C}), b({B * T, C});
  dropout_forward(kCpu, a.t(), x.t(), p, coords(T));
  dropout_forward(kCpu, b.t(), x.t(), p, coords(T));
  EXPECT_EQ(a.vec(), b.vec());
  // Element by element: dropout_keep at (step, sample, position, feature).
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const bool keep = dropout_keep(coords(T).key, 3, 5 + n / T, n % T, c, p);
      EXPECT_EQ(a.vec()[n * C + c], keep ? x.vec()[n * C + c] * (1.0 / (1 - p)) : 0.0) << n << " " << c;
    }
  // Another step, first sample, first position or layer: another mask.
  DropoutCoords layer = coords(T);
  layer.key = philox::make_key(1337, "blocks.3.attn.q.lora_dropout");
  for (const DropoutCoords& other : {coords(T, 4), coords(T, 3, 6), coords(T, 3, 5, 0, 1), layer}) {
    dropout_forward(kCpu, b.t(), x.t(), p, other);
    EXPECT_NE(a.vec(), b.vec());
  }
  // In place (y aliases x) gives the same.
  HostTensor<double> inplace = x;
  dropout_forward(kCpu, inplace.t(), inplace.t(), p, coords(T));
  EXPECT_EQ(inplace.vec(), a.vec());
}

// What a row-parallel layer's tp rank holds (columns [c0, C) with feature0 = c0) and what a
// context-parallel rank holds (positions [t0, T) of each sequence, one sequence at a time) draw
// the elements the whole tensor's call draws.
TEST(Dropout, ASplitTensorDrawsTheWholeOnesElements) {
  const int64_t T = 6, B = 2, C = 11, c0 = 5, t0 = 2;
  const double p = 0.4;
  const auto x = HostTensor<double>::uniform({B * T, C}, 3);
  HostTensor<double> whole({B * T, C});
  dropout_forward(kCpu, whole.t(), x.t(), p, coords(T));
  // Columns [c0, C).
  HostTensor<double> xc({B * T, C - c0}), yc({B * T, C - c0});
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = c0; c < C; ++c) xc.vec()[n * (C - c0) + c - c0] = x.vec()[n * C + c];
  dropout_forward(kCpu, yc.t(), xc.t(), p, coords(T, 3, 5, c0));
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = c0; c < C; ++c) EXPECT_EQ(yc.vec()[n * (C - c0) + c - c0], whole.vec()[n * C + c]);
  // Sequence 1's positions [t0, T).
  const int64_t Tp = T - t0;
  HostTensor<double> xs({Tp, C}), ys({Tp, C});
  for (int64_t t = 0; t < Tp; ++t)
    for (int64_t c = 0; c < C; ++c) xs.vec()[t * C + c] = x.vec()[(T + t0 + t) * C + c];
  dropout_forward(kCpu, ys.t(), xs.t(), p, coords(Tp, 3, 6, 0, t0));
  for (int64_t t = 0; t < Tp; ++t)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(ys.vec()[t * C + c], whole.vec()[(T + t0 + t) * C + c]);
}

TEST(Dropout, ZeroIsTheIdentityAndFloatMatchesDouble) {
  const int64_t T = 5, C = 9;
  const auto x = HostTensor<double>::uniform({2 * T, C}, 4);
  HostTensor<double> y({2 * T, C});
  dropout_forward(kCpu, y.t(), x.t(), 0.0, coords(T));
  EXPECT_EQ(y.vec(), x.vec());
  const auto xf = x.cast<float>();
  HostTensor<float> yf({2 * T, C});
  dropout_forward(kCpu, yf.t(), xf.t(), 0.25, coords(T));
  dropout_forward(kCpu, y.t(), x.t(), 0.25, coords(T));
  for (size_t i = 0; i < y.vec().size(); ++i) EXPECT_NEAR(yf.vec()[i], y.vec()[i], 1e-6 * (1 + std::abs(y.vec()[i])));
}

TEST(Dropout, BackwardMatchesFiniteDifferences) {
  const int64_t T = 4, C = 7;
  const double p = 0.35;
  auto x = HostTensor<double>::uniform({3 * T, C}, 5);
  const auto w = HostTensor<double>::uniform({3 * T, C}, 6);
  HostTensor<double> y({3 * T, C}), dx({3 * T, C});
  auto loss = [&] {  // the mask is fixed: the same coordinates every call
    dropout_forward(kCpu, y.t(), x.t(), p, coords(T));
    return testing::weighted_sum(y, w);
  };
  dropout_backward(kCpu, dx.t(), w.t(), p, coords(T));
  testing::expect_gradient_matches(loss, x, dx, "x");
  EXPECT_GT(kept(dx), 0);
  EXPECT_LT(kept(dx), 3 * T * C);  // some dropped: the check covers both kinds of element
}

TEST(Dropout, BadArgumentsAreRefused) {
  const auto x = HostTensor<double>::uniform({6, 4}, 7);
  HostTensor<double> y({6, 4});
  EXPECT_TRUE(testing::throws_with([&] { dropout_forward(kCpu, y.t(), x.t(), 1.0, coords(3)); }, {"p = 1"}));
  EXPECT_TRUE(testing::throws_with([&] { dropout_forward(kCpu, y.t(), x.t(), 0.1, coords(4)); },
                                   {"6 rows", "4 positions"}));
  EXPECT_TRUE(testing::throws_with([&] { dropout_forward(kCpu, y.t(), x.t(), 0.1, coords(3, uint64_t(1) << 33)); },
                                   {"step", "32-bit"}));
}

}  // namespace
}  // namespace tessera
