// Export of a checkpoint's model to Hugging Face transformers: model.safetensors with HF tensor
// names (GPT2LMHeadModel or LlamaForCausalLM) and config.json. The name mapping is one table per
// preset (docs/checkpoints.md); each HF tensor is a concatenation of tessera tensors along dim 0,
// optionally transposed (GPT-2's Conv1D stores weights as (in, out)).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "app/checkpoint/checkpoint_io.h"
#include "model/config.h"

namespace tessera {

// The model described by the config stored in the checkpoint's /meta ([model] section), with
// vocab_size / max_seq_len = 0 taken from the tensors (wte.weight rows, wpe.weight rows; llama:
// train.seq_len), resolved as the trainer resolves it.
ModelConfig model_config_of(const CheckpointReader& reader);

// Every model parameter's dataset path and global shape for cfg: "/model/<name>".
std::vector<std::pair<std::string, Shape>> model_tensor_shapes(const ModelConfig& cfg);

// One HF tensor: the tessera tensors `sources` (dataset paths) concatenated along dim 0, then
// transposed when `transpose` (2-D only).
struct HfTensor {
  std::string name;
  std::vector<std::string> sources;
  bool transpose = false;
};
// The mapping table for cfg's preset, in HF module order.
std::vector<HfTensor> hf_tensor_map(const ModelConfig& cfg);
// config.json for cfg (a complete JSON document).
std::string hf_config_json(const ModelConfig& cfg);

// A tensor to store in a safetensors file; data() produces its float32 values when written, so
// only one tensor at a time is in memory.
struct SafetensorsEntry {
  std::string name;
  Shape shape;
  std::function<std::vector<float>()> data;
};
// Writes the safetensors format: u64 little-endian header size N, N bytes of JSON (padded with
// spaces so the data starts 8-byte aligned), then the tensors back to back in entry order.
// Written to a fresh exclusive temporary (app/checkpoint/atomic_file.h) and renamed, so a failed export
// leaves no partial file and a file or symlink planted in the directory is never written through.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                       const std::map<std::string, std::string>& metadata);

struct HfExportSummary {
  std::string architecture;  // "GPT2LMHeadModel"
  int64_t tensors = 0;
  int64_t parameters = 0;
};
// Checks the checkpoint's /model against its config (every mismatch listed), then writes
// out_dir/model.safetensors and out_dir/config.json (creating out_dir).
HfExportSummary export_hf_safetensors(const CheckpointReader& reader, const std::string& out_dir);

}  // namespace tessera
