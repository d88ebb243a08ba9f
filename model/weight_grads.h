// Zero-bubble's split backward (ZB-H1): a backward's weight-gradient GEMMs, deferred. The input-
// gradient half (B) records each Linear's input x and output gradient dy instead of computing its
// dW and db; the weight half (W) replays the recorded GEMMs in B's order, then frees what they read.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

class Linear;
struct LoraDropout;  // model/lora.h

// The weight-gradient work one stage backward (B) left for its W, for one micro-batch and chunk.
// What stays in B: the norms' scales and biases (the fused norm kernels compute them with the input
// gradient), the token and position embeddings (a scatter-add) and the input gradients; every
// Linear's dW (the GEMM dy^T x) and db move to W. The saved copies of x and dy are Activations
// (bytes() says how many), alive from B to W: this is what ZB-H1 keeps per micro-batch in place of
// the context B released.
class WeightGrads {
 public:
  using GradsReady = std::function<void(int first, int end)>;
  explicit WeightGrads(Allocator& alloc) : alloc_(&alloc) {}
  WeightGrads(WeightGrads&&) noexcept = default;
  WeightGrads& operator=(WeightGrads&&) noexcept = default;

  // Records layer's weight gradient from dy (N, out) and x (N, in) (leading dims flatten into N):
  // both copied, since the caller's are temporaries or the context's.
  // drop: the adapter's dropout (model/lora.h), copied for W (null: none).
  void defer(const Exec& ex, const Linear& layer, const Tensor& dy, const Tensor& x,
             const LoraDropout* drop = nullptr);
  // The gradients of parameters [first, end) are final once everything deferred so far has run:
  // run() reports the range to its on_ready there (Gpt::GradsReady's order, kept).
  void ready(int first, int end);
  // W: runs the deferred GEMMs in the order B recorded them (so the gradients are accumulated as
  // the whole backward would: bitwise equal), reports each range marked ready in between, and
  // releases every saved tensor. Afterwards empty().
  void run(const Exec& ex, const GradsReady& on_ready = {});

  bool empty() const { return steps_.empty(); }
  // Bytes of the saved copies now (x shared between layers counted once).
  int64_t bytes() const;

  // While alive, layers deferred with the same input tensor (the same data and shape: q, k and v
  // read one normalized input, gate and up another) share one saved copy of it. A scope, not a
  // lookup by address: a freed block's address comes back for another tensor (the allocator's
  // cache). Null: nothing to share (the backward is not split).
  class SharedInput {
   public:
    explicit SharedInput(WeightGrads* grads);
    ~SharedInput();
    SharedInput(const SharedInput&) = delete;
    SharedInput& operator=(const SharedInput&) = delete;

   private:
    WeightGrads* grads_;
  };

 private:
  struct Step {
    const Linear* layer = nullptr;  // null: a ready marker for [first, end)
    std::shared_ptr<Buffer> x;
    Buffer dy;
    std::shared_ptr<const LoraDropout> drop;  // the adapter's dropout, or null
    int first = 0, end = 0;
  };
  Allocator* alloc_;
  std::vector<Step> steps_;
  bool sharing_ = false;
  Tensor shared_source_;  // the input the open SharedInput scope saved, and its copy
  std::shared_ptr<Buffer> shared_copy_;
};

}  // namespace tessera
