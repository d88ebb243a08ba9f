// GPT-2's pre-tokenizer: the pieces (each BPE-encoded alone) that openai/gpt-2 encoder.py matches with
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Key decision: a hand-written scanner (no regex library), on bytes that need not be UTF-8.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace tessera {

// The end of the piece that starts at text[begin] (begin < text.size()). The scanner only looks
// right of begin, so any piece start is a valid place to resume.
size_t gpt2_piece_end(std::string_view text, size_t begin);

// Every piece of text, in order; they concatenate to text.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

// True when a piece always starts at text[pos] whatever comes before it, judged from the two bytes
// around pos: lets a long text be split into chunks that tokenize independently.
bool gpt2_is_safe_split(std::string_view text, size_t pos);

}  // namespace tessera
