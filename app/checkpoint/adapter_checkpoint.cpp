// Opening an adapters-only LoRA checkpoint together with its base.
#include "app/checkpoint/adapter_checkpoint.h"

#include "app/freeze.h"
#include "app/lora.h"
#include "kernels/check.h"

namespace tessera {

bool is_adapters_only(const AttrMap& lora_record) {
  const auto it = lora_record.find(kLoraCheckpointKey);
  return it != lora_record.end() && std::holds_alternative<std::string>(it->second) &&
         std::get<std::string>(it->second) == "adapters";
}

std::unique_ptr<CheckpointReader> open_model_checkpoint(const std::string& path, MPI_Comm comm) {
  auto reader = std::make_unique<CheckpointReader>(path, comm);
  const GroupAttributes& groups = reader->group_attributes();
  const auto it = groups.find(kLoraGroup);
  if (it == groups.end() || !is_adapters_only(it->second)) return reader;
  const std::string base = string_attr(it->second, "base");
  TESSERA_CHECK(!base.empty(), "[lora]: ", path, " is an adapters-only checkpoint (lora.checkpoint = \"adapters\") "
                "that names no base checkpoint: its base tensors are in no file");
  lora_check_base(path, it->second, comm);  // exists, same checksum; errors name both files
  reader->use_model_base(std::make_unique<CheckpointReader>(base, comm));
  return reader;
}

void set_lora_checkpoint_mode(AttrMap& lora_record, const std::string& mode, const std::string& resumed_from) {
  TESSERA_CHECK(mode != "adapters" || !string_attr(lora_record, "base").empty(), "lora.checkpoint = \"adapters\": ",
                resumed_from.empty() ? std::string("this run's base") : "the base of " + resumed_from,
                " was drawn from train.seed, so no file holds it; an adapters-only checkpoint needs its base in a "
                "file: start the LoRA run from one with checkpoint.init_from, or use lora.checkpoint = \"full\"");
  lora_record[kLoraCheckpointKey] = mode;
}

}  // namespace tessera
