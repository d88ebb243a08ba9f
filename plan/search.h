// The layout search: every dp x tp x pp x cp factorization of the ranks with every option the trainer
// takes (sequence parallelism, ZeRO-1, the pipeline schedule and its virtual chunks, the cp
// exchange, the micro-batch, recomputation, the dtype), pruned by the trainer's own rules and by
// memory, ranked by the cost model's predicted step time (plan/cost_model.h). Galvatron's idea
// (prune the space first, then cost what is left), with a branch-and-bound order: candidates are
// costed exactly (the pipeline simulated) and checked (the trainer's validation, the exact memory
// estimate) in the order of a cheap lower bound, until no remaining one can enter the top K.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/cost_model.h"
#include "plan/layout.h"

namespace tessera::plan {

// What the search may choose; the defaults choose everything.
struct SearchSpace {
  std::vector<bool> bf16 = {false, true};  // train.dtype: fp32, bf16
  std::vector<Recompute> recompute = {Recompute::None, Recompute::Selective, Recompute::Full};
  // With "full" and pp > 1, also model.recompute = "bubble" (the schedule's R actions), and with
  // recompute_ahead that with model.recompute_ahead = 2 (R two micro-batches ahead, where the rank
  // sees at least 2).
  bool recompute_bubble = true;
  bool recompute_ahead = true;
  std::vector<PipelineKind> schedules = {PipelineKind::OneFOneB, PipelineKind::GPipe, PipelineKind::Interleaved,
                                         PipelineKind::ZeroBubbleH1};
  int64_t micro_batch = 0;  // 0: every divisor of global_batch / dp; else only this one
  int64_t max_vpp = 8;      // interleaved: 2 .. max_vpp chunks per rank (at least a block each)
  bool sequence_parallel = true;  // also try parallel.sequence_parallel = true when tp > 1
  bool zero = true;               // also try parallel.zero = 1 when dp x cp > 1
  bool cp_allgather = true;       // also try parallel.cp_comm = "allgather" when cp > 1
  int64_t max_tp = 0, max_pp = 0, max_cp = 0;  // 0: no bound beyond the model's
  // Recomputation per layer (plan/recompute_choice.h): a layout under "none" or "selective" that is
  // over memory gets the least model.recompute_layers that fits, by bisection. recompute_layers_every
  // instead enumerates every k as a layout of its own (brute force, for the tests).
  bool recompute_layers = true;
  bool recompute_layers_every = false;
  // Per-op recomputation (model/recompute_ops.h): with op sets here, a layout under "none" that is
  // over memory gets per block of each chunk one of: keep, one of these sets, full, the fastest mix
  // that fits (plan/recompute_choice.h recompute_frontier; it replaces the bisection on
  // recompute_layers there). Sets that rerun GEMMs are left out with cp > 1 (the trainer refuses
  // them). Empty: whole blocks only. recompute_ops_every enumerates every mix as a layout of its own
  // (brute force, for the tests).
  std::vector<RecomputeOps> recompute_op_sets = {};
  bool recompute_ops_every = false;
  // The result keeps one micro-batch and recompute_layers per layout (its best): rows that differ
  // only in the micro-batch are mostly the same prediction; false lists them all.
  bool best_micro_batch_only = true;
  // Shortcuts that leave the result as it is (docs/planning.md "Search time"): the pipeline
  // simulated once per distinct input (the schedule, every chunk's costs, the latency:
  // plan/cost_model.h CostCache), the memory estimate asked once per layout, and a layout's memory
  // estimated before its simulation (a layout over memory is then never simulated unless the
  // result depends on its step). false: everything computed afresh in the order of the plain
  // branch and bound, the same top K (Search.ShortcutsLeaveTheResultAsItIs).
  bool shortcuts = true;
};

// One rank's memory estimate (the largest rank's), from the trainer's own estimate
// (app/memory_check.h): the allocator's tensors (device memory on a GPU) and everything.
struct MemoryUse {
  int64_t device = 0;
  int64_t total = 0;
  // What every recomputation of the layout needs at least (the same layout with any
  // model.recompute_layers and op sets: parameters, gradients, moments and the transients that do
  // not depend on activations), device and total; 0: unknown. A layout whose floor is over the
  // device is over memory however it recomputes: the search then asks no further estimates.
  int64_t floor_device = 0;
  int64_t floor_total = 0;
};

// The trainer's judgement of a layout, supplied by the caller (app/plan_command.cpp wires
// app/config.h validate, the trainer's layout checks and app/memory_check.h): `invalid` returns ""
// when `tessera train` would accept the layout, else its message; `memory` the estimate. Either may
// throw tessera::Error, which counts as refusing the layout.
struct PlanChecks {
  std::function<std::string(const Layout&)> invalid;
  std::function<MemoryUse(const Layout&)> memory;
  // The pipeline schedules `memory` walks, when it keeps them: the search simulates the same ones.
  std::shared_ptr<CostCache::Schedules> schedules = nullptr;
};

struct Candidate {
  Layout layout;
  StepCost cost;
  MemoryUse memory;
  int64_t planned_bytes = 0;  // what is compared with the device: memory.device, or .total for host memory
};

struct SearchStats {
  int64_t degree_sets = 0;           // (tp, cp, pp, dp) factorizations of the ranks
  int64_t degree_sets_invalid = 0;   // refused by the grid's validation (heads, layers, sequence over tp, cp)
  int64_t degree_sets_too_big = 0;   // parameters, gradients and moments alone exceed the device
  int64_t layouts = 0;               // layouts enumerated (the schedule rules of the generator applied)
  int64_t costed = 0;                // of them, simulated (the rest ruled out by their lower bound)
  int64_t refused = 0;               // refused by the trainer's validation
  int64_t over_memory = 0;           // over the device memory by the exact estimate
  int64_t over_memory_inferred = 0;  // a smaller micro-batch of the same layout was already over
  int64_t recompute_chosen = 0;      // over memory as enumerated, fitted by recomputing some layers
  double seconds = 0;
  std::string first_refusal;         // one refusal message, for the report
};

struct PlanResult {
  std::vector<Candidate> top;  // best first, at most top_k, every one valid and fitting
  SearchStats stats;
};

// The op sets `tessera plan` offers the search (docs/planning.md "Recomputation per op"): norm,
// mlp_act, norm+mlp_act (= selective), norm+mlp_in+mlp_act, norm+attn+mlp_act, all.
std::vector<RecomputeOps> default_recompute_op_sets();

PlanResult search_layouts(const Workload& w, const ClusterSpec& cluster, int64_t ranks, const SearchSpace& space,
                          const PlanChecks& checks, int64_t top_k);

}  // namespace tessera::plan
