// DataParallelOptimizer: replicated AdamW with bucketed all-reduce, or ZeroAdamW.
#include "parallel/dp_optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/check.h"
#include "kernels/elementwise.h"

namespace tessera {

bool DataParallelOptimizer::sharded(const DpOptimizerOptions& opts, int64_t group_size) {
  return opts.zero && group_size > 1;
}

int64_t DataParallelOptimizer::pad_multiple(const DpOptimizerOptions& opts, int64_t group_size) {
  return sharded(opts, group_size) ? group_size : 1;
}

DataParallelOptimizer::DataParallelOptimizer(const FlatParams& flat, std::vector<ParamSegment> segments,
                                             const AdamWOptions& opt, const DpOptimizerOptions& opts,
                                             Communicator* group, Allocator& alloc)
    : flat_(flat), group_(group), alloc_(alloc) {
  const int64_t group_size = group ? group->size() : 1;
  if (sharded(opts, group_size)) {
    TESSERA_CHECK(flat.padded_params.numel() % group_size == 0, "parallel.zero = 1: the parameter buffer (",
                  flat.padded_params.numel(), " elements) is not padded to a multiple of the ", group_size,
                  " ranks of the gradient-reduction group");
    zero_ = std::make_unique<ZeroAdamW>(flat.padded_params, flat.padded_grads, segments, *group, alloc, opt);
    return;
  }
  adamw_ = std::make_unique<AdamW>(flat.params, flat.grads, std::move(segments), alloc, opt, flat.compute);
  if (group_size > 1) {
    std::vector<int64_t> offsets;
    for (const FlatParam& e : flat.entries) offsets.push_back(e.offset);
    offsets.push_back(flat.numel());
    reducer_ = std::make_unique<BucketedAllReduce>(flat.grads, offsets, static_cast<int64_t>(opts.bucket_mb * (1 << 20)),
                                                   *group, opts.overlap_grad_reduce);
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
                                         const std::function<bool(const FlatParam&)>& counts) {
  // The reduced gradient this rank holds: all of it, or its ZeRO-1 range [begin, begin + n).
  const Tensor g = zero_ ? zero_->grad_shard() : flat_.grads;
  const int64_t begin = zero_ ? zero_->shard_begin() : 0, end = begin + g.numel();
  // Consecutive counted parameters are summed as one run (all of them when nothing is left out):
  // each run's sum of squares goes to a slot of `runs`, and out is their sum.
  const Buffer runs(alloc_, DType::F64, {flat_.size() + 1}, MemCategory::Workspace);  // zero-filled
  int64_t n_runs = 0, run_lo = 0, run_hi = 0;
  auto flush = [&] {
    if (run_lo < run_hi) {
      squared_norm(ex, runs.tensor().slice_rows(n_runs, n_runs + 1), g.slice_rows(run_lo - begin, run_hi - begin));
      ++n_runs;
    }
    run_lo = run_hi = 0;
  };
  for (const FlatParam& e : flat_.entries) {
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.numel);
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
  if (zero_) group_->all_reduce(out, ReduceOp::Sum);
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
  const Tensor& p = flat_.padded_params;
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
