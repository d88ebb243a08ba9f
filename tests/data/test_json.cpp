// Tests data/json.h: the encoder.json map (escapes, surrogate pairs, errors naming the file and
// byte offset, lone surrogates refused) and the "text" of a JSON line (other values skipped by
// structure, lone surrogates replaced).
#include "data/json.h"

#include "temp_files.h"
#include "testing.h"

namespace tessera {
namespace {

using Map = std::vector<std::pair<std::string, int64_t>>;
using testing::throws_with;

std::string map_error(const std::string& text) {
  return testing::error_of([&] { parse_json_string_int_map(text, "dir/encoder.json"); });
}

std::optional<std::string> text_of(std::string_view json) { return json_string_field(json, "text"); }

TEST(JsonStringIntMap, ParsesEscapesAndKeepsFileOrder) {
  Map m = parse_json_string_int_map(
      " {\"b\": 2, \"a\\\"\\\\\\/\\n\\t\" :-1,\n\"\\u0120x\": 3, \"\\ud83e\\udd17\": 40, \"\xC3\xA9\": 5}\n", "f.json");
  EXPECT_EQ(m, (Map{{"b", 2}, {"a\"\\/\n\t", -1}, {"\xC4\xA0x", 3}, {"\xF0\x9F\xA4\x97", 40}, {"\xC3\xA9", 5}}));
  EXPECT_TRUE(parse_json_string_int_map("{}", "f.json").empty());
  EXPECT_TRUE(parse_json_string_int_map(" { } ", "f.json").empty());
}

TEST(JsonStringIntMap, ErrorsNameTheFileAndOffset) {
  EXPECT_EQ(map_error("{\"a\": x}"), "dir/encoder.json: malformed JSON at byte 6: expected an integer value");
  EXPECT_EQ(map_error("{\"a\" 1}"), "dir/encoder.json: malformed JSON at byte 5: expected ':'");
  EXPECT_EQ(map_error("{\"\\udc00\": 1}"), "dir/encoder.json: malformed JSON at byte 2: unpaired low surrogate \\u escape");
  EXPECT_NE(map_error("{\"a: 1}").find("unterminated string"), std::string::npos);
  EXPECT_NE(map_error("{\"\\q\": 1}").find("unknown escape \\q"), std::string::npos);
  EXPECT_NE(map_error("{\"\\ud800x\": 1}").find("without its low half"), std::string::npos);
  EXPECT_NE(map_error("{\"\\ud800\\u0041\": 1}").find("without its low half"), std::string::npos);
  EXPECT_NE(map_error("{\"\\u12\": 1}").find("hex digit"), std::string::npos);
  EXPECT_NE(map_error("{\"a\": 1} x").find("after the closing '}'"), std::string::npos);
  EXPECT_NE(map_error("{\"a\": 1").find("expected ',' but the text ended"), std::string::npos);
  EXPECT_NE(map_error("{\"a\": 1.5}").find("fraction or exponent"), std::string::npos);
  EXPECT_NE(map_error("{\"a\": 99999999999999999999}").find("out of range"), std::string::npos);
  EXPECT_NE(map_error("{\"a\nb\": 1}").find("control character"), std::string::npos);
  EXPECT_NE(map_error("[1]").find("expected '{'"), std::string::npos);
}

TEST(JsonStringField, FindsTheTopLevelKeyAndSkipsEverythingElse) {
  EXPECT_EQ(text_of(R"({"text": "hello"})"), "hello");
  EXPECT_EQ(text_of(R"(  {"id": 3, "meta": {"text": "nested", "a": [1, 2.5e3, true, null, {"x": "]}"}]},)"
                    R"( "text" : "top", "after": false}  )"),
            "top");
  EXPECT_EQ(text_of(R"({"a": [], "b": {}, "text": ""})"), "");
  EXPECT_EQ(text_of(R"({"text": "first", "text": "last"})"), "last");
  EXPECT_EQ(text_of(R"({"other": "text"})"), std::nullopt);
  EXPECT_EQ(text_of("{}"), std::nullopt);
}

TEST(JsonStringField, DecodesEscapesAndReplacesLoneSurrogates) {
  EXPECT_EQ(text_of(R"({"text": "a\"b\\c\/d\b\f\n\r\t"})"), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(text_of(R"({"text": "caf\u00e9 \u20AC \u0041"})"), "caf\xC3\xA9 \xE2\x82\xAC A");
  EXPECT_EQ(text_of(R"({"text": "\ud83d\ude00"})"), "\xF0\x9F\x98\x80");  // U+1F600 from a pair
  EXPECT_EQ(text_of(R"({"text": "x\ud83dy"})"), "x\xEF\xBF\xBDy");         // lone high: U+FFFD
  EXPECT_EQ(text_of(R"({"text": "\ude00\u0041"})"), "\xEF\xBF\xBD" "A");    // lone low
  EXPECT_EQ(text_of(R"({"text": "\ud83d\u0041"})"), "\xEF\xBF\xBD" "A");    // high then non-low
  EXPECT_EQ(text_of("{\"text\": \"raw \xC3\xA9 utf-8\"}"), "raw \xC3\xA9 utf-8");
}

TEST(JsonStringField, RejectsMalformedInput) {
  EXPECT_TRUE(throws_with([] { text_of(R"(["text"])"); }, {"JSON object"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": 5})"); }, {"byte 9", "\"text\" is not a string"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "abc)"); }, {"unterminated string"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "\x"})"); }, {"unknown escape"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "\u12G4"})"); }, {"bad hex digit 'G'"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "a"} extra)"); }, {"after the object"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"a" 1})"); }, {"expected ':'"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"a": 1)"); }, {"expected ','"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"a": [1, {"b": ]}, "text": "x"})"); }, {"expected a value"}));
  EXPECT_TRUE(throws_with([] { text_of(std::string(600, '[')); }, {"JSON object"}));
  EXPECT_TRUE(throws_with([] { text_of("{\"a\": " + std::string(600, '[')); }, {"nesting deeper than 512"}));
}

}  // namespace
}  // namespace tessera
