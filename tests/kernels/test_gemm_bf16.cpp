// The bf16 GEMM (kernels/cpu/gemm_bf16.h) against a double reference, both kernels (the
// AVX512_BF16 one where the CPU has it; the portable one forced, as on a CPU without it).
#include "kernels/cpu/gemm_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "error_testing.h"
#include "kernels/matmul.h"

namespace tessera::cpu {
namespace {

std::vector<Bf16Kernel> kernels_here() {
  std::vector<Bf16Kernel> ks{Bf16Kernel::Portable};
  if (cpu_has_avx512_bf16()) ks.push_back(Bf16Kernel::Avx512Bf16);
  if (cpu_has_avx512_bf16() && onednn_built()) ks.push_back(Bf16Kernel::OneDnn);
  return ks;
}

float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

TEST(Bf16Rounding, NearestEvenAndSpecials) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to the even 1; 1 + 3 2^-8 to 1 + 2^-6.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);  // above the tie: up
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf, as RNE does
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  uint32_t snan_bits = 0x7f800001u;  // a NaN whose payload sits in the low half: must not become inf
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(snan))));
  std::vector<float> src{0.1f, -3.3f, 1e-3f}, back(3);
  std::vector<uint16_t> dst(3);
  f32_to_bf16(dst.data(), src.data(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(dst[i], f32_to_bf16(src[i]));
}

// The array conversion (vectorized with AVX-512 where the CPU has it, threaded over long arrays)
// gives the scalar function's bits for every input: random bit patterns (all exponents, NaNs with
// any payload, subnormals, which vcvtneps2bf16 would flush), exact ties, and lengths that end in a
// partial vector and cross the serial/threaded boundary (2^17) and a thread chunk (2^14).
TEST(Bf16Rounding, ArrayConversionEqualsTheScalarBitForBit) {
  std::mt19937 rng(7);
  for (const int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(1000), (int64_t(1) << 17) + 3,
                          int64_t(3) * (int64_t(1) << 16) + 5}) {
    std::vector<uint32_t> bits(static_cast<size_t>(n));
    for (uint32_t& b : bits) b = rng();
    const uint32_t specials[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00408000u, 0x3f808000u,
                                 0x3f818000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00000u,
                                 0x7fffffffu, 0x3f80ffffu, 0x477fe000u};
    for (size_t i = 0; i < std::size(specials) && i < bits.size(); ++i) bits[bits.size() - 1 - i] = specials[i];
    std::vector<float> src(bits.size());
    std::memcpy(src.data(), bits.data(), bits.size() * 4);
    std::vector<uint16_t> dst(bits.size() + 1, 0xabcd);
    f32_to_bf16(dst.data(), src.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(dst[static_cast<size_t>(i)], f32_to_bf16(src[static_cast<size_t>(i)]))
          << "n " << n << ", element " << i << ", bits 0x" << std::hex << bits[static_cast<size_t>(i)];
    EXPECT_EQ(dst.back(), 0xabcd) << "wrote past the end, n " << n;
  }
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
};

// Stores op(X) (rows x cols) as X is stored (transposed when trans), with a row stride padded by 3.
struct Stored {
  std::vector<float> f;
  std::vector<uint16_t> h;
  int64_t ld;
  bool trans;
  GemmOperand as(DType dt) const {
    return {dt == DType::BF16 ? static_cast<const void*>(h.data()) : f.data(), dt, ld, trans};
  }
  float at(int64_t i, int64_t j) const { return trans ? f[j * ld + i] : f[i * ld + j]; }
};

Stored make_operand(int64_t rows, int64_t cols, bool trans, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Stored s;
  s.trans = trans;
  const int64_t srows = trans ? cols : rows, scols = trans ? rows : cols;
  s.ld = scols + 3;
  s.f.assign(static_cast<size_t>(srows * s.ld), std::numeric_limits<float>::quiet_NaN());  // padding never read
  for (int64_t i = 0; i < srows; ++i)
    for (int64_t j = 0; j < scols; ++j) s.f[i * s.ld + j] = nd(rng);
  s.h.resize(s.f.size());
  for (size_t i = 0; i < s.f.size(); ++i) s.h[i] = f32_to_bf16(s.f[i]);
  return s;
}

// Checks one case for every kernel and operand storage. Two oracles in double:
//  - on the bf16-rounded inputs, where the only error left is fp32 accumulation: at most
//    gamma_k = k u32 (u32 = 2^-24) times sum |a||b| (Higham, any summation order; x2 for the
//    alpha/beta update) — a packing or indexing mistake is far outside it;
//  - on the unrounded fp32 inputs: bf16 keeps 8 significant bits, so each input rounds with
//    relative error <= u = 2^-8, each product by <= 2u + u^2, hence
//    |err| <= (2^-7 + 2^-16 + 2 k 2^-24) sum |a||b|: the bf16 tolerance.
void check_case(const Case& cs, float alpha, float beta, uint32_t seed) {
  std::mt19937 rng(seed);
  const Stored a = make_operand(cs.m, cs.k, cs.ta, rng), b = make_operand(cs.k, cs.n, cs.tb, rng);
  const int64_t ldc = cs.n + 1;
  std::vector<float> c0(static_cast<size_t>(cs.m * ldc));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : c0) v = beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : nd(rng);  // beta 0: never read
  // The oracles, once per case: want_r (rounded inputs), want (unrounded), and their tolerances.
  const size_t mn = static_cast<size_t>(cs.m * cs.n);
  std::vector<double> want_r(mn), want(mn), tol_r(mn), tol(mn);
  const double u32 = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < cs.m; ++i)
    for (int64_t j = 0; j < cs.n; ++j) {
      double exact_r = 0, exact = 0, mag = 0;
      for (int64_t p = 0; p < cs.k; ++p) {
        exact_r += double(round_bf16(a.at(i, p))) * double(round_bf16(b.at(p, j)));
        exact += double(a.at(i, p)) * double(b.at(p, j));
        mag += std::fabs(double(a.at(i, p)) * double(b.at(p, j)));
      }
      const double c_old = beta == 0.0f ? 0.0 : double(c0[i * ldc + j]);
      const double scale = std::fabs(alpha) * mag + std::fabs(beta * c_old);
      const size_t o = static_cast<size_t>(i * cs.n + j);
      want_r[o] = alpha * exact_r + beta * c_old;
      want[o] = alpha * exact + beta * c_old;
      tol_r[o] = 2 * (cs.k + 2) * u32 * scale + 1e-30;
      tol[o] = (std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + 2 * (cs.k + 2) * u32) * scale + 1e-30;
    }
  for (Bf16Kernel kern : kernels_here())
    for (DType da : {DType::F32, DType::BF16})
      for (DType db : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(::testing::Message() << bf16_kernel_name(kern) << " m " << cs.m << " n " << cs.n << " k " << cs.k
                                          << " ta " << cs.ta << " tb " << cs.tb << " a " << dtype_name(da) << " b "
                                          << dtype_name(db));
        std::vector<float> c = c0;
        gemm_bf16("test", cs.m, cs.n, cs.k, alpha, a.as(da), b.as(db), beta, c.data(), ldc, kern);
        int bad = 0;
        for (int64_t i = 0; i < cs.m && bad < 5; ++i)
          for (int64_t j = 0; j < cs.n && bad < 5; ++j) {
            const size_t o = static_cast<size_t>(i * cs.n + j);
            const double got = c[i * ldc + j];
            if (!(std::fabs(got - want_r[o]) <= tol_r[o]) || !(std::fabs(got - want[o]) <= tol[o])) {
              ADD_FAILURE() << "c(" << i << ", " << j << ") = " << got << ", want " << want_r[o] << " +- " << tol_r[o]
                            << " (unrounded " << want[o] << " +- " << tol[o] << ")";
              ++bad;
            }
          }
        // ldc's padding column is left alone.
        for (int64_t i = 0; i < cs.m; ++i) {
          const float pad = c[i * ldc + cs.n], pad0 = c0[i * ldc + cs.n];
          EXPECT_TRUE(std::memcmp(&pad, &pad0, 4) == 0) << "row " << i << " padding written";
        }
      }
}

