// What the [lora] section asks for (docs/finetuning.md, "LoRA"): low-rank adapters on the linear
// layers a list of targets names, counted in ModelConfig because they are part of the model's
// structure (its parameters, its memory). No dependencies: model/config.h includes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct LoraConfig {
  int64_t rank = 0;      // r: the adapters' inner dimension; 0 = no adapters
  double alpha = 16.0;   // the update is scaled by alpha / r
  double dropout = 0.0;  // on the adapter input, in training only (model/lora.h LoraDropout)
  // Linear layers of every block, named after the block: "attn.q", "attn.k", "attn.v",
  // "attn.proj", "mlp.fc", "mlp.proj" (gpt2), "mlp.gate", "mlp.up", "mlp.down" (llama); globs
  // ("attn.*", "mlp.*") allowed.
  std::vector<std::string> targets = {"attn.q", "attn.v"};

  bool enabled() const { return rank > 0; }
  double scale() const { return alpha / static_cast<double>(rank); }
  bool operator==(const LoraConfig&) const = default;
};

// Throws tessera::Error naming the [lora] key for a rank < 0, alpha <= 0, a dropout outside [0, 1),
// an empty target list, or a target that names no linear layer of the preset (listing them).
// Called by resolve() (model/config.h); defined in model/lora.cpp.
void validate_lora(const LoraConfig& cfg, const std::string& preset);

}  // namespace tessera
