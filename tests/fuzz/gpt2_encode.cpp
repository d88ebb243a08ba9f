// Fuzzes GPT-2 encoding (data/gpt2_tokenizer.h) of arbitrary bytes with the real vocabulary
// (../shared/data/gpt2; a tiny built-in one when it is absent). Oracle: decode(encode(x)) == x,
// with and without the special token allowed, and every id inside the vocabulary.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "data/gpt2_tokenizer.h"
#include "fuzz_common.h"
#include "tiny_vocab.h"

namespace tf = tessera::fuzz;
using tessera::Gpt2Tokenizer;

namespace {

std::unique_ptr<Gpt2Tokenizer> load_tokenizer() {
  const std::string real = std::string(TESSERA_SHARED_DATA_DIR) + "/gpt2";
  if (std::filesystem::is_regular_file(real + "/encoder.json") && std::filesystem::is_regular_file(real + "/vocab.bpe")) {
    std::fprintf(stderr, "fuzz_gpt2_encode: GPT-2's vocabulary from %s\n", real.c_str());
    return std::make_unique<Gpt2Tokenizer>(real);
  }
  static const tf::ScratchDir dir("gpt2_encode");
  tf::write_file(dir / "encoder.json", tf::tiny_encoder_json());
  tf::write_file(dir / "vocab.bpe", tf::tiny_vocab_bpe());
  std::fprintf(stderr, "fuzz_gpt2_encode: %s not found; a tiny vocabulary instead\n", real.c_str());
  return std::make_unique<Gpt2Tokenizer>(dir / "");
}

void check_round_trip(const Gpt2Tokenizer& tok, std::string_view text, bool allow_special) {
  const std::vector<int32_t> ids = tok.encode(text, allow_special);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) tf::finding("encode produced id " + std::to_string(id) + " outside the vocabulary");
  if (tok.decode(ids) != text) tf::finding("decode(encode(x)) != x");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Gpt2Tokenizer> tok = load_tokenizer();
  const std::string_view text = tf::as_text(data, size);
  tf::expect_clean("Gpt2Tokenizer::encode", [&] {
    check_round_trip(*tok, text, false);
    check_round_trip(*tok, text, true);
  });
  return 0;
}
