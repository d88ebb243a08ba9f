// Tests data/json_field.h: the "text" of a JSON line, escapes and surrogates, and malformed input.
#include "data/json_field.h"

#include "temp_files.h"
#include "testing.h"

namespace tessera {
namespace {

using testing::throws_with;

std::optional<std::string> text_of(std::string_view json) { return json_string_field(json, "text"); }

TEST(JsonField, FindsTheTopLevelKeyAndSkipsEverythingElse) {
  EXPECT_EQ(text_of(R"({"text": "hello"})"), "hello");
  EXPECT_EQ(text_of(R"(  {"id": 3, "meta": {"text": "nested", "a": [1, 2.5e3, true, null, {"x": "]}"}]},)"
                    R"( "text" : "top", "after": false}  )"),
            "top");
  EXPECT_EQ(text_of(R"({"a": [], "b": {}, "text": ""})"), "");
  EXPECT_EQ(text_of(R"({"other": "text"})"), std::nullopt);
  EXPECT_EQ(text_of("{}"), std::nullopt);
}

TEST(JsonField, DecodesEscapesAndSurrogatePairs) {
  EXPECT_EQ(text_of(R"({"text": "a\"b\\c\/d\b\f\n\r\t"})"), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(text_of(R"({"text": "caf\u00e9 \u20AC \u0041"})"), "caf\xC3\xA9 \xE2\x82\xAC A");
  EXPECT_EQ(text_of(R"({"text": "\ud83d\ude00"})"), "\xF0\x9F\x98\x80");  // U+1F600 from a pair
  EXPECT_EQ(text_of(R"({"text": "x\ud83dy"})"), "x\xEF\xBF\xBDy");         // lone high: U+FFFD
  EXPECT_EQ(text_of(R"({"text": "\ude00\u0041"})"), "\xEF\xBF\xBD" "A");    // lone low
  EXPECT_EQ(text_of(R"({"text": "\ud83d\u0041"})"), "\xEF\xBF\xBD" "A");    // high then non-low
  EXPECT_EQ(text_of("{\"text\": \"raw \xC3\xA9 utf-8\"}"), "raw \xC3\xA9 utf-8");
}

TEST(JsonField, RejectsMalformedInput) {
  EXPECT_TRUE(throws_with([] { text_of(R"(["text"])"); }, {"JSON object"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": 5})"); }, {"\"text\" is not a string"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "abc)"); }, {"unterminated string"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "\x"})"); }, {"unknown escape"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "\u12G4"})"); }, {"bad hex digit"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "a"} extra)"); }, {"after the object"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"a" 1})"); }, {"expected ':'"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"a": 1)"); }, {"expected ','"}));
}

}  // namespace
}  // namespace tessera
