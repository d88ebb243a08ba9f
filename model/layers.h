// The building-block modules: Linear, Embedding, Norm. Each has a forward/backward pair; what a
// forward must keep for its backward lives in a per-micro-batch context struct owned by the caller.
#pragma once

#include <string>

#include "kernels/allocator.h"
#include "kernels/tensor.h"
#include "model/config.h"
#include "model/parameters.h"

namespace tessera {

// y = x W^T + b. Column-parallel layers shard W along dim 0 (and b with it), row-parallel along
// dim 1 (b replicated); with tp = 1 both are the plain layer.
class Linear {
 public:
  Linear() = default;
  Linear(ParameterStore& ps, const std::string& name, int64_t in, int64_t out, bool bias, ShardSpec weight_shard,
         double init_std);
  // A layer whose weight is an existing parameter (tied LM head: the token embedding), no bias.
  static Linear tied(ParameterStore& ps, int weight_id);

  // y (N, out), x (N, in); leading dims flatten into N.
  void forward(const Tensor& y, const Tensor& x) const;
  // dx (N, in) written, or added to when accumulate_dx; dW and db accumulated. dx may be undefined.
  void backward(const Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate_dx = false) const;

  int64_t in() const;
  int64_t out() const;

 private:
  const ParameterStore* ps_ = nullptr;
  int weight_ = -1;
  int bias_ = -1;
};

// Token embedding (V, C) plus, for learned positions, a position embedding (P, C).
class Embedding {
 public:
  Embedding() = default;
  Embedding(ParameterStore& ps, const ModelConfig& cfg);
  // out (B, T, C), tokens (B, T) I32.
  void forward(const Tensor& out, const Tensor& tokens, int64_t pos_offset) const;
  // Accumulates the embeddings' gradients from dout (B, T, C).
  void backward(const Tensor& dout, const Tensor& tokens, int64_t pos_offset) const;
  int token_weight_id() const { return wte_; }

 private:
  const ParameterStore* ps_ = nullptr;
  int wte_ = -1;
  int wpe_ = -1;
};

// What a Norm's forward keeps: its output (the next GEMM's input) and per-row statistics.
struct NormCtx {
  Buffer y;     // (B, T, C)
  Buffer mean;  // (B*T) LayerNorm only
  Buffer rstd;  // (B*T)
};

// LayerNorm (gpt2) or RMSNorm (llama), over the last dimension.
class Norm {
 public:
  Norm() = default;
  Norm(ParameterStore& ps, const std::string& name, const ModelConfig& cfg);
  // x (B, T, C) -> ctx.y
  void forward(NormCtx& ctx, Allocator& alloc, const Tensor& x) const;
  // dx (B, T, C) += d/dx (a norm's input is the residual stream); parameter gradients accumulated.
  void backward(const Tensor& dx, const Tensor& dy, const Tensor& x, const NormCtx& ctx) const;

 private:
  const ParameterStore* ps_ = nullptr;
  NormKind kind_ = NormKind::LayerNorm;
  double eps_ = 1e-5;
  int weight_ = -1;
  int bias_ = -1;
};

}  // namespace tessera
