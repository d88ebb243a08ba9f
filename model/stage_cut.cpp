// The pipeline cut: part costs from the FLOP count of flops_per_token and the activation count of
// model_memory, and the water-filling cut over pp x vpp chunks (or the hand-made one of pp_layers).
#include "model/stage_cut.h"

#include <queue>
#include <string>

#include "kernels/check.h"
#include "model/memory.h"

namespace tessera {

namespace {

constexpr double kFloatBytes = 4;

// Block counts in model order -> specs: the embedding on chunk 0 (a VLM's may hold no block: the
// next chunk starts at layer 0 too), the head on the last.
std::vector<StageSpec> specs_of(const std::vector<int64_t>& blocks, const ModelConfig& cfg) {
  std::vector<StageSpec> out;
  int64_t first = 0;
  for (size_t c = 0; c < blocks.size(); ++c) {
    const int64_t end = first + blocks[c];
    out.push_back(resolve_stage(StageSpec{first, end, c == 0, c + 1 == blocks.size()}, cfg));
    first = end;
  }
  return out;
}

// Water-filling: one block per chunk (none for chunk 0 when encoder_stage: a vision-language
// model's first stage may hold the vision tower, projector and embedding alone), then each further
// block to the chunk whose weight after taking it is least (the lowest index on ties). With
// identical blocks this minimises the largest chunk weight: a chunk stops receiving blocks only
// when every other one would end up heavier.
std::vector<int64_t> balanced_blocks(const LayerCosts& costs, int64_t n_layer, int64_t chunks, bool encoder_stage) {
  const double block = costs.weight(costs.block);
  std::vector<double> base(static_cast<size_t>(chunks), 0.0);
  base.front() += costs.weight(costs.embedding) + costs.weight(costs.vision);
  base.back() += costs.weight(costs.head);
  std::vector<int64_t> blocks(static_cast<size_t>(chunks), 1);
  if (encoder_stage) blocks.front() = 0;
  int64_t placed = 0;
  using Next = std::pair<double, int64_t>;  // (weight after one more block, chunk)
  std::priority_queue<Next, std::vector<Next>, std::greater<>> heap;
  for (int64_t c = 0; c < chunks; ++c) {
    heap.push({base[c] + static_cast<double>(blocks[c] + 1) * block, c});
    placed += blocks[c];
  }
  for (int64_t left = n_layer - placed; left > 0; --left) {
    const int64_t c = heap.top().second;
    heap.pop();
    ++blocks[c];
    heap.push({base[c] + static_cast<double>(blocks[c] + 1) * block, c});
  }
  return blocks;
}

// parallel.pp_layers: stage r's blocks split into vpp equal chunks, chunk v pp + r holding one.
// vlm: stage 0 may hold none (the encoder's stage), with vpp = 1.
std::vector<int64_t> blocks_by_hand(const std::vector<int64_t>& pp_layers, int64_t n_layer, int64_t pp, int64_t vpp,
                                    bool vlm) {
  TESSERA_CHECK(static_cast<int64_t>(pp_layers.size()) == pp, "parallel.pp_layers has ", pp_layers.size(),
                " entries, but parallel.pp = ", pp, ": give one block count per stage");
  int64_t sum = 0;
  for (size_t r = 0; r < pp_layers.size(); ++r) {
    if (r == 0 && pp_layers[r] == 0 && vlm && pp > 1) {
      TESSERA_CHECK(vpp == 1, "parallel.pp_layers: stage 0 holds 0 blocks (the vision encoder's own stage), which "
                    "needs parallel.vpp = 1, not ", vpp, ": its virtual chunks would hold no block");
      continue;
    }
    TESSERA_CHECK(pp_layers[r] >= 1 && pp_layers[r] % vpp == 0, "parallel.pp_layers: stage ", r, " holds ",
                  pp_layers[r], " blocks; each stage needs a positive multiple of parallel.vpp = ", vpp,
                  vlm && r > 0 && pp_layers[r] == 0 ? " (only stage 0, the vision encoder's, may hold none)" : "");
    sum += pp_layers[r];
  }
  TESSERA_CHECK(sum == n_layer, "parallel.pp_layers sums to ", sum, " blocks, but model.n_layer = ", n_layer);
  std::vector<int64_t> blocks(static_cast<size_t>(pp * vpp));
  for (int64_t c = 0; c < pp * vpp; ++c) blocks[c] = pp_layers[c % pp] / vpp;
  return blocks;
}

}  // namespace

double LayerCosts::weight(const PartCost& p) const {
  return 0.5 * (p.flops / block.flops + p.activation_bytes / block.activation_bytes);
}

double LayerCosts::weight(const StageSpec& chunk) const {
  return static_cast<double>(chunk.layers()) * weight(block) + (chunk.embedding ? weight(embedding) + weight(vision) : 0.0) +
         (chunk.head ? weight(head) : 0.0);
}

LayerCosts layer_costs(const ModelConfig& cfg, int64_t seq_len) {
  const ModelConfig c = resolve(cfg);
  TESSERA_CHECK(seq_len >= 1, "layer_costs: seq_len = ", seq_len, " must be at least 1");
  const double T = static_cast<double>(seq_len), C = static_cast<double>(c.n_embd);
  const double kv = static_cast<double>(c.kv_heads() * c.head_dim()), F = static_cast<double>(c.ffn_hidden);
  const double mlp_mats = c.mlp == MlpKind::SwiGlu ? 3.0 : 2.0;
  // flops_per_token's terms (docs/architecture.md), per sequence: 3 x forward, 2 FLOPs a multiply-add.
  const double block_forward = 2.0 * T * (C * C + 2 * C * kv + C * C + mlp_mats * C * F) + 2.0 * 2.0 * T * T * C;
  const double head_forward = 2.0 * T * C * static_cast<double>(c.vocab_size);
  const ActivationParts acts = activation_parts(c, {1, seq_len, 1, false});
  LayerCosts costs;
  costs.embedding = {0.0, kFloatBytes * static_cast<double>(acts.embedding)};
  costs.block = {3.0 * block_forward, kFloatBytes * static_cast<double>(acts.block)};
  costs.head = {3.0 * head_forward, kFloatBytes * static_cast<double>(acts.head)};
  if (c.is_vlm()) {
    ModelMemoryLayout one_image{1, seq_len, 1, false};
    one_image.images = 1;
    costs.vision = {vision_flops_per_image(c),
                    kFloatBytes * static_cast<double>(activation_parts(c, one_image).vision)};
  }
  return costs;
}

std::vector<StageSpec> cut_stages(const ModelConfig& cfg, int64_t seq_len, int64_t pp, int64_t vpp,
                                  const std::vector<int64_t>& pp_layers) {
  const ModelConfig c = resolve(cfg);
  TESSERA_CHECK(pp >= 1 && vpp >= 1, "parallel.pp = ", pp, " and parallel.vpp = ", vpp, " must be at least 1");
  TESSERA_CHECK(pp * vpp <= c.n_layer, "parallel.pp x parallel.vpp = ", pp, " x ", vpp, " = ", pp * vpp,
                " model chunks need at least one block each, but model.n_layer = ", c.n_layer);
  // A vision-language model's first stage may hold the vision tower, projector and embedding alone
  // (one chunk per rank: with vpp > 1 its other chunks would hold no block).
  const bool encoder_stage = c.is_vlm() && pp > 1 && vpp == 1;
  const std::vector<int64_t> blocks = pp_layers.empty()
                                          ? balanced_blocks(layer_costs(c, seq_len), c.n_layer, pp * vpp, encoder_stage)
                                          : blocks_by_hand(pp_layers, c.n_layer, pp, vpp, c.is_vlm());
  return specs_of(blocks, c);
}

std::vector<StageSpec> rank_chunks(const std::vector<StageSpec>& chunks, int64_t pp, int64_t rank) {
  const int64_t n = static_cast<int64_t>(chunks.size());
  TESSERA_CHECK(pp >= 1 && n % pp == 0 && rank >= 0 && rank < pp, "rank_chunks: pipeline rank ", rank, " of ", pp,
                " for ", n, " chunks");
  std::vector<StageSpec> out;
  for (int64_t c = rank; c < n; c += pp) out.push_back(chunks[static_cast<size_t>(c)]);
  return out;
}

}  // namespace tessera
