// Tests data/json_string_map.h: escapes (surrogate pairs included), whitespace, and errors that
// name the file and the byte offset.
#include "data/json_string_map.h"

#include "kernels/check.h"
#include "testing.h"

namespace tessera {
namespace {

using Map = std::vector<std::pair<std::string, int64_t>>;

TEST(JsonStringMap, ParsesEscapesAndKeepsFileOrder) {
  Map m = parse_json_string_int_map(
      " {\"b\": 2, \"a\\\"\\\\\\/\\n\\t\" :-1,\n\"\\u0120x\": 3, \"\\ud83e\\udd17\": 40, \"\xC3\xA9\": 5}\n", "f.json");
  EXPECT_EQ(m, (Map{{"b", 2}, {"a\"\\/\n\t", -1}, {"\xC4\xA0x", 3}, {"\xF0\x9F\xA4\x97", 40}, {"\xC3\xA9", 5}}));
  EXPECT_TRUE(parse_json_string_int_map("{}", "f.json").empty());
}

TEST(JsonStringMap, ErrorsNameTheFileAndOffset) {
  auto message = [](const std::string& text) {
    try {
      parse_json_string_int_map(text, "dir/encoder.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("{\"a\": x}"), "dir/encoder.json: malformed JSON at byte 6: expected an integer value");
  EXPECT_EQ(message("{\"a\" 1}"), "dir/encoder.json: malformed JSON at byte 5: expected ':'");
  EXPECT_NE(message("{\"a: 1}").find("unterminated string"), std::string::npos);
  EXPECT_NE(message("{\"\\q\": 1}").find("unknown escape \\q"), std::string::npos);
  EXPECT_NE(message("{\"\\udc00\": 1}").find("unpaired low surrogate"), std::string::npos);
  EXPECT_NE(message("{\"\\ud800x\": 1}").find("without its low half"), std::string::npos);
  EXPECT_NE(message("{\"\\u12\": 1}").find("hex digit"), std::string::npos);
  EXPECT_NE(message("{\"a\": 1} x").find("after the closing '}'"), std::string::npos);
  EXPECT_NE(message("{\"a\": 1").find("file ended"), std::string::npos);
  EXPECT_NE(message("{\"a\": 99999999999999999999}").find("out of range"), std::string::npos);
  EXPECT_NE(message("{\"a\nb\": 1}").find("control character"), std::string::npos);
}

}  // namespace
}  // namespace tessera
