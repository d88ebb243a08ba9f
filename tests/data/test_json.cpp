// Tests data/json.h: documents parsed by nlohmann/json with errors naming the source and what was
// expected, repeated keys refused (and named with their enclosing keys), .jsonl lines read as
// Python's json.loads reads them (last repeated key wins, lone surrogates replaced), and the typed
// member reads with their messages.
#include "data/json.h"

#include "temp_files.h"
#include "testing.h"

namespace tessera {
namespace {

using testing::error_of;
using testing::throws_with;

std::string parse_error(const std::string& text) {
  return error_of([&] { parse_json(text, "dir/config.json"); });
}

std::optional<std::string> text_of(std::string_view line) { return json_string(parse_json_line(line), "text", "f:3"); }

TEST(ParseJson, DecodesEscapesAndSurrogatePairs) {
  const Json j = parse_json(" {\"b\": 2, \"a\\\"\\\\\\/\\n\\t\" :-1,\n\"\\u0120x\": 3, \"\\ud83e\\udd17\": 40, \"\xC3\xA9\": 5}\n",
                            "f.json");
  EXPECT_EQ(j.size(), 5u);
  EXPECT_EQ(j.at("a\"\\/\n\t"), -1);
  EXPECT_EQ(j.at("\xC4\xA0x"), 3);
  EXPECT_EQ(j.at("\xF0\x9F\xA4\x97"), 40);
  EXPECT_EQ(j.at("\xC3\xA9"), 5);
  EXPECT_TRUE(parse_json(" { } ", "f.json").empty());
}

TEST(ParseJson, ErrorsNameTheSourceAndWhatWasExpected) {
  EXPECT_EQ(parse_error("{\"a\" 1}"),
            "dir/config.json: malformed JSON: parse error at line 1, column 6: syntax error while parsing object "
            "separator - unexpected number literal; expected ':'");
  EXPECT_NE(parse_error("{\"a\": 1,}").find("expected string literal"), std::string::npos);
  EXPECT_NE(parse_error("{\"a\": 1").find("unexpected end of input; expected '}'"), std::string::npos);
  EXPECT_NE(parse_error("{\"a\": 1} x").find("expected end of input"), std::string::npos);
  EXPECT_NE(parse_error("{\n\"a\": x}").find("line 2, column 6"), std::string::npos);
  EXPECT_NE(parse_error("{\"\\udc00\": 1}").find("surrogate"), std::string::npos);  // a file must be exact
  EXPECT_NE(parse_error("{\"a\": \"\xff\"}").find("ill-formed UTF-8"), std::string::npos);
  EXPECT_NE(parse_error("{\"a\": 1e999}").find("number overflow"), std::string::npos);
  EXPECT_NE(parse_error("").find("unexpected end of input"), std::string::npos);
  EXPECT_EQ(parse_error("{\"a\": 1}").size(), 0u);
}

TEST(ParseJson, RefusesARepeatedKeyNamingWhereItIs) {
  EXPECT_EQ(parse_error("{\"a\": 1, \"a\": 2}"), "dir/config.json: \"a\" appears twice in one object");
  EXPECT_EQ(parse_error("{\"x\": {\"y\": [{\"b\": 1, \"b\": 1}]}}"),
            "dir/config.json: \"b\" appears twice in one object (in \"x\".\"y\"[])");
  // The same key in different objects is fine.
  EXPECT_EQ(parse_json("{\"a\": {\"a\": 1}, \"b\": [{\"a\": 1}, {\"a\": 2}]}", "f")["b"][1]["a"], 2);
}

TEST(ParseJson, DeepNestingIsAnErrorOrAValueNeverACrash) {
  // nlohmann's parser and destructor do not recurse: deep arrays parse.
  const Json j = parse_json(std::string(100000, '[') + std::string(100000, ']'), "deep.json");
  EXPECT_TRUE(j.is_array());
  EXPECT_TRUE(throws_with([] { parse_json(std::string(100000, '['), "deep.json"); }, {"deep.json: malformed JSON"}));
}

TEST(ReadJsonFile, NamesAFileThatCannotBeRead) {
  EXPECT_EQ(error_of([] { read_json_file("/nonexistent/config.json"); }), "cannot read /nonexistent/config.json");
  testing::TempDir dir("read_json_file");
  const std::string p = dir / "c.json";
  testing::write_bytes(p, "{\"n\": [1, 2]");
  EXPECT_TRUE(throws_with([&] { read_json_file(p); }, {p + ": malformed JSON", "expected"}));
  testing::write_bytes(p, "{\"n\": [1, 2]}");
  EXPECT_EQ(read_json_file(p)["n"][1], 2);
}

TEST(JsonLine, FindsTheTopLevelKeyAndSkipsEverythingElse) {
  EXPECT_EQ(text_of(R"({"text": "hello"})"), "hello");
  EXPECT_EQ(text_of(R"(  {"id": 3, "meta": {"text": "nested", "a": [1, 2.5e3, true, null, {"x": "]}"}]},)"
                    R"( "text" : "top", "after": false}  )"),
            "top");
  EXPECT_EQ(text_of(R"({"text": "first", "text": "last"})"), "last");  // as Python's json.loads
  EXPECT_EQ(text_of(R"({"other": "text"})"), std::nullopt);
  EXPECT_EQ(text_of(R"({"text": null})"), std::nullopt);
  EXPECT_EQ(text_of("{}"), std::nullopt);
  EXPECT_EQ(text_of("{\"text\": \"a\"}\r"), "a");  // a CRLF line
}

