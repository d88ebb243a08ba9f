// CPU rotary position embedding: one templated loop for F32 and F64 (the rotation is the same simple
// code in both, so the reference is the code itself). Angles come from a (T, D/2) cos/sin table
// computed in double per call, so F32 positions far into a sequence lose no accuracy to the angle.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tessera {
namespace {

// Below this many elements a rotation is cheaper than waking the OpenMP team.
constexpr int64_t kParallelMinElements = 1 << 15;

// cos and sin of a = (pos_offset + t) * theta^(-2i/D), each (T, D/2), rounded once to T.
template <typename T>
struct RotationTable {
  std::vector<T> cos, sin;
  RotationTable(int64_t n_pos, int64_t half, int64_t pos_offset, double theta)
      : cos(static_cast<size_t>(n_pos * half)), sin(static_cast<size_t>(n_pos * half)) {
    for (int64_t i = 0; i < half; ++i) {
      double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
      for (int64_t t = 0; t < n_pos; ++t) {
        double a = static_cast<double>(pos_offset + t) * freq;
        cos[t * half + i] = static_cast<T>(std::cos(a));
        sin[t * half + i] = static_cast<T>(std::sin(a));
      }
    }
  }
};

// y = rotation of x by sign * a, per (b, t, h) row of D. Reads both halves before writing, so y may
// alias x.
template <typename T>
void rotate(T* y, const T* x, const Shape& shape, int64_t pos_offset, double theta, T sign) {
  const int64_t B = shape[0], Tn = shape[1], H = shape[2], D = shape[3], half = D / 2;
  const RotationTable<T> table(Tn, half, pos_offset, theta);
#pragma omp parallel for collapse(2) schedule(static) if (B * Tn * H * D >= kParallelMinElements)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tn; ++t) {
      const T* c = table.cos.data() + t * half;
      const T* s = table.sin.data() + t * half;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row = ((b * Tn + t) * H + h) * D;
        const T* xr = x + row;
        T* yr = y + row;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          T x1 = xr[i], x2 = xr[i + half], si = sign * s[i];
          yr[i] = x1 * c[i] - x2 * si;
          yr[i + half] = x2 * c[i] + x1 * si;
        }
      }
    }
  }
}

void dispatch(const Tensor& y, const Tensor& x, int64_t pos_offset, double theta, double sign) {
  if (x.dtype == DType::F64)
    rotate(y.ptr<double>(), x.ptr<double>(), x.shape, pos_offset, theta, sign);
  else
    rotate(y.ptr<float>(), x.ptr<float>(), x.shape, pos_offset, theta, static_cast<float>(sign));
}

}  // namespace

void cpu::rope_forward(const Exec&, const Tensor& y, const Tensor& x, int64_t pos_offset, double theta) {
  dispatch(y, x, pos_offset, theta, 1.0);
}

void cpu::rope_backward(const Exec&, const Tensor& dx, const Tensor& dy, int64_t pos_offset, double theta) {
  dispatch(dx, dy, pos_offset, theta, -1.0);
}

}  // namespace tessera
