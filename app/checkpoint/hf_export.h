// Export of a checkpoint's model to Hugging Face transformers: model.safetensors with HF tensor
// names (GPT2LMHeadModel or LlamaForCausalLM), config.json and the tokenizer it was trained with. The name mapping is one table per
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
// A command that takes text-only GPT checkpoints (`what`, e.g. "tessera upscale") refuses a
// vision-language model's (model.kind = "vlm" in the stored config) with a message saying so,
// before any tensor is compared.
void require_text_model(const CheckpointReader& reader, const std::string& what);

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
// The tokenizer the checkpoint's model was trained with (its stored [data] section), as Hugging
// Face's byte-level BPE files, so that AutoTokenizer.from_pretrained(export dir) loads it:
// - data.tokenizer = "gpt2": GPT-2's encoder.json and vocab.bpe as vocab.json and merges.txt (the
//   same format), special token <|endoftext|> = 50256;
// - "byte": the 256 bytes as single-byte tokens (GPT-2's byte-to-unicode characters, ids = byte
//   values) and no merges, <|endoftext|> = 256: exactly the byte tokenizer;
// - data.task = "addition": its 13 characters "0123456789+=\n" the same way, "\n" (id 12) ends a
//   sequence.
// bos = eos = unk = the end-of-document token, as in GPT-2.
struct HfTokenizer {
  std::string name;        // "gpt2", "byte", "addition characters"
  int64_t vocab_size = 0;  // of the tokenizer (the model may pad beyond it)
  int32_t eos_id = 0;      // also bos: config.json's bos_token_id / eos_token_id
  std::string eos_token;   // its token string in vocab.json ("<|endoftext|>")
  std::string vocab_json, merges_txt;
};
// GPT-2's files come from vocab_dir, else the stored data.vocab_dir when it exists, else the
// default directory (data/tokenizer.h default_gpt2_vocab_dir); missing files are an error naming
// where they were looked for.
HfTokenizer hf_tokenizer_of(const CheckpointReader& reader, const std::string& vocab_dir);
// tokenizer_config.json and special_tokens_map.json for tok (model_max_length = max_seq_len).
std::string hf_tokenizer_config_json(const HfTokenizer& tok, int64_t max_seq_len);
std::string hf_special_tokens_map_json(const HfTokenizer& tok);

// config.json for cfg (a complete JSON document); bos_token_id and eos_token_id = eos_id.
std::string hf_config_json(const ModelConfig& cfg, int32_t eos_id);

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
  std::string tokenizer;     // "gpt2"
  int64_t tensors = 0;
  int64_t parameters = 0;
};
// Checks the checkpoint's /model against its config (every mismatch listed) and finds its tokenizer,
// then writes out_dir/model.safetensors, config.json, generation_config.json and the tokenizer's
// vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json (creating out_dir).
HfExportSummary export_hf_safetensors(const CheckpointReader& reader, const std::string& out_dir,
                                      const std::string& vocab_dir = "");

}  // namespace tessera
