// A small recursive-descent reader for a flat JSON object of string -> integer (RFC 8259 strings).
#include "data/json_string_map.h"

#include "kernels/check.h"

namespace tessera {
namespace {

[[noreturn]] void fail_at(const std::string& source, size_t pos, const std::string& what) {
  detail::fail(source, ": malformed JSON at byte ", pos, ": ", what);
}

void skip_space(std::string_view text, size_t* pos) {
  while (*pos < text.size() && (text[*pos] == ' ' || text[*pos] == '\t' || text[*pos] == '\n' ||
                                text[*pos] == '\r'))
    ++*pos;
}

void expect_char(std::string_view text, size_t* pos, char c, const std::string& source) {
  skip_space(text, pos);
  if (*pos >= text.size() || text[*pos] != c)
    fail_at(source, *pos, std::string("expected '") + c + "'" +
                              (*pos >= text.size() ? " but the file ended" : ""));
  ++*pos;
}

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

// The 4 hex digits after "\u" at text[pos].
char32_t hex4(std::string_view text, size_t pos, const std::string& source) {
  if (pos + 4 > text.size()) fail_at(source, pos, "truncated \\u escape");
  char32_t v = 0;
  for (size_t i = pos; i < pos + 4; ++i) {
    char c = text[i];
    int d = c >= '0' && c <= '9' ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) fail_at(source, i, "bad hex digit in \\u escape");
    v = v * 16 + static_cast<char32_t>(d);
  }
  return v;
}

// The code point of the \uXXXX escape at text[*pos] (the 'u'), joining a surrogate pair.
char32_t unicode_escape(std::string_view text, size_t* pos, const std::string& source) {
  size_t at = *pos - 1;  // the backslash
  char32_t cp = hex4(text, *pos + 1, source);
  *pos += 5;
  if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(source, at, "unpaired low surrogate \\u escape");
  if (cp < 0xD800 || cp > 0xDBFF) return cp;
  if (text.substr(*pos, 2) != "\\u") fail_at(source, at, "high surrogate \\u escape without its low half");
  char32_t low = hex4(text, *pos + 2, source);
  if (low < 0xDC00 || low > 0xDFFF) fail_at(source, at, "high surrogate \\u escape without its low half");
  *pos += 6;
  return 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
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

int64_t parse_integer(std::string_view text, size_t* pos, const std::string& source) {
  skip_space(text, pos);
  size_t start = *pos;
  bool negative = *pos < text.size() && text[*pos] == '-';
  if (negative) ++*pos;
  int64_t v = 0;
  size_t digits = 0;
  for (; *pos < text.size() && text[*pos] >= '0' && text[*pos] <= '9'; ++*pos, ++digits) {
    if (v > (INT64_MAX - 9) / 10) fail_at(source, start, "integer out of range");
    v = v * 10 + (text[*pos] - '0');
  }
  if (digits == 0) fail_at(source, start, "expected an integer value");
  if (*pos < text.size() && (text[*pos] == '.' || text[*pos] == 'e' || text[*pos] == 'E'))
    fail_at(source, start, "expected an integer value, got a fraction or exponent");
  return negative ? -v : v;
}

}  // namespace

std::string parse_json_string(std::string_view text, size_t* pos, const std::string& source) {
  skip_space(text, pos);
  if (*pos >= text.size() || text[*pos] != '"') fail_at(source, *pos, "expected a string");
  size_t start = (*pos)++;
  std::string out;
  while (true) {
    if (*pos >= text.size()) fail_at(source, start, "unterminated string");
    char c = text[*pos];
    if (c == '"') break;
    if (static_cast<unsigned char>(c) < 0x20) fail_at(source, *pos, "raw control character in string");
    if (c != '\\') {
      out.push_back(c);
      ++*pos;
      continue;
    }
    if (++*pos >= text.size()) fail_at(source, start, "unterminated string");
    if (text[*pos] == 'u') {
      append_utf8(unicode_escape(text, pos, source), &out);
    } else if (char e = simple_escape(text[*pos])) {
      out.push_back(e);
      ++*pos;
    } else {
      fail_at(source, *pos - 1, std::string("unknown escape \\") + text[*pos]);
    }
  }
  ++*pos;  // the closing quote
  return out;
}

std::vector<std::pair<std::string, int64_t>> parse_json_string_int_map(std::string_view text,
                                                                       const std::string& source) {
  std::vector<std::pair<std::string, int64_t>> out;
  size_t pos = 0;
  expect_char(text, &pos, '{', source);
  skip_space(text, &pos);
  bool empty = pos < text.size() && text[pos] == '}';
  if (empty) ++pos;
  while (!empty) {
    std::string key = parse_json_string(text, &pos, source);
    expect_char(text, &pos, ':', source);
    int64_t value = parse_integer(text, &pos, source);
    out.emplace_back(std::move(key), value);
    skip_space(text, &pos);
    if (pos < text.size() && text[pos] == '}') {
      ++pos;
      break;
    }
    expect_char(text, &pos, ',', source);
  }
  skip_space(text, &pos);
  if (pos != text.size()) fail_at(source, pos, "unexpected text after the closing '}'");
  return out;
}

}  // namespace tessera
