// lora.checkpoint = "adapters" (docs/finetuning.md, "Adapter-only checkpoints"): a LoRA run's
// checkpoints hold the /lora record, the adapters, their moments and the run state, but not the
// frozen base tensors. Whoever opens such a checkpoint for its model (resuming, generate,
// `ckpt export`) reads the base tensors from the base checkpoint the record names
// (checkpoint.init_from), after checking its checksum.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "app/checkpoint/checkpoint_io.h"

namespace tessera {

// /lora@checkpoint: "full" (every /model tensor in the file) or "adapters".
inline constexpr const char* kLoraCheckpointKey = "checkpoint";

// Whether a /lora record (app/lora.h) marks an adapters-only checkpoint.
bool is_adapters_only(const AttrMap& lora_record);

// Opens path for its model: a checkpoint with every /model tensor as it is; an adapters-only one with
// its base attached (CheckpointReader::use_model_base) once lora_check_base (app/lora.h) has
// verified it. Refused, naming both files, when the base is missing or changed since the adapters
// were trained, and when the record names no base. Collective over comm.
std::unique_ptr<CheckpointReader> open_model_checkpoint(const std::string& path, MPI_Comm comm);

// The run's lora.checkpoint mode ("full" or "adapters") into its /lora record, which its
// checkpoints carry. "adapters" needs a base file in the record: refused, naming the checkpoint
// resumed (resumed_from, "" on a fresh start), when the base was drawn from train.seed.
void set_lora_checkpoint_mode(AttrMap& lora_record, const std::string& mode, const std::string& resumed_from);

}  // namespace tessera
