// Test helpers shared by every suite: owning host tensors, seeded random fill, normwise error,
// and the finite-difference gradient check (double precision) that every backward is held to.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera::testing {

// The execution context of tests on host memory: the CPU's (trivial: no stream).
inline constexpr Exec kCpu{};

// The reductions of kernels/elementwise.h on host tensors, their one F64 result returned.
inline double sum_of(const Tensor& t) {
  double v = 0;
  sum(kCpu, Tensor(&v, DType::F64, {1}), t);
  return v;
}
inline double squared_norm_of(const Tensor& t) {
  double v = 0;
  squared_norm(kCpu, Tensor(&v, DType::F64, {1}), t);
  return v;
}
inline int64_t count_not_equal_of(const Tensor& ids, int32_t value) {
  double v = 0;
  count_not_equal(kCpu, Tensor(&v, DType::F64, {1}), ids, value);
  return static_cast<int64_t>(v);
}

// Host memory owned by a test, viewed as a Tensor.
template <typename T>
class HostTensor {
 public:
  HostTensor() = default;
  explicit HostTensor(Shape shape, T fill = T(0)) : shape_(shape), v_(static_cast<size_t>(shape.numel()), fill) {}
  // Uniform in [lo, hi), reproducible from the seed.
  static HostTensor uniform(Shape shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
    HostTensor t(shape);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> d(lo, hi);
    for (auto& x : t.v_) x = static_cast<T>(d(rng));
    return t;
  }
  Tensor t() const { return Tensor(const_cast<T*>(v_.data()), dtype_of<T>(), shape_); }
  T* data() { return v_.data(); }
  const T* data() const { return v_.data(); }
  int64_t numel() const { return static_cast<int64_t>(v_.size()); }
  T& operator[](int64_t i) { return v_[static_cast<size_t>(i)]; }
  T operator[](int64_t i) const { return v_[static_cast<size_t>(i)]; }
  const Shape& shape() const { return shape_; }
  std::vector<T>& vec() { return v_; }
  const std::vector<T>& vec() const { return v_; }
  template <typename U>
  HostTensor<U> cast() const {
    HostTensor<U> o(shape_);
    for (size_t i = 0; i < v_.size(); ++i) o.vec()[i] = static_cast<U>(v_[i]);
    return o;
  }

 private:
  Shape shape_;
  std::vector<T> v_;
};

// Random integer ids in [0, n), e.g. tokens.
inline HostTensor<int32_t> random_ids(Shape shape, int32_t n, uint64_t seed) {
  HostTensor<int32_t> t(shape);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, n - 1);
  for (auto& x : t.vec()) x = d(rng);
  return t;
}

// Normwise relative error: max_i |a_i - b_i| / max_i |b_i| (b is the reference).
template <typename A, typename B>
double max_rel_error(const A* a, const B* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    // A NaN anywhere (an output left unwritten over a NaN poison) or an unequal infinity is an
    // infinite error: std::max would drop a NaN, and inf - inf is one.
    if (std::isnan(x) || std::isnan(y) || ((std::isinf(x) || std::isinf(y)) && x != y))
      return std::numeric_limits<double>::infinity();
    if (x == y) {  // equal, possibly equal infinities: no difference, and the scale of a finite one
      if (std::isfinite(y)) scale = std::max(scale, std::abs(y));
      continue;
    }
    diff = std::max(diff, std::abs(x - y));
    scale = std::max(scale, std::abs(y));
  }
  return diff / std::max(scale, 1e-30);
}
template <typename A, typename B>
double max_rel_error(const HostTensor<A>& a, const HostTensor<B>& b) {
  EXPECT_EQ(a.numel(), b.numel());
  return max_rel_error(a.data(), b.data(), std::min(a.numel(), b.numel()));
}

// sum_i w_i * y_i: the scalar that finite-difference checks differentiate.
inline double weighted_sum(const HostTensor<double>& y, const HostTensor<double>& w) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += y[i] * w[i];
  return s;
}

// Checks an analytic gradient of loss() with respect to x against central differences,
// in double precision: (L(x + h e_i) - L(x - h e_i)) / 2h. With h = 1e-5 the truncation error is
// O(h^2 |L'''|) ~ 1e-10 and the rounding error O(eps |L| / h) ~ 1e-11, so a normwise relative
// error of 1e-6 leaves ample margin while any real bug (a wrong term) shows as O(1).
// At most max_points elements are probed (spread evenly) to keep large tensors fast.
// The error is relative to max(gradient scale, floor): a gradient that is exactly zero in exact
// arithmetic (e.g. a key bias, to which softmax is invariant) is judged against the floor, which
// callers set to the magnitude of the gradients around it.
inline void expect_gradient_matches(const std::function<double()>& loss, HostTensor<double>& x,
                                    const HostTensor<double>& analytic, const char* what,
                                    double tol = 1e-6, double h = 1e-5, int64_t max_points = 64,
                                    double floor = 1e-12) {
  ASSERT_EQ(x.numel(), analytic.numel()) << what;
  int64_t n = x.numel();
  int64_t stride = std::max<int64_t>(1, n / max_points);
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; i += stride) {
    double saved = x[i];
    x[i] = saved + h;
    double lp = loss();
    x[i] = saved - h;
    double lm = loss();
    x[i] = saved;
    double numeric = (lp - lm) / (2 * h);
    diff = std::max(diff, std::abs(numeric - analytic[i]));
    scale = std::max(scale, std::abs(numeric));
  }
  EXPECT_LT(diff / std::max(scale, floor), tol) << "gradient of " << what << ": max abs diff " << diff
                                                << ", scale " << scale;
}

}  // namespace tessera::testing
