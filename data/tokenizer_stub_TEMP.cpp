// TEMPORARY (branch data-f only; delete at merge): make_tokenizer for "byte" so that `tessera
// prepare` links before the GPT-2 tokenizer branch, which defines the real make_tokenizer, lands.
#include "data/tokenizer.h"
#include "kernels/check.h"

namespace tessera {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  TESSERA_CHECK(kind != "gpt2", "tokenizer gpt2 is not built into this tessera yet (temporary stub)");
  detail::fail("unknown tokenizer '", kind, "' (choose byte or gpt2)");
}

}  // namespace tessera
