// Tests kernels/cpu/blas_select.h: which OpenBLAS cores count as generic, which ones a CPU's
// features allow, and the start-up GEMM check. The whole selection, in a real process, is tested
// through `tessera info` (tests/app/test_info.cpp).
#include "kernels/cpu/blas_select.h"

#include <gtest/gtest.h>

namespace tessera::cpu {
namespace {

TEST(BlasSelect, GenericCoresAreThoseWithoutAvx2Kernels) {
  for (const char* core : {"Prescott", "prescott", "Nehalem", "Core2", "Sandybridge", "Barcelona", "Steamroller"})
    EXPECT_TRUE(is_generic_openblas_core(core)) << core;
  // Unknown names (a newer library's cores) are trusted.
  for (const char* core : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator", ""})
    EXPECT_FALSE(is_generic_openblas_core(core)) << core;
}

TEST(BlasSelect, CoresFollowTheCpuFeaturesFastestFirst) {
  using V = std::vector<std::string>;
  EXPECT_EQ(openblas_cores_for({}), V{});
  EXPECT_EQ(openblas_cores_for({.avx2_fma = true}), (V{"Haswell", "Zen"}));
  EXPECT_EQ(openblas_cores_for({.avx2_fma = true, .amd = true}), (V{"Zen", "Haswell"}));
  EXPECT_EQ(openblas_cores_for({.avx2_fma = true, .avx512 = true}), (V{"SkylakeX", "Haswell", "Zen"}));
  EXPECT_EQ(openblas_cores_for({.avx2_fma = true, .avx512 = true, .avx512_bf16 = true}),
            (V{"Cooperlake", "SkylakeX", "Haswell", "Zen"}));
  EXPECT_EQ(openblas_cores_for({.avx2_fma = true, .avx512 = true, .avx512_bf16 = true, .amd = true}),
            (V{"Cooperlake", "SkylakeX", "Zen", "Haswell"}));
}

TEST(BlasSelect, LevelNames) {
  EXPECT_EQ(simd_level_name({}), "no AVX2");
  EXPECT_EQ(simd_level_name({.avx2_fma = true}), "AVX2");
  EXPECT_EQ(simd_level_name({.avx2_fma = true, .avx512 = true}), "AVX-512");
  EXPECT_EQ(simd_level_name({.avx2_fma = true, .avx512 = true, .avx512_bf16 = true}), "AVX-512 BF16");
}

TEST(BlasSelect, DetectedFeaturesAreNested) {
  const CpuSimd cpu = detect_cpu_simd();
  EXPECT_TRUE(!cpu.avx512_bf16 || cpu.avx512);
  EXPECT_TRUE(!cpu.avx512 || cpu.avx2_fma);
}

TEST(BlasSelect, LinkedBlasMatchesTheReferenceGemm) {
  EXPECT_TRUE(sgemm_matches_reference());
  EXPECT_GT(measure_sgemm_gflops(), 0.0);  // a rate, not a speed requirement
}

}  // namespace
}  // namespace tessera::cpu
