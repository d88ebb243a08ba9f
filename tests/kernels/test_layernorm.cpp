// Tests kernels/layernorm.h: the float path against the double reference on the same inputs, every
// gradient against finite differences, += accumulation, known statistics and argument errors.
#include <omp.h>

#include "kernels/layernorm.h"
#include "op_testing.h"

namespace tessera {
using testing::expect_error;
using testing::float_rounded;
using testing::HostTensor;
using testing::kCpu;
namespace {

constexpr double kEps = 1e-5;

// One forward's inputs and outputs in dtype T. x has mean ~3 and spread ~0.6, so a one-pass
// E[x^2] - E[x]^2 variance would lose digits that the two-pass statistics keep.
template <typename T>
struct Forward {
  HostTensor<T> x, w, b, y, mean, rstd;
  Forward(const HostTensor<double>& x0, const HostTensor<double>& w0, const HostTensor<double>& b0)
      : x(x0.cast<T>()),
        w(w0.cast<T>()),
        b(b0.cast<T>()),
        y(x0.shape()),
        mean({x0.numel() / w0.numel()}),
        rstd({x0.numel() / w0.numel()}) {}
  void run(bool bias = true, double eps = kEps) {
    layernorm_forward(kCpu, y.t(), mean.t(), rstd.t(), x.t(), w.t(), bias ? b.t() : Tensor(), eps);
  }
};

struct Inputs {
  HostTensor<double> x, w, b;
};
Inputs make_inputs(Shape x_shape, uint64_t seed) {
  int64_t C = x_shape[-1];
  return {float_rounded(HostTensor<double>::uniform(x_shape, seed, 2, 4)),
          float_rounded(HostTensor<double>::uniform({C}, seed + 1, 0.5, 1.5)),
          float_rounded(HostTensor<double>::uniform({C}, seed + 2))};
}

}  // namespace

TEST(LayerNorm, FloatForwardMatchesReference) {
  // (2, 7, 67): leading dims flatten into N = 14; C = 67 spans two column blocks and a SIMD tail.
  Inputs in = make_inputs({2, 7, 67}, 10);
  Forward<double> ref(in.x, in.w, in.b);
  Forward<float> f32(in.x, in.w, in.b);
  ref.run();
  f32.run();
  // A sum of C floats with random rounding errs by ~sqrt(C) eps = 8 * 6e-8 = 5e-7 relative (the
  // worst case C eps = 4e-6 needs every rounding to align); x - mean amplifies mean's error by
  // |mean| / std ~ 5 in y and rstd. So 5e-7 for mean, 5e-6 normwise for y and rstd.
  EXPECT_LT(testing::max_rel_error(f32.y, ref.y), 5e-6);
  EXPECT_LT(testing::max_rel_error(f32.mean, ref.mean), 5e-7);
  EXPECT_LT(testing::max_rel_error(f32.rstd, ref.rstd), 5e-6);
}

TEST(LayerNorm, UnitWeightGivesZeroMeanUnitVariance) {
  Inputs in = make_inputs({9, 50}, 20);
  in.w = HostTensor<double>({50}, 1.0);
  Forward<double> ref(in.x, in.w, in.b);
  Forward<float> f32(in.x, in.w, in.b);
  ref.run(/*bias=*/false, /*eps=*/0.0);
  f32.run(/*bias=*/false, /*eps=*/0.0);
  for (int64_t n = 0; n < 9; ++n) {
    double m_ref = 0, m32 = 0, v_ref = 0, v32 = 0, x_mean = 0;
    for (int64_t c = 0; c < 50; ++c) {
      m_ref += ref.y[n * 50 + c] / 50;
      m32 += f32.y[n * 50 + c] / 50.0;
      v_ref += ref.y[n * 50 + c] * ref.y[n * 50 + c] / 50;
      v32 += double(f32.y[n * 50 + c]) * f32.y[n * 50 + c] / 50.0;
      x_mean += in.x[n * 50 + c] / 50;
    }
    EXPECT_NEAR(m_ref, 0.0, 1e-13);
    EXPECT_NEAR(v_ref, 1.0, 1e-13);
    EXPECT_NEAR(ref.mean[n], x_mean, 1e-13);
    // Float: each y has error ~1e-6 relative (see FloatForwardMatchesReference).
    EXPECT_NEAR(m32, 0.0, 1e-5);
    EXPECT_NEAR(v32, 1.0, 1e-5);
  }
}

TEST(LayerNorm, NoBiasEqualsZeroBias) {
  Inputs in = make_inputs({4, 12}, 30);
  Forward<float> without(in.x, in.w, in.b), zero(in.x, in.w, HostTensor<double>({12}));
  without.run(/*bias=*/false);
  zero.run();
  EXPECT_EQ(without.y.vec(), zero.y.vec());
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  Inputs in = make_inputs({5, 9}, 40);
  auto r = HostTensor<double>::uniform({5, 9}, 43);  // the loss weights: dy = r
  Forward<double> f(in.x, in.w, in.b);
  f.run();
  HostTensor<double> dx({5, 9}), dw({9}), db({9});
  layernorm_backward(kCpu, dx.t(), dw.t(), db.t(), r.t(), f.x.t(), f.w.t(), f.mean.t(), f.rstd.t());
  Forward<double> probe(in.x, in.w, in.b);
  auto loss = [&] {
    probe.run();
    return testing::weighted_sum(probe.y, r);
  };
  testing::expect_gradient_matches(loss, probe.x, dx, "x");
  testing::expect_gradient_matches(loss, probe.w, dw, "w");
  testing::expect_gradient_matches(loss, probe.b, db, "b");
}

TEST(LayerNorm, FloatBackwardMatchesReference) {
  // N = 20 rows, C = 130: three column blocks in the dw/db reduction, the last one partial.
  Inputs in = make_inputs({20, 130}, 50);
  auto r = float_rounded(HostTensor<double>::uniform({20, 130}, 53));
  Forward<double> ref(in.x, in.w, in.b);
  Forward<float> f32(in.x, in.w, in.b);
  ref.run();
  f32.run();
  HostTensor<double> dx({20, 130}), dw({130}), db({130});
  layernorm_backward(kCpu, dx.t(), dw.t(), db.t(), r.t(), ref.x.t(), ref.w.t(), ref.mean.t(), ref.rstd.t());
  auto rf = r.cast<float>();
  HostTensor<float> dxf({20, 130}), dwf({130}), dbf({130});
  layernorm_backward(kCpu, dxf.t(), dwf.t(), dbf.t(), rf.t(), f32.x.t(), f32.w.t(), f32.mean.t(), f32.rstd.t());
  // dx: row sums of C = 130 float products, ~sqrt(C) eps = 7e-7 relative, on top of the forward's
  // errors in rstd and xhat (5e-6, see FloatForwardMatchesReference): 5e-6 normwise.
  // dw: float products summed in double over rows, so only xhat's error remains: 5e-6.
  // db: float dy summed in double and rounded once: eps = 1.2e-7, 2e-7 with margin.
  EXPECT_LT(testing::max_rel_error(dxf, dx), 5e-6);
  EXPECT_LT(testing::max_rel_error(dwf, dw), 5e-6);
  EXPECT_LT(testing::max_rel_error(dbf, db), 2e-7);
}

TEST(LayerNorm, BackwardAccumulates) {
  Inputs in = make_inputs({6, 70}, 60);
  auto r = HostTensor<double>::uniform({6, 70}, 63);
  auto check = [&](auto tag, double tol) {
    using T = decltype(tag);
    Forward<T> f(in.x, in.w, in.b);
    f.run();
    auto dy = r.cast<T>();
    HostTensor<T> dx({6, 70}), dw({70}), db({70});
    layernorm_backward(kCpu, dx.t(), dw.t(), db.t(), dy.t(), f.x.t(), f.w.t(), f.mean.t(), f.rstd.t());
    auto dx0 = HostTensor<double>::uniform({6, 70}, 64).cast<T>(),
         dw0 = HostTensor<double>::uniform({70}, 65).cast<T>(), db0 = HostTensor<double>::uniform({70}, 66).cast<T>();
    auto dx1 = dx0, dw1 = dw0, db1 = db0;
    layernorm_backward(kCpu, dx1.t(), dw1.t(), db1.t(), dy.t(), f.x.t(), f.w.t(), f.mean.t(), f.rstd.t());
    for (int64_t i = 0; i < dx.numel(); ++i) dx0[i] += dx[i];
    for (int64_t i = 0; i < dw.numel(); ++i) dw0[i] += dw[i], db0[i] += db[i];
    // fresh + old in one rounding vs the kernel's own +=: equal up to a possible fused multiply-add.
    EXPECT_LT(testing::max_rel_error(dx1, dx0), tol);
    EXPECT_LT(testing::max_rel_error(dw1, dw0), tol);
    EXPECT_LT(testing::max_rel_error(db1, db0), tol);
  };
  check(double{}, 1e-15);
  check(float{}, 1e-6);
}

TEST(LayerNorm, BackwardWithoutBiasGradient) {
  Inputs in = make_inputs({4, 10}, 70);
  auto dy = HostTensor<double>::uniform({4, 10}, 73).cast<float>();
  Forward<float> f(in.x, in.w, in.b);
  f.run();
  HostTensor<float> dx({4, 10}), dw({10}), db({10}), dx2({4, 10}), dw2({10});
  layernorm_backward(kCpu, dx.t(), dw.t(), db.t(), dy.t(), f.x.t(), f.w.t(), f.mean.t(), f.rstd.t());
  layernorm_backward(kCpu, dx2.t(), dw2.t(), Tensor(), dy.t(), f.x.t(), f.w.t(), f.mean.t(), f.rstd.t());
  EXPECT_EQ(dx.vec(), dx2.vec());
  EXPECT_EQ(dw.vec(), dw2.vec());
}

TEST(LayerNorm, FloatBackwardIndependentOfThreadCount) {
  Inputs in = make_inputs({17, 200}, 80);
  auto dy = HostTensor<double>::uniform({17, 200}, 83).cast<float>();
  Forward<float> f(in.x, in.w, in.b);
  f.run();
  auto grads = [&](int threads) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    HostTensor<float> dx({17, 200}), dw({200}), db({200});
    layernorm_backward(kCpu, dx.t(), dw.t(), db.t(), dy.t(), f.x.t(), f.w.t(), f.mean.t(), f.rstd.t());
    omp_set_num_threads(saved);
    std::vector<float> all = dx.vec();
    all.insert(all.end(), dw.vec().begin(), dw.vec().end());
    all.insert(all.end(), db.vec().begin(), db.vec().end());
    return all;
  };
  auto one = grads(1);
  EXPECT_EQ(one, grads(2));
  EXPECT_EQ(one, grads(3));
}

