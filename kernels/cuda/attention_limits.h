// The sizes the CUDA attention kernels (kernels/cuda/attention.cu) can launch for, as host code
// with no CUDA header, so the CPU suite tests them (tests/kernels/test_attention_limits.cpp).
// Element offsets are 64-bit everywhere, so tensors past 2^31 elements are fine; what limits a
// launch is each dimension fitting the kernels' int fields and each grid's dimensions (x up to
// 2^31 - 1 blocks, y up to 65535) as the kernels are launched.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace tessera::cuda {

// q (B, T, H, D), k, v (B, S, KV, D).
struct AttentionSizes {
  int64_t B, T, S, H, KV, D;
};

// The grids, by kernel (attention.cu's launchers):
//   f32 forward, delta (both paths), f32 dq:  (ceil(T / 4), B H)
//   f32 dk/dv:                                (ceil(S / 4), B KV)
//   bf16 forward, bf16 dq:                    (B H, ceil(T / 64))
//   bf16 dk/dv:                               (B KV, ceil(S / 64))
inline constexpr int64_t kGridXMax = 2147483647, kGridYMax = 65535;
inline constexpr int64_t kRowsPerBlock = 4;  // the row kernels' warps per block
inline constexpr int64_t kTileRows = 64;     // the bf16 kernels' query rows / keys per block

// "" when attention_forward (backward = false) or attention_backward on the bf16 or f32 path can
// launch for s, else why not, naming the grid dimension (or the int field) that does not fit.
// A named size the kernels take as an int.
struct IntSize {
  const char* name;
  int64_t v;
};

// "" when every size fits an int, else which does not.
inline std::string int_size_error(std::initializer_list<IntSize> sizes) {
  constexpr int64_t int_max = 2147483647;
  for (const IntSize& d : sizes)
    if (d.v > int_max)
      return std::string(d.name) + " = " + std::to_string(d.v) + " exceeds the kernels' int sizes (" +
             std::to_string(int_max) + ")";
  return "";
}

inline std::string attention_launch_error(const AttentionSizes& s, bool bf16, bool backward) {
  if (std::string e = int_size_error({{"B", s.B}, {"T", s.T}, {"S", s.S}, {"H", s.H}, {"KV", s.KV}, {"D", s.D}});
      !e.empty())
    return e;
  // The row kernels run on both paths in the backward (delta), on the f32 path in the forward.
  const auto ceil_div = [](int64_t n, int64_t d) { return (n + d - 1) / d; };
  if (!bf16 || backward) {
    if (s.B * s.H > kGridYMax)
      return "B x H = " + std::to_string(s.B * s.H) + " exceeds the " + std::to_string(kGridYMax) +
             " blocks of grid dimension y (the row kernels: one block row per (b, h))";
  }
  // Implied by the above: the row kernels' x (ceil(T / 4), ceil(S / 4) <= 2^29 for T, S <= int
  // max) and y of the f32 dk/dv (B KV <= B H); the bf16 kernels' x (B H <= 65535 from the delta
  // kernel's y, which every bf16 backward launches; a bf16 forward alone is bounded here too).
  if (bf16) {
    if (s.B * s.H > kGridXMax)
      return "B x H = " + std::to_string(s.B * s.H) + " exceeds the " + std::to_string(kGridXMax) +
             " blocks of grid dimension x (the bf16 kernels: one block column per (b, h))";
    if (ceil_div(s.T, kTileRows) > kGridYMax)
      return "T = " + std::to_string(s.T) + " needs " + std::to_string(ceil_div(s.T, kTileRows)) +
             " query tiles of 64, more than the " + std::to_string(kGridYMax) + " blocks of grid dimension y";
    if (backward && ceil_div(s.S, kTileRows) > kGridYMax)
      return "S = " + std::to_string(s.S) + " needs " + std::to_string(ceil_div(s.S, kTileRows)) +
             " key tiles of 64, more than the " + std::to_string(kGridYMax) + " blocks of grid dimension y (dk/dv)";
  }
  return "";
}

// attention_merge's launch for out (B, T, H, D): one warp per (b, t, h) row, 4 rows per block, on
// grid dimension x; T, H and D are the kernel's int arguments.
inline std::string attention_merge_launch_error(int64_t B, int64_t T, int64_t H, int64_t D) {
  if (std::string e = int_size_error({{"T", T}, {"H", H}, {"D", D}}); !e.empty()) return e;
  const int64_t rows = B * T * H;
  if ((rows + kRowsPerBlock - 1) / kRowsPerBlock > kGridXMax)
    return "B x T x H = " + std::to_string(rows) + " rows need more than the " + std::to_string(kGridXMax) +
           " blocks of grid dimension x (4 rows per block)";
  return "";
}

}  // namespace tessera::cuda
