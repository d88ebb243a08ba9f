// Tests data/gpt2_pretokenizer.h and data/unicode_class.h: each alternative of GPT-2's pattern on
// hand-checked inputs (the expected pieces are what the `regex` module gives for encoder.py's
// pattern), invalid UTF-8 as "other" characters, and that safe split points are piece starts.
#include "data/gpt2_pretokenizer.h"

#include <random>

#include "data/unicode_class.h"
#include "testing.h"

namespace tessera {
namespace {

using Pieces = std::vector<std::string>;

Pieces pieces(std::string_view text) {
  Pieces out;
  for (std::string_view p : gpt2_pretokenize(text)) out.emplace_back(p);
  return out;
}

TEST(Gpt2Pretokenizer, LettersNumbersAndOtherRunsTakeOneLeadingSpace) {
  EXPECT_EQ(pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces("3.14159"), (Pieces{"3", ".", "14159"}));
  EXPECT_EQ(pieces(" 123abc"), (Pieces{" 123", "abc"}));
  EXPECT_EQ(pieces("a !!? b"), (Pieces{"a", " !!?", " b"}));
  EXPECT_EQ(pieces("x\xC2\xB2"), (Pieces{"x", "\xC2\xB2"}));               // U+00B2 is \p{N}
  EXPECT_EQ(pieces("caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC"), (Pieces{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC"}));
  EXPECT_EQ(pieces("a\xCC\x81"), (Pieces{"a", "\xCC\x81"}));               // a combining mark is "other"
  EXPECT_EQ(pieces(""), Pieces{});
}

TEST(Gpt2Pretokenizer, ContractionsComeFirstAndAreCaseSensitive) {
  EXPECT_EQ(pieces("it's's"), (Pieces{"it", "'s", "'s"}));
  EXPECT_EQ(pieces("we'll've'd're'm't"), (Pieces{"we", "'ll", "'ve", "'d", "'re", "'m", "'t"}));
  EXPECT_EQ(pieces("DON'T"), (Pieces{"DON", "'", "T"}));
  EXPECT_EQ(pieces("x 're"), (Pieces{"x", " '", "re"}));  // a space never joins a contraction
  EXPECT_EQ(pieces("''s"), (Pieces{"''", "s"}));          // inside an "other" run no contraction starts
  EXPECT_EQ(pieces("!!'s"), (Pieces{"!!'", "s"}));
  EXPECT_EQ(pieces("'sx"), (Pieces{"'s", "x"}));
  EXPECT_EQ(pieces("'l"), (Pieces{"'", "l"}));
}

TEST(Gpt2Pretokenizer, WhiteSpaceRunsGiveBackTheirLastCharacter) {
  EXPECT_EQ(pieces("  hello"), (Pieces{" ", " hello"}));
  EXPECT_EQ(pieces("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));  // "\n" is given back but joins nothing
  EXPECT_EQ(pieces("a \n\nb"), (Pieces{"a", " \n", "\n", "b"}));
  EXPECT_EQ(pieces("a\t!"), (Pieces{"a", "\t", "!"}));           // a single one before non-space: \s+
  EXPECT_EQ(pieces("a  \n"), (Pieces{"a", "  \n"}));             // at the end of text: the whole run
  EXPECT_EQ(pieces("   "), (Pieces{"   "}));
  EXPECT_EQ(pieces(" "), (Pieces{" "}));
  EXPECT_EQ(pieces("a \t b"), (Pieces{"a", " \t", " b"}));
}

TEST(Gpt2Pretokenizer, WhiteSpaceIsUnicodeWhiteSpace) {
  // U+3000, U+00A0 and U+2003 are White_Space; only U+0020 may prefix the next piece.
  EXPECT_EQ(pieces("a\xE3\x80\x80\xE3\x80\x80" "b"), (Pieces{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));
  EXPECT_EQ(pieces("a\xC2\xA0" "b"), (Pieces{"a", "\xC2\xA0", "b"}));
  EXPECT_EQ(pieces("a\xE2\x80\x83 b"), (Pieces{"a", "\xE2\x80\x83", " b"}));
  // U+001C..U+001F are white space to Python's `re` but not to `regex` (encoder.py) or tiktoken.
  EXPECT_EQ(pieces("a\x1C b"), (Pieces{"a", "\x1C", " b"}));
  EXPECT_EQ(code_point_class(0x1F), CharClass::kOther);
  EXPECT_EQ(code_point_class(0x85), CharClass::kSpace);
  EXPECT_EQ(code_point_class(0x200B), CharClass::kOther);  // zero width space is not White_Space
}

TEST(Gpt2Pretokenizer, InvalidUtf8BytesAreOtherCharacters) {
  EXPECT_EQ(pieces("a\xFF\xFE" "b"), (Pieces{"a", "\xFF\xFE", "b"}));
  EXPECT_EQ(pieces(" \xFF"), (Pieces{" \xFF"}));
  EXPECT_EQ(pieces("\xC3(x"), (Pieces{"\xC3(", "x"}));                 // truncated sequence
  EXPECT_EQ(pieces("\xED\xA0\x80" "a"), (Pieces{"\xED\xA0\x80", "a"}));  // an encoded surrogate
  EXPECT_EQ(pieces("\xC0\xAF" "a"), (Pieces{"\xC0\xAF", "a"}));          // overlong '/'
  EXPECT_EQ(pieces(std::string("a\0b", 3)), (Pieces{"a", std::string(1, '\0'), "b"}));
  const unsigned char bad[] = {0xE2, 0x82};
  Utf8Char c = decode_utf8(bad, bad + 2);
  EXPECT_FALSE(c.valid);
  EXPECT_EQ(c.length, 1u);
  const unsigned char euro[] = {0xE2, 0x82, 0xAC};
  c = decode_utf8(euro, euro + 3);
  EXPECT_TRUE(c.valid);
  EXPECT_EQ(c.code_point, 0x20ACu);
  const unsigned char max[] = {0xF4, 0x8F, 0xBF, 0xBF}, over[] = {0xF4, 0x90, 0x80, 0x80};
  EXPECT_TRUE(decode_utf8(max, max + 4).valid);
  EXPECT_FALSE(decode_utf8(over, over + 4).valid);
}

TEST(Gpt2Pretokenizer, UnicodeTablesClassifyKnownCodePoints) {
  EXPECT_STREQ(unicode_tables_version(), "14.0.0");
  EXPECT_EQ(code_point_class(U'é'), CharClass::kLetter);
  EXPECT_EQ(code_point_class(0x65E5), CharClass::kLetter);   // 日
  EXPECT_EQ(code_point_class(0x0416), CharClass::kLetter);   // Ж
  EXPECT_EQ(code_point_class(0x0663), CharClass::kNumber);   // Arabic-Indic three
  EXPECT_EQ(code_point_class(0x2167), CharClass::kNumber);   // Roman numeral eight (Nl)
  EXPECT_EQ(code_point_class(0x1F600), CharClass::kOther);   // emoji
  EXPECT_EQ(code_point_class(0x10FFFF), CharClass::kOther);
  EXPECT_EQ(code_point_class(0x2000), CharClass::kSpace);
  EXPECT_EQ(code_point_class(0x20000), CharClass::kLetter);  // CJK extension B
}

TEST(Gpt2Pretokenizer, SafeSplitPointsArePieceStarts) {
  std::mt19937_64 rng(5);
  const char* bits[] = {"a", "B", "1", " ", "\n", "\t", "'", "'s", ",", "\xC3\xA9", "\xE3\x80\x80", "\xFF"};
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    for (int i = 0; i < 60; ++i) s += bits[rng() % std::size(bits)];
    std::vector<bool> starts(s.size() + 1, false);
    size_t at = 0;
    for (std::string_view p : gpt2_pretokenize(s)) starts[at] = true, at += p.size();
    ASSERT_EQ(at, s.size());
    for (size_t pos = 0; pos < s.size(); ++pos)
      ASSERT_TRUE(!gpt2_is_safe_split(s, pos) || starts[pos]) << "trial " << trial << " at " << pos;
  }
}

}  // namespace
}  // namespace tessera
