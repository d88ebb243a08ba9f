// The Hugging Face name tables and config.json in both directions. Reading applies transformers'
// class defaults to absent keys and refuses, by name, every option whose meaning tessera's model
// would not reproduce.
#include "app/checkpoint/hf_model.h"

#include <map>
#include <optional>
#include <regex>

#include "kernels/check.h"

namespace tessera {

// ---- name tables ----

namespace {

std::string src(const std::string& name) { return "/model/" + name; }

void add_gpt2_block(std::vector<HfTensor>& t, int64_t l) {
  const std::string p = "blocks." + std::to_string(l) + ".", h = "transformer.h." + std::to_string(l) + ".";
  t.push_back({h + "ln_1.weight", {src(p + "ln1.weight")}});
  t.push_back({h + "ln_1.bias", {src(p + "ln1.bias")}});
  // Conv1D: y = x W + b with W (in, out), so tessera's Linear (out, in) weights are transposed.
  t.push_back({h + "attn.c_attn.weight", {src(p + "attn.q.weight"), src(p + "attn.k.weight"), src(p + "attn.v.weight")}, true});
  t.push_back({h + "attn.c_attn.bias", {src(p + "attn.q.bias"), src(p + "attn.k.bias"), src(p + "attn.v.bias")}});
  t.push_back({h + "attn.c_proj.weight", {src(p + "attn.proj.weight")}, true});
  t.push_back({h + "attn.c_proj.bias", {src(p + "attn.proj.bias")}});
  t.push_back({h + "ln_2.weight", {src(p + "ln2.weight")}});
  t.push_back({h + "ln_2.bias", {src(p + "ln2.bias")}});
  t.push_back({h + "mlp.c_fc.weight", {src(p + "mlp.fc.weight")}, true});
  t.push_back({h + "mlp.c_fc.bias", {src(p + "mlp.fc.bias")}});
  t.push_back({h + "mlp.c_proj.weight", {src(p + "mlp.proj.weight")}, true});
  t.push_back({h + "mlp.c_proj.bias", {src(p + "mlp.proj.bias")}});
}

// nn.Linear weights are (out, in) as in tessera; RoPE uses the same rotate-half convention, so
// q/k need no permutation.
void add_llama_block(std::vector<HfTensor>& t, int64_t l) {
  const std::string p = "blocks." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
  t.push_back({h + "input_layernorm.weight", {src(p + "ln1.weight")}});
  t.push_back({h + "self_attn.q_proj.weight", {src(p + "attn.q.weight")}});
  t.push_back({h + "self_attn.k_proj.weight", {src(p + "attn.k.weight")}});
  t.push_back({h + "self_attn.v_proj.weight", {src(p + "attn.v.weight")}});
  t.push_back({h + "self_attn.o_proj.weight", {src(p + "attn.proj.weight")}});
  t.push_back({h + "post_attention_layernorm.weight", {src(p + "ln2.weight")}});
  t.push_back({h + "mlp.gate_proj.weight", {src(p + "mlp.gate.weight")}});
  t.push_back({h + "mlp.up_proj.weight", {src(p + "mlp.up.weight")}});
  t.push_back({h + "mlp.down_proj.weight", {src(p + "mlp.down.weight")}});
}

}  // namespace

std::vector<HfTensor> hf_tensor_map(const ModelConfig& cfg) {
  std::vector<HfTensor> t;
  if (cfg.preset == "gpt2") {
    t.push_back({"transformer.wte.weight", {src("wte.weight")}});
    t.push_back({"transformer.wpe.weight", {src("wpe.weight")}});
    for (int64_t l = 0; l < cfg.n_layer; ++l) add_gpt2_block(t, l);
    t.push_back({"transformer.ln_f.weight", {src("ln_f.weight")}});
    t.push_back({"transformer.ln_f.bias", {src("ln_f.bias")}});
  } else if (cfg.preset == "llama") {
    t.push_back({"model.embed_tokens.weight", {src("wte.weight")}});
    for (int64_t l = 0; l < cfg.n_layer; ++l) add_llama_block(t, l);
    t.push_back({"model.norm.weight", {src("ln_f.weight")}});
  } else {
    detail::fail("no Hugging Face mapping for model.preset = \"", cfg.preset, "\"");
  }
  // A tied head is the embedding (HF re-ties it on load and its files leave it out).
  if (!cfg.tied_embeddings) t.push_back({"lm_head.weight", {src("lm_head.weight")}});
  return t;
}

bool hf_ignored_buffer(const std::string& preset, const std::string& name) {
  static const std::regex gpt2(R"(transformer\.h\.\d+\.attn\.(bias|masked_bias))");
  static const std::regex llama(R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
  return std::regex_match(name, preset == "gpt2" ? gpt2 : llama);
}

std::string hf_base_prefix(const std::string& preset) { return preset == "gpt2" ? "transformer." : "model."; }

// ---- config.json, written ----

std::string hf_config_json(const ModelConfig& cfg, int32_t eos_id) {
  // Without bos/eos Hugging Face assumes bos 1 and eos 2 (LLaMA's SentencePiece ids), and
  // generate() stops on whatever token 2 is ("#" in GPT-2's vocabulary).
  nlohmann::ordered_json j;
  if (cfg.preset == "gpt2") {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = cfg.vocab_size;
    j["n_positions"] = cfg.max_seq_len;
    j["n_embd"] = cfg.n_embd;
    j["n_layer"] = cfg.n_layer;
    j["n_head"] = cfg.n_head;
    j["n_inner"] = cfg.ffn_hidden;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = cfg.norm_eps;
  } else {
    TESSERA_CHECK(cfg.preset == "llama", "no Hugging Face config for model.preset = \"", cfg.preset, "\"");
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["vocab_size"] = cfg.vocab_size;
    j["hidden_size"] = cfg.n_embd;
    j["intermediate_size"] = cfg.ffn_hidden;
    j["num_hidden_layers"] = cfg.n_layer;
    j["num_attention_heads"] = cfg.n_head;
    j["num_key_value_heads"] = cfg.kv_heads();
    j["max_position_embeddings"] = cfg.max_seq_len;
    j["rms_norm_eps"] = cfg.norm_eps;
    j["rope_theta"] = cfg.rope_theta;
    j["hidden_act"] = "silu";
  }
  j["tie_word_embeddings"] = cfg.tied_embeddings;
  j["bos_token_id"] = eos_id;
  j["eos_token_id"] = eos_id;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

// ---- config.json, read ----

namespace {

// Reads typed keys of one config.json with transformers' defaults; errors name the source.
class ConfigKeys {
 public:
  ConfigKeys(const Json& j, const std::string& source) : j_(j), source_(source) {}
  bool has(const std::string& key) const { return j_.contains(key); }
  bool is_null(const std::string& key) const { return has(key) && j_.at(key).is_null(); }
  int64_t integer(const std::string& key, int64_t fallback) const { return json_int(j_, key, source_).value_or(fallback); }
  double number(const std::string& key, double fallback) const { return json_number(j_, key, source_).value_or(fallback); }
  bool boolean(const std::string& key, bool fallback) const { return json_bool(j_, key, source_).value_or(fallback); }
  std::string string(const std::string& key, const std::string& fallback) const {
    return json_string(j_, key, source_).value_or(fallback);
  }
  // A key that must hold `want` (its default when absent) for tessera's model to be the same.
  void require_bool(const std::string& key, bool fallback, bool want, const std::string& why) const {
    const bool v = boolean(key, fallback);
    TESSERA_CHECK(v == want, source_, ": \"", key, "\": ", v ? "true" : "false", " is not supported: ", why);
  }
  const std::string& source() const { return source_; }
  const Json& json() const { return j_; }

 private:
  const Json& j_;
  const std::string& source_;
};

void read_gpt2(const ConfigKeys& k, HfModelConfig& out) {
  ModelConfig& m = out.model;
  m.preset = "gpt2";
  // GPT2Config's defaults.
  m.vocab_size = k.integer("vocab_size", 50257);
  m.max_seq_len = k.integer("n_positions", 1024);
  m.n_embd = k.integer("n_embd", 768);
  m.n_layer = k.integer("n_layer", 12);
  m.n_head = k.integer("n_head", 12);
  m.ffn_hidden = k.integer("n_inner", 0);  // null: 4 x n_embd
  m.norm_eps = k.number("layer_norm_epsilon", 1e-5);
  const std::string act = k.string("activation_function", "gelu_new");
  // tessera's GELU is the tanh approximation, which these three names compute.
  TESSERA_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast", k.source(),
                ": \"activation_function\": \"", act, "\" is not supported: tessera's gpt2 uses the tanh GELU "
                "(gelu_new, gelu_pytorch_tanh)");
  k.require_bool("scale_attn_weights", true, true, "tessera scales attention scores by 1/sqrt(head_dim)");
  k.require_bool("scale_attn_by_inverse_layer_idx", false, false,
                 "tessera does not scale attention by the layer index");
  k.require_bool("add_cross_attention", false, false, "tessera's gpt2 has no cross-attention");
  m.lm_head = k.boolean("tie_word_embeddings", true) ? "tied" : "untied";
}

// rope_scaling (transformers 4) or rope_parameters (transformers 5): only the plain rotary
// embedding. Returns rope_theta when rope_parameters gives it.
std::optional<double> check_rope(const ConfigKeys& k) {
  std::optional<double> theta;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!k.has(key) || k.is_null(key)) continue;
    const Json& r = k.json().at(key);
    TESSERA_CHECK(r.is_object(), k.source(), ": \"", key, "\" is ", json_kind(r), ", expected an object");
    const std::string where = k.source() + ": \"" + key + "\"";
    std::string type = json_string(r, "rope_type", where).value_or(json_string(r, "type", where).value_or("default"));
    TESSERA_CHECK(type == "default", k.source(), ": \"", key, "\" has rope_type \"", type,
                  "\", which tessera does not implement (its rotary embedding is the plain one with rope_theta)");
    if (auto t = json_number(r, "rope_theta", where)) theta = *t;
    if (auto f = json_number(r, "partial_rotary_factor", where))
      TESSERA_CHECK(*f == 1.0, where, " has partial_rotary_factor ", *f, ": tessera rotates the whole head");
  }
  return theta;
}

void read_llama(const ConfigKeys& k, HfModelConfig& out, bool mistral) {
  ModelConfig& m = out.model;
  m.preset = "llama";
  // LlamaConfig's defaults, or MistralConfig's where they differ.
  m.vocab_size = k.integer("vocab_size", 32000);
  m.n_embd = k.integer("hidden_size", 4096);
  m.ffn_hidden = k.integer("intermediate_size", mistral ? 14336 : 11008);
  m.n_layer = k.integer("num_hidden_layers", 32);
  m.n_head = k.integer("num_attention_heads", 32);
  // null means n_head; absent means the class default (Mistral's is 8).
  m.n_kv_head = k.has("num_key_value_heads") ? k.integer("num_key_value_heads", 0) : mistral ? 8 : 0;
  m.max_seq_len = k.integer("max_position_embeddings", mistral ? 4096 * 32 : 2048);
  m.norm_eps = k.number("rms_norm_eps", 1e-6);
  m.rope_theta = k.number("rope_theta", 10000.0);
  if (const std::optional<double> theta = check_rope(k)) m.rope_theta = *theta;
  const std::string act = k.string("hidden_act", "silu");
  TESSERA_CHECK(act == "silu" || act == "swish", k.source(), ": \"hidden_act\": \"", act,
                "\" is not supported: tessera's llama MLP is SwiGLU (silu)");
  k.require_bool("attention_bias", false, false, "tessera's llama attention has no biases");
  k.require_bool("mlp_bias", false, false, "tessera's llama MLP has no biases");
  if (k.has("head_dim") && !k.is_null("head_dim")) {
    const int64_t d = k.integer("head_dim", 0);
    TESSERA_CHECK(m.n_head > 0 && d * m.n_head == m.n_embd, k.source(), ": \"head_dim\": ", d,
                  " is not supported: tessera's head dimension is hidden_size / num_attention_heads = ", m.n_embd, " / ",
                  m.n_head);
  }
  m.lm_head = k.boolean("tie_word_embeddings", false) ? "tied" : "untied";
  // Sliding-window attention: within the window, attention is the full causal one.
  const bool has_window = mistral ? !k.is_null("sliding_window") : k.has("sliding_window") && !k.is_null("sliding_window");
  if (has_window && !(k.has("use_sliding_window") && !k.boolean("use_sliding_window", true))) {
    const int64_t w = k.integer("sliding_window", 4096);
    TESSERA_CHECK(w > 0, k.source(), ": \"sliding_window\": ", w, " must be positive");
    if (w < m.max_seq_len) {
      out.notes.push_back("max_seq_len " + std::to_string(w) + " (sliding_window; max_position_embeddings is " +
                          std::to_string(m.max_seq_len) + ", but tessera has no sliding-window attention, which " +
                          "equals full attention up to the window)");
      m.max_seq_len = w;
    }
  }
}

}  // namespace

