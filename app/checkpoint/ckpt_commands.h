// `tessera ckpt inspect` and `tessera ckpt export`: look into a checkpoint file, or hand its model
// to Hugging Face. Both read one file as one process (MPI_COMM_SELF), whatever the launch.
#pragma once

#include <iosfwd>
#include <string>

namespace tessera {

struct CkptInspectArgs {
  std::string file;
  bool show_config = false;  // also print the stored TOML config
};

struct CkptExportArgs {
  std::string file;
  std::string format = "safetensors";
  std::string out_dir;
  bool allow_non_finite = false;  // export even when /model holds NaN or inf (refused otherwise)
  std::string vocab_dir;          // GPT-2 files for the tokenizer export; "" = data.vocab_dir, then data/gpt2
  bool merge_lora = false;        // a LoRA run's checkpoint: write W + (alpha / r) B A (app/lora.h)
  bool adapters_only = false;     // a LoRA run's checkpoint: its adapters as a PEFT folder (peft_export.h)
  std::string base_model;         // --adapters-only: base_model_name_or_path ("" = the /lora record's base)
};

// Prints metadata and a table of every tensor (name, shape, dtype, L2 norm read from the file).
// Returns the exit status; errors throw tessera::Error.
int run_ckpt_inspect(const CkptInspectArgs& args, std::ostream& out);
int run_ckpt_export(const CkptExportArgs& args, std::ostream& out);

}  // namespace tessera
