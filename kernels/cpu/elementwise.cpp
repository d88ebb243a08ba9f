// CPU elementwise ops: one template per op, instantiated for F32 and F64, parallelized with OpenMP
// (the float and double paths are the same simple loop, so the reference is the code itself).
#include "kernels/elementwise.h"

#include <cstdint>
#include <cstring>

namespace tessera {
namespace {

void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  check_cpu(op, a);
  check_cpu(op, b);
  check_same_dtype(op, a, b);
  TESSERA_CHECK(a.numel() == b.numel(), op, ": sizes differ, ", a.shape.str(), " vs ", b.shape.str());
}

// Calls f(ptr<T>...) with T = float or double according to t's dtype.
template <typename F>
void dispatch_float(const char* op, const Tensor& t, F&& f) {
  if (t.dtype == DType::F32)
    f(float{});
  else if (t.dtype == DType::F64)
    f(double{});
  else
    TESSERA_CHECK(false, op, ": unsupported dtype ", dtype_name(t.dtype));
}

}  // namespace

void fill_zero(const Tensor& t) {
  check_cpu("fill_zero", t);
  if (t.data) std::memset(t.data, 0, t.nbytes());
}

void copy(const Tensor& dst, const Tensor& src) {
  check_pair("copy", dst, src);
  if (dst.data != src.data) std::memcpy(dst.data, src.data, dst.nbytes());
}

namespace {
// Copies w columns per row between a narrow (N, w) and a wide (N, W) matrix at column col0.
void copy_column_block(const char* op, const Tensor& narrow, const Tensor& wide, int64_t col0, bool to_wide) {
  check_cpu(op, narrow);
  check_cpu(op, wide);
  check_same_dtype(op, narrow, wide);
  TESSERA_CHECK(narrow.ndim() == 2 && wide.ndim() == 2 && narrow.dim(0) == wide.dim(0), op, ": expected (N, w) and (N, W), got ",
                narrow.shape.str(), " and ", wide.shape.str());
  const int64_t N = narrow.dim(0), w = narrow.dim(1), W = wide.dim(1);
  TESSERA_CHECK(col0 >= 0 && col0 + w <= W, op, ": columns [", col0, ", ", col0 + w, ") outside the ", W, " of ",
                wide.shape.str());
  const size_t es = dtype_size(narrow.dtype);
  char* n = static_cast<char*>(narrow.data);
  char* x = static_cast<char*>(wide.data);
#pragma omp parallel for schedule(static) if (N * w > 65536)
  for (int64_t r = 0; r < N; ++r) {
    char* a = n + static_cast<size_t>(r * w) * es;
    char* b = x + static_cast<size_t>(r * W + col0) * es;
    if (to_wide)
      std::memcpy(b, a, static_cast<size_t>(w) * es);
    else
      std::memcpy(a, b, static_cast<size_t>(w) * es);
  }
}
}  // namespace

void copy_columns(const Tensor& dst, const Tensor& src, int64_t col0) {
  copy_column_block("copy_columns", dst, src, col0, /*to_wide=*/false);
}

void paste_columns(const Tensor& dst, const Tensor& src, int64_t col0) {
  copy_column_block("paste_columns", src, dst, col0, /*to_wide=*/true);
}

void residual_forward(const Tensor& y, const Tensor& a, const Tensor& b) {
  check_pair("residual_forward", y, a);
  check_pair("residual_forward", y, b);
  dispatch_float("residual_forward", y, [&](auto tag) {
    using T = decltype(tag);
    T* py = y.ptr<T>();
    const T* pa = a.ptr<T>();
    const T* pb = b.ptr<T>();
    int64_t n = y.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
  });
}

void accumulate(const Tensor& dst, const Tensor& src) {
  check_pair("accumulate", dst, src);
  dispatch_float("accumulate", dst, [&](auto tag) {
    using T = decltype(tag);
    T* pd = dst.ptr<T>();
    const T* ps = src.ptr<T>();
    int64_t n = dst.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) pd[i] += ps[i];
  });
}

void residual_backward(const Tensor& da, const Tensor& db, const Tensor& dy) {
  if (da.defined()) accumulate(da, dy);
  if (db.defined()) accumulate(db, dy);
}

void scale(const Tensor& t, double s) {
  check_cpu("scale", t);
  dispatch_float("scale", t, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.ptr<T>();
    T f = static_cast<T>(s);
    int64_t n = t.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] *= f;
  });
}

double sum(const Tensor& t) {
  check_cpu("sum", t);
  double total = 0;
  dispatch_float("sum", t, [&](auto tag) {
    using T = decltype(tag);
    const T* p = t.ptr<T>();
    int64_t n = t.numel();
    double acc = 0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(p[i]);
    total = acc;
  });
  return total;
}

int64_t count_not_equal(const Tensor& ids, int32_t value) {
  check_cpu("count_not_equal", ids);
  check_dtype("count_not_equal", "ids", ids, DType::I32);
  const int32_t* p = ids.ptr<int32_t>();
  int64_t n = ids.numel(), count = 0;
#pragma omp parallel for reduction(+ : count) schedule(static)
  for (int64_t i = 0; i < n; ++i) count += p[i] != value;
  return count;
}

double squared_norm(const Tensor& t) {
  check_cpu("squared_norm", t);
  double total = 0;
  dispatch_float("squared_norm", t, [&](auto tag) {
    using T = decltype(tag);
    const T* p = t.ptr<T>();
    int64_t n = t.numel();
    double acc = 0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(p[i]) * p[i];
    total = acc;
  });
  return total;
}

}  // namespace tessera
