// Cross-entropy's front: the argument checks, then the backend of the tensors' device
// (kernels/front.h). The target ids themselves are checked by the backend, which reads them.
#include "kernels/cross_entropy.h"

#include <cstdint>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {
namespace {

// In place means the same buffer: a partial overlap would read logits already overwritten.
void check_in_place(const char* op, const Tensor& dlogits, const Tensor& logits) {
  auto a = reinterpret_cast<uintptr_t>(dlogits.data), b = reinterpret_cast<uintptr_t>(logits.data);
  bool overlap = a < b + logits.nbytes() && b < a + dlogits.nbytes();
  TESSERA_CHECK(a == b || !overlap, op, ": dlogits partially overlaps logits (in place needs the same buffer)");
}

// logits (N, cols) under a shard and targets (N) I32; returns N.
int64_t check_shard_logits(const char* op, const Tensor& logits, const Tensor& targets, const VocabShard& shard) {
  const int64_t cols = front::check_rows(op, "logits", logits), N = logits.numel() / cols;
  const VocabShard s = shard.resolved(cols);
  TESSERA_CHECK(s.start >= 0 && s.valid >= 0 && s.valid <= cols && s.start + s.valid <= s.vocab, op,
                ": vocabulary shard [", s.start, ", ", s.start + s.valid, ") of ", s.vocab, " ids does not fit logits ",
                logits.shape.str());
  front::check_numel(op, "targets", targets, DType::I32, N);
  return N;
}

}  // namespace

void cross_entropy_forward(const Exec& ex, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets) {
  const char* op = "cross_entropy_forward";
  const Device d =
      front::device_of(op, ex, {{"losses", losses}, {"lse", lse}, {"logits", logits}, {"targets", targets}});
  int64_t V = front::check_rows(op, "logits", logits), N = logits.numel() / V;
  front::check_numel(op, "losses", losses, logits.dtype, N);
  front::check_numel(op, "lse", lse, logits.dtype, N);
  front::check_numel(op, "targets", targets, DType::I32, N);
  if (d.is_cpu()) return cpu::cross_entropy_forward(ex, losses, lse, logits, targets);
  TESSERA_CUDA_CALL(op, cuda::cross_entropy_forward(ex, losses, lse, logits, targets));
}

void cross_entropy_backward(const Exec& ex, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, double loss_scale, const VocabShard& shard) {
  const char* op = "cross_entropy_backward";
  const Device d =
      front::device_of(op, ex, {{"dlogits", dlogits}, {"logits", logits}, {"lse", lse}, {"targets", targets}});
  const int64_t N = check_shard_logits(op, logits, targets, shard);
  front::check_like(op, "dlogits", dlogits, logits);
  front::check_numel(op, "lse", lse, logits.dtype, N);
  check_in_place(op, dlogits, logits);
  if (d.is_cpu()) return cpu::cross_entropy_backward(ex, dlogits, logits, lse, targets, loss_scale, shard);
  TESSERA_CUDA_CALL(op, cuda::cross_entropy_backward(ex, dlogits, logits, lse, targets, loss_scale, shard));
}

void cross_entropy_shard_forward(const Exec& ex, const Tensor& lse_part, const Tensor& target_logit,
                                 const Tensor& logits, const Tensor& targets, const VocabShard& shard) {
  const char* op = "cross_entropy_shard_forward";
  const Device d = front::device_of(
      op, ex, {{"lse_part", lse_part}, {"target_logit", target_logit}, {"logits", logits}, {"targets", targets}});
  const int64_t N = check_shard_logits(op, logits, targets, shard);
  front::check_numel(op, "lse_part", lse_part, logits.dtype, N);
  front::check_numel(op, "target_logit", target_logit, logits.dtype, N);
  if (d.is_cpu()) return cpu::cross_entropy_shard_forward(ex, lse_part, target_logit, logits, targets, shard);
  TESSERA_CUDA_CALL(op, cuda::cross_entropy_shard_forward(ex, lse_part, target_logit, logits, targets, shard));
}

void cross_entropy_combine(const Exec& ex, const Tensor& losses, const Tensor& lse, const Tensor& lse_parts,
                           const Tensor& target_logit, const Tensor& targets) {
  const char* op = "cross_entropy_combine";
  const Device d = front::device_of(op, ex,
                                    {{"losses", losses}, {"lse", lse}, {"lse_parts", lse_parts},
                                     {"target_logit", target_logit}, {"targets", targets}});
  const int64_t N = losses.numel();
  front::check_float(op, "losses", losses);
  TESSERA_CHECK(lse_parts.ndim() == 2 && lse_parts.dim(1) == N, op, ": lse_parts ", lse_parts.shape.str(),
                " must be (ranks, ", N, ")");
  const int64_t R = lse_parts.dim(0);
  front::check_numel(op, "lse", lse, losses.dtype, N);
  front::check_numel(op, "lse_parts", lse_parts, losses.dtype, R * N);
  front::check_numel(op, "target_logit", target_logit, losses.dtype, N);
  front::check_numel(op, "targets", targets, DType::I32, N);
  if (d.is_cpu()) return cpu::cross_entropy_combine(ex, losses, lse, lse_parts, target_logit, targets);
  TESSERA_CUDA_CALL(op, cuda::cross_entropy_combine(ex, losses, lse, lse_parts, target_logit, targets));
}

}  // namespace tessera
