// Token ids stored in files: the element types the formats use (Megatron's dtype codes) and a
// typed view of a range of a file, read with pread and converted to int32 only when copied out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "data/file_io.h"

namespace tessera {

// Megatron's DType codes (megatron/core/datasets/indexed_dataset.py), as stored in the .idx.
enum class TokenDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
  // Not a Megatron code (token_dtype_from_code never returns it): llm.c's Llama 3 shards.
  kUInt32 = 100,
};

// The dtype for a code read from a file, or nothing for a code Megatron does not define.
std::optional<TokenDType> token_dtype_from_code(uint8_t code);
int64_t token_dtype_size(TokenDType dtype);
const char* token_dtype_name(TokenDType dtype);  // numpy's name: "uint16", "int32", ...
bool token_dtype_is_integer(TokenDType dtype);

// n token ids of one integer dtype stored from byte `offset` of `file` (a view: the file's owner
// keeps it open). Reads go through ReadOnlyFile, so a file truncated since it was opened is an
// error naming it, never a crash.
class TokenSpan {
 public:
  TokenSpan() = default;
  TokenSpan(const ReadOnlyFile* file, int64_t offset, int64_t size, TokenDType dtype)
      : file_(file), offset_(offset), size_(size), dtype_(dtype) {}

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  TokenDType dtype() const { return dtype_; }
  const ReadOnlyFile* file() const { return file_; }
  int64_t offset() const { return offset_; }  // in bytes
  int64_t operator[](int64_t i) const;        // one read per call: for messages and tests
  TokenSpan subspan(int64_t begin, int64_t n) const {
    return TokenSpan(file_, offset_ + begin * token_dtype_size(dtype_), n, dtype_);
  }
  // The ids [begin, begin + n) converted to int32 (callers check the range against a vocabulary).
  void copy_to(int64_t begin, int64_t n, int32_t* out) const;
  // The position of the first id outside [0, limit), or nothing. Reads the span in chunks of
  // kScanChunkBytes, one vectorized minimum/maximum pass each; a chunk is searched only when
  // something in it is out of range.
  std::optional<int64_t> find_out_of_range(int64_t limit) const;
  static constexpr int64_t kScanChunkBytes = int64_t(1) << 18;

 private:
  const ReadOnlyFile* file_ = nullptr;
  int64_t offset_ = 0, size_ = 0;
  TokenDType dtype_ = TokenDType::kUInt16;
};

}  // namespace tessera
