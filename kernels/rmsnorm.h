// RMSNorm over the last dimension (LLaMA): y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps).
#pragma once

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

// y (N, C), rstd (N) saved for backward, x (N, C), w (C). Leading dims flatten into N.
void rmsnorm_forward(const Exec& ex, const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps);

// dx (N, C) += ...   accumulated (residual stream, as layernorm_backward)
// dw (C) += ...      accumulated
void rmsnorm_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd);

}  // namespace tessera
