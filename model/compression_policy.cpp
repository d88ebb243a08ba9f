// The per-layer compression policy from the config's three keys, and its check against recomputation.
#include "model/compression_policy.h"

#include "model/gpt.h"

namespace tessera {

std::vector<ActivationCompression> compression_policy(const std::string& all, const std::vector<std::string>& layers,
                                                      int64_t rank, int64_t n_layer) {
  TESSERA_CHECK(rank >= 1, "model.activation_compression_rank = ", rank, " must be >= 1 (the rank r of \"lowrank\")");
  TESSERA_CHECK(layers.empty() || static_cast<int64_t>(layers.size()) == n_layer,
                "model.activation_compression_layers has ", layers.size(), " entries; expected one per layer "
                "(model.n_layer = ", n_layer, ") or none ([] = every layer model.activation_compression)");
  std::vector<ActivationCompression> policy;
  const CompressionMethod every = compression_method(all, "model.activation_compression");
  for (int64_t l = 0; l < n_layer; ++l) {
    const CompressionMethod m =
        layers.empty() ? every
                       : compression_method(layers[static_cast<size_t>(l)],
                                            "model.activation_compression_layers[" + std::to_string(l) + "]");
    policy.push_back({m, rank});
  }
  return policy;
}

void check_compression_policy(const std::vector<ActivationCompression>& compression,
                              const std::vector<Recompute>& recompute) {
  for (size_t l = 0; l < compression.size() && l < recompute.size(); ++l) {
    if (!compression[l].active() || recompute[l] == Recompute::None) continue;
    TESSERA_CHECK(false, "model.activation_compression = \"", compression_name(compression[l].method), "\" on layer ",
                  l, " compresses the inputs a block keeps for its backward, but the layer recomputes (",
                  recompute[l] == Recompute::Full ? "full: model.recompute or model.recompute_layers" : "selective",
                  ") and keeps none of them: use model.recompute = \"none\" for it, or compression \"none\"");
  }
}

bool any_compression(const std::vector<ActivationCompression>& compression) {
  for (const ActivationCompression& c : compression)
    if (c.active()) return true;
  return false;
}

}  // namespace tessera
