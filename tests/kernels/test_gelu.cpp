// Tests kernels/gelu.h: the float SIMD path against the double reference, and the backward
// against finite differences.
#include "kernels/gelu.h"

#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;

TEST(Gelu, ForwardMatchesReferenceAndKnownValues) {
  auto x = HostTensor<double>::uniform({4, 37}, 1, -4, 4);
  HostTensor<double> y_ref(x.shape());
  gelu_forward(kCpu, y_ref.t(), x.t());
  auto xf = x.cast<float>();
  HostTensor<float> yf(x.shape());
  gelu_forward(kCpu, yf.t(), xf.t());
  // Inputs are rounded to float once; the formula is well conditioned, so ~1e-6 relative.
  EXPECT_LT(testing::max_rel_error(yf, y_ref), 2e-6);
  // Known values: gelu(0) = 0, gelu(1) = 0.841191990 (tanh form), gelu(-1) = -0.158808010.
  HostTensor<double> p({3}), q({3});
  p[0] = 0; p[1] = 1; p[2] = -1;
  gelu_forward(kCpu, q.t(), p.t());
  EXPECT_NEAR(q[0], 0.0, 1e-15);
  EXPECT_NEAR(q[1], 0.8411919906082768, 1e-12);
  EXPECT_NEAR(q[2], -0.15880800939172324, 1e-12);
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  auto x = HostTensor<double>::uniform({3, 11}, 2, -3, 3);
  auto w = HostTensor<double>::uniform(x.shape(), 3);
  HostTensor<double> y(x.shape()), dx(x.shape());
  auto loss = [&] {
    gelu_forward(kCpu, y.t(), x.t());
    return testing::weighted_sum(y, w);
  };
  gelu_backward(kCpu, dx.t(), w.t(), x.t());
  testing::expect_gradient_matches(loss, x, dx, "x");

  auto xf = x.cast<float>(), wf = w.cast<float>();
  HostTensor<float> dxf(x.shape());
  gelu_backward(kCpu, dxf.t(), wf.t(), xf.t());
  EXPECT_LT(testing::max_rel_error(dxf, dx), 2e-6);
}

TEST(Gelu, RejectsMismatchedSizes) {
  HostTensor<float> a({4}), b({5});
  EXPECT_THROW(gelu_forward(kCpu, a.t(), b.t()), Error);
}

}  // namespace tessera
