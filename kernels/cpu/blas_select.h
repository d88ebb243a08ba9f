// Which GEMM kernels the CPU BLAS runs, and why: OpenBLAS's own choice of core at load time, or
// tessera's where the library fell back to a generic core on a CPU with AVX2 or AVX-512.
#pragma once

#include <string>
#include <vector>

namespace tessera::cpu {

// The x86 SIMD levels that decide which OpenBLAS cores can run here. Each one includes the
// operating system's support for the registers (what __builtin_cpu_supports checks).
struct CpuSimd {
  bool avx2_fma = false;
  bool avx512 = false;       // AVX-512 F, CD, VL, BW and DQ: the Skylake-X set
  bool avx512_bf16 = false;  // and AVX512_BF16 on top (Cooper Lake and later)
  bool amd = false;          // AuthenticAMD or HygonGenuine
};
CpuSimd detect_cpu_simd();
// "AVX-512 BF16", "AVX-512", "AVX2" or "no AVX2": the best level, for messages.
std::string simd_level_name(const CpuSimd& cpu);

// True for the OpenBLAS x86 cores that have no AVX2 kernels (Prescott, Nehalem, Sandybridge, ...):
// the generic fallbacks a CPU gets that the library does not know. Unknown names are not generic
// (a newer library's core is trusted).
bool is_generic_openblas_core(const std::string& core);

// The OpenBLAS cores this CPU can run, fastest first: Cooperlake (AVX-512 BF16), SkylakeX
// (AVX-512), then Haswell, or Zen on AMD (AVX2 + FMA). Empty without AVX2 + FMA.
std::vector<std::string> openblas_cores_for(const CpuSimd& cpu);

// Who decided which kernels run.
enum class CoreSource {
  Library,      // the BLAS's own choice when it loaded (OpenBLAS: from the CPU model)
  Tessera,      // tessera replaced OpenBLAS's generic core by the best one for the CPU's features
  Environment,  // OPENBLAS_CORETYPE, set by the user or the site: always respected
};

struct BlasSelection {
  std::string library;  // "OpenBLAS 0.3.21, OpenMP build" or "BLIS"
  std::string core;     // the kernels that run ("Cooperlake"); empty where the library does not say
  CoreSource source = CoreSource::Library;
  std::string reason;   // why these kernels, a clause for `tessera info`
  bool matches_reference = false;  // the start-up GEMM check (sgemm_matches_reference)
  std::vector<std::string> warnings;  // kernels slower than the CPU allows, or wrong results
};

// Chooses once, on the first call, and returns that result afterwards. Call it before anything
// calls the BLAS (main() does, first thing): switching OpenBLAS's core re-runs the library's
// initialisation, which nothing else may be using at the time.
const BlasSelection& blas_selection();
// One line for `tessera info` and the run header: library, core, who chose it and why.
std::string describe(const BlasSelection& s);

// cblas_sgemm in the three forms training issues (NN, NT, and TN accumulating with beta = 1) on
// shapes that are multiples of no kernel's tile, against a double-precision loop, within fp32's
// summation error bound. Cheap (three 67 x 45 x 53 products).
bool sgemm_matches_reference();

// fp32 GEMM rate in GFLOP/s: each OpenMP thread multiplies its own 256 x 256 matrices (the BLAS
// runs single-threaded inside the parallel region), timed by the thread's CPU clock, summed over
// the threads. What all the cores would do if this process had them, so other processes on a
// shared machine do not lower it much. About 10 ms.
double measure_sgemm_gflops();

}  // namespace tessera::cpu
