// Pipeline schedule generators: (pp, vpp, micro-batches, kind) -> every rank's ordered action list
// (parallel/schedule.h), for GPipe, 1F1B, Megatron-LM's interleaved 1F1B and zero-bubble ZB-H1.
// Each generator orders a rank's computations by its phases (warm-up, steady 1F1B, cool-down); the
// sends and receives between neighbouring ranks are then placed by one rule for all of them
// (docs/parallel.md, "Pipeline schedules").
#pragma once

#include <cstdint>
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
// bubble_recompute (model.recompute = "bubble"): every backward B(m, c) is preceded by its own
// recomputation R(m, c), and the receive of B's output gradient is posted before R. R reads
// nothing received, so it runs while the gradient is on its way: in the slot where the rank would
// otherwise wait for it (the bubble before a B whose input is not there yet; with no wait, R simply
// runs just before B, as full recomputation does inside B). Nothing else moves: R comes right
// before its B, so at most one recomputed micro-batch is held at a time (its chunk's block contexts
// live from R to B, where full recomputation holds one block's at a time inside B; the memory
// estimate walks R, docs/parallel.md "Recomputation").
Schedule pipeline_schedule(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind,
                           bool bubble_recompute = false);

}  // namespace tessera
