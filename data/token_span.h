// Token ids stored in files, read in place: the element types the formats use (Megatron's dtype
// codes) and a typed view over mapped bytes that converts to int32 only when copied out.
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
};

// The dtype for a code read from a file, or nothing for a code Megatron does not define.
std::optional<TokenDType> token_dtype_from_code(uint8_t code);
int64_t token_dtype_size(TokenDType dtype);
const char* token_dtype_name(TokenDType dtype);  // numpy's name: "uint16", "int32", ...
bool token_dtype_is_integer(TokenDType dtype);

// n token ids of one integer dtype at `bytes` (aligned for the dtype: .bin files are mapped at a
// page boundary and every sequence starts at a multiple of the element size).
class TokenSpan {
 public:
  TokenSpan() = default;
  TokenSpan(const std::byte* bytes, int64_t size, TokenDType dtype) : bytes_(bytes), size_(size), dtype_(dtype) {}

  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  TokenDType dtype() const { return dtype_; }
  const std::byte* bytes() const { return bytes_; }
  int64_t operator[](int64_t i) const;
  TokenSpan subspan(int64_t begin, int64_t n) const {
    return TokenSpan(bytes_ + begin * token_dtype_size(dtype_), n, dtype_);
  }
  // The ids [begin, begin + n) converted to int32 (callers check the range against a vocabulary).
  void copy_to(int64_t begin, int64_t n, int32_t* out) const;
  // The position of the first id outside [0, limit), or nothing. One vectorized pass computing
  // the minimum and maximum; a second pass only when something is out of range.
  std::optional<int64_t> find_out_of_range(int64_t limit) const;

 private:
  const std::byte* bytes_ = nullptr;
  int64_t size_ = 0;
  TokenDType dtype_ = TokenDType::kUInt16;
};

}  // namespace tessera
