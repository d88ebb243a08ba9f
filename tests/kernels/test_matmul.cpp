// Tests kernels/matmul.h: the F64 reference against an independent loop, the F32 BLAS path against
// the F64 reference on the same float-rounded inputs, and linear_backward against finite differences.
#include "kernels/matmul.h"

#include <limits>
#include <string>

#include "testing.h"

namespace tessera {
using testing::HostTensor;
using testing::kCpu;

namespace {

// fp32 tolerance for a K-length dot product compared normwise with the exact result on the same
// rounded inputs: rounding errors of the K accumulations add up like a random walk, relative error
// ~ sqrt(K) * 2^-24 ~ 7e-7 for K = 130 (the largest K below); the deterministic worst case is
// K * 2^-24 ~ 8e-6. 1e-5 covers even the worst case, while any indexing bug shows as O(1).
constexpr double kF32Tol = 1e-5;

// Stored operand (rows, cols) -> the (cols, rows) transpose, so the oracle below never needs
// trans flags: it multiplies plain row-major matrices.
HostTensor<double> transposed(const HostTensor<double>& a) {
  int64_t r = a.shape()[0], c = a.shape()[1];
  HostTensor<double> t({c, r});
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) t[j * r + i] = a[i * c + j];
  return t;
}

// c = alpha * a (M, K) · b (K, N) + beta * c, written independently of the kernel under test.
void naive_matmul(HostTensor<double>& c, const HostTensor<double>& a, const HostTensor<double>& b, double alpha,
                  double beta) {
  int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[i * k + p] * b[p * n + j];
      c[i * n + j] = alpha * s + beta * c[i * n + j];
    }
}

// Random operands stored for the given trans flags: a (M, K) or (K, M); b (K, N) or (N, K).
// Values are exactly representable in float, so F32 and F64 see the same inputs.
struct Operands {
  HostTensor<double> a, b, c;
};
Operands random_operands(int64_t m, int64_t n, int64_t k, bool ta, bool tb, uint64_t seed) {
  Operands o;
  o.a = HostTensor<float>::uniform(ta ? Shape{k, m} : Shape{m, k}, seed).cast<double>();
  o.b = HostTensor<float>::uniform(tb ? Shape{n, k} : Shape{k, n}, seed + 1).cast<double>();
  o.c = HostTensor<float>::uniform({m, n}, seed + 2).cast<double>();
  return o;
}

// Expects f() to throw an Error whose message names every given word.
template <typename F>
void expect_error_naming(F&& f, std::initializer_list<const char*> words) {
  try {
    f();
    ADD_FAILURE() << "expected tessera::Error";
  } catch (const Error& e) {
    for (const char* w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Matmul, HandComputedExample) {
  HostTensor<double> a({2, 2}), b({2, 2}), c({2, 2}, 1.0);
  a.vec() = {1, 2, 3, 4};
  b.vec() = {5, 6, 7, 8};
  matmul(kCpu, c.t(), a.t(), b.t(), false, false, 2.0, 0.5);  // 2 * [[19, 22], [43, 50]] + 0.5
  EXPECT_EQ(c.vec(), (std::vector<double>{38.5, 44.5, 86.5, 100.5}));
}

TEST(Matmul, EveryTransposeCombinationMatchesNaive) {
  const int64_t m = 33, n = 65, k = 130;  // odd sizes hit the BLAS kernels' edge tiles
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(std::string("trans_a=") + (ta ? "1" : "0") + " trans_b=" + (tb ? "1" : "0"));
      Operands o = random_operands(m, n, k, ta, tb, 10 + 2 * ta + tb);
      for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{1.5, 0.5}, std::pair{-0.25, 1.0}}) {
        HostTensor<double> expected = o.c;
        naive_matmul(expected, ta ? transposed(o.a) : o.a, tb ? transposed(o.b) : o.b, alpha, beta);

        HostTensor<double> c64 = o.c;
        matmul(kCpu, c64.t(), o.a.t(), o.b.t(), ta, tb, alpha, beta);
        EXPECT_LT(testing::max_rel_error(c64, expected), 1e-13);  // same sums, reassociated at most

        auto af = o.a.cast<float>(), bf = o.b.cast<float>();
        auto c32 = o.c.cast<float>();
        matmul(kCpu, c32.t(), af.t(), bf.t(), ta, tb, alpha, beta);
        EXPECT_LT(testing::max_rel_error(c32, expected), kF32Tol);
      }
    }
  }
}

