// The pre-tokenization scanner. Characters are classified by data/unicode_class.h; an invalid
// UTF-8 byte is one character of class "other" (it matches [^\s\p{L}\p{N}] only).
#include "data/gpt2_pretokenizer.h"

#include "data/unicode_class.h"

namespace tessera {
namespace {

using Byte = unsigned char;

// Length of the contraction 's 't 're 've 'm 'll 'd at p (p[0] == '\''), or 0. Case-sensitive.
size_t contraction_length(const Byte* p, const Byte* end) {
  if (end - p < 2) return 0;
  switch (p[1]) {
    case 's': case 't': case 'm': case 'd': return 2;
    case 'r': case 'v': return end - p >= 3 && p[2] == 'e' ? 3 : 0;
    case 'l': return end - p >= 3 && p[2] == 'l' ? 3 : 0;
    default: return 0;
  }
}

}  // namespace

size_t gpt2_piece_end(std::string_view text, size_t begin) {
  const Byte* s = reinterpret_cast<const Byte*>(text.data());
  const Byte* end = s + text.size();
  const Byte* p = s + begin;
  if (*p == '\'') {
    if (size_t n = contraction_length(p, end)) return begin + n;
  }
  uint32_t len;
  CharClass cls = char_class_at(p, end, &len);
  if (*p == ' ' && p + 1 < end) {  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' with the space
    uint32_t next_len;
    CharClass next = char_class_at(p + 1, end, &next_len);
    if (next != CharClass::kSpace) return class_run_end(p + 1 + next_len, end, next) - s;
  }
  if (cls != CharClass::kSpace) return class_run_end(p + len, end, cls) - s;
  return space_piece_end(p, end, len) - s;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = gpt2_piece_end(text, begin);
    pieces.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return pieces;
}

// A piece holding an ASCII letter ends where the letters end (contractions end in letters too), and
// one holding a non-' ' white space byte (\t \n \v \f \r) is all white space. So if text[pos - 1] is
// either and text[pos] is an ASCII non-space of another class, a piece starts at pos.
bool gpt2_is_safe_split(std::string_view text, size_t pos) {
  if (pos == 0 || pos >= text.size()) return false;
  Byte before = static_cast<Byte>(text[pos - 1]), at = static_cast<Byte>(text[pos]);
  if (before >= 0x80 || at >= 0x80 || before == ' ') return false;
  CharClass a = detail::kAsciiClasses.c[before], b = detail::kAsciiClasses.c[at];
  return (a == CharClass::kLetter || a == CharClass::kSpace) && b != CharClass::kSpace && a != b;
}

}  // namespace tessera
