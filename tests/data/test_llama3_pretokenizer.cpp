// Tests data/llama3_pretokenizer.h: the pieces of each case in tests/reference/hf_tokenizers/
// cases.json equal those Python's `regex` module (and the `tokenizers` library's Split) gives for
// LLaMA-3's pattern, plus hand-checked cases for each alternative and invalid UTF-8.
#include "data/llama3_pretokenizer.h"

#include <string>

#include "data/json.h"
#include "testing.h"

namespace tessera {
namespace {

using Pieces = std::vector<std::string>;

Pieces pieces(std::string_view text) {
  Pieces out;
  for (std::string_view p : llama3_pretokenize(text)) out.emplace_back(p);
  return out;
}

TEST(Llama3Pretokenizer, PiecesEqualTheRegexModules) {
  const Json doc = read_json_file(std::string(TESSERA_TEST_DATA_DIR) + "/hf_tokenizers/cases.json");
  ASSERT_GE(doc.at("cases").size(), 50u);
  for (const Json& c : doc.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(pieces(text), c.at("llama3_pieces").get<Pieces>()) << Json(text).dump();
  }
}

TEST(Llama3Pretokenizer, EachAlternative) {
  // (?i:'s|'t|'re|'ve|'m|'ll|'d): case-insensitive, unlike GPT-2's.
  EXPECT_EQ(pieces("DON'T we'LL"), (Pieces{"DON", "'T", " we", "'LL"}));
  // [^\r\n\p{L}\p{N}]?\p{L}+: any one non-letter, non-number, non-newline character joins letters.
  EXPECT_EQ(pieces("\tab.cd,ef"), (Pieces{"\tab", ".cd", ",ef"}));
  EXPECT_EQ(pieces("\nab"), (Pieces{"\n", "ab"}));
  // \p{N}{1,3}: numbers in groups of at most three, never with a space.
  EXPECT_EQ(pieces("1234567 89"), (Pieces{"123", "456", "7", " ", "89"}));
  //  ?[^\s\p{L}\p{N}]+[\r\n]*: punctuation takes the newlines after it.
  EXPECT_EQ(pieces("a !?\n\nb"), (Pieces{"a", " !?\n\n", "b"}));
  // \s*[\r\n]+: white space up to its last newline.
  EXPECT_EQ(pieces("a \n \n  b"), (Pieces{"a", " \n \n", " ", " b"}));
  // \s+(?!\S) and \s+ as in GPT-2's pattern.
  EXPECT_EQ(pieces("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a   "), (Pieces{"a", "   "}));
  EXPECT_EQ(pieces(""), Pieces{});
}

TEST(Llama3Pretokenizer, InvalidUtf8BytesAreOtherCharacters) {
  EXPECT_EQ(pieces("a\xFF" "bc"), (Pieces{"a", "\xFF" "bc"}));
  EXPECT_EQ(pieces(" \xFF\xFE\n"), (Pieces{" \xFF\xFE\n"}));
}

}  // namespace
}  // namespace tessera
