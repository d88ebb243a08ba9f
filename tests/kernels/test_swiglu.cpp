// Tests kernels/swiglu.h: the float path against the double reference on the same inputs, both
// gradients against finite differences, known values, saturation and argument errors.
#include <limits>

#include "kernels/swiglu.h"
#include "op_testing.h"

namespace tessera {
using testing::expect_error;
using testing::float_rounded;
using testing::HostTensor;
using testing::kCpu;
TEST(SwiGlu, FloatForwardMatchesReferenceAndKnownValues) {
  auto gate = float_rounded(HostTensor<double>::uniform({6, 45}, 210, -6, 6));
  auto up = float_rounded(HostTensor<double>::uniform({6, 45}, 211, -2, 2));
  HostTensor<double> y({6, 45});
  swiglu_forward(kCpu, y.t(), gate.t(), up.t());
  auto gf = gate.cast<float>(), uf = up.cast<float>();
  HostTensor<float> yf({6, 45});
  swiglu_forward(kCpu, yf.t(), gf.t(), uf.t());
  // A handful of roundings (exp within an ulp or two, one add, one divide, two multiplies), all
  // well conditioned for |gate| <= 6: ~6 eps = 7e-7 relative; 2e-6 with margin.
  EXPECT_LT(testing::max_rel_error(yf, y), 2e-6);

  // silu(0) = 0; silu(1) * 2 = 2 / (1 + e^-1); silu(-2) * 1 = -2 / (1 + e^2).
  HostTensor<double> g({3}), u({3}), out({3});
  g[0] = 0, g[1] = 1, g[2] = -2;
  u[0] = 5, u[1] = 2, u[2] = 1;
  swiglu_forward(kCpu, out.t(), g.t(), u.t());
  EXPECT_EQ(out[0], 0.0);
  EXPECT_NEAR(out[1], 1.4621171572600098, 1e-15);
  EXPECT_NEAR(out[2], -0.23840584404423537, 1e-15);
}

TEST(SwiGlu, BackwardMatchesFiniteDifferences) {
  auto gate = HostTensor<double>::uniform({4, 13}, 220, -5, 5);
  auto up = HostTensor<double>::uniform({4, 13}, 221, -2, 2);
  auto r = HostTensor<double>::uniform({4, 13}, 222);  // the loss weights: dy = r
  HostTensor<double> y({4, 13}), dgate({4, 13}), dup({4, 13});
  swiglu_backward(kCpu, dgate.t(), dup.t(), r.t(), gate.t(), up.t());
  auto loss = [&] {
    swiglu_forward(kCpu, y.t(), gate.t(), up.t());
    return testing::weighted_sum(y, r);
  };
  testing::expect_gradient_matches(loss, gate, dgate, "gate");
  testing::expect_gradient_matches(loss, up, dup, "up");
}

TEST(SwiGlu, FloatBackwardMatchesReferenceAndOverwrites) {
  auto gate = float_rounded(HostTensor<double>::uniform({7, 33}, 230, -6, 6));
  auto up = float_rounded(HostTensor<double>::uniform({7, 33}, 231, -2, 2));
  auto dy = float_rounded(HostTensor<double>::uniform({7, 33}, 232));
  HostTensor<double> dgate({7, 33}), dup({7, 33});
  swiglu_backward(kCpu, dgate.t(), dup.t(), dy.t(), gate.t(), up.t());
  auto gf = gate.cast<float>(), uf = up.cast<float>(), dyf = dy.cast<float>();
  // dgate and dup are written, not accumulated: stale content (NaN) must not survive.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  HostTensor<float> dgf({7, 33}, nan), duf({7, 33}, nan);
  swiglu_backward(kCpu, dgf.t(), duf.t(), dyf.t(), gf.t(), uf.t());
  // As the forward, a handful of well-conditioned roundings; 1 - sig and 1 + g (1 - sig) lose at
  // most a few bits for |g| <= 6 (the product stays O(1)): 5e-6.
  EXPECT_LT(testing::max_rel_error(dgf, dgate), 5e-6);
  EXPECT_LT(testing::max_rel_error(duf, dup), 2e-6);
}

TEST(SwiGlu, SaturatesWithoutNaN) {
  // exp(-gate) overflows float for gate < -88: sigmoid must go to 0, not NaN; gate > 88 gives 1.
  HostTensor<float> g({4}), u({4}, 2.0f), y({4}), dy({4}, 1.0f), dg({4}), du({4});
  g[0] = -200, g[1] = -100, g[2] = 100, g[3] = 200;
  swiglu_forward(kCpu, y.t(), g.t(), u.t());
  swiglu_backward(kCpu, dg.t(), du.t(), dy.t(), g.t(), u.t());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(y[i], 0.0f);
    EXPECT_EQ(dg[i], 0.0f);
    EXPECT_EQ(du[i], 0.0f);
  }
  for (int i = 2; i < 4; ++i) {
    EXPECT_EQ(y[i], 2 * g[i]);
    EXPECT_EQ(dg[i], 2.0f);
    EXPECT_EQ(du[i], g[i]);
  }
}

TEST(SwiGlu, RejectsBadArguments) {
  HostTensor<float> g({4, 8}), u({4, 8}), y({4, 8}), u_bad({4, 7});
  HostTensor<double> y64({4, 8});
  HostTensor<int32_t> gi({4, 8});
  expect_error([&] { swiglu_forward(kCpu, y.t(), g.t(), u_bad.t()); }, {"swiglu_forward", "up", "(4, 7)"});
  expect_error([&] { swiglu_forward(kCpu, y64.t(), g.t(), u.t()); }, {"swiglu_forward", "y has dtype f64"});
  expect_error([&] { swiglu_forward(kCpu, y.t(), gi.t(), u.t()); }, {"swiglu_forward", "unsupported dtype i32"});
  expect_error([&] { swiglu_backward(kCpu, g.t(), u_bad.t(), y.t(), g.t(), u.t()); }, {"swiglu_backward", "dup"});
}

}  // namespace tessera
