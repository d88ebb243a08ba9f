// The per-token loss mask stored beside an indexed dataset (PREFIX.mask next to PREFIX.bin/.idx),
// written by `tessera prepare --sft`: one byte per token of the .bin, 1 where the token is a training
// target (a response), 0 where it is not (prompt, system text, chat template). Key decision: a
// companion file rather than a change to the .bin/.idx, so the pair stays Megatron-compatible.
//
// PREFIX.mask, little-endian:
//   offset 0    8 bytes   magic "TSRMASK\0"
//   offset 8    uint64    version, 1
//   offset 16   uint64    N, the number of tokens (the .bin's)
//   offset 24   uint8[N]  flags, each 0 or 1
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/file_io.h"

namespace tessera {

inline constexpr char kLossMaskMagic[8] = {'T', 'S', 'R', 'M', 'A', 'S', 'K', '\0'};
inline constexpr uint64_t kLossMaskVersion = 1;
inline constexpr int64_t kLossMaskHeaderBytes = 24;

// "data/x" -> "data/x.mask".
std::string loss_mask_path(const std::string& prefix);

// A mask file, read with pread while training runs. Opening checks the magic, the version, and that
// the file holds the N flags its header announces; num_tokens is checked against the dataset by the
// caller (open_loss_mask). Flags other than 0 or 1 are errors naming the file and position when read.
class LossMaskFile {
 public:
  explicit LossMaskFile(const std::string& path);
  const std::string& path() const { return file_.path(); }
  int64_t num_tokens() const { return num_tokens_; }
  // Flags [first, first + count) into out.
  void read(int64_t first, int64_t count, uint8_t* out) const;

 private:
  ReadOnlyFile file_;
  int64_t num_tokens_ = 0;
};

// The mask beside the indexed dataset PREFIX, or null when there is none. A mask whose token count
// differs from the dataset's (num_tokens) is an error naming both files.
std::shared_ptr<const LossMaskFile> open_loss_mask(const std::string& prefix, int64_t num_tokens);

// Writes PREFIX.mask under a temporary name; finalize() renames it into place.
class LossMaskBuilder {
 public:
  explicit LossMaskBuilder(const std::string& prefix);
  void add(std::span<const uint8_t> flags);  // each 0 or 1
  // Writes the file: the header (the count is known only now), then the flags kept in memory.
  void finalize();
  int64_t num_tokens() const { return static_cast<int64_t>(flags_.size()); }
  int64_t num_trained() const { return trained_; }

 private:
  std::string prefix_;
  std::vector<uint8_t> flags_;  // one byte per token: small next to the token ids themselves
  int64_t trained_ = 0;
  bool finalized_ = false;
};

}  // namespace tessera
