// AdamW over flat buffers, exactly as PyTorch's torch.optim.AdamW (decoupled weight decay).
#pragma once

#include <cstdint>

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

struct AdamWStep {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;          // 1-based step count, for bias correction
  double grad_scale = 1.0;   // gradients are multiplied by this first (clipping, loss scaling)
};

// For every i, with g = grad_scale * grads[i]:
//   p *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   p -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// params, grads, m, v: (N) same dtype (F32 or F64).
// compute: optional (N) BF16, on the same device, F32 params only: receives the updated params
// rounded to bf16 (round to nearest even, as convert does) in the same pass: mixed precision's copy
// of the weights for the GEMMs, refreshed without a second pass over the masters.
void adamw_update(const Exec& ex, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const AdamWStep& s, const Tensor& compute = Tensor());

}  // namespace tessera
