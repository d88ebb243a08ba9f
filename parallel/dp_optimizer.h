// The optimizer side of a data-parallel training step, chosen by DpOptimizerOptions::zero:
// replicated (BucketedAllReduce sums the gradients during the last backward, every rank runs AdamW
// on the whole model) or ZeRO-1 (one reduce-scatter after backward, AdamW on this rank's shard, an
// all-gather of the parameters). The trainer sees one interface either way. Its group is the
// gradient-reduction group, dp x cp: the ranks that hold the same parameters and different tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "optim/adamw.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/flat_params.h"
#include "parallel/zero.h"

namespace tessera {

// What the optimizer reads of the [parallel] config section (app/ fills it from ParallelConfig).
struct DpOptimizerOptions {
  bool zero = false;                // parallel.zero = 1: the AdamW state sharded over the group
  double bucket_mb = 25.0;          // parallel.bucket_mb: replicated buckets of about this many MiB
  bool overlap_grad_reduce = true;  // parallel.overlap_grad_reduce: buckets start during backward
};

// Optimizer state at the full flat layout, for checkpoints. Under ZeRO-1 it owns the gathered
// moments (freed with it); otherwise `state` views AdamW's own buffers.
struct FullOptimizerState {
  OptimizerState state;
  Buffer exp_avg, exp_avg_sq;
};

class DataParallelOptimizer {
 public:
  // Whether ZeRO-1 shards the optimizer over a group of this size (zero on one rank is plain AdamW).
  static bool sharded(const DpOptimizerOptions& opts, int64_t group_size);
  // What the flat buffers must be padded to (ParameterStore::finalize).
  static int64_t pad_multiple(const DpOptimizerOptions& opts, int64_t group_size);

  // flat: padded to pad_multiple(opts, group size); its views must outlive the optimizer. group:
  // the gradient-reduction group (dp x cp), or null on one rank. Segments tile [0, flat.numel()).
  DataParallelOptimizer(const FlatParams& flat, std::vector<ParamSegment> segments, const AdamWOptions& opt,
                        const DpOptimizerOptions& opts, Communicator* group, Allocator& alloc);

  // For the last micro-batch's backward (Gpt::GradsReady): parameters [first, end) hold final
  // gradients. Empty when nothing starts during backward (one rank, or ZeRO-1).
  std::function<void(int first, int end)> grads_ready_hook();
  // After backward, collective: the gradients summed over the group (all of them, or this rank's
  // shard). finalize_grads (parallel/finalize_grads.h) calls it between the other sums.
  void reduce_grads();
  // out (one F64 element, on the parameters' device) = the sum of squares of the reduced gradient
  // over the parameters `counts` accepts (e.g. tensor-parallel replicas on one tp rank only),
  // summed over the group under ZeRO-1 (collective then). Nothing is read back to the host.
  void grad_sq_norm(const Exec& ex, const Tensor& out, const std::function<bool(const FlatParam&)>& counts);
  // Whether ZeRO-1 shards the state (reduce_grads is then a reduce-scatter of the full buffer).
  bool sharded() const { return zero_ != nullptr; }
  Communicator* group() const { return group_; }
  // Collective under ZeRO-1 (the all-gather of the parameters).
  void step(const Exec& ex, double lr, double grad_scale);
  // Whether step() also rewrote flat.compute (the replicated AdamW rounds its update into it in the
  // same pass); false under ZeRO-1, whose ranks update a shard each: the caller converts after the
  // all-gather (ParameterStore::refresh_compute_copy).
  bool refreshes_compute_copy() const { return !zero_ && adamw_->writes_compute_copy(); }

  // Checkpoints. The moments at the full layout and the steps (ZeRO-1: gathered; collective).
  FullOptimizerState gather_state();
  // Buffers for restore_training_state to read full moments into; then load_state(them, steps).
  FullOptimizerState state_buffers();
  void load_state(const Exec& ex, const OptimizerState& full, int64_t steps);

 private:
  FlatParams flat_;
  Communicator* group_ = nullptr;
  Allocator& alloc_;
  std::unique_ptr<AdamW> adamw_;                // replicated
  std::unique_ptr<BucketedAllReduce> reducer_;  // replicated, group > 1
  std::unique_ptr<ZeroAdamW> zero_;             // ZeRO-1, group > 1
};

}  // namespace tessera
