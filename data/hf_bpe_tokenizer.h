// A byte-level BPE tokenizer read from the tokenizer.json that Hugging Face's `tokenizers` library
// writes (GPT-2, LLaMA-3 and Mistral-style vocabularies), with ids equal to that library's.
// Key decision: read exactly the byte-level BPE subset and refuse everything else by its key and
// value (SentencePiece/Unigram/WordPiece models, Metaspace pre-tokenizers, normalizers, other split
// patterns), so a file tessera accepts is one it tokenizes exactly.
//
// What is read (anything else in those keys is refused naming the file, key and value):
//   model:         type "BPE", vocab (token -> id), merges as "a b" strings or ["a", "b"] pairs,
//                  ignore_merges (honoured), byte_fallback and unk_token (never used: all 256 byte
//                  tokens must be in the vocabulary), dropout null, no subword prefix/suffix;
//   normalizer:    null;
//   pre_tokenizer: ByteLevel (GPT-2's regex, or none with use_regex false), or Sequence of
//                  Split(LLaMA-3's regex, Isolated) and ByteLevel(use_regex false); no prefix space;
//   decoder:       ByteLevel;
//   added_tokens:  matched in the text before pre-tokenization, leftmost then longest, exactly
//                  as written (lstrip, rstrip or single_word tokens are refused); special ones
//                  only when encode's allow_special is set.
// The post_processor (e.g. a template adding <|begin_of_text|>) is not applied: encode gives the
// library's encode(text, add_special_tokens=False). Merges run as data/bpe.h runs them (the lowest
// rank, all its occurrences left to right); the library's queue (lowest rank, then leftmost) gives
// the same whenever each merge ranks after the merges that made its parts, as in any trained file.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/bpe.h"
#include "data/tokenizer.h"

namespace tessera {

class HfBpeTokenizer : public Tokenizer {
 public:
  // Reads path (a tokenizer.json). Throws Error naming the file and key when it is missing,
  // malformed, or holds something this tokenizer does not implement.
  explicit HfBpeTokenizer(const std::string& path);

  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  // The end-of-document token: the first of <|endoftext|>, <|end_of_text|>, </s> it defines.
  int32_t eot_id() const override { return eot_id_; }
  std::string name() const override { return "tokenizer.json"; }
  // An added token marked special whose content is exactly `text` (chat templates' tokens).
  std::optional<int32_t> special_token_id(std::string_view text) const override;
  const std::string& path() const { return path_; }

  // The bytes a token stands for (an added token: its content as written).
  std::string_view token_bytes(int32_t id) const;

  // How text is cut into pieces before BPE (the pre_tokenizer).
  enum class Split { kNone, kGpt2, kLlama3 };
  Split split() const { return split_; }

 private:
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special;
  };
  class Loader;
  // Piece -> its ids, for one encode call (the pieces point into its text).
  using PieceCache = std::unordered_map<std::string_view, std::vector<int32_t>>;
  // One stretch of text between added tokens: pre-tokenized, each piece BPE-encoded (once per call).
  void encode_ordinary(std::string_view text, PieceCache& cache, std::vector<int32_t>* out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;
  // The added token (longest first) that starts at text[pos], or nullptr.
  const AddedToken* added_token_at(std::string_view text, size_t pos, bool allow_special) const;

  std::string path_;
  std::vector<std::string> token_bytes_;  // id -> bytes ("" for ids no token has)
  std::vector<uint8_t> has_token_;        // id -> 1 when the file defines it
  std::unordered_map<std::string, int32_t> vocab_ids_;  // model.vocab's token bytes -> id
  std::array<int32_t, 256> byte_ids_{};
  BpeMerges merges_;
  bool ignore_merges_ = false;
  Split split_ = Split::kGpt2;
  std::vector<AddedToken> added_;  // longest content first
  std::array<std::vector<uint32_t>, 256> added_by_first_byte_;  // indices into added_, in its order
  int64_t vocab_size_ = 0;
  int32_t eot_id_ = -1;
};

// True when path names a tokenizer.json: it ends in ".json" (how make_tokenizer tells it from the
// names "byte" and "gpt2").
bool is_tokenizer_json_path(std::string_view path);

}  // namespace tessera
