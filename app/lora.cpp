// What a LoRA run freezes: the base model, every parameter that is not an adapter's.
#include "app/lora.h"

namespace tessera {

bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

std::set<std::string> lora_frozen_base(const std::vector<std::string>& names) {
  std::set<std::string> frozen;
  for (const std::string& n : names)
    if (!is_lora_parameter(n)) frozen.insert(n);
  return frozen;
}

}  // namespace tessera
