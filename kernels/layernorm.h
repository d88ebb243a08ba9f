// LayerNorm over the last dimension (GPT-2). Saves per-row mean and reciprocal std for backward.
#pragma once

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

// y (N, C) = (x - mean) * rstd * w (C) + b (C); mean (N), rstd (N) = 1/sqrt(var + eps), biased var.
// Leading dims of x/y flatten into N. b may be undefined (no bias).
void layernorm_forward(const Exec& ex, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& w, const Tensor& b, double eps);

// dx (N, C) += d/dx   accumulated: a norm's input is the residual stream, whose gradient already
//                     holds the skip path
// dw (C) += ..., db (C) += ...   accumulated; db skipped when undefined
void layernorm_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                        const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd);

}  // namespace tessera
