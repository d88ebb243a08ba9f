// `tessera prepare`: tokenizes text files (.txt, .jsonl) into a Megatron indexed dataset
// (PREFIX.bin + PREFIX.idx), optionally holding out the last documents as PREFIX_val.
// Inputs are read twice: a cheap pass counts documents (to place the split), a second tokenizes.
#pragma once

#include <string>
#include <vector>

namespace tessera {

struct PrepareArgs {
  std::vector<std::string> inputs;  // .jsonl: one JSON object per line, its "text"; else plain text
  std::string tokenizer;            // "gpt2" or "byte"
  std::string vocab_dir;            // gpt2: the directory with encoder.json and vocab.bpe; "" = data/gpt2
  std::string out;                  // output prefix: writes OUT.bin/.idx (and OUT_val.bin/.idx)
  double val_fraction = 0;          // the last fraction of documents goes to OUT_val
  std::string separator;            // plain text: split documents on this ("\n" escapes allowed); empty: one per file
  bool append_eot = true;           // append the tokenizer's end-of-document id to each document
};

// Runs the command; returns the exit status (0). User errors throw tessera::Error.
int run_prepare_command(const PrepareArgs& args);

// "\n", "\t", "\r" and "\\" in a separator typed on the command line, as the characters.
std::string unescape_separator(const std::string& s);

}  // namespace tessera
