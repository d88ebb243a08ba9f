// The tokenizer interface (text <-> token ids) and the tokenizers tessera ships: byte-level
// (256 byte ids + end-of-document) and GPT-2's byte-level BPE (data/gpt2_tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// GPT-2's vocabulary: 50,000 merges + 256 bytes + <|endoftext|>.
constexpr int64_t kGpt2VocabSize = 50257;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids of text. Special tokens in the text (e.g. "<|endoftext|>") are encoded as plain text
  // unless allow_special, in which case they become their ids.
  virtual std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const = 0;
  // The bytes the ids stand for; decode(encode(s)) == s for any bytes s, invalid UTF-8 included.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eot_id() const = 0;  // the end-of-document token appended by `tessera prepare`
  virtual std::string name() const = 0;
  // The id of the special token written as `text` (e.g. "<|endoftext|>", "<|im_start|>"), or nothing
  // when this tokenizer has no such special token. Chat templates (data/chat_template.h) look
  // their tokens up here; a tokenizer with added special tokens overrides it.
  virtual std::optional<int32_t> special_token_id(std::string_view /*text*/) const { return std::nullopt; }
};

// Bytes 0..255 are ids 0..255; id 256 is the end-of-document token. Vocabulary 257.
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 257; }
  int32_t eot_id() const override { return 256; }
  std::string name() const override { return "byte"; }
};

// "byte", a path ending in ".json" (a Hugging Face tokenizer.json, data/hf_bpe_tokenizer.h), or "gpt2" loaded from vocab_dir (a directory holding encoder.json and vocab.bpe), or
// from default_gpt2_vocab_dir() when vocab_dir is empty. An unknown kind or missing files are
// errors naming what was expected and where it was looked for.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir);

// Where tokenizer files are looked for when no directory is named: $TESSERA_DATA_DIR when it is
// set, else the data/ directory of the repository this binary was built from (where
// scripts/get_data.sh puts them). GPT-2's files are in its gpt2/ subdirectory.
std::string default_data_dir();
std::string default_gpt2_vocab_dir();

}  // namespace tessera
