// The planner's cost model: one optimizer step of a layout on a cluster, in seconds, from the model's
// shapes. Compute per op from its FLOPs and bytes (a roofline: device peak x efficiency, memory
// bandwidth, a least time per op); every collective the trainer issues for the layout on the link
// its group's ranks use (alpha-beta, ring algorithms), exposed where the trainer blocks on it and
// overlapped where it does not; the pipeline's step from the simulator (parallel/pipeline_sim.h)
// running the schedule's real action lists with each chunk's costs; then the gradient reduction
// and the optimizer. Equations and their sources: docs/planning.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "model/gpt.h"
#include "parallel/schedule.h"

#include "plan/cluster.h"
#include "plan/layout.h"

namespace tessera::plan {

// ---- Collectives (ring algorithms over n ranks on one link; bytes = the whole buffer) ----------

// 2 (n - 1) (latency + bytes / (n bandwidth)): a reduce-scatter then an all-gather, each n - 1 steps.
double all_reduce_seconds(double bytes, int64_t n, const Link& link);
// (n - 1) (latency + bytes / (n bandwidth)); bytes: the gathered (or scattered) whole.
double all_gather_seconds(double bytes, int64_t n, const Link& link);
double reduce_scatter_seconds(double bytes, int64_t n, const Link& link);
// latency + bytes / bandwidth.
double p2p_seconds(double bytes, const Link& link);
// What one rank sends: 2 (n - 1) / n x bytes (all-reduce), (n - 1) / n x bytes (all-gather,
// reduce-scatter): the trainer's byte counters (parallel/communicator.h) count the same.
double all_reduce_bytes(double bytes, int64_t n);
double all_gather_bytes(double bytes, int64_t n);

// ---- Where each group's ranks are ---------------------------------------------------------

// The link each group of the layout uses: within a node when every group of that kind lies inside
// one node (ranks fill nodes of devices_per_node in order, tp fastest: parallel/process_grid.h),
// across nodes when any crosses.
struct GroupLinks {
  Link tp, cp, dp, pp, embedding;  // dp: the gradient-reduction group dp x cp
  bool tp_across = false, cp_across = false, dp_across = false, pp_across = false, embedding_across = false;
};
GroupLinks group_links(const Layout& l, const ClusterSpec& c);

// ---- The GEMMs of a step -------------------------------------------------------------------

// (m, k) x (k, n): one GEMM's shape.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  auto operator<=>(const GemmShape&) const = default;
};
// Every GEMM shape one micro-batch of the layout runs on a rank (a block's Linears forward, dX and dW,
// and the LM head's), each once: what `tessera plan --calibrate CONFIG` times.
std::vector<GemmShape> gemm_shapes(const Workload& w, const Layout& l);

// ---- One chunk, one micro-batch ------------------------------------------------------------

// Seconds one rank spends on one micro-batch of one model chunk (model/gpt.h StageSpec).
struct ChunkTime {
  double forward = 0;    // GEMMs, attention, elementwise ops of the forward
  double backward = 0;   // B: input gradients, attention and elementwise backward, recomputation
  double weight = 0;     // W: the linear layers' weight gradients
  double recompute = 0;  // the part of backward that recomputation adds
  double recompute_comm = 0;  // the part of tp_backward and cp_backward that full recomputation adds
  double tp_forward = 0, tp_backward = 0;  // tensor-parallel collectives (blocking: all exposed)
  double cp_forward = 0, cp_backward = 0;  // context-parallel transfers, the part attention does not hide
  double tp_bytes = 0, cp_bytes = 0;       // bytes this rank sends over each group
  double flops = 0;                        // FLOPs executed (recomputation included)
  // What the pipeline simulator takes (parallel/pipeline_sim.h ChunkCost).
  double f() const { return forward + tp_forward + cp_forward; }
  double b() const { return backward + tp_backward + cp_backward; }
  double w() const { return weight; }
};
ChunkTime chunk_time(const Workload& w, const Layout& l, const ClusterSpec& c, const GroupLinks& links,
                     const StageSpec& chunk);

// What one block's recomputation adds to one micro-batch's backward on a rank (B: its compute and
// the collectives it issues again), as chunk_time counts it: under the op set `ops` (the block
// otherwise keeping its context, model/recompute_ops.h), or in full (ops ignored). The layout's
// own recomputation is ignored. The per-block price the recomputation choice weighs
// (plan/recompute_choice.h).
double block_recompute_seconds(const Workload& w, const Layout& l, const ClusterSpec& c, const GroupLinks& links,
                               const RecomputeOps& ops, bool full);

