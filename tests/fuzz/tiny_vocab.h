// A tiny GPT-2-format vocabulary (the 256 byte tokens, a few merges, <|endoftext|>), for the
// encode target when ../shared/data/gpt2 is absent. The same shape as the one in
// tests/data/test_gpt2_tokenizer.cpp.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "data/gpt2_tokenizer.h"

namespace tessera::fuzz {

// GPT-2's printable stand-in for each byte, as UTF-8 (all below U+0800: one or two bytes).
inline std::string mapped_utf8(std::string_view bytes) {
  const auto map = gpt2_byte_to_unicode();
  std::string out;
  for (unsigned char b : bytes) {
    const char32_t cp = map[b];
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

inline std::string json_quoted(const std::string& utf8) {
  std::string out = "\"";
  for (char c : utf8) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

inline const std::vector<std::pair<std::string, std::string>>& tiny_merges() {
  static const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"o", "r"}, {" w", "or"}, {"l", "d"}, {" wor", "ld"}};
  return merges;
}

inline std::string tiny_encoder_json() {
  std::string json = "{";
  for (int b = 0; b < 256; ++b) json += json_quoted(mapped_utf8(std::string(1, char(b)))) + ": " + std::to_string(b) + ", ";
  int id = 256;
  for (const auto& [l, r] : tiny_merges()) json += json_quoted(mapped_utf8(l + r)) + ": " + std::to_string(id++) + ", ";
  return json + "\"<|endoftext|>\": " + std::to_string(id) + "}";
}

inline std::string tiny_vocab_bpe() {
  std::string bpe = "#version: 0.2\n";
  for (const auto& [l, r] : tiny_merges()) bpe += mapped_utf8(l) + " " + mapped_utf8(r) + "\n";
  return bpe;
}

}  // namespace tessera::fuzz
