// Which blocks store their saved GEMM inputs compressed (model.activation_compression,
// model.activation_compression_layers, model.activation_compression_rank; the methods are
// kernels/activation_compression.h's): one ActivationCompression per layer of the whole model, as
// the Gpt constructor and the memory model take it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/activation_compression.h"

namespace tessera {

enum class Recompute;  // model/gpt.h

// The rank model.activation_compression_rank takes when not set.
inline constexpr int64_t kDefaultCompressionRank = 16;

// One entry per layer: `layers` (model.activation_compression_layers) when it is not empty, one
// name per layer of the n_layer; otherwise every layer `all` (model.activation_compression).
// rank: model.activation_compression_rank (>= 1). An Error names the key, the layer and the value
// at fault (an unknown name, a list of the wrong length, a rank below 1).
std::vector<ActivationCompression> compression_policy(const std::string& all, const std::vector<std::string>& layers,
                                                      int64_t rank, int64_t n_layer);

// Compression applies to the tensors a block keeps between forward and backward: a block that
// recomputes (selective or full) keeps none of them (model/gpt.h Recompute). An Error names the
// first layer whose compression is active under a recompute policy other than None; recompute
// empty = None everywhere.
void check_compression_policy(const std::vector<ActivationCompression>& compression,
                              const std::vector<Recompute>& recompute);

// Whether any layer compresses.
bool any_compression(const std::vector<ActivationCompression>& compression);

}  // namespace tessera
