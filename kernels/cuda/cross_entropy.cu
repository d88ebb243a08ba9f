// CUDA fused softmax cross-entropy (kernels/cross_entropy.h): one block per row. Max-subtracted
// log-sum-exp with float exps summed in double, as the CPU's float path; the backward writes the
// gradient over the logits (each element read, then written, by one thread), so it runs in place.
#include <cmath>

#include "kernels/cross_entropy.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

// log(sum_v exp(x_v)) over x[0 .. V) of one row, to every thread of the block. V > 0.
__device__ double row_logsumexp(const float* x, int64_t V, float* fshared, double* dshared) {
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
  m = block_max(m, fshared);
  double s = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += double(expf(x[v] - m));
  s = block_sum(s, dshared);
  return double(m) + log(s);
}

// Block n: lse[n], losses[n] = lse - x[target] (0 where ignored).
__global__ void cross_entropy_forward_kernel(float* losses, float* lse, const float* logits, const int32_t* targets,
                                             int64_t V) {
  __shared__ float fshared[32];
  __shared__ double dshared[32];
  const int64_t n = blockIdx.x;
  const float* x = logits + n * V;  // (V)
  const double l = row_logsumexp(x, V, fshared, dshared);
  if (threadIdx.x == 0) {
    lse[n] = float(l);
    // Formed in double before rounding: lse and x[t] may be large and nearly equal.
    losses[n] = targets[n] == kIgnoreIndex ? 0.0f : float(l - double(x[targets[n]]));
  }
}

// Block n: d[n, v] = scale (exp(x - lse) - onehot(target)) over the valid columns, 0 on padding
// columns and on ignored rows. The target's column belongs to the thread that writes it.
__global__ void cross_entropy_backward_kernel(float* dlogits, const float* logits, const float* lse,
                                              const int32_t* targets, int64_t cols, int64_t valid, int64_t start,
                                              float scale) {
  const int64_t n = blockIdx.x;
  const float* x = logits + n * cols;
  float* d = dlogits + n * cols;  // possibly x itself
  const int32_t target = targets[n];
  const bool ignored = target == kIgnoreIndex;
  const int64_t t = ignored ? -1 : int64_t(target) - start;  // local column, or outside [0, valid)
  const float l = lse[n];
  for (int64_t v = threadIdx.x; v < cols; v += blockDim.x) {
    float g = 0.0f;
    if (!ignored && v < valid) {
      g = scale * expf(x[v] - l);
      if (v == t) g -= scale;
    }
    d[v] = g;
  }
}

// Block n: the log-sum-exp of this shard's valid columns (-inf with none) and the target's logit
// when this shard holds it (else 0; 0 where ignored).
__global__ void cross_entropy_shard_kernel(float* lse_part, float* target_logit, const float* logits,
                                           const int32_t* targets, int64_t cols, int64_t valid, int64_t start) {
  __shared__ float fshared[32];
  __shared__ double dshared[32];
  const int64_t n = blockIdx.x;
  const float* x = logits + n * cols;
  const double l = valid > 0 ? row_logsumexp(x, valid, fshared, dshared) : -INFINITY;
  if (threadIdx.x == 0) {
    lse_part[n] = float(l);
    const int32_t target = targets[n];
    const int64_t t = target == kIgnoreIndex ? -1 : int64_t(target) - start;
    target_logit[n] = t >= 0 && t < valid ? x[t] : 0.0f;
  }
}

// One thread per row n: lse = log(sum_r exp(parts[r, n])) in double; losses = lse - target_logit.
__global__ void cross_entropy_combine_kernel(float* losses, float* lse, const float* parts, const float* target_logit,
                                             const int32_t* targets, int64_t R, int64_t N) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  double m = -INFINITY;
  for (int64_t r = 0; r < R; ++r) m = fmax(m, double(parts[r * N + n]));
  double s = 0;
  for (int64_t r = 0; r < R; ++r) s += exp(double(parts[r * N + n]) - m);
  const double l = m + log(s);
  lse[n] = float(l);
  losses[n] = targets[n] == kIgnoreIndex ? 0.0f : float(l - double(target_logit[n]));
}

// Every target in [0, V) or kIgnoreIndex, or an Error as the CPU backend's.
void check_target_ids(const char* op, const Exec& ex, const Tensor& targets, int64_t V) {
  const BadId bad = first_bad_id(op, ex, targets, V, true, kIgnoreIndex);
  TESSERA_CHECK(bad.index < 0, op, ": target ", bad.value, " at row ", bad.index, " is outside [0, ", V,
                ") and is not the ignore index ", kIgnoreIndex);
}

unsigned rows_grid(int64_t N) { return static_cast<unsigned>(N); }

}  // namespace

void cross_entropy_forward(const Exec& ex, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets) {
  const char* op = "cross_entropy_forward";
  require_f32(op, logits);
  use_device(op, ex);
  const int64_t V = logits.dim(-1), N = logits.numel() / V;
  check_target_ids(op, ex, targets, V);
  if (N == 0) return;
  cross_entropy_forward_kernel<<<rows_grid(N), kThreads, 0, stream_of(ex)>>>(
      losses.ptr<float>(), lse.ptr<float>(), logits.ptr<float>(), targets.ptr<int32_t>(), V);
  check_launch(op);
}

void cross_entropy_backward(const Exec& ex, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, double loss_scale, const VocabShard& shard) {
  const char* op = "cross_entropy_backward";
  require_f32(op, logits);
  use_device(op, ex);
  const int64_t cols = logits.dim(-1), N = logits.numel() / cols;
  const VocabShard s = shard.resolved(cols);
  check_target_ids(op, ex, targets, s.vocab);
  if (N == 0) return;
  cross_entropy_backward_kernel<<<rows_grid(N), kThreads, 0, stream_of(ex)>>>(
      dlogits.ptr<float>(), logits.ptr<float>(), lse.ptr<float>(), targets.ptr<int32_t>(), cols, s.valid, s.start,
      static_cast<float>(loss_scale));
  check_launch(op);
}

void cross_entropy_shard_forward(const Exec& ex, const Tensor& lse_part, const Tensor& target_logit,
                                 const Tensor& logits, const Tensor& targets, const VocabShard& shard) {
  const char* op = "cross_entropy_shard_forward";
  require_f32(op, logits);
  use_device(op, ex);
  const int64_t cols = logits.dim(-1), N = logits.numel() / cols;
  const VocabShard s = shard.resolved(cols);
  check_target_ids(op, ex, targets, s.vocab);
  if (N == 0) return;
  cross_entropy_shard_kernel<<<rows_grid(N), kThreads, 0, stream_of(ex)>>>(
      lse_part.ptr<float>(), target_logit.ptr<float>(), logits.ptr<float>(), targets.ptr<int32_t>(), cols, s.valid,
      s.start);
  check_launch(op);
}

void cross_entropy_combine(const Exec& ex, const Tensor& losses, const Tensor& lse, const Tensor& lse_parts,
                           const Tensor& target_logit, const Tensor& targets) {
  const char* op = "cross_entropy_combine";
  require_f32(op, losses);
  use_device(op, ex);
  const int64_t N = losses.numel(), R = lse_parts.dim(0);
  if (N == 0) return;
  cross_entropy_combine_kernel<<<static_cast<unsigned>((N + kThreads - 1) / kThreads), kThreads, 0,
                                 stream_of(ex)>>>(losses.ptr<float>(), lse.ptr<float>(), lse_parts.ptr<float>(),
                                                  target_logit.ptr<float>(), targets.ptr<int32_t>(), R, N);
  check_launch(op);
}

}  // namespace tessera::cuda
