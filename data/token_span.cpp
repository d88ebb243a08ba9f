// TokenSpan: one switch on the dtype per call, then reads into a buffer and a loop over the typed
// elements.
#include "data/token_span.h"

#include <algorithm>
#include <vector>

#include "kernels/check.h"

namespace tessera {

namespace {
// Calls f(T{}) with T the C++ type of an integer dtype.
template <typename F>
decltype(auto) visit_integer(TokenDType dtype, F&& f) {
  switch (dtype) {
    case TokenDType::kUInt8: return f(uint8_t{});
    case TokenDType::kInt8: return f(int8_t{});
    case TokenDType::kInt16: return f(int16_t{});
    case TokenDType::kInt32: return f(int32_t{});
    case TokenDType::kInt64: return f(int64_t{});
    case TokenDType::kUInt16: return f(uint16_t{});
    case TokenDType::kUInt32: return f(uint32_t{});
    default: detail::fail("token ids of dtype ", token_dtype_name(dtype), " are not integers");
  }
}
}  // namespace

std::optional<TokenDType> token_dtype_from_code(uint8_t code) {
  if (code < 1 || code > 8) return std::nullopt;
  return static_cast<TokenDType>(code);
}

int64_t token_dtype_size(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8: case TokenDType::kInt8: return 1;
    case TokenDType::kInt16: case TokenDType::kUInt16: return 2;
    case TokenDType::kInt32: case TokenDType::kUInt32: case TokenDType::kFloat32: return 4;
    case TokenDType::kInt64: case TokenDType::kFloat64: return 8;
  }
  return 0;
}

const char* token_dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8: return "uint8";
    case TokenDType::kInt8: return "int8";
    case TokenDType::kInt16: return "int16";
    case TokenDType::kInt32: return "int32";
    case TokenDType::kInt64: return "int64";
    case TokenDType::kFloat64: return "float64";
    case TokenDType::kFloat32: return "float32";
    case TokenDType::kUInt16: return "uint16";
    case TokenDType::kUInt32: return "uint32";
  }
  return "?";
}

bool token_dtype_is_integer(TokenDType dtype) {
  return dtype != TokenDType::kFloat32 && dtype != TokenDType::kFloat64;
}

int64_t TokenSpan::operator[](int64_t i) const {
  return visit_integer(dtype_, [&](auto t) -> int64_t {
    file_->read(offset_ + i * int64_t(sizeof(t)), sizeof(t), &t);
    return static_cast<int64_t>(t);
  });
}

void TokenSpan::copy_to(int64_t begin, int64_t n, int32_t* out) const {
  TESSERA_CHECK(begin >= 0 && n >= 0 && begin + n <= size_, "internal: tokens [", begin, ", ", begin + n,
                ") outside a span of ", size_);
  visit_integer(dtype_, [&](auto t) {
    using T = decltype(t);
    // A training window (T + 1 ids, a few KiB) is one read into this buffer.
    constexpr int64_t kChunk = 16384 / sizeof(T);
    T buf[kChunk];
    for (int64_t done = 0; done < n;) {
      const int64_t k = std::min(kChunk, n - done);
      file_->read(offset_ + (begin + done) * int64_t(sizeof(T)), k * int64_t(sizeof(T)), buf);
      for (int64_t i = 0; i < k; ++i) out[done + i] = static_cast<int32_t>(buf[i]);
      done += k;
    }
  });
}

std::optional<int64_t> TokenSpan::find_out_of_range(int64_t limit) const {
  return visit_integer(dtype_, [&](auto t) -> std::optional<int64_t> {
    using T = decltype(t);
    const int64_t chunk = kScanChunkBytes / int64_t(sizeof(T));
    std::vector<T> buf(static_cast<size_t>(std::min(chunk, size_)));
    for (int64_t at = 0; at < size_; at += chunk) {
      const int64_t k = std::min(chunk, size_ - at);
      file_->read(offset_ + at * int64_t(sizeof(T)), k * int64_t(sizeof(T)), buf.data());
      const T* p = buf.data();
      T lo = p[0], hi = p[0];
      for (int64_t i = 1; i < k; ++i) {
        lo = p[i] < lo ? p[i] : lo;
        hi = p[i] > hi ? p[i] : hi;
      }
      if (static_cast<int64_t>(lo) >= 0 && static_cast<int64_t>(hi) < limit) continue;
      for (int64_t i = 0; i < k; ++i) {
        const auto v = static_cast<int64_t>(p[i]);
        if (v < 0 || v >= limit) return at + i;
      }
    }
    return std::nullopt;
  });
}

}  // namespace tessera
