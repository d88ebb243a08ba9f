// Backend report: CPU features, BLAS, and the CUDA runtime when the CUDA backend is compiled in.
#include "kernels/backend_info.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <cstdlib>
#include <sstream>

#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif
#include "kernels/check.h"
#include "kernels/cpu/blas_select.h"
#include "kernels/cpu/gemm_bf16.h"

namespace tessera {

namespace {
std::string cpu_features() {
  std::string s;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) s += " avx2";
  if (__builtin_cpu_supports("fma")) s += " fma";
  if (__builtin_cpu_supports("avx512f")) s += " avx512f";
  if (__builtin_cpu_supports("avx512bf16")) s += " avx512bf16";
  return s.empty() ? " (baseline x86-64)" : s;
}
}  // namespace

namespace {
// 8 independent multiply-add chains per thread keep the FMA pipes busy; the compiler vectorizes
// each chain to the widest SIMD width of -march.
double fma_loop(int64_t iters) {
  constexpr int kChains = 8, kWidth = 16;
  float acc[kChains][kWidth];
  for (int c = 0; c < kChains; ++c)
    for (int w = 0; w < kWidth; ++w) acc[c][w] = 0.001f * static_cast<float>(c + w);
  const float a = 0.999999f, b = 1e-7f;
  for (int64_t i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c)
#pragma omp simd
      for (int w = 0; w < kWidth; ++w) acc[c][w] = acc[c][w] * a + b;
  float s = 0;
  for (int c = 0; c < kChains; ++c)
    for (int w = 0; w < kWidth; ++w) s += acc[c][w];
  return s;
}
}  // namespace

int cpu_threads() { return omp_get_max_threads(); }

double measure_cpu_peak_gflops() {
  const int64_t iters = 2'000'000;
  const int threads = omp_get_max_threads();
  double sink = 0;
  fma_loop(iters / 10);  // warm up clocks
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
  {
    double s = fma_loop(iters);
#pragma omp atomic
    sink += s;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sink == 42.0) std::abort();  // keeps the loop's result observable so it is not optimized away
  const double flops = 2.0 * 8 * 16 * static_cast<double>(iters) * threads;
  return flops / secs / 1e9;
}

double cpu_nominal_peak_gflops() {
  std::ifstream in("/proc/cpuinfo");
  double mhz = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) mhz = std::max(mhz, std::atof(line.c_str() + colon + 1));
    }
  }
  __builtin_cpu_init();
  const double flops_per_cycle = __builtin_cpu_supports("avx512f")                                  ? 64.0
                                 : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 32.0
                                                                                                    : 8.0;
  return omp_get_max_threads() * mhz / 1e3 * flops_per_cycle;
}

double cpu_peak_gflops() { return std::max(cpu_nominal_peak_gflops(), measure_cpu_peak_gflops()); }

// Below a third of the CPU's fp32 peak the GEMM kernels are not using the vector units the CPU
// has. Measured per CPU-second on a 2-core AVX-512 Xeon (docs/performance.md, "BLAS kernels"),
// against its nominal peak: OpenBLAS's generic Prescott core 23-24%, Sandybridge (AVX, no FMA)
// 39-42%, Haswell (AVX2) 57%, SkylakeX and Cooperlake 102-106%. On an AVX2 CPU the generic core
// reaches at most a quarter of the peak (4-wide SSE against 8-wide FMA).
constexpr double kSlowGemmShare = 1.0 / 3.0;

std::string cpu_bf16_gemm_kernel() {
  return cpu::bf16_kernel_name(cpu::resolve_bf16_kernel(cpu::Bf16Kernel::Auto));
}

std::string kernels_backend_info() {
  std::ostringstream os;
  const double nominal = cpu_nominal_peak_gflops(), measured = measure_cpu_peak_gflops();
  const double peak = std::max(nominal, measured);  // cpu_peak_gflops(), measured once
  os << "cpu: features" << cpu_features() << ", " << omp_get_max_threads() << " OpenMP threads, fp32 peak "
     << static_cast<int64_t>(nominal) << " GFLOP/s nominal, " << static_cast<int64_t>(measured) << " measured\n";
  const cpu::BlasSelection& blas = cpu::blas_selection();
  os << "blas: " << cpu::describe(blas) << "\n";
  // Timed by each thread's CPU clock, so this machine's other processes barely move the rate; a
  // virtual CPU that the host deschedules still can (seen: one reading of 15 GFLOP/s among 60 of
  // 125-285 with the same kernels). A slow reading is therefore taken again before it warns; the
  // generic kernels are slow every time.
  double gemm = cpu::measure_sgemm_gflops();
  for (int retry = 0; retry < 2 && gemm < kSlowGemmShare * peak; ++retry) gemm = std::max(gemm, cpu::measure_sgemm_gflops());
  os << "gemm: fp32 " << static_cast<int64_t>(gemm) << " GFLOP/s at start";
  if (peak > 0) os << " (" << static_cast<int64_t>(100 * gemm / peak) << "% of the fp32 peak)";
  os << ", " << (blas.matches_reference ? "matches" : "DIFFERS FROM") << " a reference GEMM\n";
  for (const std::string& w : blas.warnings) os << "warning: " << w << "\n";
  os << "bf16 gemm (train.dtype = \"bf16\"): " << cpu_bf16_gemm_kernel() << "\n";
  if (peak > 0 && gemm < kSlowGemmShare * peak)
    os << "warning: the fp32 GEMM runs at " << static_cast<int64_t>(gemm) << " GFLOP/s, "
       << static_cast<int64_t>(100 * gemm / peak) << "% of this CPU's fp32 peak (" << static_cast<int64_t>(peak)
       << " GFLOP/s): the BLAS kernels do not use its vector units (see docs/performance.md, \"BLAS kernels\")\n";
#ifdef TESSERA_WITH_CUDA
  os << "cuda: built (" << cuda::library_versions() << "), " << cuda::device_count() << " device(s) visible\n";
#else
  os << "cuda: not built\n";
#endif
  return os.str();
}

std::string cuda_device_name(int index) {
#ifdef TESSERA_WITH_CUDA
  return cuda::device_name(index);
#else
  TESSERA_CHECK(false, "the name of CUDA device ", index, ": this build has no CUDA backend (TESSERA_CUDA=OFF)");
  return {};
#endif
}

size_t cuda_device_memory(int index) {
#ifdef TESSERA_WITH_CUDA
  return cuda::device_memory(index);
#else
  TESSERA_CHECK(false, "the memory of CUDA device ", index, ": this build has no CUDA backend (TESSERA_CUDA=OFF)");
  return 0;
#endif
}

}  // namespace tessera
