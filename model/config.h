// ModelConfig: the architecture hyper-parameters and the two presets (gpt2, llama). The preset
// decides the architecture choices (norm, MLP, positions, biases, and tying unless lm_head says);
// sizes are free.
#pragma once

#include <cstdint>
#include <string>

#include "model/lora_config.h"

namespace tessera {

enum class NormKind { LayerNorm, RmsNorm };
enum class MlpKind { Gelu, SwiGlu };
enum class PositionKind { Learned, Rope };

// The vision encoder of a vision-language model (model.kind = "vlm", model/vision.h): a ViT over
// patch_size x patch_size patches of image_size x image_size images with `channels` channels,
// n_layer pre-norm blocks of width n_embd (gpt2-style: LayerNorm, GELU, biases) with bidirectional
// attention, then a projector (Linear, GELU, Linear) to the language model's width. A sample's
// image takes the place of its num_patches() placeholder tokens (placeholder_id) in the sequence.
struct VisionConfig {
  int64_t image_size = 32;
  int64_t patch_size = 4;
  int64_t channels = 3;
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_embd = 64;
  int64_t ffn_hidden = 0;        // 0 = 4 n_embd
  int64_t placeholder_id = -1;   // the image placeholder token id; -1 = vocab_size - 1
  int64_t patches_per_side() const { return image_size / patch_size; }
  int64_t num_patches() const { return patches_per_side() * patches_per_side(); }
  int64_t patch_dim() const { return patch_size * patch_size * channels; }
  bool operator==(const VisionConfig&) const = default;
};

struct ModelConfig {
  std::string kind = "gpt";     // gpt | vlm (a vision encoder and projector feed the GPT)
  std::string preset = "gpt2";  // gpt2 | llama
  int64_t vocab_size = 50257;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_kv_head = 0;     // 0 = n_head (no grouping); llama may use fewer (grouped-query attention)
  int64_t n_embd = 768;
  int64_t ffn_hidden = 0;    // 0 = preset default: 4C (gpt2), multiple_of-rounded 8C/3 (llama)
  int64_t max_seq_len = 1024;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  double init_std = 0.02;    // residual output projections use init_std / sqrt(2 n_layer)
  // The output projection: "tied" to the token embedding wte (no lm_head.weight), "untied" (a
  // weight of its own, lm_head.weight), or "preset": gpt2 tied, llama untied.
  std::string lm_head = "preset";

  // Architecture, derived from the preset by resolve().
  NormKind norm = NormKind::LayerNorm;
  MlpKind mlp = MlpKind::Gelu;
  PositionKind position = PositionKind::Learned;
  bool bias = true;
  bool tied_embeddings = true;  // from lm_head

  VisionConfig vision;  // kind = "vlm" only
  LoraConfig lora;      // [lora]: low-rank adapters (model/lora.h); rank 0 = none

  bool is_vlm() const { return kind == "vlm"; }
  int64_t head_dim() const { return n_embd / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  bool operator==(const ModelConfig&) const = default;
};

// "tied" or "untied": what model.lm_head = lm_head means for the preset (gpt2 ties, llama does not).
std::string resolve_lm_head(const std::string& preset, const std::string& lm_head);

// Fills the architecture fields and defaults from the preset and validates the sizes; throws
// tessera::Error naming the offending field.
ModelConfig resolve(ModelConfig cfg);

// The vision encoder's blocks as a ModelConfig for Block (gpt2 preset: LayerNorm, GELU, biases;
// n_layer, n_head, n_embd, ffn_hidden from cfg.vision; norm_eps and init_std from cfg), resolved.
ModelConfig vision_block_config(const ModelConfig& cfg);

// Matmul FLOPs per trained token (forward + backward = 3x forward), for MFU. See docs/architecture.md.
// kind = "vlm": plus one image's vision_flops_per_image spread over the seq_len tokens of its
// sequence (one image per sequence, as LLaVA-style samples and the scenes task have; text-only
// samples, which skip the encoder, are counted as if they had one).
double flops_per_token(const ModelConfig& cfg, int64_t seq_len);

// Matmul FLOPs of one image's trip through the vision tower and projector, forward and backward:
// 3x the forward, less the patch embedding's input gradient (the patches are data, never
// differentiated). 0 for kind = "gpt".
double vision_flops_per_image(const ModelConfig& cfg);

}  // namespace tessera
