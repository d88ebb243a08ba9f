// CPU RMSNorm: a double reference (the oracle) and a float path, rows in parallel; dw reduced per
// column block over all rows in order, so it is deterministic for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"

namespace tessera {
namespace {

// Columns per task in the dw reduction: a task owns its columns, so no two threads write one.
constexpr int64_t kColBlock = 64;

namespace reference {
template <typename T>
void forward(T* y, T* rstd, const T* x, const T* w, int64_t N, int64_t C, T eps) {
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;  // (C)
    T* yr = y + n * C;        // (C)
    T ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += xr[c] * xr[c];
    T s = T(1) / std::sqrt(ms / T(C) + eps);
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * s * w[c];
    rstd[n] = s;
  }
}

// With xhat = x rstd and g = dy w:  dx = rstd (g - xhat mean(g xhat)),  dw = sum_n dy xhat.
template <typename T>
void backward(T* dx, T* dw, const T* dy, const T* x, const T* w, const T* rstd, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const T* gr = dy + n * C;
    T* dxr = dx + n * C;
    T s = rstd[n];
    T gx_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      gx_mean += gr[c] * w[c] * xr[c] * s;
      dw[c] += gr[c] * xr[c] * s;
    }
    gx_mean /= T(C);
    for (int64_t c = 0; c < C; ++c) dxr[c] += s * (gr[c] * w[c] - xr[c] * s * gx_mean);
  }
}
}  // namespace reference

namespace simd {
void forward(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;  // (C)
    float* yr = y + n * C;        // (C)
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    float s = 1.0f / std::sqrt(ss / float(C) + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * s * w[c];
    rstd[n] = s;
  }
}

// dw (C) += sum_n dy xhat. Each task walks all rows in order for its block of columns,
// accumulating in double: deterministic, and accurate for many rows.
void weight_grad(float* dw, const float* dy, const float* x, const float* rstd, int64_t N, int64_t C) {
  int64_t blocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t c0 = blk * kColBlock, nc = std::min(kColBlock, C - c0);
    double acc[kColBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C + c0;
      const float* gr = dy + n * C + c0;
      float s = rstd[n];
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) acc[j] += double(gr[j] * (xr[j] * s));
    }
    for (int64_t j = 0; j < nc; ++j) dw[c0 + j] += float(acc[j]);
  }
}

// dx (N, C) += rstd (g - xhat mean(g xhat)), g = dy w; rows in parallel.
void input_grad(float* dx, const float* dy, const float* x, const float* w, const float* rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    const float* gr = dy + n * C;
    float* dxr = dx + n * C;
    float s = rstd[n];
    float gx_sum = 0;
#pragma omp simd reduction(+ : gx_sum)
    for (int64_t c = 0; c < C; ++c) gx_sum += gr[c] * w[c] * (xr[c] * s);
    float gx_mean = gx_sum / float(C);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dxr[c] += s * (gr[c] * w[c] - xr[c] * s * gx_mean);
  }
}

void backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const float* rstd, int64_t N,
              int64_t C) {
  weight_grad(dw, dy, x, rstd, N, C);
  input_grad(dx, dy, x, w, rstd, N, C);
}
}  // namespace simd

}  // namespace

void cpu::rmsnorm_forward(const Exec&, const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w,
                          double eps) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (x.dtype == DType::F64)
    reference::forward(y.ptr<double>(), rstd.ptr<double>(), x.ptr<double>(), w.ptr<double>(), N, C, eps);
  else
    simd::forward(y.ptr<float>(), rstd.ptr<float>(), x.ptr<float>(), w.ptr<float>(), N, C, float(eps));
}

void cpu::rmsnorm_backward(const Exec&, const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                           const Tensor& w, const Tensor& rstd) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (x.dtype == DType::F64)
    reference::backward(dx.ptr<double>(), dw.ptr<double>(), dy.ptr<double>(), x.ptr<double>(), w.ptr<double>(),
                        rstd.ptr<double>(), N, C);
  else
    simd::backward(dx.ptr<float>(), dw.ptr<float>(), dy.ptr<float>(), x.ptr<float>(), w.ptr<float>(), rstd.ptr<float>(),
                   N, C);
}

}  // namespace tessera