TEST(Matmul, BetaZeroOverwritesGarbage) {
  // beta = 0 must not read c (BLAS convention): an uninitialised output may hold NaN.
  Operands o = random_operands(5, 7, 3, false, true, 20);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  HostTensor<double> c64({5, 7}, nan), expected({5, 7});
  naive_matmul(expected, o.a, transposed(o.b), 1.0, 0.0);
  matmul(kCpu, c64.t(), o.a.t(), o.b.t(), false, true);
  EXPECT_LT(testing::max_rel_error(c64, expected), 1e-13);

  auto af = o.a.cast<float>(), bf = o.b.cast<float>();
  HostTensor<float> c32({5, 7}, std::numeric_limits<float>::quiet_NaN());
  matmul(kCpu, c32.t(), af.t(), bf.t(), false, true);
  EXPECT_LT(testing::max_rel_error(c32, expected), kF32Tol);
}

TEST(Matmul, RejectsMismatchedShapesAndDtypes) {
  HostTensor<float> a({4, 3}), b({5, 6}), c({4, 6}), b_ok({3, 6});
  expect_error_naming([&] { matmul(kCpu, c.t(), a.t(), b.t(), false, false); }, {"matmul", "b", "(5, 6)", "(3, 6)"});
  expect_error_naming([&] { matmul(kCpu, c.t(), a.t(), b_ok.t(), true, false); }, {"matmul", "a"});
  HostTensor<double> a64({4, 3});
  expect_error_naming([&] { matmul(kCpu, c.t(), a64.t(), b_ok.t(), false, false); }, {"matmul", "a", "f64"});
  HostTensor<float> c3({4, 6, 1});
  expect_error_naming([&] { matmul(kCpu, c3.t(), a.t(), b_ok.t(), false, false); }, {"matmul", "c"});
}

// ---- Linear ----

namespace {
// y = x · w^T + bias, row by row, independently of the kernel under test. x (N, In), w (Out, In).
HostTensor<double> naive_linear(const HostTensor<double>& x, const HostTensor<double>& w,
                                const HostTensor<double>* bias, Shape y_shape) {
  int64_t out = w.shape()[0], in = w.shape()[1], n = x.numel() / in;
  HostTensor<double> y(y_shape);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int64_t p = 0; p < in; ++p) s += x[i * in + p] * w[o * in + p];
      y[i * out + o] = s;
    }
  return y;
}

HostTensor<double> rounded_uniform(Shape s, uint64_t seed) {
  return HostTensor<float>::uniform(s, seed).cast<double>();
}
}  // namespace

TEST(Linear, ForwardWithAndWithoutBias3D) {
  const int64_t B = 2, T = 3, In = 24, Out = 17;
  auto x = rounded_uniform({B, T, In}, 30);  // (B, T, In)
  auto w = rounded_uniform({Out, In}, 31);   // (Out, In)
  auto bias = rounded_uniform({Out}, 32);    // (Out)
  for (bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "with bias" : "without bias");
    auto expected = naive_linear(x, w, with_bias ? &bias : nullptr, {B, T, Out});
    Tensor b64 = with_bias ? bias.t() : Tensor();
    HostTensor<double> y64({B, T, Out}, 7.0);  // stale content must be overwritten
    linear_forward(kCpu, y64.t(), x.t(), w.t(), b64);
    EXPECT_LT(testing::max_rel_error(y64, expected), 1e-13);

    auto xf = x.cast<float>(), wf = w.cast<float>(), bf = bias.cast<float>();
    HostTensor<float> y32({B, T, Out}, 7.0f);
    linear_forward(kCpu, y32.t(), xf.t(), wf.t(), with_bias ? bf.t() : Tensor());
    EXPECT_LT(testing::max_rel_error(y32, expected), kF32Tol);
  }
}

TEST(Linear, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 3, In = 5, Out = 4;
  auto x = HostTensor<double>::uniform({B, T, In}, 40);  // (B, T, In)
  auto w = HostTensor<double>::uniform({Out, In}, 41);   // (Out, In)
  auto bias = HostTensor<double>::uniform({Out}, 42);    // (Out)
  auto wr = HostTensor<double>::uniform({B, T, Out}, 43);  // loss weights = dy
  HostTensor<double> y({B, T, Out});
  auto loss = [&] {
    linear_forward(kCpu, y.t(), x.t(), w.t(), bias.t());
    return testing::weighted_sum(y, wr);
  };
  HostTensor<double> dx(x.shape()), dw(w.shape()), dbias(bias.shape());
  linear_backward(kCpu, dx.t(), dw.t(), dbias.t(), wr.t(), x.t(), w.t());
  testing::expect_gradient_matches(loss, x, dx, "x");
  testing::expect_gradient_matches(loss, w, dw, "w");
  testing::expect_gradient_matches(loss, bias, dbias, "bias");
}

