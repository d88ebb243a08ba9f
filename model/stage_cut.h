// Where a pipeline cuts the model: what each part costs (a block's FLOPs and activation bytes; the
// embedding and the LM head + loss weighed as what they are, not as blocks) and the cut into
// pp x vpp chunks of consecutive blocks that balances those costs, so that the first and last
// stages are not overloaded; parallel.pp_layers replaces the cut by hand.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/gpt.h"

namespace tessera {

// One part's cost for one sequence of seq_len tokens (tp = 1, no recomputation: the cut is the
// same for every layout).
struct PartCost {
  double flops = 0;             // matmul FLOPs of its forward and backward (3x forward), as flops_per_token
  double activation_bytes = 0;  // what its forward keeps for backward (f32), as model_memory
};

struct LayerCosts {
  PartCost embedding;  // token (and learned position) embedding: no matmul, one (T, C) output
  PartCost block;      // one transformer block
  PartCost head;       // final norm, LM head and loss: the LM head's matmul and the (T, V) logits
  // kind = "vlm": the vision tower and projector, on the chunk with the embedding, for the
  // sequence's one image (vision_flops_per_image; its context as model_memory counts it). Zero for
  // kind = "gpt".
  PartCost vision;
  // A part's weight in blocks: the mean of its FLOPs and its activation bytes, each relative to a
  // block's, so a block weighs 1; at T = 1024 GPT-2 124M's head weighs 4.3 blocks and its embedding
  // 0.03 (printed by tests/model/test_stage_cut.cpp).
  double weight(const PartCost& p) const;
  // A chunk's weight: its blocks, plus the embedding (and the vision tower) and the head where it
  // holds them.
  double weight(const StageSpec& chunk) const;
};

LayerCosts layer_costs(const ModelConfig& cfg, int64_t seq_len);

// The model cut into pp x vpp chunks of consecutive blocks, in model order (chunk 0 holds the
// embedding, the last the head). Chunk c runs on pipeline rank c % pp as its virtual chunk c / pp
// (Megatron's interleaved layout: rank r holds chunks r, r + pp, r + 2 pp, ...; vpp = 1: chunk r is
// stage r).
//   pp_layers empty: cut by cost: every chunk gets one block, then each further block goes to the
//     chunk whose weight it raises least (water-filling), which minimises the heaviest chunk's
//     weight (tested against every possible cut) and fills the lighter ones evenly. A
//     vision-language model's (kind = "vlm") chunk 0 starts with none when vpp = 1 and pp > 1: with
//     a tower heavy enough it keeps none, the encoder's own stage (the tower, projector and
//     embedding).
//   pp_layers given (parallel.pp_layers): pp entries, stage r's blocks, summing to n_layer, each a
//     multiple of vpp; rank r's vpp chunks hold pp_layers[r] / vpp blocks each. Each entry is at
//     least 1, except a vision-language model's stage 0 with vpp = 1, which may hold 0.
// Throws tessera::Error naming parallel.pp, parallel.vpp, parallel.pp_layers and model.n_layer when
// the split is impossible (fewer blocks than chunks, ...).
std::vector<StageSpec> cut_stages(const ModelConfig& cfg, int64_t seq_len, int64_t pp, int64_t vpp = 1,
                                  const std::vector<int64_t>& pp_layers = {});

// The chunks pipeline rank `rank` holds (of cut_stages' pp x vpp), its virtual chunk 0 first.
std::vector<StageSpec> rank_chunks(const std::vector<StageSpec>& chunks, int64_t pp, int64_t rank);

}  // namespace tessera
