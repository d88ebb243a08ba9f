// Tests kernels/rmsnorm.h: the float path against the double reference on the same inputs, every
// gradient against finite differences, += accumulation, known values, determinism and errors.
#include <omp.h>

#include "kernels/rmsnorm.h"
#include "op_testing.h"

namespace tessera {
using testing::expect_error;
using testing::float_rounded;
using testing::HostTensor;
using testing::kCpu;
namespace {

constexpr double kEps = 1e-5;

// One forward's inputs and outputs in dtype T.
template <typename T>
struct Forward {
  HostTensor<T> x, w, y, rstd;
  Forward(const HostTensor<double>& x0, const HostTensor<double>& w0)
      : x(x0.cast<T>()), w(w0.cast<T>()), y(x0.shape()), rstd({x0.numel() / w0.numel()}) {}
  void run(double eps = kEps) { rmsnorm_forward(kCpu, y.t(), rstd.t(), x.t(), w.t(), eps); }
};

struct Inputs {
  HostTensor<double> x, w;
};
Inputs make_inputs(Shape x_shape, uint64_t seed) {
  return {float_rounded(HostTensor<double>::uniform(x_shape, seed, -2, 2)),
          float_rounded(HostTensor<double>::uniform({x_shape[-1]}, seed + 1, 0.5, 1.5))};
}

}  // namespace

TEST(RmsNorm, FloatForwardMatchesReference) {
  // (3, 5, 67): leading dims flatten into N = 15; C = 67 spans two column blocks and a SIMD tail.
  Inputs in = make_inputs({3, 5, 67}, 110);
  Forward<double> ref(in.x, in.w);
  Forward<float> f32(in.x, in.w);
  ref.run();
  f32.run();
  // The sum of C positive squares errs by ~sqrt(C) eps = 8 * 6e-8 = 5e-7 relative (worst case
  // C eps = 4e-6), halved by the square root; y adds two roundings. No cancellation: 2e-6.
  EXPECT_LT(testing::max_rel_error(f32.y, ref.y), 2e-6);
  EXPECT_LT(testing::max_rel_error(f32.rstd, ref.rstd), 2e-6);
}

TEST(RmsNorm, UnitWeightGivesUnitMeanSquareAndScaleInvariance) {
  Inputs in = make_inputs({7, 40}, 120);
  in.w = HostTensor<double>({40}, 1.0);
  Forward<double> ref(in.x, in.w), scaled(in.x, in.w);
  for (auto& v : scaled.x.vec()) v *= 3;
  ref.run(/*eps=*/0.0);
  scaled.run(/*eps=*/0.0);
  for (int64_t n = 0; n < 7; ++n) {
    double ms = 0;
    for (int64_t c = 0; c < 40; ++c) ms += ref.y[n * 40 + c] * ref.y[n * 40 + c] / 40;
    EXPECT_NEAR(ms, 1.0, 1e-13);
  }
  EXPECT_LT(testing::max_rel_error(scaled.y, ref.y), 1e-14);
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  Inputs in = make_inputs({5, 9}, 130);
  auto r = HostTensor<double>::uniform({5, 9}, 133);  // the loss weights: dy = r
  Forward<double> f(in.x, in.w);
  f.run();
  HostTensor<double> dx({5, 9}), dw({9});
  rmsnorm_backward(kCpu, dx.t(), dw.t(), r.t(), f.x.t(), f.w.t(), f.rstd.t());
  Forward<double> probe(in.x, in.w);
  auto loss = [&] {
    probe.run();
    return testing::weighted_sum(probe.y, r);
  };
  testing::expect_gradient_matches(loss, probe.x, dx, "x");
  testing::expect_gradient_matches(loss, probe.w, dw, "w");
}

TEST(RmsNorm, FloatBackwardMatchesReference) {
  // N = 20 rows, C = 130: three column blocks in the dw reduction, the last one partial.
  Inputs in = make_inputs({20, 130}, 140);
  auto r = float_rounded(HostTensor<double>::uniform({20, 130}, 143));
  Forward<double> ref(in.x, in.w);
  Forward<float> f32(in.x, in.w);
  ref.run();
  f32.run();
  HostTensor<double> dx({20, 130}), dw({130});
  rmsnorm_backward(kCpu, dx.t(), dw.t(), r.t(), ref.x.t(), ref.w.t(), ref.rstd.t());
  auto rf = r.cast<float>();
  HostTensor<float> dxf({20, 130}), dwf({130});
  rmsnorm_backward(kCpu, dxf.t(), dwf.t(), rf.t(), f32.x.t(), f32.w.t(), f32.rstd.t());
  // dx: a row sum of C = 130 float products, ~sqrt(C) eps = 7e-7 relative, which cancels in
  // g - xhat mean(g xhat) by a factor of a few, plus rstd's ~5e-7: 5e-6 normwise.
  // dw: float products summed in double over rows; only rstd's error remains: 2e-6.
  EXPECT_LT(testing::max_rel_error(dxf, dx), 5e-6);
  EXPECT_LT(testing::max_rel_error(dwf, dw), 2e-6);
}

TEST(RmsNorm, BackwardAccumulates) {
  Inputs in = make_inputs({6, 70}, 150);
  auto r = HostTensor<double>::uniform({6, 70}, 153);
  auto check = [&](auto tag, double tol) {
    using T = decltype(tag);
    Forward<T> f(in.x, in.w);
    f.run();
    auto dy = r.cast<T>();
    HostTensor<T> dx({6, 70}), dw({70});
    rmsnorm_backward(kCpu, dx.t(), dw.t(), dy.t(), f.x.t(), f.w.t(), f.rstd.t());
    auto dx0 = HostTensor<double>::uniform({6, 70}, 154).cast<T>(),
         dw0 = HostTensor<double>::uniform({70}, 155).cast<T>();
    auto dx1 = dx0, dw1 = dw0;
    rmsnorm_backward(kCpu, dx1.t(), dw1.t(), dy.t(), f.x.t(), f.w.t(), f.rstd.t());
    for (int64_t i = 0; i < dx.numel(); ++i) dx0[i] += dx[i];
    for (int64_t i = 0; i < dw.numel(); ++i) dw0[i] += dw[i];
    // fresh + old in one rounding vs the kernel's own +=: equal up to a possible fused multiply-add.
    EXPECT_LT(testing::max_rel_error(dx1, dx0), tol);
    EXPECT_LT(testing::max_rel_error(dw1, dw0), tol);
  };
  check(double{}, 1e-15);
  check(float{}, 1e-6);
}

TEST(RmsNorm, FloatBackwardIndependentOfThreadCount) {
  Inputs in = make_inputs({17, 200}, 160);
  auto dy = HostTensor<double>::uniform({17, 200}, 163).cast<float>();
  Forward<float> f(in.x, in.w);
  f.run();
  auto grads = [&](int threads) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    HostTensor<float> dx({17, 200}), dw({200});
    rmsnorm_backward(kCpu, dx.t(), dw.t(), dy.t(), f.x.t(), f.w.t(), f.rstd.t());
    omp_set_num_threads(saved);
    std::vector<float> all = dx.vec();
    all.insert(all.end(), dw.vec().begin(), dw.vec().end());
    return all;
  };
  auto one = grads(1);
  EXPECT_EQ(one, grads(2));
  EXPECT_EQ(one, grads(3));
}

