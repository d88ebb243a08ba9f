// UTF-8 decoding and the character classes of GPT-2's pre-tokenizer (letter, number, white space,
// other). Key decision: a byte that does not start a valid UTF-8 sequence is a character of its own,
// class "other", so any byte string can be classified and tokenized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera {

enum class CharClass : uint8_t { kOther, kLetter, kNumber, kSpace };

// One character of a byte string: its code point (or the lone byte when invalid) and length.
struct Utf8Char {
  char32_t code_point;
  uint32_t length;  // 1..4 bytes
  bool valid;       // false: an invalid byte, treated as one character of class kOther
};

// The character starting at p (p < end), strict UTF-8 (Unicode Table 3-7): no overlong forms, no
// surrogates, nothing above U+10FFFF, no truncated sequences.
Utf8Char decode_utf8(const unsigned char* p, const unsigned char* end);

// \p{L}, \p{N} and \s (Unicode White_Space) of a code point, from data/unicode_tables.inc.
CharClass code_point_class(char32_t cp);

// The Unicode version the tables were generated from (e.g. "14.0.0").
const char* unicode_tables_version();

namespace detail {
// ASCII classes: the hot path of English text, without a table search.
struct AsciiClasses {
  CharClass c[128];
  constexpr AsciiClasses() : c() {
    for (int i = 0; i < 128; ++i) {
      bool letter = (i >= 'a' && i <= 'z') || (i >= 'A' && i <= 'Z');
      bool space = i == ' ' || (i >= '\t' && i <= '\r');
      c[i] = letter ? CharClass::kLetter
             : (i >= '0' && i <= '9') ? CharClass::kNumber
             : space ? CharClass::kSpace
                     : CharClass::kOther;
    }
  }
};
inline constexpr AsciiClasses kAsciiClasses{};
}  // namespace detail

// The class of the character at p, and its length through *length.
inline CharClass char_class_at(const unsigned char* p, const unsigned char* end, uint32_t* length) {
  if (*p < 0x80) {
    *length = 1;
    return detail::kAsciiClasses.c[*p];
  }
  Utf8Char ch = decode_utf8(p, end);
  *length = ch.length;
  return ch.valid ? code_point_class(ch.code_point) : CharClass::kOther;
}

// The end of the run of class `cls` characters from p (p itself when p's class differs): the
// pre-tokenizers' "\p{L}+", "\s+" and the like.
inline const unsigned char* class_run_end(const unsigned char* p, const unsigned char* end, CharClass cls) {
  while (p < end) {
    uint32_t len;
    if (char_class_at(p, end, &len) != cls) break;
    p += len;
  }
  return p;
}

// \s+(?!\S)|\s+ from p (a white space character of length len): a run that ends the text is taken
// whole; a run of two or more before a non-space character gives back its last character (it may
// then prefix the next piece as ' ?'); a single one is taken by \s+.
inline const unsigned char* space_piece_end(const unsigned char* p, const unsigned char* end, uint32_t len) {
  const unsigned char* last = p;  // the start of the run's last character
  const unsigned char* q = p + len;
  while (q < end) {
    uint32_t l;
    if (char_class_at(q, end, &l) != CharClass::kSpace) break;
    last = q;
    q += l;
  }
  if (q == end || last == p) return q;
  return last;
}

}  // namespace tessera
