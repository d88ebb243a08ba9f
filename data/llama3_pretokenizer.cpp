// The LLaMA-3 pre-tokenization scanner: the pattern's alternatives tried in order at each piece
// start, each written out as the regex engine would match it (greedy, with its backtracking spelt
// out where it matters: \s*[\r\n]+ and \s+(?!\S)).
#include "data/llama3_pretokenizer.h"

#include "data/unicode_class.h"

namespace tessera {

const std::string_view kLlama3SplitPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

namespace {

using Byte = unsigned char;

bool is_cr_lf(Byte b) { return b == '\r' || b == '\n'; }
Byte lower_ascii(Byte b) { return b >= 'A' && b <= 'Z' ? static_cast<Byte>(b + ('a' - 'A')) : b; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at p (p[0] == '\''): its length, or 0. ASCII case folding only.
size_t contraction_length(const Byte* p, const Byte* end) {
  if (end - p < 2) return 0;
  const Byte second = lower_ascii(p[1]);
  const Byte third = end - p >= 3 ? lower_ascii(p[2]) : 0;
  switch (second) {
    case 's': case 't': case 'm': case 'd': return 2;
    case 'r': case 'v': return third == 'e' ? 3 : 0;
    case 'l': return third == 'l' ? 3 : 0;
    default: return 0;
  }
}

// [^\r\n\p{L}\p{N}]?\p{L}+ at p: the end, or nullptr when it does not match.
const Byte* letters_end(const Byte* p, const Byte* end, CharClass cls, uint32_t len) {
  if (cls == CharClass::kLetter) return class_run_end(p + len, end, CharClass::kLetter);
  if (cls == CharClass::kNumber || is_cr_lf(*p) || p + len >= end) return nullptr;
  uint32_t next_len;
  if (char_class_at(p + len, end, &next_len) != CharClass::kLetter) return nullptr;
  return class_run_end(p + len + next_len, end, CharClass::kLetter);
}

// \p{N}{1,3} at p (a number character of length len).
const Byte* numbers_end(const Byte* p, const Byte* end, uint32_t len) {
  p += len;
  for (int taken = 1; taken < 3 && p < end; ++taken) {
    uint32_t l;
    if (char_class_at(p, end, &l) != CharClass::kNumber) break;
    p += l;
  }
  return p;
}

//  ?[^\s\p{L}\p{N}]+[\r\n]* at p: the end, or nullptr when it does not match.
const Byte* others_end(const Byte* p, const Byte* end, CharClass cls, uint32_t len) {
  const Byte* q = nullptr;
  if (cls == CharClass::kOther) {
    q = class_run_end(p + len, end, CharClass::kOther);
  } else if (*p == ' ' && p + 1 < end) {
    uint32_t next_len;
    if (char_class_at(p + 1, end, &next_len) != CharClass::kOther) return nullptr;
    q = class_run_end(p + 1 + next_len, end, CharClass::kOther);
  } else {
    return nullptr;
  }
  while (q < end && is_cr_lf(*q)) ++q;
  return q;
}

// \s*[\r\n]+ at p (a white space character): \s* backtracks from the end of the white space run to
// its last \r or \n, which [\r\n]+ then takes; nullptr when the run holds none.
const Byte* space_to_newline_end(const Byte* p, const Byte* end) {
  const Byte* run_end = class_run_end(p, end, CharClass::kSpace);
  for (const Byte* q = run_end; q > p; --q)
    if (is_cr_lf(q[-1])) return q;
  return nullptr;
}

}  // namespace

size_t llama3_piece_end(std::string_view text, size_t begin) {
  const Byte* s = reinterpret_cast<const Byte*>(text.data());
  const Byte* end = s + text.size();
  const Byte* p = s + begin;
  if (*p == '\'') {
    if (size_t n = contraction_length(p, end)) return begin + n;
  }
  uint32_t len;
  const CharClass cls = char_class_at(p, end, &len);
  if (const Byte* q = letters_end(p, end, cls, len)) return q - s;
  if (cls == CharClass::kNumber) return numbers_end(p, end, len) - s;
  if (const Byte* q = others_end(p, end, cls, len)) return q - s;
  // Only white space is left (an "other" character always matched above).
  if (const Byte* q = space_to_newline_end(p, end)) return q - s;
  return space_piece_end(p, end, len) - s;
}

std::vector<std::string_view> llama3_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = llama3_piece_end(text, begin);
    pieces.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return pieces;
}

}  // namespace tessera
