// GPT-2's byte-level BPE tokenizer from the original encoder.json and vocab.bpe, exact on any bytes.
// Key decision: no shared mutable state (read-only tables, per-call caches), so large inputs split
// at safe points encode on OpenMP threads with ids that never depend on the thread count.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/bpe.h"
#include "data/tokenizer.h"

namespace tessera {

class Gpt2Tokenizer : public Tokenizer {
 public:
  // Loads dir/encoder.json (token -> id) and dir/vocab.bpe (merges in rank order). Throws Error
  // naming the file when one is missing or malformed.
  explicit Gpt2Tokenizer(const std::string& dir);
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;  // whole_tokens_ points into token_pool_
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  // Uses up to omp_get_max_threads() threads on large inputs; the ids equal the serial ones.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const override;
  // The same on at most `threads` threads (1: serial).
  std::vector<int32_t> encode(std::string_view text, bool allow_special, int threads) const;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eot_id() const override { return eot_id_; }  // "<|endoftext|>", 50256
  std::string name() const override { return "gpt2"; }
  std::optional<int32_t> special_token_id(std::string_view text) const override {  // only <|endoftext|>
    return text == "<|endoftext|>" ? std::optional<int32_t>(eot_id_) : std::nullopt;
  }

  // The bytes of a token (after GPT-2's byte-to-unicode mapping is undone).
  std::string_view token_bytes(int32_t id) const;
  const BpeMerges& merges() const { return merges_; }

  // Large inputs are cut into up to kChunksPerThread chunks per thread, of kMinChunkBytes or more;
  // an input of less than 2 * kMinChunkBytes is encoded on the calling thread.
  static constexpr size_t kMinChunkBytes = 128 * 1024;
  static constexpr int kChunksPerThread = 4;

 private:
  class ChunkEncoder;
  using IdsByBytes = std::unordered_map<std::string, int32_t>;
  IdsByBytes load_vocab(const std::string& path);
  void load_merges(const std::string& path, const IdsByBytes& ids);
  void index_whole_tokens();
  void encode_ordinary(std::string_view text, int threads, std::vector<int32_t>* out) const;

  std::string token_pool_;                               // every token's bytes, back to back
  std::vector<std::pair<uint32_t, uint32_t>> token_at_;  // id -> (offset, length) in token_pool_
  std::vector<uint8_t> has_token_;                       // id -> 1 when encoder.json defines it
  std::array<int32_t, 256> byte_ids_{};                  // byte -> id of its one-byte token
  BpeMerges merges_;
  // Token bytes -> id for every token that BPE encodes as itself: a read-only cache, shared by all
  // calls and threads, of most frequent words (" the", " and", ...).
  std::unordered_map<std::string_view, int32_t> whole_tokens_;
  int64_t vocab_size_ = 0;
  int32_t eot_id_ = -1;
};

// GPT-2's bytes_to_unicode(): the code point that stands for each byte in encoder.json and vocab.bpe.
// The 188 printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7F..0xA0,
// 0xAD) take U+0100, U+0101, ... in byte order, so the space byte 0x20 is U+0120 'Ġ'.
std::array<char32_t, 256> gpt2_byte_to_unicode();

// The bytes a byte-level token stands for (each character mapped back through
// gpt2_byte_to_unicode()), appended to *bytes; false, with *bytes as it was, when a character is not
// one of the 256 byte code points. Used by encoder.json/vocab.bpe and tokenizer.json readers alike.
bool byte_level_to_bytes(std::string_view token, std::string* bytes);

}  // namespace tessera
