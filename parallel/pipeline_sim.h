// A pipeline schedule simulator (no MPI): runs every rank's action list together with per-action
// costs, as run_schedule would run them (p2p batches posted in order, waited where the executor
// waits), and reports deadlock, per-rank busy and idle time, the bubble and the activations alive.
// Schedule tests and the timeline pictures of docs/parallel.md come from it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/pipeline_schedule.h"
#include "parallel/schedule.h"

namespace tessera {

// When a rank waits for a p2p batch it posted.
enum class P2pWait : uint8_t {
  AtUse,   // before the first computation that reads what it received, and at the end of the step
           // (what run_schedule does)
  AtPost,  // at once, as a blocking batch_send_recv would: a stricter test of deadlock freedom
};

// One model chunk's times for one micro-batch: forward, input gradient (B), weight gradient (W).
struct ChunkCost {
  double forward = 0, backward = 0, weight = 0;
  double recompute = -1;  // an R action's time (the recomputed forward); < 0: forward's
};

struct SimOptions {
  // A stage's times for one micro-batch (all of its chunks: a chunk's action takes 1/vpp of them):
  // forward, input gradient (B) and weight gradient (W). A whole backward takes backward + weight.
  double forward = 1, backward = 1, weight = 1;
  // Unequal stages (the planner's costs: the embedding, the head, a stage with one block more):
  // when not empty, pp x vpp entries by virtual stage (chunk c of rank r is virtual stage c pp + r),
  // each the chunk's own times, replacing forward, backward and weight above.
  std::vector<ChunkCost> chunks = {};
  // Every chunk recomputes fully (model.recompute = "full" or "bubble"): a Backward whose
  // Recompute the schedule does not hold re-runs the forward inside, costing `forward` more; an R
  // costs `forward` (it always does, whatever this says).
  bool full_recompute = false;
  double latency = 0;  // a message arrives this long after both of its ends are posted
  P2pWait wait = P2pWait::AtUse;
};

struct SimSpan {  // one computation of one rank
  int64_t rank = 0;
  Action action;
  double start = 0, end = 0;
};

struct SimRank {
  double busy = 0;    // computing
  double idle = 0;    // the step's makespan minus busy
  double finish = 0;  // when its last action or wait ends
  // The most (micro-batch, chunk) activations alive at once: from a forward to its backward (to its
  // W when the backward is split). A chunk's activations are 1/vpp of a stage's.
  int64_t peak_in_flight = 0;
  // The most recomputed micro-batches (chunks) held at once: from an R to its backward.
  int64_t peak_recomputed = 0;
};

struct SimResult {
  bool deadlock = false;
  std::vector<std::string> stuck;  // deadlock: per blocked rank, where it waits and for what
  double makespan = 0;             // the step: the latest finish
  double bubble_fraction = 0;      // idle / (ranks x makespan)
  std::vector<SimRank> ranks;
  std::vector<SimSpan> spans;  // every computation, per rank in order
};

// Runs the schedule. Sends and receives between two ranks match in posting order (as MPI with one
// tag, and NCCL); a transfer completes `latency` after both ends are posted, and a batch when all
// of its transfers have (sends too: the conservative rendezvous protocol). Throws tessera::Error
// when a rank's list fails run_schedule's checks, or a receive would get another message than the
// one it names.
SimResult simulate(const Schedule& schedule, const SimOptions& options = {});

// model.recompute = "bubble" with R placed by real costs (options: every chunk recomputes, options'
// durations and latency) rather than the generator's unit timeline: the candidates are the
// generator's placement for recompute_ahead walked with these costs (PlacementCosts), the same with
// unit costs, and every R right before its B (recompute_ahead = 1); each is simulated under options
// (full_recompute set) and the shortest step wins, ties going to the one holding fewer recomputed
// micro-batches (so recompute_ahead = 1 on a tie); a candidate that deadlocks, waiting where
// run_schedule waits or at every post (its receives are placed by the unit timeline), is dropped.
// So the step is never longer than with each R
// right before its B, by the simulator. pp, vpp, micro_batches, kind and recompute_ahead as
// pipeline_schedule (parallel/pipeline_schedule.h) takes them.
Schedule bubble_schedule_for_costs(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind,
                                   int64_t recompute_ahead, const SimOptions& options);

// The result as JSON for scripts/pipeline_timeline.py: name, sizes, costs, the recomputation
// ("none", "full" or "bubble"), per-rank numbers and
// every computation's span.
std::string timeline_json(const Schedule& schedule, const SimResult& result, std::string_view name,
                          const SimOptions& options);

}  // namespace tessera
