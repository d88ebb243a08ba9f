// [lora]: low-rank adapters on a frozen base (model/lora.h, docs/finetuning.md "LoRA"; the section's
// keys are LoraSection's in app/config.h). What a LoRA run freezes: every parameter of the base
// model, so that only the adapters train.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <mpi.h>

#include "app/checkpoint/checkpoint_io.h"
#include "data/sampler.h"
#include "model/lora.h"
#include "model/lora_config.h"


namespace tessera {

// Whether a global parameter name is an adapter's ("blocks.0.attn.q.lora_A.weight").
bool is_lora_parameter(const std::string& name);

// The names (of `names`, the whole model's) a LoRA run freezes: every one but the adapters'.
std::set<std::string> lora_frozen_base(const std::vector<std::string>& names);

// A LoRA run's checkpoints carry /lora: the base checkpoint it started from (checkpoint.init_from,
// by absolute path; "" when the base was drawn from train.seed) and a checksum of that file's base
// model tensors. A resume needs the base as it was: lora_check_base refuses otherwise.
inline constexpr const char* kLoraGroup = "/lora";

// FNV-1a 64 over every /model tensor of the checkpoint at path that is not an adapter's, in path
// order: the name's bytes, then the float32 values' bytes. Collective over comm (every rank reads).
uint64_t lora_base_checksum(const std::string& path, MPI_Comm comm);

// The /lora record of a run whose base is init_from ("" for none), with the adapters' settings.
AttrMap lora_record(const std::string& init_from, const LoraConfig& cfg, MPI_Comm comm);

// Resuming `checkpoint` with [lora]: its /lora record (record empty: none) must be there and its
// base must still exist with the same checksum. Throws tessera::Error naming the checkpoint, the
// base and what differs. Collective over comm.
void lora_check_base(const std::string& checkpoint, const AttrMap& record, MPI_Comm comm);

// Adapter dropout (lora.dropout > 0) for this data-parallel rank's micro-batch `micro` of optimizer
// step `step`: train.seed, the step, and the index of the micro-batch's first sequence in the
// step's global batch (dp_rank x global_batch / dp + micro x micro_batch, as the sampler deals
// them), the same sequence's index on every layout; Gpt::forward adds the positions. Nothing
// with lora.dropout = 0 (or no [lora]).
std::optional<LoraDropout> lora_dropout_at(const LoraConfig& cfg, int64_t seed, int64_t step, const BatchLayout& layout,
                                           int64_t micro);

// The weight at weight_path ("/model/blocks.0.attn.q.weight", (out, in)) merged with its adapter:
// W + scale B A, accumulated in double, when the file holds "<layer>.lora_A.weight" and
// "lora_B.weight" beside it; W as stored otherwise (a layer without an adapter).
std::vector<float> lora_merged_weight(const CheckpointReader& reader, const std::string& weight_path, double scale);

}  // namespace tessera
