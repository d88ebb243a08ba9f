// WeightGrads: the deferred half of a split backward (zero-bubble's W), recorded by Linear::backward.
#include "model/weight_grads.h"

#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "model/layers.h"
#include "model/lora.h"

namespace tessera {

namespace {
Buffer saved_copy(const Exec& ex, Allocator& alloc, const Tensor& t) {
  Buffer b(alloc, t.dtype, t.shape, MemCategory::Activations);
  copy(ex, b, t);
  return b;
}
}  // namespace

void WeightGrads::defer(const Exec& ex, const Linear& layer, const Tensor& dy, const Tensor& x,
                        const LoraDropout* drop) {
  Step s;
  s.layer = &layer;
  const bool same_input = sharing_ && shared_copy_ && shared_source_.data == x.data && shared_source_.shape == x.shape &&
                          shared_source_.dtype == x.dtype;
  if (same_input) {
    s.x = shared_copy_;
  } else {
    s.x = std::make_shared<Buffer>(saved_copy(ex, *alloc_, x));
    if (sharing_) {
      shared_source_ = x;
      shared_copy_ = s.x;
    }
  }
  s.dy = saved_copy(ex, *alloc_, dy);
  if (drop) s.drop = std::make_shared<const LoraDropout>(*drop);
  steps_.push_back(std::move(s));
}

void WeightGrads::ready(int first, int end) {
  if (end <= first) return;
  Step s;
  s.first = first;
  s.end = end;
  steps_.push_back(std::move(s));
}

void WeightGrads::run(const Exec& ex, const GradsReady& on_ready) {
  TESSERA_CHECK(!sharing_, "WeightGrads::run inside a SharedInput scope (the backward that records is not done)");
  for (Step& s : steps_) {
    if (s.layer) {
      s.layer->backward_weight(ex, s.dy, *s.x, s.drop.get());
      s.dy.release();
      s.x.reset();  // the last layer reading a shared input frees it
    } else if (on_ready) {
      on_ready(s.first, s.end);
    }
  }
  steps_.clear();
}

int64_t WeightGrads::bytes() const {
  int64_t total = 0;
  const Buffer* last_x = nullptr;
  for (const Step& s : steps_) {
    if (!s.layer) continue;
    total += static_cast<int64_t>(s.dy.tensor().nbytes());
    if (s.x.get() != last_x) total += static_cast<int64_t>(s.x->tensor().nbytes());
    last_x = s.x.get();
  }
  return total;
}

WeightGrads::SharedInput::SharedInput(WeightGrads* grads) : grads_(grads) {
  if (!grads_) return;
  TESSERA_CHECK(!grads_->sharing_, "WeightGrads::SharedInput scopes do not nest");
  grads_->sharing_ = true;
}

WeightGrads::SharedInput::~SharedInput() {
  if (!grads_) return;
  grads_->sharing_ = false;
  grads_->shared_source_ = Tensor();
  grads_->shared_copy_.reset();
}

}  // namespace tessera