TEST(RmsNorm, RejectsBadArguments) {
  HostTensor<float> x({4, 8}), y({4, 8}), w({8}), rstd({4}), w_bad({8, 1}), rstd_bad({5}), y_bad({8, 4});
  HostTensor<double> rstd64({4});
  expect_error([&] { rmsnorm_forward(kCpu, y.t(), rstd.t(), x.t(), w_bad.t(), kEps); },
               {"rmsnorm_forward", "w", "(8, 1)"});
  expect_error([&] { rmsnorm_forward(kCpu, y.t(), rstd_bad.t(), x.t(), w.t(), kEps); },
               {"rmsnorm_forward", "rstd", "4 elements"});
  expect_error([&] { rmsnorm_forward(kCpu, y_bad.t(), rstd.t(), x.t(), w.t(), kEps); },
               {"rmsnorm_forward", "y", "(8, 4)"});
  expect_error([&] { rmsnorm_forward(kCpu, y.t(), rstd64.t(), x.t(), w.t(), kEps); },
               {"rmsnorm_forward", "rstd", "f64"});
  HostTensor<float> dx({4, 8}), dw({8});
  expect_error([&] { rmsnorm_backward(kCpu, dx.t(), dw.t(), y.t(), x.t(), w.t(), rstd_bad.t()); },
               {"rmsnorm_backward", "rstd"});
  expect_error([&] { rmsnorm_backward(kCpu, Tensor(), dw.t(), y.t(), x.t(), w.t(), rstd.t()); },
               {"rmsnorm_backward", "dx is undefined"});
}

}  // namespace tessera
