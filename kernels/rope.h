// Rotary position embedding, "rotate half" convention (as Hugging Face LLaMA): for i < D/2,
//   f_i = theta^(-2i/D), a = (pos_offset + t) * f_i,
//   y[i] = x[i] cos a - x[i + D/2] sin a,   y[i + D/2] = x[i + D/2] cos a + x[i] sin a.
// pos_offset lets a chunk of a longer sequence (context parallel) get its true positions.
#pragma once

#include <cstdint>

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

// y, x: (B, T, H, D), D even. y may alias x (in place).
void rope_forward(const Exec& ex, const Tensor& y, const Tensor& x, int64_t pos_offset, double theta);
// dx = rotation by -a of dy (the transpose). dx may alias dy. Written.
void rope_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, int64_t pos_offset, double theta);

}  // namespace tessera
