// CPU LayerNorm: a double reference (the oracle) and a float path, rows in parallel with two-pass
// statistics; dw/db reduced per column block over all rows in order: deterministic for any threads.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"

namespace tessera {
namespace {

// Columns per task in the dw/db reduction: a task owns its columns, so no two threads write one.
constexpr int64_t kColBlock = 64;

namespace reference {
template <typename T>
void forward(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t N, int64_t C, T eps) {
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;  // (C)
    T* yr = y + n * C;        // (C)
    T m = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= T(C);
    T var = 0;
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    T s = T(1) / std::sqrt(var / T(C) + eps);
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * w[c] + (b ? b[c] : T(0));
    mean[n] = m;
    rstd[n] = s;
  }
}

// With xhat = (x - mean) rstd and g = dy w:
//   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dw = sum_n dy xhat,  db = sum_n dy.
template <typename T>
void backward(T* dx, T* dw, T* db, const T* dy, const T* x, const T* w, const T* mean, const T* rstd, int64_t N,
              int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const T* gr = dy + n * C;
    T* dxr = dx + n * C;
    T m = mean[n], s = rstd[n];
    T g_mean = 0, gx_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      T xh = (xr[c] - m) * s;
      g_mean += gr[c] * w[c];
      gx_mean += gr[c] * w[c] * xh;
      dw[c] += gr[c] * xh;
      if (db) db[c] += gr[c];
    }
    g_mean /= T(C);
    gx_mean /= T(C);
    for (int64_t c = 0; c < C; ++c) {
      T xh = (xr[c] - m) * s;
      dxr[c] += s * (gr[c] * w[c] - g_mean - xh * gx_mean);
    }
  }
}
}  // namespace reference

namespace simd {
// Mean and 1/sqrt(var + eps) of one row: two passes in float, so no E[x^2] - E[x]^2 cancellation.
inline void row_stats(const float* x, int64_t C, float eps, float& mean, float& rstd) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t c = 0; c < C; ++c) sum += x[c];
  float m = sum / float(C);
  float var = 0;
#pragma omp simd reduction(+ : var)
  for (int64_t c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
  mean = m;
  rstd = 1.0f / std::sqrt(var / float(C) + eps);
}

void forward(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t N, int64_t C,
             float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;  // (C)
    float* yr = y + n * C;        // (C)
    float m, s;
    row_stats(xr, C, eps, m, s);
    if (b) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * w[c] + b[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * w[c];
    }
    mean[n] = m;
    rstd[n] = s;
  }
}

// dw (C) += sum_n dy xhat, db (C) += sum_n dy. Each task walks all rows in order for its block of
// columns, accumulating in double: deterministic, and accurate for many rows.
void param_grads(float* dw, float* db, const float* dy, const float* x, const float* mean, const float* rstd, int64_t N,
                 int64_t C) {
  int64_t blocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t c0 = blk * kColBlock, nc = std::min(kColBlock, C - c0);
    double acc_w[kColBlock] = {}, acc_b[kColBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C + c0;
      const float* gr = dy + n * C + c0;
      float m = mean[n], s = rstd[n];
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) {
        acc_w[j] += double(gr[j] * ((xr[j] - m) * s));
        acc_b[j] += double(gr[j]);
      }
    }
    for (int64_t j = 0; j < nc; ++j) dw[c0 + j] += float(acc_w[j]);
    if (db)
      for (int64_t j = 0; j < nc; ++j) db[c0 + j] += float(acc_b[j]);
  }
}

// dx (N, C) += rstd (g - mean(g) - xhat mean(g xhat)), g = dy w; rows in parallel.
void input_grad(float* dx, const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    const float* gr = dy + n * C;
    float* dxr = dx + n * C;
    float m = mean[n], s = rstd[n];
    float g_sum = 0, gx_sum = 0;
#pragma omp simd reduction(+ : g_sum, gx_sum)
    for (int64_t c = 0; c < C; ++c) {
      float g = gr[c] * w[c];
      g_sum += g;
      gx_sum += g * ((xr[c] - m) * s);
    }
    float g_mean = g_sum / float(C), gx_mean = gx_sum / float(C);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dxr[c] += s * (gr[c] * w[c] - g_mean - (xr[c] - m) * s * gx_mean);
  }
}

void backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w, const float* mean,
              const float* rstd, int64_t N, int64_t C) {
  param_grads(dw, db, dy, x, mean, rstd, N, C);
  input_grad(dx, dy, x, w, mean, rstd, N, C);
}
}  // namespace simd

}  // namespace

void cpu::layernorm_forward(const Exec&, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                            const Tensor& w, const Tensor& b, double eps) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (x.dtype == DType::F64)
    reference::forward(y.ptr<double>(), mean.ptr<double>(), rstd.ptr<double>(), x.ptr<double>(), w.ptr<double>(),
                       b.defined() ? b.ptr<double>() : nullptr, N, C, eps);
  else
    simd::forward(y.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), x.ptr<float>(), w.ptr<float>(),
                  b.defined() ? b.ptr<float>() : nullptr, N, C, float(eps));
}

void cpu::layernorm_backward(const Exec&, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                             const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (x.dtype == DType::F64)
    reference::backward(dx.ptr<double>(), dw.ptr<double>(), db.defined() ? db.ptr<double>() : nullptr, dy.ptr<double>(),
                        x.ptr<double>(), w.ptr<double>(), mean.ptr<double>(), rstd.ptr<double>(), N, C);
  else
    simd::backward(dx.ptr<float>(), dw.ptr<float>(), db.defined() ? db.ptr<float>() : nullptr, dy.ptr<float>(),
                   x.ptr<float>(), w.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), N, C);
}

}  // namespace tessera
