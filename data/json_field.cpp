// A small recursive scanner over one JSON object: strings are decoded only for keys and for the
// wanted value; everything else is skipped by structure (nesting, strings, literals).
#include "data/json_field.h"

#include "kernels/check.h"

namespace tessera {

namespace {

class Scanner {
 public:
  explicit Scanner(std::string_view s) : s_(s) {}

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool at_end() const { return i_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[i_]; }
  void expect(char c, const char* where) {
    skip_space();
    if (peek() != c) fail("expected '", c, "' ", where);
    ++i_;
  }
  std::string string();
  void skip_value(int depth = 0);

  template <typename... Args>
  [[noreturn]] void fail(Args&&... args) const {
    detail::fail("malformed JSON at column ", i_ + 1, ": ", args...);
  }

 private:
  uint32_t hex4();
  uint32_t escaped_code_point();
  void skip_literal();

  std::string_view s_;
  size_t i_ = 0;
};

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t Scanner::hex4() {
  if (i_ + 4 > s_.size()) fail("truncated \\u escape");
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) {
    const char c = s_[i_++];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
    else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
    else fail("bad hex digit '", c, "' in \\u escape");
  }
  return v;
}

// After "\u": one code point, joining a high surrogate with the "\uDC00-\uDFFF" that follows it.
uint32_t Scanner::escaped_code_point() {
  const uint32_t u = hex4();
  if (u >= 0xDC00 && u <= 0xDFFF) return 0xFFFD;  // a low surrogate with no high one before it
  if (u < 0xD800 || u > 0xDBFF) return u;
  if (s_.substr(i_, 2) != "\\u") return 0xFFFD;
  const size_t save = i_;
  i_ += 2;
  const uint32_t lo = hex4();
  if (lo < 0xDC00 || lo > 0xDFFF) {
    i_ = save;  // not a pair: the next escape stands on its own
    return 0xFFFD;
  }
  return 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
}

std::string Scanner::string() {
  expect('"', "at the start of a string");
  std::string out;
  while (true) {
    if (at_end()) fail("unterminated string");
    const char c = s_[i_++];
    if (c == '"') return out;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (at_end()) fail("unterminated string");
    const char e = s_[i_++];
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': append_utf8(out, escaped_code_point()); break;
      default: fail("unknown escape \\", e);
    }
  }
}

void Scanner::skip_literal() {  // a number, true, false or null
  const size_t start = i_;
  while (!at_end() && std::string_view(",}] \t\r\n").find(peek()) == std::string_view::npos) ++i_;
  if (i_ == start) fail("expected a value");
}

void Scanner::skip_value(int depth) {
  if (depth > 512) fail("nesting deeper than 512");
  skip_space();
  const char c = peek();
  if (c == '"') {
    string();
  } else if (c == '{' || c == '[') {
    const char close = c == '{' ? '}' : ']';
    ++i_;
    skip_space();
    if (peek() == close) {
      ++i_;
      return;
    }
    while (true) {
      if (c == '{') {
        string();
        expect(':', "after an object key");
      }
      skip_value(depth + 1);
      skip_space();
      if (peek() == close) {
        ++i_;
        return;
      }
      expect(',', "between elements");
      skip_space();
    }
  } else {
    skip_literal();
  }
}

}  // namespace

std::optional<std::string> json_string_field(std::string_view json, std::string_view key) {
  Scanner sc(json);
  sc.skip_space();
  if (sc.peek() != '{') sc.fail("a line must be one JSON object");
  sc.expect('{', "");
  sc.skip_space();
  std::optional<std::string> found;
  if (sc.peek() == '}') {
    sc.expect('}', "");
  } else {
    while (true) {
      const std::string k = sc.string();
      sc.expect(':', "after an object key");
      sc.skip_space();
      if (k == key) {
        if (sc.peek() != '"') sc.fail("the value of \"", key, "\" is not a string");
        found = sc.string();  // a repeated key: the last one wins, as in Python's json
      } else {
        sc.skip_value();
      }
      sc.skip_space();
      if (sc.peek() == '}') {
        sc.expect('}', "");
        break;
      }
      sc.expect(',', "between object members");
    }
  }
  sc.skip_space();
  if (!sc.at_end()) sc.fail("unexpected text after the object");
  return found;
}

}  // namespace tessera
