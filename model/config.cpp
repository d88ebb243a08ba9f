// Preset resolution, validation and the FLOPs-per-token formula.
#include "model/config.h"

#include "kernels/check.h"

namespace tessera {

namespace {
int64_t llama_ffn_hidden(int64_t c) {
  const int64_t multiple_of = 64;
  int64_t h = (8 * c) / 3;
  return (h + multiple_of - 1) / multiple_of * multiple_of;
}
}  // namespace

std::string resolve_lm_head(const std::string& preset, const std::string& lm_head) {
  if (lm_head != "preset") return lm_head;
  return preset == "gpt2" ? "tied" : "untied";
}

ModelConfig resolve(ModelConfig cfg) {
  if (cfg.preset == "gpt2") {
    cfg.norm = NormKind::LayerNorm;
    cfg.mlp = MlpKind::Gelu;
    cfg.position = PositionKind::Learned;
    cfg.bias = true;
    if (cfg.ffn_hidden == 0) cfg.ffn_hidden = 4 * cfg.n_embd;
  } else if (cfg.preset == "llama") {
    cfg.norm = NormKind::RmsNorm;
    cfg.mlp = MlpKind::SwiGlu;
    cfg.position = PositionKind::Rope;
    cfg.bias = false;
    if (cfg.ffn_hidden == 0) cfg.ffn_hidden = llama_ffn_hidden(cfg.n_embd);
  } else {
    TESSERA_CHECK(false, "model.preset = \"", cfg.preset, "\" is unknown; expected \"gpt2\" or \"llama\"");
  }
  TESSERA_CHECK(cfg.lm_head == "preset" || cfg.lm_head == "tied" || cfg.lm_head == "untied", "model.lm_head = \"",
                cfg.lm_head, "\" is unknown; expected \"preset\", \"tied\" or \"untied\"");
  cfg.tied_embeddings = resolve_lm_head(cfg.preset, cfg.lm_head) == "tied";
  TESSERA_CHECK(cfg.vocab_size > 0, "model.vocab_size must be positive, got ", cfg.vocab_size);
  TESSERA_CHECK(cfg.n_layer > 0, "model.n_layer must be positive, got ", cfg.n_layer);
  TESSERA_CHECK(cfg.n_head > 0, "model.n_head must be positive, got ", cfg.n_head);
  TESSERA_CHECK(cfg.n_embd > 0 && cfg.n_embd % cfg.n_head == 0, "model.n_embd = ", cfg.n_embd,
                " must be a positive multiple of model.n_head = ", cfg.n_head);
  TESSERA_CHECK(cfg.kv_heads() > 0 && cfg.n_head % cfg.kv_heads() == 0, "model.n_kv_head = ", cfg.n_kv_head,
                " must divide model.n_head = ", cfg.n_head);
  TESSERA_CHECK(cfg.preset == "llama" || cfg.kv_heads() == cfg.n_head,
                "model.n_kv_head (grouped-query attention) is a llama option; gpt2 uses n_kv_head = n_head");
  TESSERA_CHECK(cfg.position != PositionKind::Rope || cfg.head_dim() % 2 == 0, "rotary embedding needs an even head ",
                "dimension, got n_embd / n_head = ", cfg.head_dim());
  TESSERA_CHECK(cfg.max_seq_len > 0, "model.max_seq_len must be positive, got ", cfg.max_seq_len);
  TESSERA_CHECK(cfg.ffn_hidden > 0, "model.ffn_hidden must be positive, got ", cfg.ffn_hidden);
  TESSERA_CHECK(cfg.norm_eps > 0, "model.norm_eps must be positive, got ", cfg.norm_eps);
  validate_lora(cfg.lora, cfg.preset);
  TESSERA_CHECK(cfg.kind == "gpt" || cfg.kind == "vlm", "model.kind = \"", cfg.kind,
                "\" is unknown; expected \"gpt\" or \"vlm\"");
  if (cfg.is_vlm()) {
    VisionConfig& v = cfg.vision;
    TESSERA_CHECK(v.image_size > 0, "vision.image_size must be positive, got ", v.image_size);
    TESSERA_CHECK(v.patch_size > 0 && v.image_size % v.patch_size == 0, "vision.patch_size = ", v.patch_size,
                  " must divide vision.image_size = ", v.image_size);
    TESSERA_CHECK(v.channels > 0, "vision.channels must be positive, got ", v.channels);
    TESSERA_CHECK(v.n_layer > 0, "vision.n_layer must be positive, got ", v.n_layer);
    TESSERA_CHECK(v.n_head > 0 && v.n_embd > 0 && v.n_embd % v.n_head == 0, "vision.n_embd = ", v.n_embd,
                  " must be a positive multiple of vision.n_head = ", v.n_head);
    if (v.ffn_hidden == 0) v.ffn_hidden = 4 * v.n_embd;
    TESSERA_CHECK(v.ffn_hidden > 0, "vision.ffn_hidden must be positive, got ", v.ffn_hidden);
    if (v.placeholder_id == -1) v.placeholder_id = cfg.vocab_size - 1;
    TESSERA_CHECK(v.placeholder_id >= 0 && v.placeholder_id < cfg.vocab_size, "vision.placeholder_id = ",
                  v.placeholder_id, " is outside the vocabulary [0, ", cfg.vocab_size, ")");
    TESSERA_CHECK(v.num_patches() <= cfg.max_seq_len, "an image's ", v.num_patches(),
                  " placeholder tokens ((vision.image_size / vision.patch_size)^2) exceed model.max_seq_len = ",
                  cfg.max_seq_len);
  }
  return cfg;
}

ModelConfig vision_block_config(const ModelConfig& cfg) {
  ModelConfig v;
  v.preset = "gpt2";
  v.vocab_size = 1;
  v.n_layer = cfg.vision.n_layer;
  v.n_head = cfg.vision.n_head;
  v.n_embd = cfg.vision.n_embd;
  v.ffn_hidden = cfg.vision.ffn_hidden > 0 ? cfg.vision.ffn_hidden : 4 * cfg.vision.n_embd;
  v.max_seq_len = cfg.vision.num_patches();
  v.norm_eps = cfg.norm_eps;
  v.init_std = cfg.init_std;
  return resolve(v);
}

double flops_per_token(const ModelConfig& cfg, int64_t seq_len) {
  const double C = static_cast<double>(cfg.n_embd);
  const double kv = static_cast<double>(cfg.kv_heads() * cfg.head_dim());
  const double F = static_cast<double>(cfg.ffn_hidden);
  const double mlp_mats = cfg.mlp == MlpKind::SwiGlu ? 3.0 : 2.0;
  // Weights each token multiplies (2 FLOPs per multiply-add): q, k, v, proj, MLP, and the LM head.
  double matmul_params = cfg.n_layer * (C * C + 2 * C * kv + C * C + mlp_mats * C * F) + C * cfg.vocab_size;
  // Attention scores and weighted sum: q·k and p·v over all T keys per query (the full square,
  // not halved for the causal mask, as in the PaLM/Megatron convention).
  double attention = cfg.n_layer * 2.0 * static_cast<double>(seq_len) * C;
  double forward = 2.0 * matmul_params + 2.0 * attention;
  // backward costs twice the forward
  return 3.0 * forward + vision_flops_per_image(cfg) / static_cast<double>(seq_len);
}

double vision_flops_per_image(const ModelConfig& cfg) {
  if (!cfg.is_vlm()) return 0.0;
  const ModelConfig v = vision_block_config(cfg);
  const double P = static_cast<double>(cfg.vision.num_patches()), K = static_cast<double>(cfg.vision.patch_dim());
  const double W = static_cast<double>(v.n_embd), F = static_cast<double>(v.ffn_hidden);
  const double C = static_cast<double>(cfg.n_embd), Lv = static_cast<double>(v.n_layer);
  // Per patch: the patch embedding, each block's q, k, v, proj and MLP (gpt2 blocks), the projector.
  const double patch = K * W, blocks = Lv * (4.0 * W * W + 2.0 * W * F), projector = W * C + C * C;
  // Bidirectional attention over the image's P patches: q k^T and p v, the full P x P square.
  const double attention = Lv * 2.0 * P * P * W;
  const double forward = 2.0 * P * (patch + blocks + projector) + 2.0 * attention;
  return 3.0 * forward - 2.0 * P * patch;  // no gradient for the patches themselves
}

}  // namespace tessera
