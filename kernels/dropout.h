// Dropout with a mask that is a pure function of where an element sits, not of what ran before:
// y = x * keep / (1 - p), keep = 0 with probability p, drawn by the counter-based Philox generator
// (kernels/philox.h) from the element's coordinates (docs/finetuning.md, "Adapter dropout"). So
// every parallel layout, a resumed run and a backward that recomputes the mask instead of storing
// it all draw the same mask: a rank holding some rows and columns of a tensor draws exactly
// those. Used by LoRA's adapter dropout (model/lora.h).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/exec.h"
#include "kernels/philox.h"
#include "kernels/tensor.h"

namespace tessera {

// Where a (N, C_local) tensor's elements sit: row n is position positions[n % T] of the sequence
// sample0 + n / T (T = positions.size(), N a multiple of T), column c the feature feature0 + c; the
// stream (key) names the tensor (a seed and a layer), `step` the optimizer step.
struct DropoutCoords {
  philox::Key key{};
  uint64_t step = 0;
  int64_t sample0 = 0;
  std::vector<int64_t> positions;  // (T) global positions of a sequence's local rows
  int64_t feature0 = 0;
};

// Whether the element at (step, sample, position, feature) of the stream key is kept under
// dropout probability p, 0 <= p < 1: Philox4x32-10 of the counter (feature / 4, position, sample,
// step) under key, word feature % 4, as a fraction of 2^32, is >= p. Each coordinate must fit 32
// bits (feature / 4 does up to 2^34 features); an Error names the one that does not.
bool dropout_keep(philox::Key key, uint64_t step, int64_t sample, int64_t position, int64_t feature, double p);

// y = x * keep * (1 / (1 - p)) over x (N, C_local) at coords (y may alias x). F32 or F64; CPU only (the
// CUDA backend has no dropout kernel: the error names the op).
void dropout_forward(const Exec& ex, const Tensor& y, const Tensor& x, double p, const DropoutCoords& coords);
// dx = dy * keep / (1 - p): the same mask, recomputed (dx may alias dy).
void dropout_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, double p, const DropoutCoords& coords);

}  // namespace tessera
