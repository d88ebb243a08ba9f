// `tessera ckpt export --adapters-only`: a LoRA run's adapters as a PEFT adapter folder
// (adapter_config.json and adapter_model.safetensors) that peft's PeftModel.from_pretrained loads on
// the Hugging Face model exported from the base. Key decision: the tensors keep tessera's layout
// (A (r, in), B (out, r): peft's Linear and Conv1D adapters alike), only their names change; a
// tessera layer with no Hugging Face module of its own (GPT-2's q, k, v, fused in c_attn) is refused.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/safetensors.h"
#include "model/config.h"

namespace tessera {

// The PEFT target module of a block-relative tessera layer: llama attn.q -> "q_proj", attn.k ->
// "k_proj", attn.v -> "v_proj", attn.proj -> "o_proj", mlp.gate/up/down -> "gate_proj"/"up_proj"/
// "down_proj"; gpt2 attn.proj -> "attn.c_proj", mlp.fc -> "mlp.c_fc", mlp.proj -> "mlp.c_proj"
// (qualified: both projections are c_proj). "" for gpt2 attn.q/k/v (Hugging Face's fused c_attn).
std::string peft_target_module(const std::string& preset, const std::string& layer);

// adapter_config.json for cfg's [lora]: peft_type LORA, r, lora_alpha, lora_dropout, the target
// modules, task_type CAUSAL_LM, fan_in_fan_out (true for GPT-2's Conv1D layers) and
// base_model_name_or_path = base_model.
std::string peft_adapter_config_json(const ModelConfig& cfg, const std::string& base_model);

// The adapters of cfg as PEFT names them ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
// in block then layer order; `read` gives a tessera parameter's values by name
// ("blocks.0.attn.q.lora_A.weight"). Throws tessera::Error naming `source` when a targeted layer has
// no PEFT module (gpt2 attn.q/k/v: suggests --merge-lora) or cfg has no adapters.
std::vector<SafetensorsEntry> peft_adapter_tensors(const ModelConfig& cfg, const std::string& source,
                                                   const std::function<std::vector<float>(const std::string&)>& read);

struct PeftExportSummary {
  int64_t tensors = 0;
  int64_t parameters = 0;
  std::string base_model;  // as written in adapter_config.json
};
// Writes out_dir/adapter_config.json and adapter_model.safetensors (creating out_dir) for the LoRA
// checkpoint `reader`. base_model "" = the base its /lora record names (checkpoint.init_from; ""
// when the base was drawn from train.seed).
PeftExportSummary export_peft_adapter(const CheckpointReader& reader, const std::string& out_dir,
                                      const std::string& base_model = "");

}  // namespace tessera
