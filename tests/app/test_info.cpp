// Tests `tessera info` (app/commands.cpp) and the run header: which BLAS kernels run and why. On a
// CPU with AVX2, OpenBLAS's generic kernels (4x slower) must never be what runs unless the
// environment asks for them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>

#include "cli_testing.h"

namespace tessera {
namespace {
namespace fs = std::filesystem;

// The test's own list (an oracle independent of kernels/cpu/blas_select.cpp): OpenBLAS's x86
// cores whose GEMM kernels predate AVX2 and FMA.
bool generic_core(const std::string& core) {
  for (const char* g : {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn",
                        "Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Nano", "Bobcat",
                        "Sandybridge", "Bulldozer", "Piledriver", "Steamroller"})
    if (core == g) return true;
  return false;
}

bool cpu_has_avx2_fma() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// The "blas:" line of the output, and the core it names ("" when it names none: BLIS).
std::string blas_line(const std::string& output) {
  std::smatch m;
  return std::regex_search(output, m, std::regex("blas: [^\n]*")) ? m.str() : "";
}
std::string core_of(const std::string& line) {
  std::smatch m;
  return std::regex_search(line, m, std::regex(", core ([A-Za-z0-9_]+)")) ? m[1].str() : "";
}

TEST(Info, NoGenericBlasKernelsOnAvx2) {
  if (std::getenv("OPENBLAS_CORETYPE"))
    GTEST_SKIP() << "OPENBLAS_CORETYPE is set in this environment (tessera respects it); this test needs it unset";
  if (!cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2 + FMA, so OpenBLAS's generic kernels are its own";
  const fs::path dir = testing::temp_dir("info_kernels");
  const auto r = testing::run_tessera({"info"}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string line = blas_line(r.output);
  ASSERT_FALSE(line.empty()) << r.output;
  const std::string core = core_of(line);
  if (core.empty()) GTEST_SKIP() << "the BLAS names no core (not OpenBLAS): " << line;
  EXPECT_FALSE(generic_core(core)) << "generic kernels on a CPU with AVX2: " << line;
  EXPECT_TRUE(line.find("detected by the library") != std::string::npos ||
              line.find("chosen by tessera") != std::string::npos)
      << line;
  EXPECT_NE(r.output.find("matches a reference GEMM"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

TEST(Info, ExplicitCoretypeIsRespected) {
  const fs::path dir = testing::temp_dir("info_coretype");
  const auto r = testing::run_tessera({"info"}, dir, {}, SIGINT, {"OPENBLAS_CORETYPE=Prescott"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string line = blas_line(r.output);
  if (core_of(line).empty()) GTEST_SKIP() << "the BLAS names no core (not OpenBLAS): " << line;
  EXPECT_EQ(core_of(line), "Prescott") << line;
  EXPECT_NE(line.find("set by the environment (OPENBLAS_CORETYPE=Prescott)"), std::string::npos) << line;
  if (cpu_has_avx2_fma()) {
    EXPECT_NE(r.output.find("warning: OPENBLAS_CORETYPE=Prescott runs the generic Prescott kernels"),
              std::string::npos)
        << r.output;
  }
  fs::remove_all(dir);
}

TEST(Info, TrainHeaderSaysWhichKernelsRun) {
  const testing::TrainRun run = testing::make_run("info_header");
  const auto r = run.train({"train.steps=1", "checkpoint.at_end=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string line = blas_line(r.output);
  EXPECT_FALSE(line.empty()) << r.output;
  EXPECT_TRUE(line.find("detected by the library") != std::string::npos ||
              line.find("chosen by tessera") != std::string::npos ||
              line.find("set by the environment") != std::string::npos)
      << line;
  EXPECT_NE(r.output.find("gemm: fp32 "), std::string::npos) << r.output;
  fs::remove_all(run.dir);
}

}  // namespace
}  // namespace tessera
