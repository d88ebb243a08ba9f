// Fuzzes the GPT-2 vocabulary loaders (data/gpt2_tokenizer.h: encoder.json through data/json.h,
// vocab.bpe): the input is encoder.json, NUL, vocab.bpe, NUL, a text. A vocabulary that loads must
// encode the text to ids that decode back to it.
#include <string>

#include "data/gpt2_tokenizer.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tf::ScratchDir dir("gpt2_vocab");
  const auto parts = tf::split_at_nul(tf::as_text(data, size), 3);
  tf::write_file(dir / "encoder.json", parts[0]);
  tf::write_file(dir / "vocab.bpe", parts.size() > 1 ? parts[1] : std::string_view());
  const std::string_view text = parts.size() > 2 ? parts[2] : std::string_view("hello world");
  tf::expect_clean("Gpt2Tokenizer(dir)", [&] {
    const tessera::Gpt2Tokenizer tok(dir / "");
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok.encode(text, special);
      if (tok.decode(ids) != text) tf::finding("decode(encode(x)) != x with a vocabulary that loaded");
    }
  });
  return 0;
}
