// Export of a checkpoint's model to Hugging Face transformers: model.safetensors with HF tensor
// names (GPT2LMHeadModel or LlamaForCausalLM), config.json and the tokenizer it was trained with.
// The name tables and config.json are app/checkpoint/hf_model.h's (the import inverts them); the
// file format is app/checkpoint/safetensors.h's.
#pragma once

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
  // A Hugging Face tokenizer.json (data.tokenizer is its path): its bytes, exported as they are,
  // in place of vocab.json and merges.txt.
  std::string tokenizer_json;
};
// GPT-2's files come from vocab_dir, else the stored data.vocab_dir when it exists, else the
// default directory (data/tokenizer.h default_gpt2_vocab_dir); missing files are an error naming
// where they were looked for.
HfTokenizer hf_tokenizer_of(const CheckpointReader& reader, const std::string& vocab_dir);
// The tokenizer `name` ("addition", "byte", "gpt2", or a tokenizer.json path) as those files; gpt2's from vocab_dir, else
// stored_dir when it exists, else the default directory.
HfTokenizer hf_tokenizer_named(const std::string& name, const std::string& vocab_dir = "",
                               const std::string& stored_dir = "");
// tokenizer_config.json and special_tokens_map.json for tok (model_max_length = max_seq_len).
std::string hf_tokenizer_config_json(const HfTokenizer& tok, int64_t max_seq_len);
std::string hf_special_tokens_map_json(const HfTokenizer& tok);

struct HfExportSummary {
  std::string architecture;  // "GPT2LMHeadModel"
  std::string tokenizer;     // "gpt2"
  int64_t tensors = 0;
  int64_t parameters = 0;
};
// Checks the checkpoint's /model against its config (every mismatch listed) and finds its tokenizer,
// then writes out_dir/model.safetensors, config.json, generation_config.json and the tokenizer's
// vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json (creating out_dir).
// A LoRA run's checkpoint (a stored [lora] with rank > 0) needs merge_lora: each adapted weight is
// written merged, W + (alpha / r) B A (app/lora.h), the adapters themselves not; without adapters
// merge_lora is refused.
HfExportSummary export_hf_safetensors(const CheckpointReader& reader, const std::string& out_dir,
                                      const std::string& vocab_dir = "", bool merge_lora = false);

}  // namespace tessera
