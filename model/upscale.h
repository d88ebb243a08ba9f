// Depth up-scaling (docs/upscaling.md): growing a trained model deeper. A method is a mapping from
// each layer of the grown model to the source layer(s) it starts from plus an init rule
// (layer_mapping: pure, on layer indices); LayerUpscaler turns it into the grown model's tensors,
// one at a time, from a callback that reads source tensors by name, so no caller needs the whole
// model in memory. Embeddings, the final norm and the LM head are carried over unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace tessera {

// How a new layer is initialized from its source layer(s) a (and b).
enum class LayerInit {
  Copy,     // layer a's tensors, bit for bit
  Expand,   // layer a's, with the residual output projections (attn.proj, mlp.proj/down and their
            // biases) zero: the block is the identity (LLaMA Pro block expansion)
  Average,  // the element-wise mean of layers a and b: (x_a + x_b) * 0.5
  Fuse,     // optimal-transport fusion: b's heads (as kv groups) and MLP units aligned to a's, then averaged
};

struct LayerSource {
  LayerInit init = LayerInit::Copy;
  int64_t a = 0;
  int64_t b = -1;  // Average and Fuse only
  bool operator==(const LayerSource&) const = default;
};

// The request, as `tessera upscale` takes it. Zero / empty means "not given".
struct UpscaleOptions {
  std::string method{};     // solar | stack | interleave | expand | average | ot
  int64_t layers = 0;       // the grown depth
  int64_t factor = 0;       // stack: copies of the layer list (default 2)
  int64_t overlap = -1;     // solar: layers dropped from each copy (default n/4 rounded)
  int64_t every = 0;        // inserting methods: a new layer after every k-th slot (default 1)
  std::string position{};   // inserting methods with --layers: top | bottom | uniform (default)
  double sinkhorn_eps = 0;  // ot: 0 = exact assignment, > 0 = Sinkhorn-regularized soft alignment
  bool align_data = false;  // ot: costs from activations on a few batches (activation_features), not weights
  int64_t align_batches = 0;  // ot --align-data: batches to run (0 = the default, 4)
};

// The methods, in the order docs/upscaling.md lists them.
const std::vector<std::string>& upscale_methods();

// The grown model's layers, first to last, for a source of n_source layers. Throws tessera::Error
// ("upscale: ...") for an unknown method, an option the method does not take, or a depth it cannot
// give (e.g. solar with --layers 13, interleave asked for more than 2n layers).
//   solar m:        0 .. n-m-1, then m .. n-1                         (2(n - m) layers)
//   stack k:        0 .. n-1, k times                                  (k n)
//   interleave:     each chosen layer i followed by a copy of i         (n + d, d <= n)
//   expand:         each chosen layer i followed by Expand(i)           (n + d, d <= n)
//   average / ot:   between chosen neighbours i, i+1 a new Average/Fuse(i, i+1)  (n + d, d <= n - 1)
// The chosen slots: --every k: slots k-1, 2k-1, ...; --layers N: d = N - n slots at the top, the
// bottom, or spread uniformly (slot j of d = floor((j+1) S / d) - 1 of S slots); default every 1.
std::vector<LayerSource> layer_mapping(int64_t n_source, const UpscaleOptions& options);

// "0 1 2 3 2 3 4 5", "0 expand(0) 1 expand(1)", "0 avg(0,1) 1", "0 ot(0,1) 1": one token per layer.
std::string describe_mapping(const std::vector<LayerSource>& mapping);

// The inverse of describe_mapping: "0 expand(0) 1 avg(1,2) 2" -> the layers. Throws tessera::Error
// ("upscale: ...") naming a token it cannot read.
std::vector<LayerSource> parse_mapping(const std::string& text);

// Which layers of a grown model were carried over from its source (train.freeze = "original"): a
// Copy layer that is the first copy of its source layer (the lowest grown index that copies it).
// New are every Expand, Average and Fuse layer and every later Copy of a source layer already
// carried over (solar's second copies of the overlap, stack's repeats, interleave's duplicates).
std::vector<bool> original_layers(const std::vector<LayerSource>& mapping);

// A whole source tensor by its parameter name ("blocks.2.attn.q.weight"), row-major.
using TensorFetch = std::function<std::vector<float>(const std::string& name)>;

// How layer b is aligned to layer a (ot): new query head h <- b's head heads[h], kv head g <- b's
// kv head kv_heads[g] (a head moves with its kv group), MLP unit u <- b's unit units[u]; or, soft
// (Sinkhorn), unit u <- F * sum_v plan[u F + v] * b's unit v.
struct BlockAlignment {
  std::vector<int64_t> heads, kv_heads, units;
  std::vector<double> plan;  // (F, F) row-major; empty for an exact alignment
};

