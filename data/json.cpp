// A recursive-descent JSON reader (RFC 8259): strings decoded, everything else skipped by structure.
#include "data/json.h"

namespace tessera {
namespace {

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char simple_escape(char c) {
  switch (c) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return 0;
  }
}

bool is_low_surrogate(char32_t u) { return u >= 0xDC00 && u <= 0xDFFF; }
bool is_high_surrogate(char32_t u) { return u >= 0xD800 && u <= 0xDBFF; }

}  // namespace

void JsonReader::skip_space() {
  while (pos_ < text_.size() &&
         (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
    ++pos_;
}

char JsonReader::peek() {
  skip_space();
  return at_end() ? '\0' : text_[pos_];
}

bool JsonReader::take(char c) {
  if (peek() != c) return false;
  ++pos_;
  return true;
}

void JsonReader::expect(char c) {
  if (take(c)) return;
  fail_at(pos_, "expected '", c, "'", at_end() ? " but the text ended" : "");
}

bool JsonReader::more(char close) {
  if (take(close)) return false;
  expect(',');
  return true;
}

// The 4 hex digits at text_[at].
char32_t JsonReader::hex4(size_t at) {
  if (at + 4 > text_.size()) fail_at(at, "truncated \\u escape");
  char32_t v = 0;
  for (size_t i = at; i < at + 4; ++i) {
    const char c = text_[i];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) fail_at(i, "bad hex digit '", c, "' in \\u escape");
    v = v * 16 + static_cast<char32_t>(d);
  }
  return v;
}

// The code point of the \uXXXX escape whose backslash is at text_[backslash], joining a surrogate
// pair; pos_ moves past it (and past the low half when it pairs).
char32_t JsonReader::unicode_escape(size_t backslash) {
  const char32_t u = hex4(backslash + 2);
  pos_ = backslash + 6;
  auto lone = [&](const char* what) -> char32_t {
    if (lone_ == LoneSurrogate::kError) fail_at(backslash, what);
    return 0xFFFD;
  };
  if (is_low_surrogate(u)) return lone("unpaired low surrogate \\u escape");
  if (!is_high_surrogate(u)) return u;
  if (text_.substr(pos_, 2) != "\\u") return lone("high surrogate \\u escape without its low half");
  const char32_t low = hex4(pos_ + 2);
  // Not a pair: the next escape stands on its own.
  if (!is_low_surrogate(low)) return lone("high surrogate \\u escape without its low half");
  pos_ += 6;
  return 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
}

std::string JsonReader::string() {
  if (peek() != '"') fail_at(pos_, "expected a string");
  const size_t start = pos_++;
  std::string out;
  while (true) {
    if (at_end()) fail_at(start, "unterminated string");
    const char c = text_[pos_];
    if (c == '"') break;
    if (static_cast<unsigned char>(c) < 0x20) fail_at(pos_, "raw control character in string");
    if (c != '\\') {
      out.push_back(c);
      ++pos_;
      continue;
    }
    if (pos_ + 1 >= text_.size()) fail_at(start, "unterminated string");
    const char e = text_[pos_ + 1];
    if (e == 'u') {
      append_utf8(unicode_escape(pos_), &out);
    } else if (const char decoded = simple_escape(e)) {
      out.push_back(decoded);
      pos_ += 2;
    } else {
      fail_at(pos_, "unknown escape \\", e);
    }
  }
  ++pos_;  // the closing quote
  return out;
}

int64_t JsonReader::integer() {
  skip_space();
  const size_t start = pos_;
  const bool negative = !at_end() && text_[pos_] == '-';
  if (negative) ++pos_;
  int64_t v = 0;
  size_t digits = 0;
  for (; !at_end() && text_[pos_] >= '0' && text_[pos_] <= '9'; ++pos_, ++digits) {
    if (v > (INT64_MAX - 9) / 10) fail_at(start, "integer out of range");
    v = v * 10 + (text_[pos_] - '0');
  }
  if (digits == 0) fail_at(start, "expected an integer value");
  if (!at_end() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
    fail_at(start, "expected an integer value, got a fraction or exponent");
  return negative ? -v : v;
}

void JsonReader::skip_value(int depth) {
  if (depth > 512) fail_at(pos_, "nesting deeper than 512");
  const char c = peek();
  if (c == '"') {
    string();
    return;
  }
  if (c != '{' && c != '[') {  // a number, true, false or null
    const size_t start = pos_;
    while (!at_end() && std::string_view(",}] \t\r\n").find(text_[pos_]) == std::string_view::npos) ++pos_;
    if (pos_ == start) fail_at(pos_, "expected a value");
    return;
  }
  const char close = c == '{' ? '}' : ']';
  ++pos_;
  if (take(close)) return;
  do {
    if (c == '{') {
      string();
      expect(':');
    }
    skip_value(depth + 1);
  } while (more(close));
}

void JsonReader::expect_end(std::string_view what) {
  skip_space();
  if (!at_end()) fail_at(pos_, "unexpected text after ", what);
}

std::vector<std::pair<std::string, int64_t>> parse_json_string_int_map(std::string_view text,
                                                                       const std::string& source) {
  JsonReader in(text, source, LoneSurrogate::kError);
  std::vector<std::pair<std::string, int64_t>> out;
  in.expect('{');
  if (!in.take('}')) {
    do {
      std::string key = in.string();
      in.expect(':');
      const int64_t value = in.integer();
      out.emplace_back(std::move(key), value);
    } while (in.more('}'));
  }
  in.expect_end("the closing '}'");
  return out;
}

std::optional<std::string> json_string_field(std::string_view json, std::string_view key) {
  JsonReader in(json, "", LoneSurrogate::kReplace);
  if (in.peek() != '{') in.fail_at(0, "a line must be one JSON object");
  in.expect('{');
  std::optional<std::string> found;
  if (!in.take('}')) {
    do {
      const std::string k = in.string();
      in.expect(':');
      if (k != key) {
        in.skip_value();
      } else if (in.peek() == '"') {
        found = in.string();
      } else {
        in.fail_at(in.pos(), "the value of \"", key, "\" is not a string");
      }
    } while (in.more('}'));
  }
  in.expect_end("the object");
  return found;
}

}  // namespace tessera