TEST(Linear, BackwardAccumulatesWeightsAndOverwritesInput) {
  const int64_t N = 6, In = 5, Out = 4;
  auto x = HostTensor<double>::uniform({N, In}, 50);
  auto w = HostTensor<double>::uniform({Out, In}, 51);
  auto dy = HostTensor<double>::uniform({N, Out}, 52);
  HostTensor<double> dx0(x.shape()), dw0(w.shape()), db0({Out});
  linear_backward(kCpu, dx0.t(), dw0.t(), db0.t(), dy.t(), x.t(), w.t());  // from zero: the fresh gradients

  HostTensor<double> dx(x.shape(), 123.0), dw(w.shape(), 1.0), db({Out}, -2.0);
  linear_backward(kCpu, dx.t(), dw.t(), db.t(), dy.t(), x.t(), w.t());
  for (int64_t i = 0; i < dx.numel(); ++i) EXPECT_DOUBLE_EQ(dx[i], dx0[i]);
  for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_DOUBLE_EQ(dw[i], 1.0 + dw0[i]);
  for (int64_t i = 0; i < db.numel(); ++i) EXPECT_DOUBLE_EQ(db[i], -2.0 + db0[i]);

  // Undefined dx and dbias are skipped; dw still accumulates.
  HostTensor<double> dw2(w.shape(), 1.0);
  linear_backward(kCpu, Tensor(), dw2.t(), Tensor(), dy.t(), x.t(), w.t());
  for (int64_t i = 0; i < dw2.numel(); ++i) EXPECT_DOUBLE_EQ(dw2[i], 1.0 + dw0[i]);
}

TEST(Linear, BackwardFloatMatchesReference) {
  // N = 130 is the K of the dw GEMM and the length of the dbias sums; see kF32Tol.
  const int64_t B = 2, T = 65, In = 24, Out = 70;
  auto x = rounded_uniform({B, T, In}, 60);
  auto w = rounded_uniform({Out, In}, 61);
  auto dy = rounded_uniform({B, T, Out}, 62);
  auto dw_init = rounded_uniform({Out, In}, 63);
  auto db_init = rounded_uniform({Out}, 64);
  HostTensor<double> dx64(x.shape()), dw64 = dw_init, db64 = db_init;
  linear_backward(kCpu, dx64.t(), dw64.t(), db64.t(), dy.t(), x.t(), w.t());

  auto xf = x.cast<float>(), wf = w.cast<float>(), dyf = dy.cast<float>();
  HostTensor<float> dx32(x.shape(), 5.0f);
  auto dw32 = dw_init.cast<float>();
  auto db32 = db_init.cast<float>();
  linear_backward(kCpu, dx32.t(), dw32.t(), db32.t(), dyf.t(), xf.t(), wf.t());
  EXPECT_LT(testing::max_rel_error(dx32, dx64), kF32Tol);
  EXPECT_LT(testing::max_rel_error(dw32, dw64), kF32Tol);
  // dbias sums in double and rounds once: within one float rounding (2^-24 ~ 6e-8) normwise.
  EXPECT_LT(testing::max_rel_error(db32, db64), 1e-7);
}

TEST(Linear, RejectsMismatchedShapes) {
  HostTensor<float> x({2, 3, 5}), w({4, 5}), y({2, 3, 4}), bias({4});
  HostTensor<float> w_bad({4, 6}), y_bad({2, 4, 4}), bias_bad({5});
  expect_error_naming([&] { linear_forward(kCpu, y.t(), x.t(), w_bad.t(), bias.t()); }, {"linear_forward", "x"});
  expect_error_naming([&] { linear_forward(kCpu, y_bad.t(), x.t(), w.t(), bias.t()); }, {"linear_forward", "y"});
  expect_error_naming([&] { linear_forward(kCpu, y.t(), x.t(), w.t(), bias_bad.t()); }, {"linear_forward", "bias"});

  HostTensor<float> dx(x.shape()), dw(w.shape()), db({4}), dw_bad({5, 4}), dx_bad({6, 5});
  expect_error_naming([&] { linear_backward(kCpu, dx.t(), dw_bad.t(), db.t(), y.t(), x.t(), w.t()); },
                      {"linear_backward", "dw"});
  expect_error_naming([&] { linear_backward(kCpu, dx_bad.t(), dw.t(), db.t(), y.t(), x.t(), w.t()); },
                      {"linear_backward", "dx"});
  expect_error_naming([&] { linear_backward(kCpu, dx.t(), dw.t(), bias_bad.t(), y.t(), x.t(), w.t()); },
                      {"linear_backward", "dbias"});
  expect_error_naming([&] { linear_backward(kCpu, dx.t(), dw.t(), db.t(), y_bad.t(), x.t(), w.t()); },
                      {"linear_backward", "dy"});
  HostTensor<double> w64({4, 5});
  expect_error_naming([&] { linear_forward(kCpu, y.t(), x.t(), w64.t(), Tensor()); }, {"linear_forward", "w", "f64"});
}

}  // namespace tessera
