// CPU elementwise ops: one template per op, instantiated for F32 and F64, parallelized with OpenMP
// (the float and double paths are the same simple loop, so the reference is the code itself).
#include <cstdint>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_bf16.h"

namespace tessera {
namespace {

// Calls f(T{}) with T = float or double according to t's dtype (checked by the front).
template <typename F>
void dispatch_float(const Tensor& t, F&& f) {
  if (t.dtype == DType::F32)
    f(float{});
  else
    f(double{});
}

// Copies w columns per row between a narrow (N, w) and a wide (N, W) matrix at column col0.
void copy_column_block(const Tensor& narrow, const Tensor& wide, int64_t col0, bool to_wide) {
  const int64_t N = narrow.dim(0), w = narrow.dim(1), W = wide.dim(1);
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

void cpu::fill_zero(const Exec&, const Tensor& t) { std::memset(t.data, 0, t.nbytes()); }

void cpu::copy(const Exec&, const Tensor& dst, const Tensor& src) {
  if (dst.data != src.data) std::memcpy(dst.data, src.data, dst.nbytes());
}

void cpu::convert(const Exec&, const Tensor& dst, const Tensor& src) {
  f32_to_bf16(static_cast<uint16_t*>(dst.data), src.ptr<float>(), src.numel());
}

void cpu::copy_columns(const Exec&, const Tensor& dst, const Tensor& src, int64_t col0) {
  copy_column_block(dst, src, col0, /*to_wide=*/false);
}

void cpu::paste_columns(const Exec&, const Tensor& dst, const Tensor& src, int64_t col0) {
  copy_column_block(src, dst, col0, /*to_wide=*/true);
}

void cpu::residual_forward(const Exec&, const Tensor& y, const Tensor& a, const Tensor& b) {
  dispatch_float(y, [&](auto tag) {
    using T = decltype(tag);
    T* py = y.ptr<T>();
    const T* pa = a.ptr<T>();
    const T* pb = b.ptr<T>();
    int64_t n = y.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) py[i] = pa[i] + pb[i];
  });
}

void cpu::accumulate(const Exec&, const Tensor& dst, const Tensor& src) {
  dispatch_float(dst, [&](auto tag) {
    using T = decltype(tag);
    T* pd = dst.ptr<T>();
    const T* ps = src.ptr<T>();
    int64_t n = dst.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) pd[i] += ps[i];
  });
}

void cpu::scale(const Exec&, const Tensor& t, double s) {
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.ptr<T>();
    T f = static_cast<T>(s);
    int64_t n = t.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] *= f;
  });
}

void cpu::sum(const Exec&, const Tensor& out, const Tensor& t) {
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    const T* p = t.ptr<T>();
    int64_t n = t.numel();
    double acc = 0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(p[i]);
    *out.ptr<double>() = acc;
  });
}

void cpu::count_not_equal(const Exec&, const Tensor& out, const Tensor& ids, int32_t value) {
  const int32_t* p = ids.ptr<int32_t>();
  int64_t n = ids.numel(), count = 0;
#pragma omp parallel for reduction(+ : count) schedule(static)
  for (int64_t i = 0; i < n; ++i) count += p[i] != value;
  *out.ptr<double>() = static_cast<double>(count);
}

void cpu::squared_norm(const Exec&, const Tensor& out, const Tensor& t) {
  dispatch_float(t, [&](auto tag) {
    using T = decltype(tag);
    const T* p = t.ptr<T>();
    int64_t n = t.numel();
    double acc = 0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static)
    for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(p[i]) * p[i];
    *out.ptr<double>() = acc;
  });
}

}  // namespace tessera
