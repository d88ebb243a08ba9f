// Fuzzes the JSON reader (data/json.h) in both of its uses: encoder.json's string -> integer map
// and the "text" field of a .jsonl line. No files: the reader takes text.
#include "data/json.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = tf::as_text(data, size);
  tf::expect_clean("parse_json_string_int_map", [&] { (void)tessera::parse_json_string_int_map(text, "fuzz.json"); });
  tf::expect_clean("json_string_field", [&] { (void)tessera::json_string_field(text, "text"); });
  tf::expect_clean("JsonReader::skip_value", [&] {
    tessera::JsonReader in(text, "", tessera::LoneSurrogate::kError);
    in.skip_value();
    in.expect_end("the value");
  });
  return 0;
}
