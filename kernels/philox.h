// Philox4x32-10 counter-based RNG (Salmon et al., SC'11): a pure function of (key, counter), so any
// rank can draw element i of any tensor without drawing the others. Header-only, host and device.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace tessera::philox {

using Counter = std::array<uint32_t, 4>;
using Key = std::array<uint32_t, 2>;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Ten rounds of the Philox4x32 bijection.
inline Counter philox4x32_10(Counter c, Key k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c[0], hi0, lo0);
    mulhilo(kM1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

// Uniform in (0, 1] from 32 random bits.
inline double to_unit(uint32_t x) { return (static_cast<double>(x) + 1.0) / 4294967296.0; }

// One standard normal for element `index` of the stream `key` (Box-Muller on the first two words).
inline double normal(Key key, uint64_t index) {
  Counter c = philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u}, key);
  double u1 = to_unit(c[0]), u2 = to_unit(c[1]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// One uniform in [-1, 1) for element `index` of the stream `key` (the first word).
inline double uniform_symmetric(Key key, uint64_t index) {
  Counter c = philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0u, 0u}, key);
  return 2.0 * (static_cast<double>(c[0]) / 4294967296.0) - 1.0;
}

// A key from a 64-bit seed and a string (e.g. a parameter's global name), via FNV-1a.
inline Key make_key(uint64_t seed, const char* name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char* p = name; *p; ++p) {
    h ^= static_cast<unsigned char>(*p);
    h *= 0x100000001b3ull;
  }
  h ^= seed * 0x9E3779B97F4A7C15ull;
  return {static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32)};
}

}  // namespace tessera::philox
