// Per-op recomputation (model.recompute_ops, model.recompute_ops_layers): which of a block's saved
// tensors its forward drops and its backward recomputes, one named op at a time, beside the
// whole-block policies of model/gpt.h Recompute. The recomputation runs the forward's own kernels on
// the same inputs, so the gradients are bitwise those of keeping everything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

enum class Recompute;  // model/gpt.h

// Shapes as in model/gpt.h (T_local = T / tp under sequence parallelism; H, KV, F per rank).
struct RecomputeOps {
  bool norm = false;     // "norm": ln1's and ln2's outputs (B, T_local, C), from the kept block input,
                         // residual and statistics (elementwise)
  bool qkv = false;      // "qkv": q, k, v (B, T, H|KV, D), the three projections (and RoPE) again from
                         // ln1's output, re-gathered over the sequence under sequence parallelism
  bool attn = false;     // "attn": the attention output (B, T, H, D) and its lse (B, H, T), the
                         // attention forward again from q, k, v
  bool mlp_in = false;   // "mlp_in": the activation's input, fc's (gelu) or gate's and up's (swiglu)
                         // output (B, T, F), the MLP's first GEMM(s) again from ln2's output
  bool mlp_act = false;  // "mlp_act": the activation's output (B, T, F), GELU or SwiGLU again

  bool any() const { return norm || qkv || attn || mlp_in || mlp_act; }
  // Whether a GEMM or the attention kernel runs again (not only elementwise ops).
  bool reruns_gemms() const { return qkv || attn || mlp_in; }
  bool operator==(const RecomputeOps&) const = default;

  // "selective" (model.recompute = "selective", docs/training.md): the norms' and the activation's
  // outputs, no GEMM again.
  static RecomputeOps selective() { return {true, false, false, false, true}; }
  // "all": every op above (the block still keeps its input, x1 and the norms' statistics, which
  // model.recompute = "full" drops too).
  static RecomputeOps all() { return {true, true, true, true, true}; }
};

// The ops of either.
RecomputeOps operator|(RecomputeOps a, const RecomputeOps& b);
// Every layer's ops united.
RecomputeOps united(const std::vector<RecomputeOps>& per_layer);

// The ops of a list of names (norm, qkv, attn, mlp_in, mlp_act, and the sets selective, all; none
// adds nothing), united. An Error names `key` and the unknown name.
RecomputeOps recompute_ops_of(const std::vector<std::string>& names, const std::string& key);
// One entry of model.recompute_ops_layers: names joined by '+' ("norm+qkv"), or "none".
RecomputeOps recompute_ops_of(const std::string& joined, const std::string& key);
// The names of ops, '+'-joined in the order above; "none" when empty.
std::string recompute_ops_name(const RecomputeOps& ops);

// One entry per layer of the model: `layers` (model.recompute_ops_layers) when not empty, one per
// layer of the n_layer, else every layer `all` (model.recompute_ops). An Error names the key, the
// layer and the value at fault.
std::vector<RecomputeOps> recompute_ops_policy(const std::vector<std::string>& all,
                                               const std::vector<std::string>& layers, int64_t n_layer);

// Per-op recomputation applies to blocks that keep their context (Recompute::None): an Error names
// the first layer with ops whose whole-block policy is Selective or Full. Empty vectors: nothing.
void check_recompute_ops(const std::vector<RecomputeOps>& ops, const std::vector<Recompute>& recompute);

}  // namespace tessera
