// The pipeline cut by measured time (parallel.pp_cut = "measured"): given each part's forward +
// backward seconds (each block, the embedding, the vision tower, the head), the cut into pp stages
// of consecutive blocks whose slowest stage is fastest, among the cuts whose every stage fits in
// memory. Exact (dynamic programming over stage ends), not a heuristic; the timing pass that
// produces the seconds lives in app/pp_cut.h.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace tessera {

// Seconds of one micro-batch's forward and backward, per part of the model (the cut is found from
// these alone, so tests inject them).
struct PartTimes {
  double embedding = 0;        // token (and learned position) embedding, on stage 0
  double vision = 0;           // kind = "vlm": the vision tower and projector, on stage 0; 0 otherwise
  std::vector<double> blocks;  // block l's, model order (n_layer entries)
  double head = 0;             // final norm, LM head and loss, on the last stage
};

// Each stage's time under a cut: stage_blocks[r] blocks on stage r, in model order (the
// embedding and vision tower on stage 0, the head on the last). Throws when the counts do not sum
// to the number of blocks.
std::vector<double> stage_times(const PartTimes& t, const std::vector<int64_t>& stage_blocks);

// Whether stage `stage` of the pipeline fits in memory holding `blocks` blocks (a stage's memory
// depends on its position and its block count: the blocks of a model are identical in size).
using StageFits = std::function<bool(int64_t stage, int64_t blocks)>;

// The blocks per stage (pp entries summing to t.blocks.size()) that minimise the slowest stage's
// time, each stage fitting (`fits`; empty: no limit). Every stage holds at least one block, except
// stage 0 when encoder_stage (a vision-language model's stage may hold the vision tower, projector
// and embedding alone). Among the cuts with that slowest stage, the evenest: the least sum of
// squared stage times; among those, the one with the fewest blocks on the earlier stages
// (deterministic: the same times give the same cut). Throws tessera::Error naming parallel.pp_cut when no cut fits, or when pp is not
// in [1, n_layer].
std::vector<int64_t> cut_by_time(const PartTimes& t, int64_t pp, bool encoder_stage, const StageFits& fits = {});

}  // namespace tessera
