// The JSON that tessera reads: GPT-2's encoder.json (a flat object of string keys to integers) and
// the "text" of a .jsonl line. One reader serves both. Key decision: no JSON library; strings decode
// to UTF-8 (\uXXXX escapes, surrogate pairs joined), other values can be skipped by structure
// without being built, and every error names the byte offset (and the file, when given one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/check.h"

namespace tessera {

// What a \uXXXX escape holding half a surrogate pair with no other half decodes to.
enum class LoneSurrogate {
  kError,    // a malformed-JSON error (a vocabulary file must be exact)
  kReplace,  // U+FFFD, as Python's errors="replace" would (web text has them)
};

// A cursor over JSON text. Errors: "<source>: malformed JSON at byte N: <what>" (without the
// "<source>: " when source is empty: the caller then adds its own location).
class JsonReader {
 public:
  JsonReader(std::string_view text, std::string source, LoneSurrogate lone)
      : text_(text), source_(std::move(source)), lone_(lone) {}

  void skip_space();
  bool at_end() const { return pos_ >= text_.size(); }
  // The next character after whitespace ('\0' at the end).
  char peek();
  // Takes `c` if it is the next character after whitespace.
  bool take(char c);
  void expect(char c);
  // After an element of an array or object: false when `close` comes next (and is taken), true
  // after a ','; anything else is an error.
  bool more(char close);
  // The string literal that comes next, decoded to UTF-8.
  std::string string();
  // The integer that comes next (a fraction or exponent is an error).
  int64_t integer();
  // Skips the value that comes next: a string, number, literal, array or object (nesting <= 512).
  void skip_value(int depth = 0);
  // Only whitespace may follow; `what` names the end that was expected ("the closing '}'").
  void expect_end(std::string_view what);

  size_t pos() const { return pos_; }
  template <typename... Args>
  [[noreturn]] void fail_at(size_t pos, const Args&... what) const {
    if (source_.empty()) detail::fail("malformed JSON at byte ", pos, ": ", what...);
    detail::fail(source_, ": malformed JSON at byte ", pos, ": ", what...);
  }

 private:
  char32_t hex4(size_t at);
  char32_t unicode_escape(size_t backslash);

  std::string_view text_;
  std::string source_;
  LoneSurrogate lone_;
  size_t pos_ = 0;
};

// The (key, value) pairs of `{"key": 123, ...}` in file order; lone surrogates are errors. `source`
// names the file in errors.
std::vector<std::pair<std::string, int64_t>> parse_json_string_int_map(std::string_view text,
                                                                       const std::string& source);

// The decoded string value of the top-level `key` of the JSON object `json` (one .jsonl line), or
// nothing when the object has no such key; a repeated key: the last one wins, as in Python's json.
// Lone surrogates become U+FFFD. Throws tessera::Error (the caller adds file:line) when json is not
// an object, the value of key is not a string, or the text is malformed.
std::optional<std::string> json_string_field(std::string_view json, std::string_view key);

}  // namespace tessera
