// Fused softmax cross-entropy over the vocabulary. The backward writes the logits' gradient in
// place over the logits, so no second (N, V) buffer exists.
#pragma once

#include <cstdint>

#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "kernels/vocab_shard.h"

namespace tessera {

constexpr int32_t kIgnoreIndex = -1;

// logits (N, V), targets (N) I32 with kIgnoreIndex for positions that carry no loss.
// losses (N) = logsumexp(logits_n) - logits_n[target_n], 0 where ignored; lse (N) saved.
// A target outside [0, V) other than kIgnoreIndex is an Error.
void cross_entropy_forward(const Exec& ex, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets);

// dlogits (N, V) = loss_scale * (softmax(logits_n) - onehot(target_n)), 0 rows where ignored:
// the gradient of loss_scale * sum_n losses_n. dlogits may alias logits (in place).
// Vocabulary-parallel: with a shard, logits (N, Vl) are global columns [shard.start, shard.start +
// shard.valid) (padding columns after them get 0), lse is the global one (cross_entropy_combine)
// and targets are global ids in [0, shard.vocab).
void cross_entropy_backward(const Exec& ex, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, double loss_scale, const VocabShard& shard = {});

// ---- Vocabulary-parallel forward: the full logits are never gathered ----
// Each tensor-parallel rank computes, from its columns of the logits (as above):
//   lse_part (N)     = logsumexp over its valid columns (-inf when it holds none);
//   target_logit (N) = logits[n, target_n] when it holds target_n, else 0 (0 where ignored).
void cross_entropy_shard_forward(const Exec& ex, const Tensor& lse_part, const Tensor& target_logit,
                                 const Tensor& logits, const Tensor& targets, const VocabShard& shard);
// After the group all-gathers lse_parts (R, N) and sums target_logit (N) over its R ranks:
// lse (N) = log(sum_r exp(lse_parts[r, n])); losses (N) = lse - target_logit, 0 where ignored.
void cross_entropy_combine(const Exec& ex, const Tensor& losses, const Tensor& lse, const Tensor& lse_parts,
                           const Tensor& target_logit, const Tensor& targets);

}  // namespace tessera
