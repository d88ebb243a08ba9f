// The optimizer side of a data-parallel training step, chosen by parallel.zero: replicated
// (BucketedAllReduce sums the gradients during the last backward, every rank runs AdamW on the
// whole model) or ZeRO-1 (one reduce-scatter after backward, AdamW on this rank's shard, an
// all-gather of the parameters). The trainer sees one interface either way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "app/checkpoint/checkpointing.h"
#include "app/config.h"
#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "model/parameters.h"
#include "optim/adamw.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/zero.h"

namespace tessera {

// Optimizer state at the full flat layout, for checkpoints. Under ZeRO-1 it owns the gathered
// moments (freed with it); otherwise `state` views AdamW's own buffers.
struct FullOptimizerState {
  OptimizerState state;
  Buffer exp_avg, exp_avg_sq;
};

class DataParallelOptimizer {
 public:
  // Whether parallel.zero shards the optimizer over dp ranks (zero = 1 on one rank is plain AdamW).
  static bool sharded(const ParallelConfig& cfg, int64_t dp);
  // What the ParameterStore's flat buffers must be padded to (ParameterStore::finalize).
  static int64_t pad_multiple(const ParallelConfig& cfg, int64_t dp);

  // params: finalized with pad_multiple(cfg, dp size). dp: the data-parallel group, or null on one
  // rank. Segments tile [0, params.numel()).
  DataParallelOptimizer(const ParameterStore& params, std::vector<ParamSegment> segments, const AdamWOptions& opt,
                        const ParallelConfig& cfg, Communicator* dp, Allocator& alloc);

  // For the last micro-batch's backward (Gpt::GradsReady): parameters [first, end) hold final
  // gradients. Empty when nothing starts during backward (one rank, or ZeRO-1).
  std::function<void(int first, int end)> grads_ready_hook();
  // After backward, collective: the gradients summed over dp (all of them, or this rank's shard).
  void reduce_grads();
  // out (one F64 element, on the parameters' device) = the sum of squares of the reduced gradient
  // over the parameters `counts` accepts (e.g. tensor-parallel replicas on one tp rank only),
  // summed over dp under ZeRO-1 (collective then). Nothing is read back to the host.
  void grad_sq_norm(const Exec& ex, const Tensor& out, const std::function<bool(const ParamEntry&)>& counts);
  // Whether ZeRO-1 shards the state (reduce_grads is then a reduce-scatter of the full buffer).
  bool sharded() const { return zero_ != nullptr; }
  // Collective under ZeRO-1 (the all-gather of the parameters).
  void step(const Exec& ex, double lr, double grad_scale);

  // Checkpoints. The moments at the full layout and the steps (ZeRO-1: gathered; collective).
  FullOptimizerState gather_state();
  // Buffers for restore_training_state to read full moments into; then load_state(them, steps).
  FullOptimizerState state_buffers();
  void load_state(const Exec& ex, const OptimizerState& full, int64_t steps);

 private:
  const ParameterStore& params_;
  Communicator* dp_ = nullptr;
  Allocator& alloc_;
  std::unique_ptr<AdamW> adamw_;                // replicated
  std::unique_ptr<BucketedAllReduce> reducer_;  // replicated, dp > 1
  std::unique_ptr<ZeroAdamW> zero_;             // ZeRO-1, dp > 1
};

}  // namespace tessera
