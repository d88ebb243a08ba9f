// FlatParams: a rank's flat parameter and gradient buffers as parallel/ sees them, ranges of
// elements with the facts gradient finalisation needs and no names or shapes (parallel/ knows no
// model: app/ builds this from model/'s ParameterStore).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/tensor.h"

namespace tessera {

// One parameter: where it lies in the flat buffers and how its gradient is finalised.
struct FlatParam {
  int64_t offset = 0, numel = 0;  // [offset, offset + numel) of the flat buffers, in elements
  // Split over tp on this layout (ParamEntry::sharded()): each tp rank's part counts in the norm.
  // Otherwise every tp rank holds it whole, and it counts on tp rank 0 only.
  bool tp_sharded = false;
  // Replicated over tp, but each tp rank computes only part of its gradient (ParamSpec::
  // sum_grad_over_tp: norms under sequence parallelism, KV heads shared by several ranks).
  bool tp_partial = false;
  // Held by the pipeline's first and last stage both (a tied embedding): its gradient is summed
  // over the embedding group, and it counts in the norm on the first stage only. None with pp = 1.
  bool embedding_group = false;
};

struct FlatParams {
  Tensor params, grads;                // (N), the parameters in `entries` order
  Tensor padded_params, padded_grads;  // (P >= N): the same buffers with their zero tail (ZeRO-1's padding)
  std::vector<FlatParam> entries;      // in buffer order, tiling [0, N)
  // (N) BF16: mixed precision's copy of params for the GEMMs, or undefined. A replicated optimizer
  // rounds its update into it (DataParallelOptimizer::refreshes_compute_copy).
  Tensor compute;
  int64_t numel() const { return params.numel(); }
  int size() const { return static_cast<int>(entries.size()); }
};

}  // namespace tessera
