// ZeRO-1: AdamW whose state is sharded over the data-parallel group. It knows only a flat parameter
// buffer, a flat gradient buffer of the same layout, and weight-decay segments (optim/adamw.h): the
// buffers are padded to a multiple of the group size p, and rank r owns the flat range
// [r S, (r + 1) S), S = P / p, which may cut a parameter anywhere.
//
// A step: reduce-scatter the gradients (rank r receives the sum over ranks of its range), update its
// range of the parameters with AdamW (the moments exist only for that range), then all-gather the
// parameters so that every rank holds the whole updated model again. The update itself is AdamW's
// (an AdamW over the shard's views, with the segments intersected with the shard).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "optim/adamw.h"
#include "parallel/communicator.h"

namespace tessera {

// The parts of `segments` (which tile [0, N)) inside [begin, end), with offsets relative to begin,
// followed by one no-decay segment over the padding [max(N, begin), end) when end > N: the result
// tiles [0, end - begin). Empty intersections are left out.
std::vector<ParamSegment> shard_segments(const std::vector<ParamSegment>& segments, int64_t begin, int64_t end);

// The padded length of a flat buffer of n elements sharded over p ranks: n rounded up to a
// multiple of p.
int64_t zero_padded_numel(int64_t n, int p);

class ZeroAdamW {
 public:
  // params, grads: (P) flat buffers, P a multiple of dp.size(); segments tile [0, N), N <= P, and
  // [N, P) is padding (zero, and kept zero). Allocates this rank's moments and a gradient shard,
  // (S) each.
  ZeroAdamW(const Tensor& params, const Tensor& grads, const std::vector<ParamSegment>& segments, Communicator& dp,
            Allocator& alloc, const AdamWOptions& opt);

  // Collective: this rank's shard of the gradients summed over the group (reduce-scatter). The
  // full gradient buffer is left as it was (this rank's own contribution).
  void reduce_grads();
  // out (one F64 element) = the sum of squares of this rank's reduced gradient shard; the caller
  // sums it over the group for the global norm.
  void shard_grad_sq_norm(const Exec& ex, const Tensor& out) const;
  // Collective: AdamW on this rank's shard (gradients multiplied by grad_scale first), then every
  // rank's shard all-gathered into the full parameter buffer. Call after reduce_grads().
  void step(const Exec& ex, double lr, double grad_scale = 1.0);

  int64_t steps_taken() const { return adamw_.steps_taken(); }
  void set_steps_taken(int64_t steps) { adamw_.set_steps_taken(steps); }
  int64_t shard_begin() const { return begin_; }
  int64_t shard_size() const { return size_; }
  const Tensor& grad_shard() const { return grad_shard_.tensor(); }  // (S), after reduce_grads()
  const Tensor& exp_avg_shard() const { return adamw_.exp_avg(); }      // (S)
  const Tensor& exp_avg_sq_shard() const { return adamw_.exp_avg_sq(); }  // (S)

  // Checkpoints. Collective: every rank's moments gathered into exp_avg, exp_avg_sq: (P) each.
  void gather_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq);
  // Keeps this rank's shard of full moments: (N) or (P) each (the padding's moments are zero).
  void load_moments(const Exec& ex, const Tensor& exp_avg, const Tensor& exp_avg_sq);

 private:
  Tensor params_, grads_;  // (P)
  Communicator& comm_;
  int64_t numel_ = 0;      // N: elements before the padding
  int64_t begin_ = 0, size_ = 0;
  Buffer grad_shard_;      // (S) reduced gradients; after the update, the all-gather's input
  AdamW adamw_;            // over params_[begin_, begin_ + size_) and grad_shard_
};

}  // namespace tessera
