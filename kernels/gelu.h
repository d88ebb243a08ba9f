// GELU activation, tanh approximation as in GPT-2:
//   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// Elementwise over any shape. dtype F32 (OpenMP/SIMD path) or F64 (reference path).
#pragma once

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

// y, x: (N) any shape, same numel. y may alias x.
void gelu_forward(const Exec& ex, const Tensor& y, const Tensor& x);
// dx = dy * gelu'(x). dx may alias dy.
void gelu_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x);

}  // namespace tessera
