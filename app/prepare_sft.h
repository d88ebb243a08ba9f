// `tessera prepare --sft F.jsonl --out PREFIX [--chat-template plain|chatml|llama3] [--on-error
// refuse|skip]`: supervised fine-tuning records (data/sft.h) into an indexed dataset, one record
// per document, plus the loss mask beside it (PREFIX.mask, data/loss_mask_file.h). A bad record
// refuses the run naming file:line, or is skipped and counted.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tessera {

struct PrepareSftArgs {
  std::vector<std::string> inputs;        // .jsonl files of records
  std::string tokenizer;                  // "gpt2" or "byte" (make_tokenizer)
  std::string vocab_dir;                  // gpt2: encoder.json and vocab.bpe; "" = the default
  std::string out;                        // writes OUT.bin, OUT.idx and OUT.mask
  std::string chat_template = "plain";    // data/chat_template.h
  std::string on_error = "refuse";        // a bad record: "refuse" the run, or "skip" it and count
};

// Writes the three files (renamed into place only when the whole run succeeds) and prints a summary
// to out. Returns 0; errors throw tessera::Error.
int run_prepare_sft(const PrepareSftArgs& args, std::ostream& out);

}  // namespace tessera
