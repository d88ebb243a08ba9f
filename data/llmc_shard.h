// llm.c token shards (dev/data/data_common.py write_datafile, GPT-2 flavour): a header of 256
// little-endian int32 then the tokens as uint16. The header is validated at open and the tokens
// read with pread (a shard truncated mid-run is an error, not a SIGBUS); also written, for tests
// and to export data to llm.c.
//
//   offset 0     int32        magic 20240520
//   offset 4     int32        version 1 (uint16 tokens)
//   offset 8     int32        N, the number of tokens
//   offset 12    int32[253]   unused, 0
//   offset 1024  uint16[N]    token ids
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "data/file_io.h"
#include "data/token_span.h"

namespace tessera {

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int32_t kLlmcLlama3Magic = 20240801;  // llm.c's uint32 variant, not read by tessera
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

// True when path is a readable file whose first 4 bytes are the llm.c magic.
bool has_llmc_magic(const std::string& path);

// One shard, opened read-only. Open checks magic, version, and that the file holds exactly the
// header and the N tokens its header announces.
class LlmcShard {
 public:
  explicit LlmcShard(const std::string& path);

  const std::string& path() const { return file_.path(); }
  int64_t num_tokens() const { return num_tokens_; }
  TokenSpan tokens() const { return TokenSpan(&file_, kLlmcHeaderBytes, num_tokens_, TokenDType::kUInt16); }

 private:
  ReadOnlyFile file_;
  int64_t num_tokens_ = 0;
};

// Writes ids (each in [0, 65536); at most 2^31 - 1 of them) as a shard, atomically.
void write_llmc_shard(const std::string& path, std::span<const int32_t> ids);

}  // namespace tessera
