// Tests model/config.h: preset resolution, validation messages and the FLOPs formula.
#include "model/config.h"

#include "error_testing.h"
#include "testing.h"

namespace tessera {

TEST(ModelConfig, PresetsSetTheArchitecture) {
  ModelConfig g;
  g.preset = "gpt2";
  g = resolve(g);
  EXPECT_EQ(g.norm, NormKind::LayerNorm);
  EXPECT_EQ(g.mlp, MlpKind::Gelu);
  EXPECT_TRUE(g.tied_embeddings);
  EXPECT_EQ(g.ffn_hidden, 4 * 768);
  ModelConfig l;
  l.preset = "llama";
  l.n_embd = 2048;
  l.n_head = 16;
  l.n_kv_head = 8;
  l = resolve(l);
  EXPECT_EQ(l.norm, NormKind::RmsNorm);
  EXPECT_EQ(l.position, PositionKind::Rope);
  EXPECT_FALSE(l.bias);
  EXPECT_EQ(l.ffn_hidden, 5504);  // 8*2048/3 = 5461, rounded up to a multiple of 64
  EXPECT_EQ(l.kv_heads(), 8);
}

TEST(ModelConfig, ValidationNamesTheField) {
  ModelConfig c;
  c.preset = "bert";
  EXPECT_TRUE(testing::throws_with([&] { resolve(c); }, {"model.preset"}));
  c = ModelConfig{};
  c.n_embd = 100;
  EXPECT_TRUE(testing::throws_with([&] { resolve(c); }, {"model.n_embd"}));
  c = ModelConfig{};
  c.preset = "llama";
  c.n_kv_head = 5;
  EXPECT_TRUE(testing::throws_with([&] { resolve(c); }, {"model.n_kv_head"}));
}

// GPT-2 124M at T = 1024: the matmul count equals the literature's 6N + 12 L T C (Kaplan et al.
// 2020; PaLM appendix B), with N the non-embedding matmul weights plus the (tied) LM head.
TEST(ModelConfig, FlopsPerTokenMatchesSixNPlusAttention) {
  ModelConfig c = resolve(ModelConfig{});
  const double N = 12.0 * (4 * 768.0 * 768 + 2 * 768.0 * 3072) + 768.0 * 50257;
  EXPECT_DOUBLE_EQ(flops_per_token(c, 1024), 6 * N + 12.0 * 12 * 1024 * 768);
}

}  // namespace tessera
