// Recomputation per layer: how many blocks of each pipeline chunk recompute their forward in full
// (model.recompute_layers = k: the first k blocks of every chunk; the rest follow model.recompute),
// chosen as the least recomputation that fits the memory budget.
//
// Galvatron chooses a strategy per layer by a dynamic programme over the layers under the memory
// budget. tessera's blocks are identical and the trainer takes one count per chunk, so that
// programme collapses to one number: each further block recomputed frees the same saved
// activations and adds the same forward, so memory never grows and time never shrinks with k, and
// the smallest k that fits is the fastest layout that fits. A bisection on k finds it exactly
// with log2(blocks) memory estimates (Search.RecomputeLayersEqualBruteForce checks it against every k).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/gpt.h"

namespace tessera::plan {

struct RecomputeChoice {
  int64_t layers = -1;      // the least k in [lo, hi] that fits; -1: none does
  int64_t estimates = 0;    // how many times fits() was asked
};

// The least k in [lo, hi] with fits(k), given that fits is monotone (false ... false true ... true).
RecomputeChoice least_recompute_layers(int64_t lo, int64_t hi, const std::function<bool(int64_t)>& fits);

// The most blocks any chunk of a stage cut holds (model/gpt.h StageSpec; end_layer -1: the model's
// end): model.recompute_layers at that value recomputes every block.
int64_t max_chunk_blocks(const std::vector<StageSpec>& cut, int64_t n_layer);

}  // namespace tessera::plan