TEST(JsonLine, DecodesEscapesAndReplacesLoneSurrogates) {
  EXPECT_EQ(text_of(R"({"text": "a\"b\\c\/d\b\f\n\r\t"})"), "a\"b\\c/d\b\f\n\r\t");
  EXPECT_EQ(text_of(R"({"text": "caf\u00e9 \u20AC \u0041"})"), "caf\xC3\xA9 \xE2\x82\xAC A");
  EXPECT_EQ(text_of(R"({"text": "\ud83d\ude00"})"), "\xF0\x9F\x98\x80");  // U+1F600 from a pair
  EXPECT_EQ(text_of(R"({"text": "x\ud83dy"})"), "x\xEF\xBF\xBDy");         // lone high: U+FFFD
  EXPECT_EQ(text_of(R"({"text": "\ude00\u0041"})"), "\xEF\xBF\xBD" "A");    // lone low
  EXPECT_EQ(text_of(R"({"text": "\ud83d\u0041"})"), "\xEF\xBF\xBD" "A");    // high then non-low
  EXPECT_EQ(text_of(R"({"text": "\ud83d"})"), "\xEF\xBF\xBD");              // high at the end
  EXPECT_EQ(text_of(R"({"text": "\\ud83d"})"), "\\ud83d");                  // an escaped backslash, no escape
  EXPECT_EQ(text_of(R"({"text": "\ud83d\\ude00"})"), "\xEF\xBF\xBD\\ude00");
  EXPECT_EQ(text_of("{\"text\": \"raw \xC3\xA9 utf-8\"}"), "raw \xC3\xA9 utf-8");
}

TEST(JsonLine, RejectsMalformedInput) {
  EXPECT_EQ(error_of([] { text_of(R"(["text"])"); }), "a line must be one JSON object, got an array");
  EXPECT_EQ(error_of([] { text_of(R"({"text": 5})"); }), "f:3: \"text\" must be a string, got an integer");
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "abc)"); }, {"malformed JSON", "missing closing quote"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "\x"})"); }, {"malformed JSON", "forbidden character after backslash"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "\u12G4"})"); }, {"malformed JSON", "'\\u' must be followed by 4 hex digits"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"text": "a"} extra)"); }, {"expected end of input"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"a" 1})"); }, {"expected ':'"}));
  EXPECT_TRUE(throws_with([] { text_of(R"({"a": [1, {"b": ]}, "text": "x"})"); }, {"malformed JSON"}));
  EXPECT_TRUE(throws_with([] { text_of("{\"text\": \"\xC3\"}"); }, {"ill-formed UTF-8"}));
}

TEST(JsonMembers, ReadTypedValuesOrSayWhatWasExpected) {
  const Json j = parse_json(R"({"s": "x", "i": -3, "big": 18446744073709551615, "f": 0.5, "b": true, "n": null})", "c");
  EXPECT_EQ(json_string(j, "s", "c"), "x");
  EXPECT_EQ(json_int(j, "i", "c"), -3);
  EXPECT_EQ(json_number(j, "i", "c"), -3.0);
  EXPECT_EQ(json_number(j, "f", "c"), 0.5);
  EXPECT_EQ(json_bool(j, "b", "c"), true);
  EXPECT_EQ(json_int(j, "n", "c"), std::nullopt);  // null reads as absent (Hugging Face's unset options)
  EXPECT_EQ(json_string(j, "absent", "c"), std::nullopt);
  EXPECT_EQ(error_of([&] { json_int(j, "f", "config.json"); }),
            "config.json: \"f\" must be an integer, got a number with a fraction or exponent");
  EXPECT_EQ(error_of([&] { json_int(j, "big", "config.json"); }),
            "config.json: \"big\" = 18446744073709551615 is out of range");
  EXPECT_EQ(error_of([&] { json_bool(j, "s", "config.json"); }), "config.json: \"s\" must be true or false, got a string");
  EXPECT_EQ(error_of([&] { json_number(j, "b", "config.json"); }), "config.json: \"b\" must be a number, got a boolean");
  EXPECT_EQ(error_of([&] { json_string(j["i"], "s", "config.json"); }),
            "config.json: expected a JSON object, got an integer");
}

}  // namespace
}  // namespace tessera
