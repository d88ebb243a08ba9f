// ZeroAdamW: reduce-scatter, AdamW over the shard's views, all-gather; and the shard's segments.
#include "parallel/zero.h"

#include <algorithm>

#include "kernels/check.h"
#include "kernels/elementwise.h"

namespace tessera {

namespace {

// N: the elements the segments cover, after checking that they tile [0, N) within a (P) buffer.
int64_t checked_numel(const std::vector<ParamSegment>& segments, const Tensor& params, const Tensor& grads, int p) {
  TESSERA_CHECK(params.numel() == grads.numel(), "ZeroAdamW: ", params.numel(), " parameters but ", grads.numel(),
                " gradients");
  TESSERA_CHECK(params.numel() % p == 0, "ZeroAdamW: the flat buffer of ", params.numel(),
                " elements must be padded to a multiple of the ", p, " data-parallel ranks");
  int64_t n = 0;
  for (const ParamSegment& s : segments) {
    TESSERA_CHECK(s.offset == n && s.numel >= 0, "ZeroAdamW: segments must tile the buffer; one starts at ",
                  s.offset, ", expected ", n);
    n += s.numel;
  }
  TESSERA_CHECK(n <= params.numel(), "ZeroAdamW: segments cover ", n, " elements of a buffer of ", params.numel());
  return n;
}

}  // namespace

int64_t zero_padded_numel(int64_t n, int p) {
  TESSERA_CHECK(p >= 1, "zero_padded_numel: ", p, " ranks");
  return (n + p - 1) / p * p;
}

std::vector<ParamSegment> shard_segments(const std::vector<ParamSegment>& segments, int64_t begin, int64_t end) {
  std::vector<ParamSegment> out;
  int64_t n = 0;
  for (const ParamSegment& s : segments) {
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo < hi) out.push_back({lo - begin, hi - lo, s.decay});
    n = s.offset + s.numel;
  }
  const int64_t pad = std::max(n, begin);
  if (pad < end) out.push_back({pad - begin, end - pad, false});  // zero gradients keep zero parameters
  return out;
}

ZeroAdamW::ZeroAdamW(const Tensor& params, const Tensor& grads, const std::vector<ParamSegment>& segments,
                     Communicator& dp, Allocator& alloc, const AdamWOptions& opt)
    : params_(params.view({params.numel()})),
      grads_(grads.view({grads.numel()})),
      comm_(dp),
      numel_(checked_numel(segments, params, grads, dp.size())),
      begin_(params.numel() / dp.size() * dp.rank()),
      size_(params.numel() / dp.size()),
      grad_shard_(alloc, grads.dtype, {size_}, MemCategory::Gradients),
      adamw_(params_.slice_rows(begin_, begin_ + size_), grad_shard_.tensor(),
             shard_segments(segments, begin_, begin_ + size_), alloc, opt) {}

void ZeroAdamW::reduce_grads() { comm_.reduce_scatter(grads_, grad_shard_.tensor(), ReduceOp::Sum); }

void ZeroAdamW::shard_grad_sq_norm(const Exec& ex, const Tensor& out) const {
  squared_norm(ex, out, grad_shard_.tensor());
}

void ZeroAdamW::step(const Exec& ex, double lr, double grad_scale) {
  adamw_.step(ex, lr, grad_scale);
  // The all-gather's input may not alias its output: the updated shard goes through the (now
  // spent) gradient shard.
  copy(ex, grad_shard_.tensor(), params_.slice_rows(begin_, begin_ + size_));
  comm_.all_gather(grad_shard_.tensor(), params_);
}

void ZeroAdamW::gather_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  check_shape("ZeroAdamW::gather_moments", "exp_avg", exp_avg, params_.shape);
  check_shape("ZeroAdamW::gather_moments", "exp_avg_sq", exp_avg_sq, params_.shape);
  comm_.all_gather(adamw_.exp_avg(), exp_avg);
  comm_.all_gather(adamw_.exp_avg_sq(), exp_avg_sq);
}

void ZeroAdamW::load_moments(const Exec& ex, const Tensor& exp_avg, const Tensor& exp_avg_sq) {
  for (const auto& [full, shard] : {std::pair{exp_avg, adamw_.exp_avg()}, std::pair{exp_avg_sq, adamw_.exp_avg_sq()}}) {
    TESSERA_CHECK(full.numel() == numel_ || full.numel() == params_.numel(), "ZeroAdamW::load_moments: ",
                  full.str(), " holds neither the ", numel_, " elements of the parameters nor the padded ",
                  params_.numel());
    const Tensor flat = full.view({full.numel()});
    const int64_t have = std::clamp<int64_t>(full.numel() - begin_, 0, size_);  // the rest is padding
    fill_zero(ex, shard);
    if (have > 0) copy(ex, shard.slice_rows(0, have), flat.slice_rows(begin_, begin_ + have));
  }
}

}  // namespace tessera
