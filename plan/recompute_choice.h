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
//
// With per-op recomputation (model/recompute_ops.h) a block has more choices than keep or recompute
// in full: each op set frees its own bytes for its own forward work, and which sets are worth it
// depends on the budget. That is Galvatron's programme proper: over a chunk's blocks one at a
// time, each given one of the options (keep, an op set, full), keeping for every reachable total
// of freed bytes the least recomputation time (recompute_frontier). Its Pareto frontier, ordered
// by time, is ordered by bytes freed too, so the fastest mix that fits is again found by bisection
// over the frontier (least_recompute_layers over its indices), each step one exact memory estimate.
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

// One choice for a block: the time its recomputation adds to a micro-batch (seconds) and the bytes
// of its kept context it frees (its additive part: model/memory.h recompute_ops_cost bytes_saved for
// an op set, the whole context for full recomputation).
struct BlockOption {
  double seconds = 0;
  double saved = 0;
};
// How a chunk's blocks divide among the options: counts[o] blocks take option o.
struct RecomputeMix {
  std::vector<int64_t> counts;
  double seconds = 0;  // the sum of the blocks' options' seconds
  double saved = 0;    // and of their bytes freed
};
// The Pareto frontier of the mixes of `blocks` blocks over `options` by (seconds, saved): every mix
// that no other beats in both (least seconds first; at equal seconds the most saved; of equal mixes
// one). A dynamic programme over the blocks: after i blocks, the frontier of i-block mixes, each
// extended by every option (each option's shifted copy of a sorted frontier is sorted: merged, not
// sorted again), then pruned; each point keeps where it came from, so the counts are read back
// at the end. O(blocks x frontier x options^2). Strictly increasing in both seconds and saved;
// options[] with seconds or saved < 0 are an Error.
std::vector<RecomputeMix> recompute_frontier(const std::vector<BlockOption>& options, int64_t blocks);

}  // namespace tessera::plan
