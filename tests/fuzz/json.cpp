// Fuzzes data/json.h in its uses: a whole document (encoder.json, config.json: repeated keys
// refused), a .jsonl line (lone surrogates replaced, its "text" read), and the typed member reads.
// No files: the functions take text.
#include "data/json.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = tf::as_text(data, size);
  tf::expect_clean("parse_json", [&] {
    const tessera::Json j = tessera::parse_json(text, "fuzz.json");
    if (!j.is_object()) return;
    for (const auto& [key, value] : j.items()) {
      (void)tessera::json_int(j, key, "fuzz.json");
      (void)value.dump();  // the value serializes back (what the export writes)
    }
  });
  tf::expect_clean("parse_json_line", [&] {
    (void)tessera::json_string(tessera::parse_json_line(text), "text", "fuzz.jsonl:1");
  });
  return 0;
}
