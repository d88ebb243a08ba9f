// The building-block modules: Linear, Embedding, Rope, Norm. Each has a forward/backward pair; what a
// forward must keep for its backward lives in a per-micro-batch context struct owned by the caller.
// Every forward and backward takes the Exec its ops run on first (`ex`, kernels/exec.h: the
// device and stream), not to be confused with those context structs (`ctx`).
#pragma once

#include <memory>
#include <string>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/profiler.h"
#include "kernels/tensor.h"
#include "kernels/vocab_shard.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/parameters.h"
#include "parallel/tensor_parallel.h"

namespace tessera {

class WeightGrads;  // model/weight_grads.h

// y = x W^T + b. Column-parallel layers shard W along dim 0 (and b with it), row-parallel along
// dim 1 (b replicated); with tp = 1 both are the plain layer. The communication around them is
// the caller's (parallel/tensor_parallel.h): a row-parallel layer's output is a partial sum.
class Linear {
 public:
  Linear() = default;
  // sum_grad_over_tp: see ParamSpec (a replicated layer whose gradient each tp rank computes in part).
  Linear(ParameterStore& ps, const std::string& name, int64_t in, int64_t out, bool bias, ShardSpec weight_shard,
         double init_std, bool sum_grad_over_tp = false);
  // A layer whose weight is an existing parameter (tied LM head: the token embedding), no bias.
  static Linear tied(ParameterStore& ps, int weight_id);
  // Adds a LoRA adapter (model/lora.h) named after the layer, right after the layer's own
  // parameters; forward and backward then include it. A frozen weight (no gradient: a LoRA run's
  // base) skips its dW GEMM, and its bias must be frozen too.
  void add_lora(ParameterStore& ps, const std::string& name, ShardSpec weight_shard, bool sum_grad_over_tp,
                const LoraConfig& cfg);
  const LoraAdapter* lora() const { return lora_ ? lora_.get() : nullptr; }

  // y (N, out), x (N, in); leading dims flatten into N. with_bias = false leaves the bias out (a
  // row-parallel layer adds it on one tp rank only, so that the sum over ranks holds it once).
  // drop: the adapter's dropout in a training forward (model/lora.h; null: none).
  void forward(const Exec& ex, const Tensor& y, const Tensor& x, bool with_bias = true,
               const LoraDropout* drop = nullptr) const;
  // dx (N, in) written, or added to when accumulate_dx; dW and db accumulated. dx may be undefined.
  // With `deferred` (zero-bubble's B): dx only, and dW, db left to deferred->run() (which calls
  // backward_weight on copies of dy and x).
  // drop: the forward's (the adapter's mask recomputed; deferred keeps a copy for W).
  void backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate_dx = false,
                WeightGrads* deferred = nullptr, const LoraDropout* drop = nullptr) const;
  // The weight half alone (W): dW += dy^T x, db += the sum of dy over N; the same kernel calls as
  // backward's, so a split backward accumulates bitwise what the whole one does.
  void backward_weight(const Exec& ex, const Tensor& dy, const Tensor& x, const LoraDropout* drop = nullptr) const;
  // The input half alone, on any rows: dx (N, in) = dy W (or += when accumulate_dx), LoRA's part
  // included; the same GEMM as backward's dx, row for row. The weight half is then backward with an
  // undefined dx (which also defers it under zero-bubble): tensor-parallel overlap runs the dx GEMM
  // chunk by chunk (parallel/tp_overlap.h) and the weight gradients once over the whole sequence.
  void backward_input(const Exec& ex, const Tensor& dx, const Tensor& dy, bool accumulate_dx) const;

  int64_t in() const;
  int64_t out() const;
  // Times forward and backward as OpFamily::Matmul (null: no timing). Likewise for every module.
  void set_profiler(Profiler* p) { prof_ = p; }