TEST(GemmBf16, OddShapesAllTransposes) {
  // Edges of the 12 x 32 tile, odd k (a half pair), and blocks: k > 384 (two k blocks, the second
  // accumulating), m > 144 (two row blocks, threads), n > 3072 (two column blocks).
  const std::vector<Case> shapes{{1, 1, 1, false, false}, {13, 37, 5, false, false}, {12, 32, 2, false, false},
                                 {29, 67, 131, false, false}, {150, 40, 401, false, false}, {5, 3100, 3, false, false}};
  uint32_t seed = 1;
  for (Case cs : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        cs.ta = ta;
        cs.tb = tb;
        check_case(cs, 1.0f, 0.0f, seed++);
      }
}

TEST(GemmBf16, AlphaBeta) {
  check_case({17, 45, 33, false, true}, 0.5f, 0.0f, 7);  // beta 0: C holds NaN, never read
  check_case({17, 45, 33, true, false}, 1.0f, 1.0f, 8);  // accumulate (dw +=)
  check_case({33, 19, 500, false, false}, -2.0f, 0.25f, 9);
}

// The shapes the model's Linear layers use: forward x (N, In) w^T, dx = dy w, dw += dy^T x.
TEST(GemmBf16, ModelTransposes) {
  check_case({64, 96, 80, false, true}, 1.0f, 1.0f, 11);   // forward, bias rows in C
  check_case({64, 80, 96, false, false}, 1.0f, 0.0f, 12);  // dx
  check_case({96, 80, 64, true, false}, 1.0f, 1.0f, 13);   // dw accumulated
}