HfModelConfig hf_model_config(const Json& config, const std::string& source) {
  TESSERA_CHECK(config.is_object(), source, " is ", json_kind(config), ", expected an object");
  const ConfigKeys k(config, source);
  TESSERA_CHECK(!k.has("quantization_config") || k.is_null("quantization_config"), source,
                ": \"quantization_config\" is set: tessera imports unquantized models only (F32, F16, BF16 weights)");
  // The architecture: architectures[0], else the model_type's causal LM.
  std::string arch;
  if (k.has("architectures") && !k.is_null("architectures")) {
    const Json& a = config.at("architectures");
    TESSERA_CHECK(a.is_array() && a.size() == 1 && a[0].is_string(), source,
                  ": \"architectures\" must list one architecture, got ", a.dump());
    arch = a[0].get<std::string>();
  }
  const std::string type = k.string("model_type", "");
  if (arch.empty()) {
    arch = type == "gpt2" ? "GPT2LMHeadModel" : type == "llama" ? "LlamaForCausalLM"
                                              : type == "mistral" ? "MistralForCausalLM" : "";
    TESSERA_CHECK(!arch.empty(), source, ": no \"architectures\", and \"model_type\": \"", type,
                  "\" is not one tessera imports (gpt2, llama, mistral)");
  }
  const std::map<std::string, std::string> types = {
      {"GPT2LMHeadModel", "gpt2"}, {"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}};
  const auto want = types.find(arch);
  TESSERA_CHECK(want != types.end(), source, ": \"architectures\": [\"", arch, "\"] is not supported: tessera imports "
                "GPT2LMHeadModel, LlamaForCausalLM and MistralForCausalLM");
  TESSERA_CHECK(type.empty() || type == want->second, source, ": \"model_type\": \"", type, "\" does not match ", arch,
                " (expected \"", want->second, "\")");
  HfModelConfig out;
  out.architecture = arch;
  if (want->second == "gpt2") {
    read_gpt2(k, out);
  } else {
    read_llama(k, out, want->second == "mistral");
  }
  try {
    out.model = resolve(out.model);
  } catch (const Error& e) {
    detail::fail(source, " describes a model tessera cannot build: ", e.what());
  }
  return out;
}

}  // namespace tessera