TEST(LayerNorm, RejectsBadArguments) {
  HostTensor<float> x({4, 8}), y({4, 8}), w({8}), b({8}), mean({4}), rstd({4}), w_bad({7}), mean_bad({3});
  HostTensor<double> w64({8});
  HostTensor<int32_t> xi({4, 8});
  expect_error([&] { layernorm_forward(kCpu, y.t(), mean.t(), rstd.t(), x.t(), w_bad.t(), b.t(), kEps); },
               {"layernorm_forward", "w", "(7)"});
  expect_error([&] { layernorm_forward(kCpu, y.t(), mean_bad.t(), rstd.t(), x.t(), w.t(), b.t(), kEps); },
               {"layernorm_forward", "mean", "4 elements"});
  expect_error([&] { layernorm_forward(kCpu, y.t(), mean.t(), rstd.t(), x.t(), w64.t(), b.t(), kEps); },
               {"layernorm_forward", "w", "f64"});
  expect_error([&] { layernorm_forward(kCpu, y.t(), mean.t(), rstd.t(), xi.t(), w.t(), b.t(), kEps); },
               {"layernorm_forward", "unsupported dtype i32"});
  HostTensor<float> dx({4, 8}), dw({8}), dy({4, 9});
  expect_error([&] { layernorm_backward(kCpu, dx.t(), dw.t(), Tensor(), dy.t(), x.t(), w.t(), mean.t(), rstd.t()); },
               {"layernorm_backward", "dy", "(4, 9)"});
  expect_error([&] { layernorm_backward(kCpu, dx.t(), Tensor(), Tensor(), y.t(), x.t(), w.t(), mean.t(), rstd.t()); },
               {"layernorm_backward", "dw is undefined"});
}

}  // namespace tessera
