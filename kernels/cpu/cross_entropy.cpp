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

namespace {
// The columns of logits (N, cols) under a shard, checked; targets are checked against its vocab.
Cols shard_columns(const char* op, const Tensor& logits, const Tensor& targets, const VocabShard& shard,
                   int64_t& N) {
  const int64_t cols = cpu::check_rows(op, "logits", logits);
  N = logits.numel() / cols;
  const VocabShard s = shard.resolved(cols);
  TESSERA_CHECK(s.start >= 0 && s.valid >= 0 && s.valid <= cols && s.start + s.valid <= s.vocab, op,
                ": vocabulary shard [", s.start, ", ", s.start + s.valid, ") of ", s.vocab,
                " ids does not fit logits ", logits.shape.str());
  check_targets(op, targets, N, s.vocab);
  return {cols, s.valid, s.start};
}
}  // namespace

void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            double loss_scale, const VocabShard& shard) {
  const char* op = "cross_entropy_backward";
  int64_t N = 0;
  const Cols k = shard_columns(op, logits, targets, shard, N);
  cpu::check_like(op, "dlogits", dlogits, logits);
  cpu::check_numel(op, "lse", lse, logits.dtype, N);
  check_in_place(op, dlogits, logits);
  const int32_t* t = targets.ptr<int32_t>();
  if (logits.dtype == DType::F64)
    reference::backward(dlogits.ptr<double>(), logits.ptr<double>(), lse.ptr<double>(), t, N, k, loss_scale);
  else
    simd::backward(dlogits.ptr<float>(), logits.ptr<float>(), lse.ptr<float>(), t, N, k, float(loss_scale));
}

void cross_entropy_shard_forward(const Tensor& lse_part, const Tensor& target_logit, const Tensor& logits,
                                 const Tensor& targets, const VocabShard& shard) {
  const char* op = "cross_entropy_shard_forward";
  int64_t N = 0;
  const Cols k = shard_columns(op, logits, targets, shard, N);
  cpu::check_numel(op, "lse_part", lse_part, logits.dtype, N);
  cpu::check_numel(op, "target_logit", target_logit, logits.dtype, N);
  const int32_t* t = targets.ptr<int32_t>();
  if (logits.dtype == DType::F64)
    reference::shard_forward(lse_part.ptr<double>(), target_logit.ptr<double>(), logits.ptr<double>(), t, N, k);
  else
    simd::shard_forward(lse_part.ptr<float>(), target_logit.ptr<float>(), logits.ptr<float>(), t, N, k);
}

namespace {
template <typename T>
void combine(T* losses, T* lse, const T* parts, const T* target_logit, const int32_t* targets, int64_t R,
             int64_t N) {
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

void cross_entropy_combine(const Tensor& losses, const Tensor& lse, const Tensor& lse_parts,
                           const Tensor& target_logit, const Tensor& targets) {
  const char* op = "cross_entropy_combine";
  const int64_t N = losses.numel();
  cpu::check_float(op, "losses", losses);
  TESSERA_CHECK(lse_parts.ndim() == 2 && lse_parts.dim(1) == N, op, ": lse_parts ", lse_parts.shape.str(),
                " must be (ranks, ", N, ")");
  const int64_t R = lse_parts.dim(0);
  cpu::check_numel(op, "lse", lse, losses.dtype, N);
  cpu::check_numel(op, "lse_parts", lse_parts, losses.dtype, R * N);
  cpu::check_numel(op, "target_logit", target_logit, losses.dtype, N);
  cpu::check_numel(op, "targets", targets, DType::I32, N);
  const int32_t* t = targets.ptr<int32_t>();
  if (losses.dtype == DType::F64)
    combine(losses.ptr<double>(), lse.ptr<double>(), lse_parts.ptr<double>(), target_logit.ptr<double>(), t, R, N);
  else
    combine(losses.ptr<float>(), lse.ptr<float>(), lse_parts.ptr<float>(), target_logit.ptr<float>(), t, R, N);
}

}  // namespace tessera
