// Fuzzes the TOML config loader (app/config.h load_config) with --set overrides: the input is the
// file's text, then NUL-separated overrides. A config that loads must survive to_toml and parse
// back to the same config (to_toml's promise), so rendering bugs are findings too.
#include <string>
#include <vector>

#include "app/config.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tf::ScratchDir dir("config");
  static const std::string path = dir / "fuzz.toml";
  const auto parts = tf::split_at_nul(tf::as_text(data, size), 9);  // the file, up to 8 overrides
  tf::write_file(path, parts[0]);
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  tf::expect_clean("load_config", [&] {
    const tessera::Config c = tessera::load_config(path, overrides);
    const std::string text = tessera::to_toml(c);
    tessera::Config again;
    try {
      again = tessera::parse_config_string(text, "to_toml output");
    } catch (const tessera::Error& e) {
      tf::finding(std::string("to_toml output of a valid config does not load: ") + e.what() + "\n" + text);
    }
    // Text equality as well: NaN != NaN would fail the struct comparison of an exact round trip.
    if (!(again == c) && tessera::to_toml(again) != text)
      tf::finding("to_toml output loads as a different config:\n" + text + "\n---\n" + tessera::to_toml(again));
  });
  return 0;
}
