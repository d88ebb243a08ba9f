// TokenSpan: one switch on the dtype per call, then a loop over the typed elements.
#include "data/token_span.h"

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
    case TokenDType::kInt32: case TokenDType::kFloat32: return 4;
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
  }
  return "?";
}

bool token_dtype_is_integer(TokenDType dtype) {
  return dtype != TokenDType::kFloat32 && dtype != TokenDType::kFloat64;
}

int64_t TokenSpan::operator[](int64_t i) const {
  return visit_integer(dtype_, [&](auto t) -> int64_t {
    return static_cast<int64_t>(reinterpret_cast<const decltype(t)*>(bytes_)[i]);
  });
}

void TokenSpan::copy_to(int64_t begin, int64_t n, int32_t* out) const {
  visit_integer(dtype_, [&](auto t) {
    const auto* p = reinterpret_cast<const decltype(t)*>(bytes_) + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(p[i]);
  });
}

std::optional<int64_t> TokenSpan::find_out_of_range(int64_t limit) const {
  if (size_ == 0) return std::nullopt;
  return visit_integer(dtype_, [&](auto t) -> std::optional<int64_t> {
    using T = decltype(t);
    const auto* p = reinterpret_cast<const T*>(bytes_);
    T lo = p[0], hi = p[0];
    for (int64_t i = 1; i < size_; ++i) {
      lo = p[i] < lo ? p[i] : lo;
      hi = p[i] > hi ? p[i] : hi;
    }
    if (static_cast<int64_t>(lo) >= 0 && static_cast<int64_t>(hi) < limit) return std::nullopt;
    for (int64_t i = 0; i < size_; ++i) {
      const auto v = static_cast<int64_t>(p[i]);
      if (v < 0 || v >= limit) return i;
    }
    return std::nullopt;
  });
}

}  // namespace tessera
