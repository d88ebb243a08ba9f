// DataParallelOptimizer: replicated AdamW with bucketed all-reduce, or ZeroAdamW.
#include "app/dp_optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/elementwise.h"

#include "kernels/check.h"

namespace tessera {

bool DataParallelOptimizer::sharded(const ParallelConfig& cfg, int64_t dp) { return cfg.zero == 1 && dp > 1; }

int64_t DataParallelOptimizer::pad_multiple(const ParallelConfig& cfg, int64_t dp) { return sharded(cfg, dp) ? dp : 1; }

DataParallelOptimizer::DataParallelOptimizer(const ParameterStore& params, std::vector<ParamSegment> segments,
                                             const AdamWOptions& opt, const ParallelConfig& cfg, Communicator* dp,
                                             Allocator& alloc)
    : params_(params), dp_(dp), alloc_(alloc) {
  const int64_t dp_size = dp ? dp->size() : 1;
  if (sharded(cfg, dp_size)) {
    TESSERA_CHECK(params.padded_numel() % dp_size == 0, "parallel.zero = 1: the parameter buffer (",
                  params.padded_numel(), " elements) is not padded to a multiple of the ", dp_size, " dp ranks");
    zero_ = std::make_unique<ZeroAdamW>(params.padded_flat_params(), params.padded_flat_grads(), segments, *dp, alloc,
                                        opt);
    return;
  }
  adamw_ = std::make_unique<AdamW>(params.flat_params(), params.flat_grads(), std::move(segments), alloc, opt);
  if (dp_size > 1) {
    std::vector<int64_t> offsets;
    for (const ParamEntry& e : params.entries()) offsets.push_back(e.offset);
    offsets.push_back(params.numel());
    reducer_ = std::make_unique<BucketedAllReduce>(params.flat_grads(), offsets,
                                                   static_cast<int64_t>(cfg.bucket_mb * (1 << 20)), *dp,
                                                   cfg.overlap_grad_reduce);
  }
}

std::function<void(int, int)> DataParallelOptimizer::grads_ready_hook() {
  if (!reducer_) return {};
  return [this](int first, int end) { reducer_->ready(first, end); };
}

void DataParallelOptimizer::reduce_grads() {
  if (reducer_) reducer_->finish();
  if (zero_) zero_->reduce_grads();
}

void DataParallelOptimizer::grad_sq_norm(const Exec& ex, const Tensor& out,
                                         const std::function<bool(const ParamEntry&)>& counts) {
  // The reduced gradient this rank holds: all of it, or its ZeRO-1 range [begin, begin + n).
  const Tensor g = zero_ ? zero_->grad_shard() : params_.flat_grads();
  const int64_t begin = zero_ ? zero_->shard_begin() : 0, end = begin + g.numel();
  // Consecutive counted parameters are summed as one run (all of them when nothing is left out):
  // each run's sum of squares goes to a slot of `runs`, and out is their sum.
  const Buffer runs(alloc_, DType::F64, {params_.size() + 1}, MemCategory::Workspace);  // zero-filled
  int64_t n_runs = 0, run_lo = 0, run_hi = 0;
  auto flush = [&] {
    if (run_lo < run_hi) {
      squared_norm(ex, runs.tensor().slice_rows(n_runs, n_runs + 1), g.slice_rows(run_lo - begin, run_hi - begin));
      ++n_runs;
    }
    run_lo = run_hi = 0;
  };
  for (const ParamEntry& e : params_.entries()) {
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.local_shape.numel());
    if (lo >= hi) continue;
    if (!counts(e)) {
      flush();
    } else if (run_lo < run_hi && lo == run_hi) {
      run_hi = hi;
    } else {
      flush();
      run_lo = lo, run_hi = hi;
    }
  }
  flush();
  sum(ex, out, runs.tensor().slice_rows(0, n_runs));
  if (zero_) dp_->all_reduce(out, ReduceOp::Sum);
}

void DataParallelOptimizer::step(const Exec& ex, double lr, double grad_scale) {
  if (zero_)
    zero_->step(ex, lr, grad_scale);
  else
    adamw_->step(ex, lr, grad_scale);
}

FullOptimizerState DataParallelOptimizer::gather_state() {
  if (!zero_) return {optimizer_state(*adamw_), {}, {}};
  FullOptimizerState full = state_buffers();
  zero_->gather_moments(full.state.exp_avg, full.state.exp_avg_sq);
  full.state.steps = zero_->steps_taken();
  return full;
}

FullOptimizerState DataParallelOptimizer::state_buffers() {
  if (!zero_) return {optimizer_state(*adamw_), {}, {}};
  const Tensor& p = params_.padded_flat_params();
  FullOptimizerState full;
  full.exp_avg = Buffer(alloc_, p.dtype, p.shape, MemCategory::Workspace);
  full.exp_avg_sq = Buffer(alloc_, p.dtype, p.shape, MemCategory::Workspace);
  full.state = {full.exp_avg.tensor(), full.exp_avg_sq.tensor(), zero_->steps_taken()};
  return full;
}

void DataParallelOptimizer::load_state(const Exec& ex, const OptimizerState& full, int64_t steps) {
  if (zero_) {
    zero_->load_moments(ex, full.exp_avg, full.exp_avg_sq);
    zero_->set_steps_taken(steps);
  } else {
    // restore_training_state read into AdamW's own buffers (state_buffers()).
    TESSERA_CHECK(full.exp_avg.data == adamw_->exp_avg().data && full.exp_avg_sq.data == adamw_->exp_avg_sq().data,
                  "DataParallelOptimizer::load_state: moments must be read into state_buffers()");
    adamw_->set_steps_taken(steps);
  }
}

}  // namespace tessera
