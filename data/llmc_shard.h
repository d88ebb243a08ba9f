// llm.c token shards (dev/data/data_common.py write_datafile): a header of 256 little-endian int32
// then the tokens, in one of llm.c's two flavours. The header is validated at open and the tokens
// read with pread (a shard truncated mid-run is an error, not a SIGBUS); also written, for tests
// and to export data to llm.c.
//
//   offset 0     int32        magic: 20240520 (GPT-2 flavour) or 20240801 (Llama 3 flavour)
//   offset 4     int32        version: 1 (GPT-2: uint16 tokens) or 7 (Llama 3: uint32 tokens)
//   offset 8     int32        N, the number of tokens
//   offset 12    int32[253]   unused, 0
//   offset 1024  uint16[N] or uint32[N]  token ids
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "data/file_io.h"
#include "data/token_span.h"

namespace tessera {

inline constexpr int32_t kLlmcMagic = 20240520;        // GPT-2 flavour
inline constexpr int32_t kLlmcVersion = 1;             //   uint16 tokens
inline constexpr int32_t kLlmcLlama3Magic = 20240801;  // Llama 3 flavour
inline constexpr int32_t kLlmcLlama3Version = 7;       //   uint32 tokens
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

// llm.c's two flavours: what the magic says the version and token type must be.
enum class LlmcFlavour { kGpt2, kLlama3 };

// True when path is a readable file whose first 4 bytes are an llm.c magic (either flavour).
bool has_llmc_magic(const std::string& path);

// One shard, opened read-only. Open checks magic, the version that goes with it, and that the file
// holds exactly the header and the N tokens its header announces.
class LlmcShard {
 public:
  explicit LlmcShard(const std::string& path);

  const std::string& path() const { return file_.path(); }
  int64_t num_tokens() const { return num_tokens_; }
  LlmcFlavour flavour() const { return flavour_; }
  TokenSpan tokens() const { return TokenSpan(&file_, kLlmcHeaderBytes, num_tokens_, dtype()); }

 private:
  TokenDType dtype() const { return flavour_ == LlmcFlavour::kGpt2 ? TokenDType::kUInt16 : TokenDType::kUInt32; }

  ReadOnlyFile file_;
  LlmcFlavour flavour_ = LlmcFlavour::kGpt2;
  int64_t num_tokens_ = 0;
};

// Writes ids (each >= 0 and, for the GPT-2 flavour, < 65536; at most 2^31 - 1 of them) as a
// shard, atomically.
void write_llmc_shard(const std::string& path, std::span<const int32_t> ids, LlmcFlavour flavour = LlmcFlavour::kGpt2);

}  // namespace tessera
