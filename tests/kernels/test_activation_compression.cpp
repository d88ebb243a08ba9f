// Tests kernels/activation_compression.h: each method's round trip against its stated bound (int8:
// at most absmax / 254 per row; bf16: round to nearest even, checked against a bit-level rounding
// written here; lowrank: exact to fp32 rounding for a matrix of rank <= r, and a projection
// otherwise), the bytes the allocator sees against compressed_bytes, and the refusals.
#include "kernels/activation_compression.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "error_testing.h"
#include "testing.h"

namespace tessera {
namespace {

using testing::HostTensor;
using testing::kCpu;

// x (n, m) copied into an allocator's Activations buffer (what a block's context holds).
Buffer activation_of(Allocator& alloc, const HostTensor<float>& x) {
  Buffer b(alloc, DType::F32, x.t().shape, MemCategory::Activations);
  std::memcpy(b.tensor().data, x.data(), x.t().nbytes());
  return b;
}

HostTensor<float> round_trip(const HostTensor<float>& x, const ActivationCompression& c) {
  Allocator alloc;
  CompressedTensor packed = compress_activation(kCpu, alloc, activation_of(alloc, x), c);
  Buffer back = decompress_activation(kCpu, alloc, std::move(packed));
  EXPECT_TRUE(back.tensor().shape == x.t().shape);
  HostTensor<float> out(x.t().shape);
  std::memcpy(out.data(), back.tensor().data, back.tensor().nbytes());
  return out;
}

// Rows of very different magnitudes, one of them all zeros.
HostTensor<float> rows_of_scales(int64_t n, int64_t m, uint64_t seed) {
  HostTensor<float> x = HostTensor<float>::uniform({n, m}, seed);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) x[i * m + j] *= i == 2 ? 0.0f : std::pow(10.0f, static_cast<float>(i % 5) - 2);
  return x;
}

TEST(ActivationCompression, Int8ErrorIsAtMostAbsmaxOver254PerRow) {
  const int64_t n = 7, m = 33;
  const HostTensor<float> x = rows_of_scales(n, m, 1);
  const HostTensor<float> y = round_trip(x, {CompressionMethod::Int8});
  for (int64_t i = 0; i < n; ++i) {
    double absmax = 0, worst = 0;
    for (int64_t j = 0; j < m; ++j) absmax = std::max(absmax, std::fabs(static_cast<double>(x[i * m + j])));
    for (int64_t j = 0; j < m; ++j) worst = std::max(worst, std::fabs(static_cast<double>(x[i * m + j]) - y[i * m + j]));
    // The bound, plus fp32's rounding of the scale and of the product q * scale.
    EXPECT_LE(worst, absmax / 254.0 * (1 + 1e-6) + absmax * 1e-7) << "row " << i;
    if (absmax > 0) {
      EXPECT_GT(worst, 0.0) << "row " << i << ": int8 must lose something";
    }
  }
}

// Round to nearest even, from the bits: the oracle for bf16.
float bf16_rounded(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  u &= 0xFFFF0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

TEST(ActivationCompression, Bf16IsRoundToNearestEven) {
  HostTensor<float> x = HostTensor<float>::uniform({5, 9}, 2, -3.0, 3.0);
  // Ties both ways: 1 + 2^-8 (tie, to even: 1) and 1 + 3 * 2^-8 (tie, to even: 1 + 2^-6).
  x[0] = 1.0f + std::ldexp(1.0f, -8);
  x[1] = 1.0f + 3 * std::ldexp(1.0f, -8);
  const HostTensor<float> y = round_trip(x, {CompressionMethod::Bf16});
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(y[i], bf16_rounded(x[i])) << i;
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f + std::ldexp(1.0f, -6));
}

TEST(ActivationCompression, Bf16KeepsABf16TensorAsItIs) {
  Allocator alloc;
  Buffer x(alloc, DType::BF16, {4, 6}, MemCategory::Activations);
  void* data = x.tensor().data;
  CompressedTensor packed = compress_activation(kCpu, alloc, std::move(x), {CompressionMethod::Bf16});
  EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 4u * 6u * 2u);
  Buffer back = decompress_activation(kCpu, alloc, std::move(packed));
  EXPECT_EQ(back.tensor().data, data);
  EXPECT_EQ(back.tensor().dtype, DType::BF16);
}

