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

// model.lm_head: the preset's head unless it says otherwise; the tied model has no lm_head.weight.
TEST(ModelConfig, LmHeadOverridesThePresetsTying) {
  ModelConfig c;
  c.preset = "gpt2";
  c.lm_head = "untied";
  EXPECT_FALSE(resolve(c).tied_embeddings);
  c.preset = "llama";
  c.lm_head = "tied";
  EXPECT_TRUE(resolve(c).tied_embeddings);
  c.lm_head = "preset";
  EXPECT_FALSE(resolve(c).tied_embeddings);
  EXPECT_EQ(resolve_lm_head("gpt2", "preset"), "tied");
  EXPECT_EQ(resolve_lm_head("llama", "preset"), "untied");
  EXPECT_EQ(resolve_lm_head("gpt2", "untied"), "untied");
  c.lm_head = "shared";
  EXPECT_TRUE(testing::throws_with([&] { resolve(c); }, {"model.lm_head = \"shared\" is unknown"}));
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

// The quickstart VLM's encoder (configs/quickstart-vl.toml: 16x16 images in 4x4 patches, so P = 16
// patches of K = 48 values; 2 blocks of width W = 64, MLP F = 256; the language model's C = 96),
// counted by hand: per patch the patch embedding K W = 3,072, the blocks 2 (4 W^2 + 2 W F) = 98,304,
// the projector W C + C^2 = 15,360, so 2 P (116,736) = 3,735,552 FLOPs, plus attention
// 2 x 2 blocks x P^2 W = 131,072: a forward of 3,866,624; training 3 x that less the patches' own
// gradient 2 P K W = 98,304: 11,501,568. flops_per_token adds it over a sequence of 25 tokens.
TEST(ModelConfig, VisionFlopsPerImageEqualTheHandCount) {
  ModelConfig c;
  c.kind = "vlm";
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 96;
  c.vocab_size = 15;
  c.max_seq_len = 25;
  c.vision.image_size = 16;
  c.vision.patch_size = 4;
  c.vision.channels = 3;
  c.vision.n_layer = 2;
  c.vision.n_head = 4;
  c.vision.n_embd = 64;
  c = resolve(c);
  EXPECT_DOUBLE_EQ(vision_flops_per_image(c), 11501568.0);
  ModelConfig text = c;
  text.kind = "gpt";
  EXPECT_DOUBLE_EQ(vision_flops_per_image(text), 0.0);
  EXPECT_DOUBLE_EQ(flops_per_token(c, 25), flops_per_token(text, 25) + 11501568.0 / 25);
}

}  // namespace tessera
