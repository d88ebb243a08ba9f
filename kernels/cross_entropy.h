// Fused softmax cross-entropy over the vocabulary. The backward writes the logits' gradient in
// place over the logits, so no second (N, V) buffer exists.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace tessera {

constexpr int32_t kIgnoreIndex = -1;

// logits (N, V), targets (N) I32 with kIgnoreIndex for positions that carry no loss.
// losses (N) = logsumexp(logits_n) - logits_n[target_n], 0 where ignored; lse (N) saved.
// A target outside [0, V) other than kIgnoreIndex is an Error.
void cross_entropy_forward(const Tensor& losses, const Tensor& lse, const Tensor& logits, const Tensor& targets);

// dlogits (N, V) = loss_scale * (softmax(logits_n) - onehot(target_n)), 0 rows where ignored:
// the gradient of loss_scale * sum_n losses_n. dlogits may alias logits (in place).
void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                            double loss_scale);

}  // namespace tessera
