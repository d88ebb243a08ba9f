// Tests model/stage_cut.h: the part costs agree with the model's own FLOP and activation counts;
// the cut by cost is the best possible (its heaviest chunk weighs as little as in any cut, found by
// trying every cut) on GPT-2 124M and a LLaMA 1B, and unloads the stage with the LM head; the
// hand-made split of parallel.pp_layers; interleaved (vpp) chunks; impossible splits refused.
#include "model/stage_cut.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "error_testing.h"
#include "model/memory.h"

namespace tessera {
namespace {

using testing::error_of;

ModelConfig gpt2_124m() {
  ModelConfig c;  // the defaults are GPT-2 small: 12 layers, 12 heads, 768 channels, 50257 tokens
  c.max_seq_len = 1024;
  return resolve(c);
}

ModelConfig llama_1b() {  // configs/llama-1b.toml
  ModelConfig c;
  c.preset = "llama";
  c.vocab_size = 32000;
  c.n_layer = 22;
  c.n_head = 32;
  c.n_kv_head = 4;
  c.n_embd = 2048;
  c.ffn_hidden = 5632;
  c.max_seq_len = 2048;
  return resolve(c);
}

std::vector<int64_t> blocks_of(const std::vector<StageSpec>& chunks) {
  std::vector<int64_t> out;
  for (const StageSpec& s : chunks) out.push_back(s.layers());
  return out;
}

double heaviest(const LayerCosts& costs, const std::vector<StageSpec>& chunks) {
  double w = 0;
  for (const StageSpec& s : chunks) w = std::max(w, costs.weight(s));
  return w;
}

// The chunks are consecutive, cover [0, n_layer), and hold the embedding first and the head last;
// every chunk holds a block (but chunk 0 with first_empty: a VLM's encoder stage).
void expect_valid_cut(const std::vector<StageSpec>& chunks, int64_t n_layer, bool first_empty = false) {
  ASSERT_FALSE(chunks.empty());
  int64_t next = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    EXPECT_EQ(chunks[c].first_layer, next) << "chunk " << c;
    EXPECT_GE(chunks[c].layers(), c == 0 && first_empty ? 0 : 1) << "chunk " << c;
    EXPECT_EQ(chunks[c].embedding, c == 0) << "chunk " << c;
    EXPECT_EQ(chunks[c].head, c + 1 == chunks.size()) << "chunk " << c;
    next = chunks[c].end_layer;
  }
  EXPECT_EQ(next, n_layer);
}

// The lightest heaviest-chunk weight over every cut of n_layer blocks into `chunks` chunks (with
// first_empty, also those whose chunk 0 holds no block).
double best_possible(const LayerCosts& costs, int64_t n_layer, int64_t chunks, bool first_empty = false) {
  double best = 1e300;
  std::vector<int64_t> blocks;
  std::function<void(int64_t)> place = [&](int64_t left) {
    if (static_cast<int64_t>(blocks.size()) == chunks - 1) {
      if (left < 1) return;
      blocks.push_back(left);
      std::vector<StageSpec> specs;
      int64_t first = 0;
      for (size_t c = 0; c < blocks.size(); ++c) {
        specs.push_back({first, first + blocks[c], c == 0, c + 1 == blocks.size()});
        first += blocks[c];
      }
      best = std::min(best, heaviest(costs, specs));
      blocks.pop_back();
      return;
    }
    for (int64_t n = blocks.empty() && first_empty ? 0 : 1;
         n <= left - (chunks - 1 - static_cast<int64_t>(blocks.size())); ++n) {
      blocks.push_back(n);
      place(left - n);
      blocks.pop_back();
    }
  };
  place(n_layer);
  return best;
}

std::string show(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Prints the cut and its weights (in blocks), and checks it against every other cut.
void check_cut(const std::string& name, const ModelConfig& cfg, int64_t T, int64_t pp) {
  const LayerCosts costs = layer_costs(cfg, T);
  const std::vector<StageSpec> cut = cut_stages(cfg, T, pp);
  ASSERT_EQ(static_cast<int64_t>(cut.size()), pp);
  expect_valid_cut(cut, cfg.n_layer);
  std::vector<StageSpec> even;
  for (int64_t s = 0; s < pp; ++s) even.push_back(StageSpec::split(cfg.n_layer, pp, s));
  double lightest = 1e300;
  std::printf("%s, T = %ld, %ld stages: embedding %.3f, head %.3f blocks\n  cut  %s, weights", name.c_str(),
              static_cast<long>(T), static_cast<long>(pp), costs.weight(costs.embedding), costs.weight(costs.head),
              show(blocks_of(cut)).c_str());
  for (const StageSpec& s : cut) {
    std::printf(" %.2f", costs.weight(s));
    lightest = std::min(lightest, costs.weight(s));
  }
  std::printf(" (spread: heaviest / lightest %.3f)\n  even %s, heaviest %.2f\n", heaviest(costs, cut) / lightest,
              show(blocks_of(even)).c_str(), heaviest(costs, even));
  EXPECT_NEAR(heaviest(costs, cut), best_possible(costs, cfg.n_layer, pp), 1e-12 * heaviest(costs, cut)) << name;
  // The head's stage is the one the even split overloads: the cut gives it fewer blocks.
  EXPECT_LT(cut.back().layers(), even.back().layers()) << name;
  EXPECT_LT(heaviest(costs, cut), heaviest(costs, even)) << name;
}

// The parts add up to the model's counts: FLOPs to flops_per_token (the MFU count) and activation
// bytes to model_memory's activations (checked against the allocator in test_memory.cpp).
TEST(StageCut, PartCostsAddUpToTheModelsCounts) {
  for (const ModelConfig& cfg : {gpt2_124m(), llama_1b()}) {
    const int64_t T = 512;
    const LayerCosts c = layer_costs(cfg, T);
    const double L = static_cast<double>(cfg.n_layer);
    const double flops = c.embedding.flops + L * c.block.flops + c.head.flops;
    EXPECT_NEAR(flops, flops_per_token(cfg, T) * T, 1e-12 * flops) << cfg.preset;
    const double bytes = c.embedding.activation_bytes + L * c.block.activation_bytes + c.head.activation_bytes;
    EXPECT_EQ(bytes, 4.0 * static_cast<double>(model_memory(cfg, {1, T, 1, false}).activations)) << cfg.preset;
    EXPECT_EQ(c.weight(c.block), 1.0);
    EXPECT_EQ(c.embedding.flops, 0.0);  // a lookup, no matmul: it weighs by its output alone
    EXPECT_LT(c.weight(c.embedding), 0.1) << cfg.preset;
    EXPECT_GT(c.weight(c.head), 1.0) << cfg.preset;
  }
}

// kind = "vlm": the vision tower (a ViT-B/16 at 224 x 224: 196 patches, 12 blocks of 768, before
// GPT-2 124M, LLaVA-style) weighs on the chunk with the embedding: its parts add up to the model's
// counts with one image per sequence, and the cut gives stage 0 fewer blocks than it gives the
// same GPT without the encoder, still the best possible cut.
TEST(StageCut, VisionTowerWeighsOnTheFirstStage) {
  ModelConfig vlm = gpt2_124m();
  vlm.kind = "vlm";
  vlm.vision.image_size = 224;
  vlm.vision.patch_size = 16;
  vlm.vision.n_layer = 12;
  vlm.vision.n_head = 12;
  vlm.vision.n_embd = 768;
  vlm = resolve(vlm);
  const int64_t T = 1024;
  const LayerCosts c = layer_costs(vlm, T);
  const double L = static_cast<double>(vlm.n_layer);
  const double flops = c.embedding.flops + c.vision.flops + L * c.block.flops + c.head.flops;
  EXPECT_NEAR(flops, flops_per_token(vlm, T) * T, 1e-12 * flops);
  ModelMemoryLayout one_image{1, T, 1, false};
  one_image.images = 1;
  const double bytes =
      c.embedding.activation_bytes + c.vision.activation_bytes + L * c.block.activation_bytes + c.head.activation_bytes;
  EXPECT_EQ(bytes, 4.0 * static_cast<double>(model_memory(vlm, one_image).activations));
  std::printf("ViT-B/16 at 224 before GPT-2 124M, T = %ld: the vision tower weighs %.2f blocks\n",
              static_cast<long>(T), c.weight(c.vision));
  EXPECT_GT(c.weight(c.vision), 1.0);
  EXPECT_EQ(layer_costs(gpt2_124m(), T).weight(layer_costs(gpt2_124m(), T).vision), 0.0);
  for (int64_t pp : {2, 4}) {
    const std::vector<StageSpec> with = cut_stages(vlm, T, pp), without = cut_stages(gpt2_124m(), T, pp);
    expect_valid_cut(with, vlm.n_layer);
    std::printf("  %ld stages: %s (the GPT alone: %s)\n", static_cast<long>(pp), show(blocks_of(with)).c_str(),
                show(blocks_of(without)).c_str());
    EXPECT_LT(with.front().layers(), without.front().layers()) << pp << " stages";
    EXPECT_NEAR(heaviest(c, with), best_possible(c, vlm.n_layer, pp), 1e-12 * heaviest(c, with)) << pp << " stages";
  }
}

// A ViT-B/16 like the above, parameterised by its image size, before GPT-2 124M.
ModelConfig vit_b16_before_gpt2(int64_t image_size) {
  ModelConfig vlm = gpt2_124m();
  vlm.kind = "vlm";
  vlm.vision.image_size = image_size;
  vlm.vision.patch_size = 16;
  vlm.vision.n_layer = 12;
  vlm.vision.n_head = 12;
  vlm.vision.n_embd = 768;
  return resolve(vlm);
}

// The encoder as a stage of its own: a VLM's stage 0 may hold no block (the tower, projector and
// embedding alone), and the cut gives it none exactly when that is the best balance. At 384 x 384
// (576 patches) the tower weighs more than a quarter of the model: over 4 stages its stage keeps
// no block; at 224 x 224 (196 patches) over 2 or 4 stages, or over 2 stages at 384, it is better
// off with some. Each cut is the best over every cut, those with an empty stage 0 included; with
// vpp > 1 (rank 0's other chunks would be empty) and for a text GPT every chunk keeps a block.
TEST(StageCut, HeavyVisionTowerGetsAStageOfItsOwn) {
  const int64_t T = 1024;
  struct Case {
    int64_t image_size, pp;
    bool empty;  // stage 0 holds no block
  };
  for (const Case& k : {Case{384, 4, true}, Case{384, 2, false}, Case{224, 4, false}, Case{224, 2, false}}) {
    const ModelConfig vlm = vit_b16_before_gpt2(k.image_size);
    const LayerCosts c = layer_costs(vlm, T);
    const std::vector<StageSpec> cut = cut_stages(vlm, T, k.pp);
    std::printf("ViT-B/16 at %ld (tower %.2f blocks) before GPT-2 124M, T = %ld, %ld stages: %s, weights",
                static_cast<long>(k.image_size), c.weight(c.vision), static_cast<long>(T), static_cast<long>(k.pp),
                show(blocks_of(cut)).c_str());
    for (const StageSpec& s : cut) std::printf(" %.2f", c.weight(s));
    std::printf("\n");
    expect_valid_cut(cut, vlm.n_layer, true);
    EXPECT_EQ(cut.front().layers() == 0, k.empty) << k.image_size << " over " << k.pp;
    EXPECT_NEAR(heaviest(c, cut), best_possible(c, vlm.n_layer, k.pp, true), 1e-12 * heaviest(c, cut))
        << k.image_size << " over " << k.pp;
    if (k.empty) {  // strictly better than any cut that gives stage 0 a block
      EXPECT_LT(heaviest(c, cut), best_possible(c, vlm.n_layer, k.pp) - 0.5);
    }
  }
  const ModelConfig heavy = vit_b16_before_gpt2(384);
  const std::vector<StageSpec> interleaved = cut_stages(heavy, T, 2, 2);
  expect_valid_cut(interleaved, heavy.n_layer);
  EXPECT_NEAR(heaviest(layer_costs(heavy, T), interleaved), best_possible(layer_costs(heavy, T), heavy.n_layer, 4),
              1e-9);
  expect_valid_cut(cut_stages(gpt2_124m(), T, 12), 12);
}

// parallel.pp_layers: [0, ...] for a VLM (stage 0 the encoder's), refused for a text GPT, for a
// zero anywhere else and with vpp > 1.
TEST(StageCut, PpLayersMayGiveTheEncoderAStageOfItsOwn) {
  const ModelConfig vlm = vit_b16_before_gpt2(224);
  const std::vector<StageSpec> cut = cut_stages(vlm, 1024, 2, 1, {0, 12});
  EXPECT_EQ(blocks_of(cut), (std::vector<int64_t>{0, 12}));
  expect_valid_cut(cut, 12, true);
  EXPECT_TRUE(cut[0].embedding && !cut[0].head && cut[1].head && !cut[1].embedding);
  EXPECT_EQ(blocks_of(cut_stages(vlm, 1024, 3, 1, {0, 7, 5})), (std::vector<int64_t>{0, 7, 5}));
  EXPECT_EQ(error_of([&] { cut_stages(gpt2_124m(), 1024, 2, 1, {0, 12}); }),
            "parallel.pp_layers: stage 0 holds 0 blocks; each stage needs a positive multiple of parallel.vpp = 1");
  EXPECT_EQ(error_of([&] { cut_stages(vlm, 1024, 3, 1, {6, 0, 6}); }),
            "parallel.pp_layers: stage 1 holds 0 blocks; each stage needs a positive multiple of parallel.vpp = 1 "
            "(only stage 0, the vision encoder's, may hold none)");
  EXPECT_EQ(error_of([&] { cut_stages(vlm, 1024, 2, 2, {0, 12}); }),
            "parallel.pp_layers: stage 0 holds 0 blocks (the vision encoder's own stage), which needs "
            "parallel.vpp = 1, not 2: its virtual chunks would hold no block");
  // The stage itself: a text GPT's empty stage is refused by the model too.
  EXPECT_NO_THROW(resolve_stage({0, 0, true, false}, vlm));
  EXPECT_EQ(error_of([&] { resolve_stage({0, 0, true, false}, gpt2_124m()); }),
            "the pipeline stage with layers [0, 0) holds no block; every stage needs at least one");
  EXPECT_EQ(error_of([&] { resolve_stage({3, 3, false, false}, vlm); }),
            "the pipeline stage with layers [3, 3) holds no block; every stage needs at least one (only a "
            "vision-language model's first stage may hold none: the vision tower, projector and embedding alone)");
}

TEST(StageCut, Gpt2_124mOverFourStagesIsTheBestCut) {
  check_cut("GPT-2 124M", gpt2_124m(), 1024, 4);
  check_cut("GPT-2 124M", gpt2_124m(), 1024, 3);
}

TEST(StageCut, Llama1bOverFourStagesIsTheBestCut) {
  check_cut("LLaMA 1B", llama_1b(), 2048, 4);
  check_cut("LLaMA 1B", llama_1b(), 2048, 8);
}

TEST(StageCut, PpLayersOverridesTheCut) {
  const ModelConfig cfg = gpt2_124m();
  const std::vector<StageSpec> cut = cut_stages(cfg, 1024, 4, 1, {2, 4, 5, 1});
  EXPECT_EQ(blocks_of(cut), (std::vector<int64_t>{2, 4, 5, 1}));
  expect_valid_cut(cut, 12);
  EXPECT_EQ(error_of([&] { cut_stages(cfg, 1024, 4, 1, {6, 6}); }),
            "parallel.pp_layers has 2 entries, but parallel.pp = 4: give one block count per stage");
  EXPECT_EQ(error_of([&] { cut_stages(cfg, 1024, 2, 1, {6, 5}); }),
            "parallel.pp_layers sums to 11 blocks, but model.n_layer = 12");
  EXPECT_EQ(error_of([&] { cut_stages(cfg, 1024, 2, 1, {12, 0}); }),
            "parallel.pp_layers: stage 1 holds 0 blocks; each stage needs a positive multiple of parallel.vpp = 1");
}

// Interleaved: pp x vpp chunks in model order, rank r holding chunks r, r + pp, ...
TEST(StageCut, VirtualChunksInterleaveOverTheRanks) {
  const ModelConfig cfg = gpt2_124m();
  const LayerCosts costs = layer_costs(cfg, 1024);
  const std::vector<StageSpec> cut = cut_stages(cfg, 1024, 2, 2);
  ASSERT_EQ(cut.size(), 4u);
  expect_valid_cut(cut, 12);
  EXPECT_NEAR(heaviest(costs, cut), best_possible(costs, 12, 4), 1e-12);
  const std::vector<StageSpec> rank0 = rank_chunks(cut, 2, 0), rank1 = rank_chunks(cut, 2, 1);
  ASSERT_EQ(rank0.size(), 2u);
  ASSERT_EQ(rank1.size(), 2u);
  EXPECT_EQ(rank0[0].first_layer, cut[0].first_layer);
  EXPECT_EQ(rank0[1].first_layer, cut[2].first_layer);
  EXPECT_EQ(rank1[0].first_layer, cut[1].first_layer);
  EXPECT_EQ(rank1[1].first_layer, cut[3].first_layer);
  EXPECT_TRUE(rank0[0].embedding && !rank0[1].embedding && rank1[1].head && !rank1[0].head);
  // By hand: stage r's blocks split into vpp equal chunks, one per round.
  EXPECT_EQ(blocks_of(cut_stages(cfg, 1024, 2, 3, {6, 6})), (std::vector<int64_t>{2, 2, 2, 2, 2, 2}));
  EXPECT_EQ(blocks_of(cut_stages(cfg, 1024, 2, 2, {8, 4})), (std::vector<int64_t>{4, 2, 4, 2}));
  EXPECT_EQ(error_of([&] { cut_stages(cfg, 1024, 2, 2, {7, 5}); }),
            "parallel.pp_layers: stage 0 holds 7 blocks; each stage needs a positive multiple of parallel.vpp = 2");
}

TEST(StageCut, ImpossibleSplitsAreRefused) {
  const ModelConfig cfg = gpt2_124m();
  EXPECT_EQ(error_of([&] { cut_stages(cfg, 1024, 13); }),
            "parallel.pp x parallel.vpp = 13 x 1 = 13 model chunks need at least one block each, but model.n_layer = 12");
  EXPECT_EQ(error_of([&] { cut_stages(cfg, 1024, 4, 4); }),
            "parallel.pp x parallel.vpp = 4 x 4 = 16 model chunks need at least one block each, but model.n_layer = 12");
  // As many chunks as blocks: one each.
  EXPECT_EQ(blocks_of(cut_stages(cfg, 1024, 12)), std::vector<int64_t>(12, 1));
  EXPECT_EQ(blocks_of(cut_stages(cfg, 1024, 1)), std::vector<int64_t>{12});
  EXPECT_TRUE(cut_stages(cfg, 1024, 1)[0].whole(12));
}

}  // namespace
}  // namespace tessera
