// Tests model.activation_compression in the GPT (model/gpt.h Block, model/compression_policy.h):
// against the same model without compression, on both presets,
// - "none" given per layer is bitwise the model without the argument;
// - only the weight gradients of the Linears whose inputs are compressed (q, k, v and the MLP's
//   layers) change: every other gradient (norms, biases, embeddings, the attention projection, whose
//   input stays exact) and the loss are bitwise those of the uncompressed run, since a compressed
//   input is read only by its layer's dW GEMM;
// - those weight gradients, per parameter group (the layer name across blocks), stay within the
//   relative errors documented in docs/training.md "Compression" (int8, bf16, lowrank at r = 4),
//   and lowrank at a rank above the tensors' rank is exact to fp32 rounding;
// - "bf16" under mixed precision (train.dtype = "bf16": every GEMM rounds its inputs to bf16) is
//   bitwise "none": the dW GEMM rounds the restored input to the value it already holds;
// - a compressing layer that recomputes is refused, naming the layer.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "error_testing.h"
#include "kernels/allocator.h"
#include "model/compression_policy.h"
#include "model/gpt.h"
#include "testing.h"

namespace tessera {
namespace {

using testing::kCpu;

ModelConfig small_config(const std::string& preset) {
  ModelConfig c;
  c.preset = preset;
  c.vocab_size = 53;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = preset == "llama" ? 2 : 0;
  c.n_embd = 32;
  c.ffn_hidden = 48;
  c.max_seq_len = 16;
  return c;
}

struct StepResult {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;  // by parameter name
};

StepResult train_step(const ModelConfig& cfg, const std::vector<ActivationCompression>& compression, bool bf16 = false,
               bool pass_policy = true) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  Gpt gpt = pass_policy ? Gpt(cfg, ps, {}, {}, {}, {}, compression) : Gpt(cfg, ps);
  ps.finalize();
  if (bf16) ps.enable_compute_copy(DType::BF16);
  ps.initialize(kCpu, 5);
  ps.refresh_compute_copy(kCpu);
  const int64_t B = 3, T = 16;
  auto tokens = testing::random_ids({B, T}, static_cast<int32_t>(cfg.vocab_size), 1);
  auto targets = testing::random_ids({B, T}, static_cast<int32_t>(cfg.vocab_size), 2);
  GptCtx ctx;
  gpt.forward(kCpu, ctx, alloc, tokens.t(), targets.t());
  StepResult r;
  r.loss = read_loss_sums(kCpu, ctx.loss_sums).mean();
  gpt.backward(kCpu, ctx, alloc, 1.0 / static_cast<double>(B * T));
  for (int id = 0; id < ps.size(); ++id) {
    const Tensor g = ps.grad(id);
    r.grads[ps.entry(id).spec.name].assign(g.ptr<float>(), g.ptr<float>() + g.numel());
  }
  return r;
}

std::vector<ActivationCompression> every_layer(CompressionMethod m, int64_t rank = kDefaultCompressionRank) {
  return std::vector<ActivationCompression>(2, {m, rank});
}

// A weight whose layer reads a compressed input: q, k, v (ln1's output) and the MLP's layers
// (ln2's output, the activation).
bool reads_compressed_input(const std::string& name) {
  for (const char* layer : {".attn.q.weight", ".attn.k.weight", ".attn.v.weight", ".mlp.fc.weight", ".mlp.proj.weight",
                            ".mlp.gate.weight", ".mlp.up.weight", ".mlp.down.weight"})
    if (name.size() > std::string(layer).size() && name.rfind(layer) == name.size() - std::string(layer).size())
      return true;
  return false;
}

// "blocks.1.attn.q.weight" -> "attn.q.weight": the group across blocks.
std::string group_of(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return name;
  return name.substr(name.find('.', 7) + 1);
}

// |a - b| / |b| per group, over the group's parameters.
std::map<std::string, double> group_errors(const StepResult& got, const StepResult& want) {
  std::map<std::string, std::pair<double, double>> sums;
  for (const auto& [name, w] : want.grads) {
    const std::vector<float>& g = got.grads.at(name);
    auto& [num, den] = sums[group_of(name)];
    for (size_t i = 0; i < w.size(); ++i) {
      num += (static_cast<double>(g[i]) - w[i]) * (static_cast<double>(g[i]) - w[i]);
      den += static_cast<double>(w[i]) * w[i];
    }
  }
  std::map<std::string, double> out;
  for (const auto& [group, s] : sums) out[group] = std::sqrt(s.first / s.second);
  return out;
}

class GptCompressionTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GptCompressionTest, NoneIsTheModelWithoutCompression) {
  const ModelConfig cfg = small_config(GetParam());
  const StepResult plain = train_step(cfg, {}, false, /*pass_policy=*/false);
  const StepResult none = train_step(cfg, every_layer(CompressionMethod::None));
  EXPECT_EQ(none.loss, plain.loss);
  for (const auto& [name, g] : plain.grads) EXPECT_EQ(none.grads.at(name), g) << name;
}

struct Bound {
  CompressionMethod method;
  int64_t rank;
  double max_error;  // per group, for the weights that read a compressed input
  double min_error;  // and at least this (the method loses something)
};

