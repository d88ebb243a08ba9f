// The one piece of JSON that tokenizer files need: a flat object of string keys to integers (GPT-2's
// encoder.json), plus string-literal decoding. Key decision: no JSON library; \uXXXX escapes,
// surrogate pairs included, decode to UTF-8, and every error names the file and the byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera {

// The (key, value) pairs of `{"key": 123, ...}` in file order. `source` names the file in errors.
std::vector<std::pair<std::string, int64_t>> parse_json_string_int_map(std::string_view text,
                                                                       const std::string& source);

// The JSON string literal that starts at text[*pos] (a '"'), decoded to UTF-8; *pos moves past its
// closing quote.
std::string parse_json_string(std::string_view text, size_t* pos, const std::string& source);

}  // namespace tessera
