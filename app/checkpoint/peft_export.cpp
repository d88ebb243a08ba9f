// PEFT adapter export: tessera's adapter names mapped to peft's, the values as they are (peft's
// lora_A / lora_B weights are (r, in) / (out, r) like tessera's, for Conv1D layers too), and the
// adapter_config.json peft reads.
#include "app/checkpoint/peft_export.h"

#include <cmath>
#include <filesystem>
#include <map>

#include "app/checkpoint/atomic_file.h"
#include "app/checkpoint/hf_export.h"
#include "app/checkpoint/hf_model.h"
#include "app/lora.h"
#include "data/json.h"
#include "kernels/check.h"
#include "model/lora.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;

// The adapted layers of one block, in lora_layer_names order: (tessera name, PEFT module).
std::vector<std::pair<std::string, std::string>> adapted_layers(const ModelConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& name : lora_layer_names(cfg.preset))
    if (lora_targets_layer(cfg.lora, "blocks.0." + name)) out.emplace_back(name, peft_target_module(cfg.preset, name));
  return out;
}

// The PEFT module's path under the causal LM: "transformer.h.3." (gpt2), "model.layers.3." (llama).
std::string peft_block_path(const ModelConfig& cfg, int64_t block) {
  return hf_base_prefix(cfg.preset) + (cfg.preset == "gpt2" ? "h." : "layers.") + std::to_string(block) + ".";
}

}  // namespace

std::string peft_target_module(const std::string& preset, const std::string& layer) {
  static const std::map<std::string, std::string> llama = {
      {"attn.q", "q_proj"},       {"attn.k", "k_proj"}, {"attn.v", "v_proj"},        {"attn.proj", "o_proj"},
      {"mlp.gate", "gate_proj"}, {"mlp.up", "up_proj"}, {"mlp.down", "down_proj"}};
  static const std::map<std::string, std::string> gpt2 = {
      {"attn.proj", "attn.c_proj"}, {"mlp.fc", "mlp.c_fc"}, {"mlp.proj", "mlp.c_proj"}};
  const auto& table = preset == "llama" ? llama : gpt2;
  const auto it = table.find(layer);
  return it == table.end() ? "" : it->second;
}

std::string peft_adapter_config_json(const ModelConfig& cfg, const std::string& base_model) {
  nlohmann::ordered_json targets = nlohmann::ordered_json::array();
  for (const auto& [name, module] : adapted_layers(cfg)) targets.push_back(module);
  nlohmann::ordered_json j;
  j["base_model_name_or_path"] = base_model;
  j["bias"] = "none";
  j["fan_in_fan_out"] = cfg.preset == "gpt2";  // GPT-2's Conv1D stores W as (in, out): peft's flag for it
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  if (cfg.lora.alpha == std::floor(cfg.lora.alpha) && std::abs(cfg.lora.alpha) < 1e15) {
    j["lora_alpha"] = static_cast<int64_t>(cfg.lora.alpha);  // as peft writes an integer alpha
  } else {
    j["lora_alpha"] = cfg.lora.alpha;
  }
  j["lora_dropout"] = cfg.lora.dropout;
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = cfg.lora.rank;
  j["rank_pattern"] = nlohmann::ordered_json::object();
  j["alpha_pattern"] = nlohmann::ordered_json::object();
  j["target_modules"] = targets;
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_rslora"] = false;
  return j.dump(2) + "\n";
}

std::vector<SafetensorsEntry> peft_adapter_tensors(const ModelConfig& cfg, const std::string& source,
                                                   const std::function<std::vector<float>(const std::string&)>& read) {
  TESSERA_CHECK(cfg.lora.enabled(), "--adapters-only: ", source, " holds no LoRA adapters (its stored config has no "
                "[lora] rank > 0)");
  const auto layers = adapted_layers(cfg);
  for (const auto& [name, module] : layers)
    TESSERA_CHECK(!module.empty(), "--adapters-only: ", source, " adapts ", name, " (lora.targets), which a Hugging "
                  "Face GPT-2 has no module of its own for: it fuses q, k and v into one Conv1D, attn.c_attn, and "
                  "tessera's separate q/k/v adapters are no PEFT adapter of it. Export with --merge-lora instead (a "
                  "plain model with W + (alpha / r) B A), or adapt attn.proj, mlp.fc and mlp.proj only");
  std::map<std::string, Shape> shapes;
  for (const auto& [path, shape] : model_tensor_shapes(cfg)) shapes[path.substr(7)] = shape;  // "/model/"
  std::vector<SafetensorsEntry> out;
  for (int64_t b = 0; b < cfg.n_layer; ++b) {
    for (const auto& [name, module] : layers) {
      // The module's path in the block: the target itself, or llama's attention under self_attn.
      const std::string in_block = cfg.preset == "llama" ? (name.rfind("attn.", 0) == 0 ? "self_attn." : "mlp.") + module
                                                         : module;
      const std::string hf = "base_model.model." + peft_block_path(cfg, b) + in_block;
      for (const char* ab : {"lora_A", "lora_B"}) {
        const std::string tessera = "blocks." + std::to_string(b) + "." + name + "." + ab + ".weight";
        TESSERA_CHECK(shapes.count(tessera), "internal: no parameter ", tessera, " in the model of ", source);
        out.push_back({hf + "." + ab + ".weight", shapes.at(tessera), [read, tessera] { return read(tessera); }});
      }
    }
  }
  return out;
}

PeftExportSummary export_peft_adapter(const CheckpointReader& reader, const std::string& out_dir,
                                      const std::string& base_model) {
  require_text_model(reader, "tessera ckpt export --adapters-only");
  const ModelConfig cfg = model_config_of(reader);
  check_shapes(reader, model_tensor_shapes(cfg));
  PeftExportSummary summary;
  summary.base_model = base_model;
  if (summary.base_model.empty()) {
    const auto& groups = reader.group_attributes();
    if (auto g = groups.find(kLoraGroup); g != groups.end())
      if (auto b = g->second.find("base"); b != g->second.end())
        if (const auto* s = std::get_if<std::string>(&b->second)) summary.base_model = *s;
  }
  const std::vector<SafetensorsEntry> tensors =
      peft_adapter_tensors(cfg, reader.path(), [&reader](const std::string& name) { return reader.read_all("/model/" + name); });
  summary.tensors = static_cast<int64_t>(tensors.size());
  for (const SafetensorsEntry& e : tensors) summary.parameters += e.shape.numel();
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  TESSERA_CHECK(!ec, "cannot create the directory ", out_dir, ": ", ec.message());
  write_safetensors((fs::path(out_dir) / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  AtomicFile f((fs::path(out_dir) / "adapter_config.json").string());
  f.write(peft_adapter_config_json(cfg, summary.base_model));
  f.commit();
  return summary;
}

}  // namespace tessera
