// Strict UTF-8 decoding and the code point class tables (generated, binary-searched ranges).
#include "data/unicode_class.h"

#include <algorithm>
#include <iterator>

namespace tessera {
namespace {

struct CodePointRange {
  char32_t first, last;
  CharClass cls;
};

#include "data/unicode_tables.inc"

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Length of a valid sequence led by b0 and the allowed range of its second byte (Table 3-7).
struct LeadInfo {
  uint32_t length;
  unsigned char second_lo, second_hi;
};
LeadInfo lead_info(unsigned char b0) {
  if (b0 >= 0xC2 && b0 <= 0xDF) return {2, 0x80, 0xBF};
  if (b0 == 0xE0) return {3, 0xA0, 0xBF};
  if (b0 == 0xED) return {3, 0x80, 0x9F};  // excludes the surrogates U+D800..U+DFFF
  if (b0 >= 0xE1 && b0 <= 0xEF) return {3, 0x80, 0xBF};
  if (b0 == 0xF0) return {4, 0x90, 0xBF};
  if (b0 >= 0xF1 && b0 <= 0xF3) return {4, 0x80, 0xBF};
  if (b0 == 0xF4) return {4, 0x80, 0x8F};  // up to U+10FFFF
  return {0, 0, 0};                        // 0x80..0xC1, 0xF5..0xFF never lead
}

}  // namespace

Utf8Char decode_utf8(const unsigned char* p, const unsigned char* end) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {b0, 1, true};
  const Utf8Char invalid{b0, 1, false};
  LeadInfo lead = lead_info(b0);
  if (lead.length == 0 || end - p < static_cast<std::ptrdiff_t>(lead.length)) return invalid;
  if (p[1] < lead.second_lo || p[1] > lead.second_hi) return invalid;
  char32_t cp = b0 & (0x7F >> lead.length);
  for (uint32_t i = 1; i < lead.length; ++i) {
    if (!is_continuation(p[i])) return invalid;
    cp = (cp << 6) | (p[i] & 0x3F);
  }
  return {cp, lead.length, true};
}

CharClass code_point_class(char32_t cp) {
  if (cp < 128) return detail::kAsciiClasses.c[cp];
  // The first range whose last >= cp; cp is in it when first <= cp.
  auto it = std::lower_bound(std::begin(kCodePointRanges), std::end(kCodePointRanges), cp,
                             [](const CodePointRange& r, char32_t x) { return r.last < x; });
  if (it != std::end(kCodePointRanges) && it->first <= cp) return it->cls;
  return CharClass::kOther;
}

const char* unicode_tables_version() { return kUnicodeTablesVersion; }

}  // namespace tessera
