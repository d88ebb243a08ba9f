// AdamW::step calls the flat-buffer kernel once per segment with that segment's decay.
#include "optim/adamw.h"

#include <cmath>

#include "kernels/adamw.h"
#include "kernels/elementwise.h"

namespace tessera {

AdamW::AdamW(const Tensor& params, const Tensor& grads, std::vector<ParamSegment> segments, Allocator& alloc,
             const AdamWOptions& opt, const Tensor& compute)
    : params_(params.view({params.numel()})),
      grads_(grads.view({grads.numel()})),
      compute_(compute.defined() ? compute.view({compute.numel()}) : Tensor()),
      segments_(std::move(segments)),
      opt_(opt),
      m_(alloc, params.dtype, {params.numel()}, MemCategory::OptimizerState),
      v_(alloc, params.dtype, {params.numel()}, MemCategory::OptimizerState) {
  TESSERA_CHECK(params.numel() == grads.numel(), "AdamW: ", params.numel(), " parameters but ", grads.numel(),
                " gradients");
  int64_t expect = 0;
  for (const ParamSegment& s : segments_) {
    TESSERA_CHECK(s.offset == expect && s.numel >= 0, "AdamW: segments must tile the buffer; one starts at ",
                  s.offset, ", expected ", expect);
    expect += s.numel;
  }
  TESSERA_CHECK(expect == params.numel(), "AdamW: segments cover ", expect, " of ", params.numel(), " elements");
  TESSERA_CHECK(!compute.defined() || compute.numel() == params.numel(), "AdamW: a compute copy of ",
                compute.numel(), " elements for ", params.numel(), " parameters");
}

void AdamW::step(const Exec& ex, double lr, double grad_scale) {
  ++steps_;
  AdamWStep s;
  s.lr = lr;
  s.beta1 = opt_.beta1;
  s.beta2 = opt_.beta2;
  s.eps = opt_.eps;
  s.step = steps_;
  s.grad_scale = grad_scale;
  for (const ParamSegment& seg : segments_) {
    const int64_t begin = seg.offset, end = seg.offset + seg.numel;
    s.weight_decay = seg.decay ? opt_.weight_decay : 0.0;
    adamw_update(ex, params_.slice_rows(begin, end), grads_.slice_rows(begin, end), m_.tensor().slice_rows(begin, end),
                 v_.tensor().slice_rows(begin, end), s,
                 compute_.defined() ? compute_.slice_rows(begin, end) : Tensor());
  }
}

double grad_norm(const Exec& ex, Allocator& alloc, const Tensor& grads) {
  const Buffer sq(alloc, DType::F64, {1}, MemCategory::Workspace);
  squared_norm(ex, sq, grads);
  return std::sqrt(read_scalar(ex, sq));
}

double clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  return max_norm / norm;
}

OptimizerState optimizer_state(const AdamW& optimizer) {
  return {optimizer.exp_avg(), optimizer.exp_avg_sq(), optimizer.steps_taken()};
}

}  // namespace tessera