// ---- One step ------------------------------------------------------------------------------

struct GroupTraffic {
  std::string group;      // "tp", "cp", "pp", "dp", "embedding"
  int64_t size = 1;       // ranks in the group
  bool across_nodes = false;
  double bytes = 0;       // sent per step by one rank (the busiest, or the average for pp)
  double seconds = 0;     // transfer time per step
  double exposed = 0;     // of it, on the step's critical path
};

struct StepCost {
  double step = 0;            // seconds per optimizer step
  double tokens_per_s = 0;
  double mfu = 0;             // model FLOPs (flops_per_token) per second / (ranks x peak)
  int64_t micro_batches = 0;  // per rank per step
  // The step on the pipeline's busiest rank, adding up to `step`:
  double compute = 0;     // forward and backward compute, recomputation left out
  double recompute = 0;   // recomputation's extra compute
  double tp_exposed = 0;  // tensor-parallel collectives (all blocking) and the tp-partial gradient sum
  double cp_exposed = 0;  // context-parallel transfers not hidden behind attention
  double bubble = 0;      // the pipeline's idle time on that rank (the schedule's bubble and p2p waits)
  double dp_exposed = 0;  // the gradient reduction (and ZeRO-1's all-gather) not hidden behind backward
  double embedding_exposed = 0;  // the tied embedding's gradient sum over the first and last stage
  double optimizer = 0;   // AdamW, the gradient norm (and the bf16 copy)
  double bubble_fraction = 0;    // the simulator's idle / (pp x makespan); 0 without pp
  double parameters = 0;         // elements on the pipeline rank that holds the most
  std::vector<GroupTraffic> groups;
};

// What the search computes once and predict_step reads many times: pipeline schedules by (pp, vpp,
// micro-batches, kind, bubble recomputation, recompute_ahead) (parallel/pipeline_schedule.h), the
// stage cut with each pipeline rank's parameter count by (tp, sequence parallel, pp, vpp) for one
// workload, and the simulated pipeline by everything the simulator reads (the schedule, every
// chunk's costs, the message latency): layouts the pipeline cannot tell apart (ZeRO-1 or not, the
// same layout costed again) simulate once.
class CostCache {
 public:
  using Schedules = std::map<std::tuple<int64_t, int64_t, int64_t, int, bool, int64_t>, Schedule>;
  CostCache() = default;
  // With the schedules another holder keeps (the trainer's memory estimates of the same search:
  // app/plan_command.h trainer_checks), each generated once for both.
  explicit CostCache(std::shared_ptr<Schedules> schedules) : schedules_(std::move(schedules)) {}
  const std::shared_ptr<Schedules>& schedules() const { return schedules_; }
  const Schedule& schedule(int64_t pp, int64_t vpp, int64_t micro_batches, PipelineKind kind, bool bubble = false,
                           int64_t ahead = 1);
  struct Stages {
    std::vector<StageSpec> cut;      // cut_stages (the whole model when pp = 1)
    std::vector<double> parameters;  // per pipeline rank: its chunks' parameters (elements)
  };
  const Stages& stages(const Workload& w, const Layout& l);
  // The simulated (extrapolated) makespan and whether it deadlocks, by the simulation's inputs.
  struct Simulated {
    double makespan = 0;
    bool deadlock = false;
  };
  using SimKey = std::tuple<int64_t, int64_t, int64_t, int, bool, int64_t, double, std::vector<double>>;
  std::map<SimKey, Simulated>& simulated() { return simulated_; }
  // Off: every call computes afresh (the tests compare the search with and without the cache).
  bool memoise = true;

 private:
  std::shared_ptr<Schedules> schedules_ = std::make_shared<Schedules>();
  std::map<std::tuple<int64_t, bool, int64_t, int64_t>, Stages> stages_;
  std::map<SimKey, Simulated> simulated_;
};

StepCost predict_step(const Workload& w, const Layout& l, const ClusterSpec& c);
// The same with the links given (group_links of the layout's degrees, which the search computes
// once per factorization) and what a cache holds (null: computed here). simulate = false leaves the
// pipeline out: the step is the busiest rank's computation plus what follows the schedule, a lower
// bound of the simulated one (bubble 0).
StepCost predict_step(const Workload& w, const Layout& l, const ClusterSpec& c, const GroupLinks& links,
                      bool simulate = true, CostCache* cache = nullptr);

}  // namespace tessera::plan
