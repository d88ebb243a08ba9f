// SwiGLU gate (LLaMA MLP): y = silu(gate) * up, silu(g) = g * sigmoid(g). Gate and up are separate
// tensors (separate projections), so a tensor-parallel shard of each stays paired.
#pragma once

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

// y, gate, up: (N, H) any shape, same numel.
void swiglu_forward(const Exec& ex, const Tensor& y, const Tensor& gate, const Tensor& up);
// dgate, dup written.
void swiglu_backward(const Exec& ex, const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                     const Tensor& up);

}  // namespace tessera