 private:
  const ParameterStore* ps_ = nullptr;
  Profiler* prof_ = nullptr;
  // The weight-gradient GEMMs (dW, db), skipped for a weight without a gradient (frozen).
  void weight_grads(const Exec& ex, const Tensor& dy, const Tensor& x) const;
  int weight_ = -1;
  int bias_ = -1;
  std::shared_ptr<const LoraAdapter> lora_;
};

// Token embedding (V, C) plus, for learned positions, a position embedding (P, C). Under tensor
// parallelism the token table is split over the vocabulary (padded to ceil(V / tp) rows per rank):
// each rank looks up the ids it holds, rank 0 adds the positions, and the group sums (or, under
// sequence parallelism, reduce-scatters) the result.
class Embedding {
 public:
  Embedding() = default;
  // sum_grad_over_embedding_group: the token table is tied to an LM head on a later pipeline
  // stage (see ParamSpec).
  Embedding(ParameterStore& ps, const ModelConfig& cfg, const TensorParallel& tp,
            bool sum_grad_over_embedding_group = false);
  // The token table's parameter ("wte.weight", (V, C), vocabulary-parallel).
  static ParamSpec token_spec(const ModelConfig& cfg);
  // out (B, T_local, C), tokens (B, T) I32 (T_local = T / tp under sequence parallelism); seq:
  // the global positions of the tokens' T columns (T = seq.length()), chunk by chunk.
  void forward(const Exec& ex, Allocator& alloc, const Tensor& out, const Tensor& tokens,
               const SequenceLayout& seq) const;
  // Accumulates the embeddings' gradients from dout (B, T_local, C).
  void backward(const Exec& ex, Allocator& alloc, const Tensor& dout, const Tensor& tokens,
                const SequenceLayout& seq) const;
  int token_weight_id() const { return wte_; }
  // The vocabulary ids this rank's table (and the tied or untied LM head) holds.
  const VocabShard& vocab_shard() const { return shard_; }
  void set_profiler(Profiler* p) { prof_ = p; }

 private:
  const ParameterStore* ps_ = nullptr;
  Profiler* prof_ = nullptr;
  TensorParallel tp_;
  VocabShard shard_;
  int wte_ = -1;
  int wpe_ = -1;
};

// Rotary position embedding of queries or keys at the global positions of a sequence layout
// (the kernel once per chunk, or once for a one-chunk layout).
class Rope {
 public:
  Rope() = default;
  explicit Rope(double theta) : theta_(theta) {}
  // y, x (B, T, H, D) with T = seq.length(); y may alias x.
  void forward(const Exec& ex, const Tensor& y, const Tensor& x, const SequenceLayout& seq) const;
  // dx = the transpose rotation of dy (written; may alias dy).
  void backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const SequenceLayout& seq) const;

 private:
  double theta_ = 10000.0;
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
  // Under sequence parallelism each tp rank normalizes its own positions, so the gradient of the
  // (replicated) weights is summed over tp: sequence_parallel marks them for it.
  Norm(ParameterStore& ps, const std::string& name, const ModelConfig& cfg, bool sequence_parallel = false);
  // x (B, T, C) -> ctx.y
  void forward(const Exec& ex, NormCtx& ctx, Allocator& alloc, const Tensor& x) const;
  // Selective recomputation: ctx.y allocated again and recomputed from the same x by the same
  // kernel (its statistics rewritten with the values they hold), bitwise the forward's.
  void recompute_output(const Exec& ex, NormCtx& ctx, Allocator& alloc, const Tensor& x) const;
  // dx (B, T, C) += d/dx (a norm's input is the residual stream); parameter gradients accumulated.
  void backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x, const NormCtx& ctx) const;
  void set_profiler(Profiler* p) { prof_ = p; }

 private:
  // ctx.y and the statistics (allocated) from x.
  void run(const Exec& ex, NormCtx& ctx, const Tensor& x) const;
  const ParameterStore* ps_ = nullptr;
  Profiler* prof_ = nullptr;
  NormKind kind_ = NormKind::LayerNorm;
  double eps_ = 1e-5;
  int weight_ = -1;
  int bias_ = -1;
};

}  // namespace tessera