TEST(GemmBf16, KZeroScalesC) {
  for (Bf16Kernel kern : kernels_here()) {
    std::vector<float> c{1, 2, 3, 4};
    float dummy = 0;
    gemm_bf16("test", 2, 2, 0, 1.0f, {&dummy, DType::F32, 1, false}, {&dummy, DType::F32, 2, false}, 0.5f, c.data(), 2,
              kern);
    EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  }
}

TEST(GemmBf16, AutoPicksByCpuAndBuild) {
  const Bf16Kernel k = resolve_bf16_kernel(Bf16Kernel::Auto);
  if (!cpu_has_avx512_bf16())
    EXPECT_EQ(k, Bf16Kernel::Portable);
  else
    EXPECT_EQ(k, onednn_built() ? Bf16Kernel::OneDnn : Bf16Kernel::Avx512Bf16);
  if (!onednn_built()) {
    EXPECT_TRUE(testing::throws_with([] { resolve_bf16_kernel(Bf16Kernel::OneDnn); }, {"no oneDNN"}));
  }
}

TEST(GemmBf16, AskingForMissingInstructionsIsAnError) {
  if (cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has AVX512_BF16";
  EXPECT_TRUE(testing::throws_with([] { resolve_bf16_kernel(Bf16Kernel::Avx512Bf16); }, {"without AVX512_BF16"}));
}

// A bf16 Linear (w a bf16 copy) with Exec::workspace set takes its rounded operands from that
// allocator (Workspace while the op runs, none left after) and computes the same bits as with the
// heap; the second call of the same shapes allocates nothing new.
TEST(GemmBf16, LinearWithAWorkspaceEqualsTheHeapPath) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t n = 37, in = 48, out = 80;
  std::vector<float> x(n * in), dy(n * out);
  std::vector<uint16_t> w(out * in);
  for (float& v : x) v = nd(rng);
  for (float& v : dy) v = nd(rng);
  for (uint16_t& v : w) v = f32_to_bf16(nd(rng));
  const Tensor xt(x.data(), DType::F32, {n, in}), dyt(dy.data(), DType::F32, {n, out});
  const Tensor wt(w.data(), DType::BF16, {out, in});
  struct Out { std::vector<float> y, dx, dw; };
  auto run = [&](const Exec& ex) {
    Out o{std::vector<float>(n * out), std::vector<float>(n * in), std::vector<float>(out * in, 0.5f)};
    linear_forward(ex, Tensor(o.y.data(), DType::F32, {n, out}), xt, wt, Tensor());
    linear_backward(ex, Tensor(o.dx.data(), DType::F32, {n, in}), Tensor(o.dw.data(), DType::F32, {out, in}),
                    Tensor(), dyt, xt, wt);
    return o;
  };
  const Out heap = run(Exec::cpu());
  Allocator alloc;
  const Exec ex{Device::cpu(), nullptr, &alloc};
  const Out first = run(ex);
  const size_t cached = alloc.cached_bytes();
  const Out second = run(ex);
  for (const Out* o : {&first, &second}) {
    EXPECT_EQ(std::memcmp(o->y.data(), heap.y.data(), heap.y.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(o->dx.data(), heap.dx.data(), heap.dx.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(o->dw.data(), heap.dw.data(), heap.dw.size() * sizeof(float)), 0);
  }
  EXPECT_EQ(alloc.counter(MemCategory::Workspace).current, 0u);
  if (resolve_bf16_kernel(Bf16Kernel::Auto) == Bf16Kernel::OneDnn) {
    EXPECT_GE(alloc.counter(MemCategory::Workspace).peak, static_cast<size_t>(n * out * 2));  // dy in bf16
  } else {
    EXPECT_EQ(alloc.counter(MemCategory::Workspace).peak, static_cast<size_t>(n * out * 2));  // only dy's rounding
  }
  EXPECT_EQ(alloc.cached_bytes(), cached);  // the same shapes again: every block came from the cache
}

}  // namespace
}  // namespace tessera::cpu
