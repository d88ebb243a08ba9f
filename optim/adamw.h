// The AdamW optimizer over flat parameter and gradient buffers: moments in two flat buffers of
// the same layout, weight decay per segment. optim knows no model: the app describes the
// parameters as segments of the flat buffer (see model/parameters.h for where they come from).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// A run of the flat buffer that shares one weight-decay setting (typically one parameter).
struct ParamSegment {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = true;
  bool operator==(const ParamSegment&) const = default;
};

class AdamW {
 public:
  // params, grads: (N) flat buffers; segments cover [0, N) in order without gaps. compute: optional
  // (N) BF16 copy of params (mixed precision), rewritten by every step from the updated params.
  AdamW(const Tensor& params, const Tensor& grads, std::vector<ParamSegment> segments, Allocator& alloc,
        const AdamWOptions& opt, const Tensor& compute = Tensor());

  // One update with learning rate lr; gradients are multiplied by grad_scale first (clipping).
  void step(const Exec& ex, double lr, double grad_scale = 1.0);
  // Whether step() also refreshes a compute copy (constructed with one).
  bool writes_compute_copy() const { return compute_.defined(); }

  int64_t steps_taken() const { return steps_; }
  // After loading the moments from a checkpoint: the bias corrections continue from `steps`.
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  const Tensor& exp_avg() const { return m_.tensor(); }
  const Tensor& exp_avg_sq() const { return v_.tensor(); }

 private:
  Tensor params_, grads_, compute_;
  std::vector<ParamSegment> segments_;
  AdamWOptions opt_;
  Buffer m_, v_;
  int64_t steps_ = 0;
};

// AdamW's state as a checkpoint holds it: the moments at the layout of the whole flat parameter
// buffer, on this rank (ZeRO-1 gathers its shards into such buffers first), and the steps taken.
struct OptimizerState {
  Tensor exp_avg, exp_avg_sq;  // (N), or longer: elements past the parameters are ignored
  int64_t steps = 0;
};
// Views of a (replicated) AdamW's state.
OptimizerState optimizer_state(const AdamW& optimizer);

// L2 norm of a flat gradient buffer (this rank's part; distributed runs reduce the squares), read
// back to the host (a device sync; scratch from alloc). The trainer's norm is
// finalize_grads (parallel/finalize_grads.h), which stays on the device until the step reads it.
double grad_norm(const Exec& ex, Allocator& alloc, const Tensor& grads);
// The factor that brings a gradient of norm `norm` down to `max_norm` (1 when within it or when
// clipping is off, max_norm <= 0).
double clip_factor(double norm, double max_norm);

}  // namespace tessera