TEST_P(GptCompressionTest, OnlyTheCompressedInputsWeightGradientsChangeWithinTheirBounds) {
  const ModelConfig cfg = small_config(GetParam());
  const StepResult exact = train_step(cfg, {});
  // Bounds ~3x the worst group measured on these models (docs/training.md, "Compression").
  for (const Bound& b : {Bound{CompressionMethod::Int8, 0, 2.5e-2, 1e-4}, Bound{CompressionMethod::Bf16, 0, 5e-3, 1e-5},
                         Bound{CompressionMethod::LowRank, 4, 1.0, 5e-2}, Bound{CompressionMethod::LowRank, 64, 1e-5, 0}}) {
    const std::string what = std::string(compression_name(b.method)) + " r=" + std::to_string(b.rank);
    const StepResult run = train_step(cfg, every_layer(b.method, b.rank));
    EXPECT_EQ(run.loss, exact.loss) << what << ": the forward reads the exact tensors";
    const std::map<std::string, double> errors = group_errors(run, exact);
    for (const auto& [name, g] : exact.grads)
      if (!reads_compressed_input(name)) {
        EXPECT_EQ(run.grads.at(name), g) << what << ": " << name;
      }
    for (const auto& [group, e] : errors) {
      if (!reads_compressed_input("blocks.0." + group)) continue;
      EXPECT_LE(e, b.max_error) << what << ": " << group;
      EXPECT_GE(e, b.min_error) << what << ": " << group;
      RecordProperty(what + " " + group, std::to_string(e));
    }
  }
}

TEST_P(GptCompressionTest, Bf16UnderMixedPrecisionIsBitwiseNone) {
  const ModelConfig cfg = small_config(GetParam());
  const StepResult none = train_step(cfg, {}, /*bf16=*/true);
  const StepResult bf16 = train_step(cfg, every_layer(CompressionMethod::Bf16), /*bf16=*/true);
  EXPECT_EQ(bf16.loss, none.loss);
  for (const auto& [name, g] : none.grads) EXPECT_EQ(bf16.grads.at(name), g) << name;
  // and it is not the f32 run's: the GEMMs really rounded.
  EXPECT_NE(train_step(cfg, {}).grads.at("blocks.0.attn.q.weight"), none.grads.at("blocks.0.attn.q.weight"));
}

TEST_P(GptCompressionTest, APerLayerPolicyCompressesOnlyItsLayers) {
  const ModelConfig cfg = small_config(GetParam());
  const StepResult exact = train_step(cfg, {});
  const StepResult run = train_step(cfg, compression_policy("none", {"none", "int8"}, 16, 2));
  for (const auto& [name, g] : exact.grads) {
    if (name.rfind("blocks.1.", 0) == 0 && reads_compressed_input(name))
      EXPECT_NE(run.grads.at(name), g) << name;
    else
      EXPECT_EQ(run.grads.at(name), g) << name;
  }
}

TEST_P(GptCompressionTest, ACompressingLayerThatRecomputesIsRefused) {
  const ModelConfig cfg = small_config(GetParam());
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  EXPECT_TRUE(testing::throws_with(
      [&] {
        Gpt(cfg, ps, {Recompute::None, Recompute::Selective}, {}, {}, {}, every_layer(CompressionMethod::Int8));
      },
      {"model.activation_compression = \"int8\" on layer 1", "selective"}));
}

INSTANTIATE_TEST_SUITE_P(Presets, GptCompressionTest, ::testing::Values("gpt2", "llama"));

// model/compression_policy.h: the three keys into one entry per layer, and what it refuses.
TEST(CompressionPolicy, OneEntryPerLayer) {
  const auto all = compression_policy("int8", {}, 8, 3);
  ASSERT_EQ(all.size(), 3u);
  for (const ActivationCompression& c : all) EXPECT_EQ(c, (ActivationCompression{CompressionMethod::Int8, 8}));
  const auto mixed = compression_policy("int8", {"none", "lowrank", "bf16"}, 8, 3);
  EXPECT_EQ(mixed[0].method, CompressionMethod::None);
  EXPECT_EQ(mixed[1].method, CompressionMethod::LowRank);
  EXPECT_EQ(mixed[2].method, CompressionMethod::Bf16);
  EXPECT_TRUE(any_compression(mixed));
  EXPECT_FALSE(any_compression(compression_policy("none", {}, 8, 3)));
}

TEST(CompressionPolicy, ErrorsNameTheKeyAndTheValue) {
  EXPECT_TRUE(testing::throws_with([] { compression_policy("fp4", {}, 8, 2); },
                                   {"model.activation_compression = \"fp4\"", "\"int8\""}));
  EXPECT_TRUE(testing::throws_with([] { compression_policy("none", {"int8", "int4"}, 8, 2); },
                                   {"model.activation_compression_layers[1] = \"int4\""}));
  EXPECT_TRUE(testing::throws_with([] { compression_policy("none", {"int8"}, 8, 2); },
                                   {"model.activation_compression_layers has 1 entries", "model.n_layer = 2"}));
  EXPECT_TRUE(testing::throws_with([] { compression_policy("lowrank", {}, 0, 2); },
                                   {"model.activation_compression_rank = 0 must be >= 1"}));
  EXPECT_TRUE(testing::throws_with(
      [] {
        check_compression_policy(compression_policy("bf16", {}, 8, 2), {Recompute::None, Recompute::Full});
      },
      {"model.activation_compression = \"bf16\" on layer 1", "full"}));
}

}  // namespace
}  // namespace tessera
