// Pipeline schedule generators: (pp, vpp, micro-batches, kind) -> every rank's ordered action list
// (parallel/schedule.h), for GPipe, 1F1B, Megatron-LM's interleaved 1F1B and zero-bubble ZB-H1.
// Each generator orders a rank's computations by its phases (warm-up, steady 1F1B, cool-down); the
// sends and receives between neighbouring ranks are then placed by one rule for all of them
// (docs/parallel.md, "Pipeline schedules").
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "parallel/schedule.h"

namespace tessera {

// parallel.pp_schedule.
enum class PipelineKind : uint8_t {
  GPipe,         // "gpipe": every forward, then every backward; m micro-batches' activations alive
  OneFOneB,      // "1f1b" (the default): warm-up forwards, then one forward one backward
  Interleaved,   // "interleaved": 1F1B over vpp model chunks per rank (virtual stages)
  ZeroBubbleH1,  // "zb-h1": 1F1B with each backward split into B (input gradient) and W (weight
                 // gradient), the W deferred into the cool-down's bubble; 1F1B's peak memory
};

// The config spelling: "gpipe", "1f1b", "interleaved", "zb-h1".
std::string_view pipeline_kind_name(PipelineKind kind);
// Throws tessera::Error naming parallel.pp_schedule and the accepted names.
PipelineKind parse_pipeline_kind(std::string_view name);

// Refuses parameters no schedule of this kind exists for, with an Error naming the keys
// (parallel.pp, parallel.vpp, parallel.pp_schedule, the micro-batches per step of train.global_batch)
// and the numbers:
// - pp, vpp and micro-batches at least 1;
// - vpp > 1 only with "interleaved", which needs pp >= 2, vpp >= 2 and micro-batches a multiple of
//   pp (Megatron-LM's interleaved schedule runs micro-batches in groups of pp per chunk);
// - "1f1b" and "zb-h1" need at least pp micro-batches (fewer never reach the steady phase: the
//   pipeline idles more than half the step; "gpipe" accepts any number).
void check_pipeline_schedule(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind);

// Every rank's actions for one step (checked by check_pipeline_schedule first). With pp = 1,
// "1f1b" is one_stage_schedule (F0 B0 F1 B1 ...).
// bubble_recompute (model.recompute = "bubble"): every backward B(m, c) gets its own recomputation
// R(m, c), which re-creates the chunk's block contexts of the micro-batch and keeps them until B.
// R reads nothing received, so it can run while the rank would otherwise wait for a tensor; the
// receive of the tensor is posted before the R's right before its reader. Nothing but R moves (the
// computations without R are the plain schedule's, in its order). Where R goes, decided in the
// ideal timeline of the unit costs the schedules are designed for (a forward, R, B and W 1 each, a
// whole backward 2; transfers free):
// - recompute_ahead = 1: right before its B, so R fills the wait for B's gradient when there is
//   one, and at most one recomputed micro-batch is held at a time;
// - recompute_ahead = K >= 2 (model.recompute_ahead): the R's go in the order of their backwards;
//   the next one runs at the earliest point where the rank would otherwise wait (before a forward
//   or a backward whose input has not arrived), for as long as a whole R fits in the wait, its
//   forward has run and fewer than K recomputed micro-batches are held; an R not placed so runs
//   right before its B. So at most K are held at a time (each: its chunk's block contexts, from R
//   to B; the memory estimate walks R, docs/parallel.md "Recomputation").
// recompute_ahead < 1 is refused, naming model.recompute_ahead.
Schedule pipeline_schedule(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind,
                           bool bubble_recompute = false, int64_t recompute_ahead = 1);

// The times the R placement above (recompute_ahead >= 2) walks the ranks' orders by, in place of
// the unit timeline: duration(rank, a, split) is how long rank's computation a takes (split: a
// backward whose W is its own action, so the backward is B alone), and a received tensor arrives
// `latency` after its producer ends. pipeline_sim.h's bubble_schedule_for_costs builds them from the
// simulator's costs. An empty duration is the unit one.
struct PlacementCosts {
  std::function<double(int64_t rank, const Action& a, bool split)> duration;
  double latency = 0;
};
// pipeline_schedule with R placed in the waits of the timeline these costs give (the rest as above:
// the transfers are still placed by the unit timeline).
Schedule pipeline_schedule(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind, bool bubble_recompute,
                           int64_t recompute_ahead, const PlacementCosts& costs);

}  // namespace tessera
