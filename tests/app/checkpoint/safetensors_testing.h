// safetensors files written by the tests themselves, independently of app/checkpoint/safetensors.h:
// any dtype, raw bytes, a header given whole (to damage it on purpose), shards with their index.
// F16 and BF16 values are made by rounding float32 here (round to nearest even), so a test knows the
// exact float32 the import must produce.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tessera::testing {

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;  // little-endian elements
};

inline std::string shape_list(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

// The header JSON of tensors stored back to back in order (names are plain ASCII here).
inline std::string safetensors_header(const std::vector<RawTensor>& ts, const std::string& metadata = "{\"format\":\"pt\"}") {
  std::string h = "{";
  if (!metadata.empty()) h += "\"__metadata__\":" + metadata;
  size_t at = 0;
  for (const RawTensor& t : ts) {
    if (h.size() > 1) h += ",";
    h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":" + shape_list(t.shape) +
         ",\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + t.bytes.size()) + "]}";
    at += t.bytes.size();
  }
  return h + "}";
}

// 8-byte size, header (padded with spaces to a multiple of 8), data.
inline std::string safetensors_file(const std::string& header, const std::string& data) {
  std::string h = header;
  h.resize((h.size() + 7) / 8 * 8, ' ');
  const uint64_t n = h.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + h + data;
}

inline std::string safetensors_bytes(const std::vector<RawTensor>& ts) {
  std::string data;
  for (const RawTensor& t : ts) data += t.bytes;
  return safetensors_file(safetensors_header(ts), data);
}

// Writes a file of tensors given by name, dtype and shape, each one's bytes made by bytes_of(i)
// just before they are written, so that the test never holds the whole file (2-byte or 4-byte
// elements).
inline void write_safetensors_streamed(const std::string& path, const std::vector<RawTensor>& heads,
                                       const std::function<std::string(size_t)>& bytes_of) {
  std::vector<RawTensor> sized = heads;
  for (RawTensor& t : sized) {
    int64_t n = 1;
    for (const int64_t d : t.shape) n *= d;
    t.bytes.assign(static_cast<size_t>(n) * (t.dtype == "F32" ? 4 : 2), '\0');  // for the offsets only
  }
  const std::string header = safetensors_file(safetensors_header(sized), "");
  sized.clear();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (size_t i = 0; i < heads.size(); ++i) {
    const std::string b = bytes_of(i);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  }
}

inline void write_binary(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// float32 -> bfloat16, round to nearest even (the values here are finite).
inline uint16_t to_bf16(float f) {
  const uint32_t b = std::bit_cast<uint32_t>(f);
  return static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}
inline float from_bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// float32 -> IEEE half, round to nearest even, for |f| below the half's largest value (the weights
// here are).
inline uint16_t to_f16(float f) {
  const uint32_t b = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  // Subnormal (and zero): multiples of 2^-24; 1024 of them is the smallest normal, 0x0400.
  if (std::fabs(f) < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(std::fabs(f), 24)));
  int e;
  const double m = std::frexp(std::fabs(static_cast<double>(f)), &e);  // f = m 2^e, m in [0.5, 1)
  // 11 significant bits: q = round(m 2^11) in [1024, 2048], exponent e - 1.
  double q = std::nearbyint(std::ldexp(m, 11));
  if (q == 2048) {
    q = 1024;
    ++e;
  }
  const int exp = e - 1 + 15;  // biased
  return static_cast<uint16_t>(sign | (exp << 10) | (static_cast<uint32_t>(q) - 1024));
}
// Half -> float by its definition: (-1)^s 2^(e-15) (1 + m/1024), subnormals m 2^-24.
inline double f16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

// A tensor of float values stored as dtype (F32, F16 or BF16); `stored` gets the float32 values the
// file then holds exactly.
inline RawTensor float_tensor(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
                              const std::vector<float>& values, std::vector<float>* stored = nullptr) {
  RawTensor t{name, dtype, shape, {}};
  std::vector<float> kept;
  for (const float v : values) {
    if (dtype == "F32") {
      t.bytes.append(reinterpret_cast<const char*>(&v), 4);
      kept.push_back(v);
    } else {
      const uint16_t h = dtype == "F16" ? to_f16(v) : to_bf16(v);
      t.bytes.append(reinterpret_cast<const char*>(&h), 2);
      kept.push_back(dtype == "F16" ? static_cast<float>(f16_value(h)) : from_bf16(h));
    }
  }
  if (stored) *stored = kept;
  return t;
}

}  // namespace tessera::testing
