// `tessera prepare --sft`: each non-blank line of each input is a record; records become documents.
#include "app/prepare_sft.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <ostream>

#include "data/chat_template.h"
#include "data/file_io.h"
#include "data/indexed_dataset.h"
#include "data/loss_mask_file.h"
#include "data/sft.h"
#include "data/tokenizer.h"
#include "kernels/check.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

std::string plural(int64_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); }

void check_args(const PrepareSftArgs& a) {
  TESSERA_CHECK(!a.inputs.empty(), "prepare --sft: give at least one .jsonl file of records");
  TESSERA_CHECK(!a.out.empty(), "prepare --sft: give an output prefix with --out");
  TESSERA_CHECK(a.on_error == "refuse" || a.on_error == "skip", "prepare: --on-error must be refuse (or fail) or skip, ",
                "got \"", a.on_error, "\"");
  for (const auto& p : a.inputs) {
    TESSERA_CHECK(fs::exists(p), "missing input file ", p);
    TESSERA_CHECK(fs::is_regular_file(p), "input ", p, " is not a regular file");
  }
}

// The dataset and its mask, written together.
struct SftWriter {
  SftWriter(const std::string& out, const Tokenizer& tok)
      : tokens(out, IndexedDatasetBuilder::dtype_for_vocab(tok.vocab_size())), mask(out) {}
  void add(const SftExample& e) {
    tokens.add_document(e.ids);
    mask.add(e.mask);
  }
  void finalize() {
    mask.finalize();  // first: a dataset that appears has its mask
    tokens.finalize();
  }
  IndexedDatasetBuilder tokens;
  LossMaskBuilder mask;
};

struct Skips {
  int64_t count = 0;
  std::string first;
};

// Calls f(line_number, line) for every non-blank line of the file.
template <typename F>
void for_each_line(const MappedFile& file, F&& f) {
  const std::string_view all(reinterpret_cast<const char*>(file.data()), size_t(file.size()));
  int64_t number = 0;
  for (size_t start = 0; start < all.size();) {
    size_t stop = all.find('\n', start);
    if (stop == std::string_view::npos) stop = all.size();
    const std::string_view line = all.substr(start, stop - start);
    start = stop + 1;
    ++number;
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) f(number, line);
  }
}

void add_file(const std::string& path, ChatTemplate t, const Tokenizer& tok, bool skip, SftWriter& w, Skips& skips) {
  const MappedFile file(path);
  for_each_line(file, [&](int64_t number, std::string_view line) {
    const std::string where = path + ":" + std::to_string(number);
    try {
      w.add(tokenize_sft(t, parse_sft_record(line), tok));
    } catch (const Error& e) {
      if (!skip) detail::fail(where, ": ", e.what());
      const std::string message = where + ": " + e.what();
      std::fprintf(stderr, "prepare: skipped %s\n", message.c_str());
      if (skips.count++ == 0) skips.first = message;
    }
  });
}

}  // namespace

int run_prepare_sft(const PrepareSftArgs& args, std::ostream& out) {
  check_args(args);
  const ChatTemplate t = parse_chat_template(args.chat_template);
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(args.tokenizer, args.vocab_dir);
  check_chat_template_tokens(t, *tok);
  const fs::path parent = fs::path(args.out).parent_path();
  if (!parent.empty()) fs::create_directories(parent);

  SftWriter w(args.out, *tok);
  Skips skips;
  for (const auto& path : args.inputs) add_file(path, t, *tok, args.on_error == "skip", w, skips);
  TESSERA_CHECK(w.tokens.num_documents() > 0, "prepare --sft: no records to write (",
                plural(skips.count, "record"), " skipped)");
  w.finalize();

  out << "prepared " << plural(w.tokens.num_documents(), "record") << " with the " << chat_template_name(t)
      << " template and the " << tok->name() << " tokenizer (vocabulary " << tok->vocab_size() << ")\n";
  out << "  " << w.tokens.bin_path() << " + " << w.tokens.idx_path() << " + " << loss_mask_path(args.out) << ": "
      << plural(w.tokens.num_tokens(), "token") << ", " << w.mask.num_trained() << " trained (loss mask 1)\n";
  if (skips.count > 0)
    out << "  skipped " << plural(skips.count, "record") << " (--on-error skip); the first: " << skips.first << "\n";
  return 0;
}

}  // namespace tessera