// Per-unit feature vectors of one block, (n, dim) row-major each: what alignment costs compare
// (squared distances between a unit of block a and one of block b).
struct UnitFeatures {
  std::vector<float> heads;     // (H, dim): query heads
  std::vector<float> kv_heads;  // (KV, dim): key/value heads; empty = no kv term in a group's cost
  std::vector<float> mlp;       // (F, dim): MLP hidden units
};

// From the weights: query heads = their q rows (and bias) and output-projection columns; kv heads
// = their k and v rows (and biases); MLP units = input rows (fc with bias, or gate and up) and
// output columns (proj / down).
UnitFeatures weight_features(const ModelConfig& cfg, const TensorFetch& fetch);

// ot --align-data: for each Fuse layer of `mapping` (by grown index), the features of its two
// source blocks a and b from their activations when both run on the same inputs, block a's input
// in the source model, over `batches` of token ids (B, T) each: query heads = their q (after RoPE)
// and attention output over every token, kv heads = their k and v, MLP units = their activation
// (the down projection's input). One process, the whole source model (params by name).
std::map<int64_t, std::pair<UnitFeatures, UnitFeatures>> activation_features(
    const ModelConfig& cfg, const TensorFetch& params, const std::vector<LayerSource>& mapping,
    const std::vector<std::vector<int32_t>>& batches, int64_t B, int64_t T);

// Aligns block b to block a from their features (align_blocks's rules).
BlockAlignment align_features(const ModelConfig& cfg, const UnitFeatures& a, const UnitFeatures& b,
                              double sinkhorn_eps);

// Aligns block b to block a from their weights (a_fetch("attn.q.weight") is layer a's tensor).
// Heads: an exact assignment of kv groups, whose cost is their k and v distance plus the best
// matching of their query heads (q rows and output-projection columns); MLP units: cost = the
// squared distance of their input rows (fc / gate, up, with bias) and output columns (proj / down),
// exact (sinkhorn_eps = 0) or Sinkhorn. The residual stream's basis is never permuted.
BlockAlignment align_blocks(const ModelConfig& cfg, const TensorFetch& a_fetch, const TensorFetch& b_fetch,
                            double sinkhorn_eps);

// Tensor `suffix` ("mlp.fc.weight") of block b, in the order of block a under the alignment.
std::vector<float> apply_alignment(const ModelConfig& cfg, const BlockAlignment& al, const std::string& suffix,
                                   const std::vector<float>& b_tensor);

// The grown model's tensors from the source's. The source config must be resolved.
class LayerUpscaler {
 public:
  // The mapping of options (layer_mapping), and its Sinkhorn eps for Fuse layers.
  LayerUpscaler(const ModelConfig& source, const UpscaleOptions& options);
  // An explicit mapping.
  LayerUpscaler(const ModelConfig& source, std::vector<LayerSource> mapping, double sinkhorn_eps = 0);

  const ModelConfig& source() const { return source_; }
  const ModelConfig& target() const { return target_; }
  const std::vector<LayerSource>& mapping() const { return mapping_; }

  // Parameter `name` of the grown model (a global name: "blocks.7.mlp.fc.weight", "wte.weight"),
  // from the source parameters.
  std::vector<float> parameter(const std::string& name, const TensorFetch& params);
  // One optimizer moment of parameter `name` (--carry-optimizer), from the source's moment of the
  // same kind (moment(name) is the source parameter's): copied as the parameter is, zero where
  // Expand zeroes the parameter, averaged (after the same alignment, for Fuse) where it is averaged.
  std::vector<float> moment(const std::string& name, const TensorFetch& params, const TensorFetch& moment);
  // ot --align-data: the features of each Fuse layer's pair (activation_features), used instead of
  // the weights' for the layers present.
  void set_features(std::map<int64_t, std::pair<UnitFeatures, UnitFeatures>> by_layer) { features_ = std::move(by_layer); }

 private:
  // The tensor `name` of the grown model from the source's `values` (parameters or one moment); the
  // alignment of a Fuse layer always comes from the parameters.
  std::vector<float> produce(const std::string& name, const TensorFetch& params, const TensorFetch& values);
  const BlockAlignment& alignment(int64_t layer, const TensorFetch& params);
  ModelConfig source_, target_;
  std::vector<LayerSource> mapping_;
  double sinkhorn_eps_;
  std::map<int64_t, BlockAlignment> alignments_;  // per Fuse layer of the grown model, made once
  std::map<int64_t, std::pair<UnitFeatures, UnitFeatures>> features_;
};

// "blocks.7.mlp.fc.weight" -> {7, "mlp.fc.weight"}; {-1, name} for a tensor outside the blocks.
std::pair<int64_t, std::string> split_block_name(const std::string& name);

// Whether Expand zeroes this block tensor ("attn.proj.weight", "attn.proj.bias", "mlp.proj.weight",
// "mlp.proj.bias", "mlp.down.weight").
bool zeroed_by_expand(const std::string& suffix);

}  // namespace tessera
