// The pipeline cut by measured time (parallel.pp_cut = "measured"): given each part's forward +
// backward seconds (each block, the embedding, the vision tower, the head), the cut into pp stages
// (each of vpp equal chunks of consecutive blocks under the interleaved schedule, as
// parallel.pp_layers cuts) whose slowest stage is fastest, among the cuts whose every stage fits in
// memory. Exact (dynamic programming over stage ends), not a heuristic; the timing pass that
// produces the seconds lives in app/pp_cut.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
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

// Each pipeline rank's time under a cut into chunks: chunk_blocks[c] blocks in chunk c, model order,
// chunk c on rank c % pp (model/stage_cut.h's layout; the embedding and vision tower on chunk 0, the
// head on the last chunk): the sum of its chunks' parts. Throws when the chunk count is not a
// multiple of pp or the counts do not sum to the number of blocks.
std::vector<double> rank_times(const PartTimes& t, const std::vector<int64_t>& chunk_blocks, int64_t pp);

// A cut in the parallel.pp_layers form as chunks: stage r's stage_blocks[r] blocks in vpp equal
// chunks, chunk v pp + r holding one (pp x vpp entries, model order; vpp = 1: stage_blocks). Throws
// when a count is not a multiple of vpp.
std::vector<int64_t> stage_chunks(const std::vector<int64_t>& stage_blocks, int64_t vpp);

// Each stage's time under a cut as parallel.pp_layers gives it: stage_blocks[r] blocks on stage r,
// split into vpp equal chunks, chunk v pp + r holding one (vpp = 1: stage r holds consecutive
// blocks, the embedding and vision tower on stage 0, the head on the last). rank_times of those
// chunks. Throws when a count is not a multiple of vpp or the counts do not sum to the blocks.
std::vector<double> stage_times(const PartTimes& t, const std::vector<int64_t>& stage_blocks, int64_t vpp = 1);

// Whether stage `stage` of the pipeline fits in memory holding `blocks` blocks (in vpp equal chunks:
// a stage's memory depends on its position and its chunks' block counts, the blocks of a model
// being identical in size).
using StageFits = std::function<bool(int64_t stage, int64_t blocks)>;

// The blocks per stage (pp entries summing to t.blocks.size(), each a multiple of vpp: the
// parallel.pp_layers form) that minimise the slowest stage's time (stage_times: with vpp > 1 a
// stage's time is the sum of its vpp chunks'), each stage fitting (`fits`; empty: no limit). Every
// chunk holds at least one block, except stage 0 when encoder_stage (vpp = 1 only: a
// vision-language model's stage may hold the vision tower, projector and embedding alone). Among
// the cuts with that slowest stage, the evenest: the least sum of squared stage times; among
// those, the one with the fewest blocks on the earlier stages (deterministic: the same times give
// the same cut). With vpp > 1, chunk v pp + r starts at block v L / vpp + (the blocks per chunk of
// stages 0..r-1), so stage r's time depends only on where its chunks start and end within one
// round of pp chunks (L / vpp blocks): the same dynamic programme as vpp = 1, over that round.
// Throws tessera::Error naming parallel.pp_cut when no cut fits, when pp x vpp exceeds n_layer, or
// when n_layer is not a multiple of vpp.
std::vector<int64_t> cut_by_time(const PartTimes& t, int64_t pp, bool encoder_stage, const StageFits& fits = {},
                                 int64_t vpp = 1);

// Which cut a run with parallel.pp_cut = "measured" runs: the measured cut (cut_by_time) only when it
// is predicted faster than the FLOPs rule's (model/stage_cut.h), both priced from the same measured
// parts. Predicted: each cut's step under the run's schedule, simulated, when both are known (> 0);
// else its slowest stage. Ties keep the FLOPs cut (the rule a run without timing reproduces). The
// FLOPs cut is kept only when its every stage fits the memory limit the measured cut respects
// (flops_unfit_stage: its first stage that does not; -1: every stage fits). The measured cut's
// equal-chunk form (vpp > 1) can lose to the FLOPs rule's unequal chunks: that is when this keeps
// the FLOPs cut.
struct CutChoice {
  bool flops = false;  // run the FLOPs rule's cut (else the measured cut)
  std::string why;     // the comparison, as the header prints it
};
CutChoice choose_cut(const std::vector<double>& measured_stages, double measured_step,
                     const std::vector<double>& flops_stages, double flops_step, int64_t flops_unfit_stage);

}  // namespace tessera
