// CPU fused softmax cross-entropy: max-subtracted log-sum-exp per row (float exps, double sum);
// backward reads each logit just before writing its gradient, so it can run in place.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd_math.h"
#include "kernels/cross_entropy.h"

namespace tessera {
namespace {

// The columns of one logits row: `cols` in memory, the first `valid` of which are global ids
// [start, start + valid); the rest are padding.
struct Cols {
  int64_t cols = 0, valid = 0, start = 0;
  // The column of global id t, or -1 when another rank holds it.
  int64_t local(int32_t t) const {
    const int64_t c = t - start;
    return c >= 0 && c < valid ? c : -1;
  }
};

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
// Columns: the row holds `cols`, of which the first `valid` are global ids start + v (see Cols).
template <typename T>
void backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int64_t N, Cols k, T scale) {
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * k.cols;  // (cols)
    T* d = dlogits + n * k.cols;       // (cols)
    if (targets[n] == kIgnoreIndex) {
      for (int64_t v = 0; v < k.cols; ++v) d[v] = T(0);
      continue;
    }
    for (int64_t v = 0; v < k.valid; ++v) d[v] = scale * std::exp(x[v] - lse[n]);
    for (int64_t v = k.valid; v < k.cols; ++v) d[v] = T(0);
    const int64_t t = k.local(targets[n]);
    if (t >= 0) d[t] -= scale;
  }
}

template <typename T>
void shard_forward(T* lse_part, T* target_logit, const T* logits, const int32_t* targets, int64_t N, Cols k) {
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * k.cols;  // (cols)
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t v = 0; v < k.valid; ++v) m = std::max(m, x[v]);
    T s = 0;
    for (int64_t v = 0; v < k.valid; ++v) s += std::exp(x[v] - m);
    lse_part[n] = k.valid > 0 ? m + std::log(s) : m;
    const int64_t t = targets[n] == kIgnoreIndex ? -1 : k.local(targets[n]);
    target_logit[n] = t >= 0 ? x[t] : T(0);
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

void backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets, int64_t N, Cols k,
              float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * k.cols;  // (cols)
    float* d = dlogits + n * k.cols;       // (cols), possibly x itself
    if (targets[n] == kIgnoreIndex) {
#pragma omp simd
      for (int64_t v = 0; v < k.cols; ++v) d[v] = 0.0f;
      continue;
    }
    float l = lse[n];
#pragma omp simd
    for (int64_t v = 0; v < k.valid; ++v) d[v] = scale * cpu::exp_polynomial(x[v] - l);
    for (int64_t v = k.valid; v < k.cols; ++v) d[v] = 0.0f;
    const int64_t t = k.local(targets[n]);
    if (t >= 0) d[t] -= scale;
  }
}

void shard_forward(float* lse_part, float* target_logit, const float* logits, const int32_t* targets, int64_t N,
                   Cols k) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * k.cols;  // (cols)
    lse_part[n] = k.valid > 0 ? float(row_logsumexp(x, k.valid)) : -std::numeric_limits<float>::infinity();
    const int64_t t = targets[n] == kIgnoreIndex ? -1 : k.local(targets[n]);
    target_logit[n] = t >= 0 ? x[t] : 0.0f;
  }
}
}  // namespace simd

// Every target in [0, V) or kIgnoreIndex: a check of the values, so the backend's (the front
// checked the shapes). The error names the first bad row and value.
void check_target_ids(const char* op, const Tensor& targets, int64_t V) {
  const int32_t* t = targets.ptr<int32_t>();
  for (int64_t n = 0; n < targets.numel(); ++n)
    TESSERA_CHECK(t[n] == kIgnoreIndex || (t[n] >= 0 && t[n] < V), op, ": target ", t[n], " at row ", n,
                  " is outside [0, ", V, ") and is not the ignore index ", kIgnoreIndex);
}

// The columns of checked logits (N, cols) under a shard; checks the targets against its vocabulary.
Cols shard_columns(const char* op, const Tensor& logits, const Tensor& targets, const VocabShard& shard) {
  const int64_t cols = logits.dim(-1);
  const VocabShard s = shard.resolved(cols);
  check_target_ids(op, targets, s.vocab);
  return {cols, s.valid, s.start};
}

template <typename T>
void combine(T* losses, T* lse, const T* parts, const T* target_logit, const int32_t* targets, int64_t R, int64_t N) {
  for (int64_t n = 0; n < N; ++n) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t r = 0; r < R; ++r) m = std::max(m, double(parts[r * N + n]));
    double s = 0;
    for (int64_t r = 0; r < R; ++r) s += std::exp(double(parts[r * N + n]) - m);
    const double l = m + std::log(s);
    lse[n] = T(l);
    losses[n] = targets[n] == kIgnoreIndex ? T(0) : T(l - double(target_logit[n]));
  }
}

}  // namespace

void cpu::cross_entropy_forward(const Exec&, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                                const Tensor& targets) {
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  check_target_ids("cross_entropy_forward", targets, V);
  const int32_t* t = targets.ptr<int32_t>();
  if (logits.dtype == DType::F64)
    reference::forward(losses.ptr<double>(), lse.ptr<double>(), logits.ptr<double>(), t, N, V);
  else
    simd::forward(losses.ptr<float>(), lse.ptr<float>(), logits.ptr<float>(), t, N, V);
}

void cpu::cross_entropy_backward(const Exec&, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                 const Tensor& targets, double loss_scale, const VocabShard& shard) {
  const Cols k = shard_columns("cross_entropy_backward", logits, targets, shard);
  const int64_t N = logits.numel() / k.cols;
  const int32_t* t = targets.ptr<int32_t>();
  if (logits.dtype == DType::F64)
    reference::backward(dlogits.ptr<double>(), logits.ptr<double>(), lse.ptr<double>(), t, N, k, loss_scale);
  else
    simd::backward(dlogits.ptr<float>(), logits.ptr<float>(), lse.ptr<float>(), t, N, k, float(loss_scale));
}

void cpu::cross_entropy_shard_forward(const Exec&, const Tensor& lse_part, const Tensor& target_logit,
                                      const Tensor& logits, const Tensor& targets, const VocabShard& shard) {
  const Cols k = shard_columns("cross_entropy_shard_forward", logits, targets, shard);
  const int64_t N = logits.numel() / k.cols;
  const int32_t* t = targets.ptr<int32_t>();
  if (logits.dtype == DType::F64)
    reference::shard_forward(lse_part.ptr<double>(), target_logit.ptr<double>(), logits.ptr<double>(), t, N, k);
  else
    simd::shard_forward(lse_part.ptr<float>(), target_logit.ptr<float>(), logits.ptr<float>(), t, N, k);
}

void cpu::cross_entropy_combine(const Exec&, const Tensor& losses, const Tensor& lse, const Tensor& lse_parts,
                                const Tensor& target_logit, const Tensor& targets) {
  const int64_t N = losses.numel(), R = lse_parts.dim(0);
  const int32_t* t = targets.ptr<int32_t>();
  if (losses.dtype == DType::F64)
    combine(losses.ptr<double>(), lse.ptr<double>(), lse_parts.ptr<double>(), target_logit.ptr<double>(), t, R, N);
  else
    combine(losses.ptr<float>(), lse.ptr<float>(), lse_parts.ptr<float>(), target_logit.ptr<float>(), t, R, N);
}

}  // namespace tessera
