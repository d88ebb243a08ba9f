// LLaMA-3's pre-tokenizer (the Split regex of its tokenizer.json, also used by tiktoken's cl100k):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// Key decision: a hand-written scanner like data/gpt2_pretokenizer.h (no regex library), on bytes
// that need not be UTF-8 (an invalid byte is one "other" character), with the same classes.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace tessera {

// The exact pattern string tokenizer.json holds for this pre-tokenizer (Split, "Regex").
extern const std::string_view kLlama3SplitPattern;

// The end of the piece that starts at text[begin] (begin < text.size()).
size_t llama3_piece_end(std::string_view text, size_t begin);

// Every piece of text, in order; they concatenate to text.
std::vector<std::string_view> llama3_pretokenize(std::string_view text);

}  // namespace tessera
