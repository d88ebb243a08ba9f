// `tessera ckpt import DIR --out FILE.h5`: a Hugging Face model folder (config.json and
// model.safetensors, or shards with model.safetensors.index.json; F32, F16 or BF16) into a tessera
// checkpoint of its model tensors. Key decision: the export's name tables (app/checkpoint/hf_model.h)
// are inverted, not restated, and everything is checked before a byte is written (the
// architecture, every tensor's presence, shape and dtype, the tokenizer); then the tensors stream
// one at a time from the safetensors files into the checkpoint, so a model never needs to fit in
// memory.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace tessera {

struct CkptImportArgs {
  std::string dir;                 // the Hugging Face model folder
  std::string out;                 // the checkpoint to write (.h5; must not exist)
  std::string tokenizer = "auto";  // auto (recognize the folder's vocab.json + merges.txt) | gpt2 | byte | addition
  std::string vocab_dir;           // GPT-2's encoder.json and vocab.bpe (default: data/gpt2)
  bool allow_non_finite = false;   // import NaN or inf weights (refused otherwise)
};

struct HfImportSummary {
  std::string architecture;                 // "LlamaForCausalLM"
  std::string tokenizer;                    // "gpt2", "byte", "addition"
  std::vector<std::string> files;           // the safetensors files read
  std::vector<std::string> dtypes;          // the source dtypes, e.g. {"BF16"}
  int64_t hf_tensors = 0, tensors = 0, parameters = 0;
  std::vector<std::string> skipped;         // buffers (causal masks, rotary frequencies) and a tied lm_head
  std::vector<std::string> notes;           // what the config needed adapting
  std::string config_toml;                  // the config stored in the checkpoint
};

// Reads DIR and writes args.out: /model/<name> for every parameter of the model config.json
// describes (float32, F16 and BF16 widened exactly), /meta with step 0 and a config whose [model]
// is that model and whose [data] names its tokenizer, /import recording the source. No optimizer
// state: a run starts from it with checkpoint.init_from (fresh moments, step 0). Refused, naming
// the key and the file, before anything is written: an architecture or option tessera cannot
// represent (hf_model_config), a tensor missing, unknown, at another shape or of a non-float
// (quantized) dtype, a tied head whose stored lm_head.weight differs from the embedding, a
// tokenizer it does not recognize (auto), a tokenizer larger than the model's vocabulary; while
// writing (the partial file removed): NaN or inf in a tensor unless allow_non_finite.
HfImportSummary import_hf_model(const CkptImportArgs& args);

// The command: import_hf_model, then a summary on out. Returns the exit status.
int run_ckpt_import(const CkptImportArgs& args, std::ostream& out);

}  // namespace tessera