// X = U V with U (n, k), V (k, m): rank k.
HostTensor<float> of_rank(int64_t n, int64_t m, int64_t k, uint64_t seed) {
  const HostTensor<float> u = HostTensor<float>::uniform({n, k}, seed), v = HostTensor<float>::uniform({k, m}, seed + 1);
  HostTensor<float> x({n, m});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += static_cast<double>(u[i * k + l]) * v[l * m + j];
      x[i * m + j] = static_cast<float>(s);
    }
  return x;
}

double relative_error(const HostTensor<float>& a, const HostTensor<float>& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

TEST(ActivationCompression, LowRankIsExactForRankAtMostR) {
  for (int64_t k : {1, 3, 8}) {
    const HostTensor<float> x = of_rank(40, 24, k, 10 + k);
    EXPECT_LT(relative_error(x, round_trip(x, {CompressionMethod::LowRank, 8})), 2e-6) << "rank " << k;
  }
  // r beyond the matrix: min(r, n, m), exact for any matrix.
  const HostTensor<float> full = HostTensor<float>::uniform({6, 5}, 3);
  EXPECT_LT(relative_error(full, round_trip(full, {CompressionMethod::LowRank, 64})), 2e-6);
}

TEST(ActivationCompression, LowRankOfAFullRankMatrixIsAProjection) {
  // Rank 12 > r = 4: lossy, and the kept part is an orthogonal projection: |X^| <= |X| and the
  // error X - X^ orthogonal to X^.
  const HostTensor<float> x = of_rank(50, 20, 12, 7);
  const HostTensor<float> y = round_trip(x, {CompressionMethod::LowRank, 4});
  double xx = 0, yy = 0, ey = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    xx += static_cast<double>(x[i]) * x[i];
    yy += static_cast<double>(y[i]) * y[i];
    ey += (static_cast<double>(x[i]) - y[i]) * y[i];
  }
  EXPECT_GT(relative_error(x, y), 0.05);
  EXPECT_LT(yy, xx);
  EXPECT_LT(std::fabs(ey), 1e-5 * xx);
}

TEST(ActivationCompression, TheAllocatorHoldsCompressedBytes) {
  for (CompressionMethod method : {CompressionMethod::Bf16, CompressionMethod::Int8, CompressionMethod::LowRank})
    for (int64_t m : {5, 8}) {
      const int64_t n = 7;
      const ActivationCompression c{method, 3};
      Allocator alloc;
      Buffer x = activation_of(alloc, HostTensor<float>::uniform({n, m}, 4));
      const size_t before = alloc.total_current();
      CompressedTensor packed = compress_activation(kCpu, alloc, std::move(x), c);
      EXPECT_EQ(alloc.total_current(), static_cast<size_t>(compressed_bytes(c, n, m))) << compression_name(method);
      EXPECT_EQ(alloc.total_peak(),
                before + static_cast<size_t>(compressed_bytes(c, n, m) + compression_workspace_bytes(c, n, m)))
          << compression_name(method);
      EXPECT_EQ(compressed_bytes(c, n, m) % 4, 0);
      Buffer back = decompress_activation(kCpu, alloc, std::move(packed));
      EXPECT_EQ(alloc.total_current(), before);
    }
}

TEST(ActivationCompression, RefusesWhatItDoesNotCompress) {
  Allocator alloc;
  Buffer x(alloc, DType::F64, {2, 3}, MemCategory::Activations);
  EXPECT_TRUE(testing::throws_with(
      [&] { compress_activation(kCpu, alloc, std::move(x), {CompressionMethod::Int8}); },
      {"model.activation_compression = \"int8\"", "compresses F32 activations, got f64"}));
  EXPECT_TRUE(testing::throws_with([] { compression_method("fp8", "model.activation_compression"); },
                                   {"model.activation_compression = \"fp8\" is not a compression", "\"lowrank\""}));
}

}  // namespace
}  // namespace tessera
