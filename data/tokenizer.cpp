// make_tokenizer: the one place that turns a tokenizer name from the config into a Tokenizer, and
// where GPT-2's files are found when no directory is named (the repository's data/gpt2, which
// scripts/get_data.sh fills, or $TESSERA_DATA_DIR/gpt2).
#include "data/tokenizer.h"

#include <cstdlib>
#include <filesystem>

#include "data/gpt2_tokenizer.h"
#include "data/hf_bpe_tokenizer.h"
#include "kernels/check.h"

#ifndef TESSERA_SOURCE_DIR
#error "TESSERA_SOURCE_DIR (the repository, for its data/ directory) is set by data/CMakeLists.txt"
#endif

namespace tessera {

namespace {
const char* data_dir_from_env() {
  const char* env = std::getenv("TESSERA_DATA_DIR");
  return env != nullptr && *env != '\0' ? env : nullptr;
}
}  // namespace

std::string default_data_dir() {
  if (const char* env = data_dir_from_env()) return env;
  return (std::filesystem::path(TESSERA_SOURCE_DIR) / "data").string();
}

std::string default_gpt2_vocab_dir() { return (std::filesystem::path(default_data_dir()) / "gpt2").string(); }

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (is_tokenizer_json_path(kind)) return std::make_unique<HfBpeTokenizer>(kind);
  if (kind == "gpt2") {
    if (!vocab_dir.empty()) return std::make_unique<Gpt2Tokenizer>(vocab_dir);
    const std::string dir = default_gpt2_vocab_dir();
    namespace fs = std::filesystem;
    TESSERA_CHECK(fs::is_regular_file(fs::path(dir) / "encoder.json") && fs::is_regular_file(fs::path(dir) / "vocab.bpe"),
                  "tokenizer gpt2 needs GPT-2's encoder.json and vocab.bpe; no directory was given (--vocab DIR, ",
                  "data.vocab_dir) and they are not in ", dir, " (the default: ",
                  data_dir_from_env() ? "$TESSERA_DATA_DIR/gpt2" : "the repository's data/gpt2",
                  "); run scripts/get_data.sh to get them, or name their directory");
    return std::make_unique<Gpt2Tokenizer>(dir);
  }
  detail::fail("unknown tokenizer '", kind,
               "'; expected one of: byte, gpt2, or the path of a Hugging Face tokenizer.json (ending in .json)");
}

}  // namespace tessera
