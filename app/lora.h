// [lora]: low-rank adapters on a frozen base (model/lora.h, docs/finetuning.md "LoRA"; the section's
// keys are LoraSection's in app/config.h). What a LoRA run freezes: every parameter of the base
// model, so that only the adapters train.
#pragma once

#include <set>
#include <string>
#include <vector>


namespace tessera {

// Whether a global parameter name is an adapter's ("blocks.0.attn.q.lora_A.weight").
bool is_lora_parameter(const std::string& name);

// The names (of `names`, the whole model's) a LoRA run freezes: every one but the adapters'.
std::set<std::string> lora_frozen_base(const std::vector<std::string>& names);

}  // namespace tessera
