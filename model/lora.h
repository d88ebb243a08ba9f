// LoRA (Hu et al. 2021): a low-rank adapter on a Linear, y = W x + b + s B (A x) with s = alpha / r,
// A (r, in) Kaiming-uniform as PEFT draws it (a = sqrt(5): bound 1 / sqrt(in)) and B (out, r) zero,
// so a new adapter leaves the layer's output unchanged. Under tensor parallelism the adapter is
// split like its layer: column-parallel (W split on out) splits B's rows and keeps A whole,
// row-parallel (W split on in) splits A's columns and keeps B whole; the row-parallel layer's
// partial output sums s B (A_local x_local) over the ranks with its own reduction, since B is linear.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "kernels/dropout.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "model/lora_config.h"
#include "model/parameters.h"

namespace tessera {

// The block-relative name of a layer ("attn.q" for "blocks.3.attn.q"); "" for layers outside the
// language model's blocks (the embedding, the LM head, a vision tower's "vision.blocks.0.attn.q").
std::string lora_layer_suffix(const std::string& layer);
// Whether cfg's targets (globs over block-relative names) name this layer, and cfg is enabled.
bool lora_targets_layer(const LoraConfig& cfg, const std::string& layer);
// The block-relative names of a preset's linear layers: gpt2 attn.{q,k,v,proj}, mlp.{fc,proj};
// llama attn.{q,k,v,proj}, mlp.{gate,up,down}.
std::vector<std::string> lora_layer_names(const std::string& preset);

// Adapter dropout (lora.dropout = p > 0) in a training forward: y = W x + b + s B A dropout(x), the
// base path undropped (the LoRA paper, peft). What places a micro-batch's rows for the mask
// (kernels/dropout.h) besides the layer and the input feature: the mask is a pure function of
// (train.seed, step, the sequence's index in the step's global batch, the row's global position,
// the layer's name, the global input feature), so every layout and a resumed run draw the same
// one. Null (no dropout) in evaluation, generation and with p = 0.
struct LoraDropout {
  uint64_t seed = 0;               // train.seed
  int64_t step = 0;                // the optimizer step
  int64_t sample0 = 0;             // the micro-batch's first sequence's index in the step's global batch
  std::vector<int64_t> positions;  // (T) the global positions of the T rows of a sequence in a region
};

class LoraAdapter {
 public:
  LoraAdapter() = default;
  // Registers "<layer>.lora_A.weight" (r, in) and "<layer>.lora_B.weight" (out, r) for a layer
  // (in, out global) whose weight is split by layer_shard; sum_grad_over_tp: the layer's own flag
  // (a replicated layer each tp rank computes part of). Parameter kind Matrix.
  LoraAdapter(ParameterStore& ps, const std::string& layer, int64_t in, int64_t out, ShardSpec layer_shard,
              bool sum_grad_over_tp, const LoraConfig& cfg);

  // y (N, out_local) += s B (A x), x (N, in_local); the temporary A x (N, r) from the store's
  // allocator. With drop (and lora.dropout > 0): x' = dropout(x) replaces x in the adapter, a
  // (N, in_local) workspace freed once A x' is computed (peak (N, in_local + r)).
  void forward(const Exec& ex, const Tensor& y, const Tensor& x, const LoraDropout* drop = nullptr) const;
  // dx (N, in_local) += s A^T (B^T dy) when dx is defined; with weights, dA += s (B^T dy)^T x and
  // dB += s dy^T (A x) (A x recomputed: r is small). dy (N, out_local). With drop the mask is
  // recomputed, not stored: dx += dropout'(s (B^T dy)^T A) through an (N, in_local) workspace, and
  // x' = dropout(x) again for dA and A x' (each step's peak (N, in_local + r), as forward's).
  void backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x, bool weights = true,
                const LoraDropout* drop = nullptr) const;
  // The weights' half alone (zero-bubble's W): dA and dB as backward accumulates them.
  void backward_weight(const Exec& ex, const Tensor& dy, const Tensor& x, const LoraDropout* drop = nullptr) const;
  // Whether a forward with drop applies dropout (drop given and lora.dropout > 0).
  bool drops(const LoraDropout* drop) const { return drop != nullptr && dropout_ > 0.0; }
  // The mask's coordinates for this layer's input (N, in_local) under drop: the key from
  // train.seed and "<layer>.lora_dropout", the input features offset by this tp rank's shard of A.
  DropoutCoords dropout_coords(const LoraDropout& drop) const;

  int a_id() const { return a_; }
  int b_id() const { return b_; }
  double scale() const { return scale_; }
  int64_t rank() const { return rank_; }

 private:
  // u (N, r) = A x: allocated from the store's allocator as workspace.
  Buffer down(const Exec& ex, const Tensor& x) const;
  // x' = dropout(x) (N, in_local) as a workspace.
  Buffer dropped(const Exec& ex, const Tensor& x, const LoraDropout& drop) const;
  const ParameterStore* ps_ = nullptr;
  std::string layer_;
  int a_ = -1, b_ = -1;
  int64_t rank_ = 0;
  double scale_ = 0.0;
  double dropout_ = 0.0;
};

}  // namespace tessera
