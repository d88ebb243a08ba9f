// The measured pipeline bubble: where a pipeline rank's step goes, timed on the host around
// run_schedule, and the ranks' numbers put together over the pipeline group.
//
// Per rank and step (host clock, std::chrono::steady_clock):
//   window  the whole run_schedule call: from its first action to its last wait
//   busy    inside the forward, backward, weight-gradient and recompute callbacks (the model's compute, with
//           any tensor-parallel collectives inside it)
//   wait    blocked in a wait on a p2p batch's handle (a receive not yet arrived, a send not yet
//           taken); a part of window - busy, which also holds posting the batches and the
//           executor's own bookkeeping
// Over the pipeline group (reduce_pipeline_times), per step on average:
//   makespan  the longest of the ranks' mean windows (the ranks start a step together: the step's
//             stop vote, a collective over every rank, comes just before run_schedule)
//   idle_r    makespan - busy_r
//   bubble    sum_r idle_r / (pp x makespan) = 1 - sum_r busy_r / (pp x makespan)
// which is the simulator's definition (parallel/pipeline_sim.h) on measured times, so it can be set
// against (p - 1) / (m + p - 1) for 1F1B at equal costs. Host time: with a stream backend the
// callbacks return before the device finishes, so busy would then count launches only.
#pragma once

#include <cstdint>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/schedule.h"

namespace tessera {

// One rank's times, summed over `steps` steps (seconds).
struct PipelineStepTimes {
  double window = 0, busy = 0, wait = 0;
  int64_t steps = 0;
};

// Times run_schedule for a rank, step after step; the totals are taken (and reset) at each record.
class PipelineTimer {
 public:
  // run_schedule(actions, callbacks) with the compute callbacks and the p2p handles' waits timed;
  // one step added to the totals.
  void run(const std::vector<Action>& actions, const PipelineCallbacks& callbacks);
  const PipelineStepTimes& totals() const { return totals_; }
  // The totals so far, which start again from zero.
  PipelineStepTimes take();

 private:
  PipelineStepTimes totals_;
};

// The pipeline group's times per step, every rank's (index = pipeline rank).
struct PipelineBubble {
  std::vector<double> busy, wait, idle;  // seconds per step, per rank
  double makespan = 0;                   // seconds per step
  double bubble_fraction = 0;            // sum idle / (ranks x makespan); 0 without steps
};

// Puts every rank's totals together: collective over `pp` (null: this rank alone), one small
// all-reduce. Every rank must pass the same number of steps.
PipelineBubble reduce_pipeline_times(const PipelineStepTimes& mine, Communicator* pp);

}  // namespace tessera
