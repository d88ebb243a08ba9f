// make_tokenizer: the one place that turns a tokenizer name from the config into a Tokenizer.
#include "data/tokenizer.h"

#include "data/gpt2_tokenizer.h"
#include "kernels/check.h"

namespace tessera {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "gpt2") {
    TESSERA_CHECK(!vocab_dir.empty(), "tokenizer gpt2 needs a vocabulary directory holding the GPT-2 ",
                  "encoder.json and vocab.bpe; none was given");
    return std::make_unique<Gpt2Tokenizer>(vocab_dir);
  }
  detail::fail("unknown tokenizer '", kind, "'; expected one of: byte, gpt2");
}

}  // namespace tessera
