// ModelConfig: the architecture hyper-parameters and the two presets (gpt2, llama). The preset
// decides the architecture choices (norm, MLP, positions, biases, tying); sizes are free.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

enum class NormKind { LayerNorm, RmsNorm };
enum class MlpKind { Gelu, SwiGlu };
enum class PositionKind { Learned, Rope };

struct ModelConfig {
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

  // Architecture, derived from the preset by resolve().
  NormKind norm = NormKind::LayerNorm;
  MlpKind mlp = MlpKind::Gelu;
  PositionKind position = PositionKind::Learned;
  bool bias = true;
  bool tied_embeddings = true;

  int64_t head_dim() const { return n_embd / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  bool operator==(const ModelConfig&) const = default;
};

// Fills the architecture fields and defaults from the preset and validates the sizes; throws
// tessera::Error naming the offending field.
ModelConfig resolve(ModelConfig cfg);

// Matmul FLOPs per trained token (forward + backward = 3x forward), for MFU. See docs/architecture.md.
double flops_per_token(const ModelConfig& cfg, int64_t seq_len);

}  // namespace tessera
