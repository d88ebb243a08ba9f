// CPU fused softmax cross-entropy: max-subtracted log-sum-exp per row (float exps, double sum);
// backward reads each logit just before writing its gradient, so it can run in place.
#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/arg_checks.h"
#include "kernels/cpu/simd_math.h"

namespace tessera {
namespace {

namespace reference {
template <typename T>
void forward(T* losses, T* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;  // (V)
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t v = 0; v < V; ++v) m = std::max(m, x[v]);
    T s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[v] - m);
    lse[n] = m + std::log(s);
    losses[n] = targets[n] == kIgnoreIndex ? T(0) : lse[n] - x[targets[n]];
  }
}

// d = scale (exp(x - lse) - onehot(target)); the one-hot term is applied to the written gradient,
// not re-read from x, so d may be x.
template <typename T>
void backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int64_t N, int64_t V, T scale) {
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;  // (V)
    T* d = dlogits + n * V;       // (V)
    if (targets[n] == kIgnoreIndex) {
      for (int64_t v = 0; v < V; ++v) d[v] = T(0);
      continue;
    }
    for (int64_t v = 0; v < V; ++v) d[v] = scale * std::exp(x[v] - lse[n]);
    d[targets[n]] -= scale;
  }
}
}  // namespace reference

namespace simd {
// log(sum_v exp(x_v)) of one row: max-subtracted, exps in float (vectorized), summed in double.
inline double row_logsumexp(const float* x, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t v = 0; v < V; ++v) m = x[v] > m ? x[v] : m;
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t v = 0; v < V; ++v) s += double(cpu::exp_polynomial(x[v] - m));
  return double(m) + std::log(s);
}

void forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;  // (V)
    double l = row_logsumexp(x, V);
    lse[n] = float(l);
    // The loss is formed in double before rounding: lse and x[t] may be large and nearly equal.
    losses[n] = targets[n] == kIgnoreIndex ? 0.0f : float(l - double(x[targets[n]]));
  }
}

void backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets, int64_t N, int64_t V,
              float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;  // (V)
    float* d = dlogits + n * V;       // (V), possibly x itself
    if (targets[n] == kIgnoreIndex) {
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) d[v] = 0.0f;
      continue;
    }
    float l = lse[n];
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] = scale * cpu::exp_polynomial(x[v] - l);
    d[targets[n]] -= scale;
  }
}
}  // namespace simd

// targets (N) I32, each in [0, V) or kIgnoreIndex; the error names the first bad row and value.
void check_targets(const char* op, const Tensor& targets, int64_t N, int64_t V) {
  cpu::check_numel(op, "targets", targets, DType::I32, N);
  const int32_t* t = targets.ptr<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    TESSERA_CHECK(t[n] == kIgnoreIndex || (t[n] >= 0 && t[n] < V), op, ": target ", t[n], " at row ", n,
                  " is outside [0, ", V, ") and is not the ignore index ", kIgnoreIndex);
}

// In place means the same buffer: a partial overlap would read logits already overwritten.
void check_in_place(const char* op, const Tensor& dlogits, const Tensor& logits) {
  auto a = reinterpret_cast<uintptr_t>(dlogits.data), b = reinterpret_cast<uintptr_t>(logits.data);
  bool overlap = a < b + logits.nbytes() && b < a + dlogits.nbytes();
  TESSERA_CHECK(a == b || !overlap, op, ": dlogits partially overlaps logits (in place needs the same buffer)");
}

}  // namespace

void cross_entropy_forward(const Tensor& losses, const Tensor& lse, const Tensor& logits, const Tensor& targets) {
  const char* op = "cross_entropy_forward";
  int64_t V = cpu::check_rows(op, "logits", logits), N = logits.numel() / V;
  cpu::check_numel(op, "losses", losses, logits.dtype, N);
  cpu::check_numel(op, "lse", lse, logits.dtype, N);
  check_targets(op, targets, N, V);
  const int32_t* t = targets.ptr<int32_t>();
  if (logits.dtype == DType::F64)
    reference::forward(losses.ptr<double>(), lse.ptr<double>(), logits.ptr<double>(), t, N, V);
  else
    simd::forward(losses.ptr<float>(), lse.ptr<float>(), logits.ptr<float>(), t, N, V);
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            double loss_scale) {
  const char* op = "cross_entropy_backward";
  int64_t V = cpu::check_rows(op, "logits", logits), N = logits.numel() / V;
  cpu::check_like(op, "dlogits", dlogits, logits);
  cpu::check_numel(op, "lse", lse, logits.dtype, N);
  check_targets(op, targets, N, V);
  check_in_place(op, dlogits, logits);
  const int32_t* t = targets.ptr<int32_t>();
  if (logits.dtype == DType::F64)
    reference::backward(dlogits.ptr<double>(), logits.ptr<double>(), lse.ptr<double>(), t, N, V, loss_scale);
  else
    simd::backward(dlogits.ptr<float>(), logits.ptr<float>(), lse.ptr<float>(), t, N, V, float(loss_scale));
}

}  // namespace tessera
