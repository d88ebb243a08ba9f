// Which kernels the CPU BLAS runs. OpenBLAS built with DYNAMIC_ARCH (Debian's) picks a "core" from
// the CPU model when it loads; 0.3.21 sends Intel family-6 models it does not know (e.g. 207,
// Emerald Rapids) to Prescott, its generic SSE3 core, 4x slower there than the AVX-512 kernels it
// ships. Where that happened and OPENBLAS_CORETYPE is unset, tessera runs the library's own core
// selection again with the variable set (switch_core below), before anything calls the BLAS.
#include "kernels/cpu/blas_select.h"

#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>
#include <strings.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>

namespace tessera::cpu {

CpuSimd detect_cpu_simd() {
  CpuSimd c;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  c.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  c.avx512 = c.avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq");
  c.avx512_bf16 = c.avx512 && __builtin_cpu_supports("avx512bf16");
  c.amd = __builtin_cpu_is("amd");  // GCC counts Hygon as AMD too
#endif
  return c;
}

std::string simd_level_name(const CpuSimd& cpu) {
  return cpu.avx512_bf16 ? "AVX-512 BF16" : cpu.avx512 ? "AVX-512" : cpu.avx2_fma ? "AVX2" : "no AVX2";
}

bool is_generic_openblas_core(const std::string& core) {
  // OpenBLAS's x86 cores (driver/others/dynamic.c) whose kernels stop at SSE or AVX without FMA.
  static const char* const kGeneric[] = {"Katmai",   "Coppermine", "Northwood",   "Prescott",  "Banias",
                                         "Atom",     "Core2",      "Penryn",      "Dunnington", "Nehalem",
                                         "Athlon",   "Opteron",    "Opteron_SSE3", "Barcelona", "Nano",
                                         "Bobcat",   "Sandybridge", "Bulldozer",  "Piledriver", "Steamroller"};
  return std::any_of(std::begin(kGeneric), std::end(kGeneric),
                     [&](const char* g) { return strcasecmp(g, core.c_str()) == 0; });
}

std::vector<std::string> openblas_cores_for(const CpuSimd& cpu) {
  std::vector<std::string> cores;
  if (cpu.avx512_bf16) cores.push_back("Cooperlake");
  if (cpu.avx512) cores.push_back("SkylakeX");
  if (cpu.avx2_fma) {
    // What OpenBLAS itself runs on the AVX2 CPUs it knows: Zen kernels on AMD, Haswell elsewhere.
    cores.push_back(cpu.amd ? "Zen" : "Haswell");
    cores.push_back(cpu.amd ? "Haswell" : "Zen");
  }
  return cores;
}

namespace {

// A fixed pseudo-random fill in [-1, 1): the check needs no seed and gives the same numbers on
// every run.
void fill(std::vector<float>& v, uint32_t seed) {
  for (float& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

bool sgemm_matches_reference() {
  const int m = 67, n = 45, k = 53;
  struct Form {
    bool trans_a, trans_b;
    float beta;
  };
  // linear_forward (NT), linear_backward's dx (NN) and its dw, accumulated (TN, beta = 1).
  const Form forms[] = {{false, true, 0.0f}, {false, false, 0.0f}, {true, false, 1.0f}};
  std::vector<float> a(m * k), b(k * n), c0(m * n);
  fill(a, 1), fill(b, 2), fill(c0, 3);
  for (const Form& f : forms) {
    // op(A) is (m, k): stored (k, m) when transposed; op(B) is (k, n): stored (n, k).
    const int lda = f.trans_a ? m : k, ldb = f.trans_b ? k : n;
    std::vector<float> c = c0;
    cblas_sgemm(CblasRowMajor, f.trans_a ? CblasTrans : CblasNoTrans, f.trans_b ? CblasTrans : CblasNoTrans, m, n,
                k, 1.0f, a.data(), lda, b.data(), ldb, f.beta, c.data(), n);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double sum = f.beta * static_cast<double>(c0[i * n + j]);
        double magnitude = std::fabs(sum);
        for (int p = 0; p < k; ++p) {
          const double prod = static_cast<double>(f.trans_a ? a[p * m + i] : a[i * k + p]) *
                              static_cast<double>(f.trans_b ? b[j * k + p] : b[p * n + j]);
          sum += prod;
          magnitude += std::fabs(prod);
        }
        // Any order of k + 1 fp32 additions errs by at most (k + 1) u sum|terms| (Higham, u =
        // FLT_EPSILON / 2); FLT_EPSILON (k + 2) is twice that. Wrong kernels miss by O(1).
        const double tolerance = (k + 2) * static_cast<double>(FLT_EPSILON) * magnitude;
        if (!(std::fabs(static_cast<double>(c[i * n + j]) - sum) <= tolerance)) return false;  // NaN fails too
      }
    }
  }
  return true;
}

double measure_sgemm_gflops() {
  constexpr int n = 256, reps = 3;
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    std::vector<float> a(n * n), b(n * n), c(n * n);
    fill(a, 4), fill(b, 5);
    const auto gemm = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                  n);
    };
    gemm();  // warm-up: pages, packing buffers, clocks
    double best = 0;
    for (int r = 0; r < reps; ++r) {
      const double t0 = thread_cpu_seconds();
      gemm();
      const double seconds = thread_cpu_seconds() - t0;
      if (seconds > 0) best = std::max(best, 2.0 * n * n * n / seconds);
    }
    total += best;
  }
  return total / 1e9;
}

namespace {

#ifdef OPENBLAS_VERSION
// OpenBLAS's dynamic-arch entry points (driver/others/dynamic.c), exported by its shared library
// though cblas.h does not declare them: gotoblas_dynamic_quit() forgets the core, and
// gotoblas_dynamic_init() picks one again exactly as the library's constructor did at load time
// (OPENBLAS_CORETYPE if set, else the CPU model) and sets that core's block sizes. Its buffers
// are sized for every core the library ships, so nothing else depends on the first choice.
//
// Why not re-exec the process with OPENBLAS_CORETYPE set: this needs no second start (which MPI
// launchers, debuggers and valgrind would each have to follow) and leaves argv, the environment
// and the process as they are. Without these symbols (a static or symbol-stripped OpenBLAS) tessera
// keeps the library's core and says what to set.
struct OpenblasDynamic {
  void (*quit)() = nullptr;
  void (*init)() = nullptr;
};

OpenblasDynamic openblas_dynamic() {
  return {reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit")),
          reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"))};
}

// Whether the library was built with this core's kernels: their table is gotoblas_<NAME>.
bool library_ships(const std::string& core) {
  std::string symbol = "gotoblas_";
  for (char ch : core) symbol += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return dlsym(RTLD_DEFAULT, symbol.c_str()) != nullptr;
}

// Runs the library's core selection again with OPENBLAS_CORETYPE=core, then unsets the variable
// (tessera switches only where it was unset), so children see the user's environment. Returns the
// core now running. (0.3.21 does not match "Cooperlake" by name, an off-by-one in its table, and
// then falls back to the CPU's features, which choose Cooperlake on a CPU with AVX512_BF16.)
std::string switch_core(const OpenblasDynamic& dyn, const std::string& core) {
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  dyn.quit();
  dyn.init();
  unsetenv("OPENBLAS_CORETYPE");
  return openblas_get_corename();
}

std::string openblas_library() {
  // The running library's version (openblas_get_config: "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."), not
  // the header's.
  std::istringstream config(openblas_get_config());
  std::string name, version;
  config >> name >> version;
  const int parallel = openblas_get_parallel();  // 0 sequential, 1 pthreads, 2 OpenMP
  return name + " " + version + ", " + (parallel == 2 ? "OpenMP" : parallel == 1 ? "pthreads" : "sequential") +
         " build";
}

// Replaces the generic core OpenBLAS picked by the best one the CPU and the library have, each
// candidate checked against the reference GEMM; back to the library's own core if none passes.
void replace_generic_core(BlasSelection& s, const CpuSimd& cpu) {
  const std::string picked = s.core;
  const std::string why = "OpenBLAS picked " + picked + ", a generic core without AVX2 kernels, on this CPU with " +
                          simd_level_name(cpu) + "; OPENBLAS_CORETYPE unset";
  const std::vector<std::string> candidates = openblas_cores_for(cpu);
  const OpenblasDynamic dyn = openblas_dynamic();
  if (!dyn.quit || !dyn.init) {
    s.reason = why + "; this OpenBLAS exports no gotoblas_dynamic_init to switch it";
    s.warnings.push_back("OpenBLAS runs its generic " + picked + " kernels on a CPU with " + simd_level_name(cpu) +
                         "; set OPENBLAS_CORETYPE=" + candidates.front() + " (docs/performance.md, \"BLAS kernels\")");
    return;
  }
  std::vector<std::string> failed;
  for (const std::string& core : candidates) {
    if (!library_ships(core)) continue;
    const std::string now = switch_core(dyn, core);
    if (!is_generic_openblas_core(now) && sgemm_matches_reference()) {
      s.core = now;
      s.source = CoreSource::Tessera;
      s.reason = why;
      s.matches_reference = true;
      return;
    }
    failed.push_back(core);
  }
  switch_core(dyn, picked);
  s.reason = why;
  std::string tried;
  for (const std::string& f : failed) tried += (tried.empty() ? "" : ", ") + f;
  s.warnings.push_back("OpenBLAS runs its generic " + picked + " kernels on a CPU with " + simd_level_name(cpu) +
                       (tried.empty() ? "; the library ships none of its AVX2 or AVX-512 cores"
                                      : "; tessera tried " + tried + ", which failed the reference GEMM"));
}

BlasSelection select_openblas() {
  BlasSelection s;
  s.library = openblas_library();
  s.core = openblas_get_corename();
  const CpuSimd cpu = detect_cpu_simd();
  if (const char* env = std::getenv("OPENBLAS_CORETYPE")) {
    s.source = CoreSource::Environment;
    s.reason = std::string("OPENBLAS_CORETYPE=") + env;
    if (cpu.avx2_fma && is_generic_openblas_core(s.core))
      s.warnings.push_back(std::string("OPENBLAS_CORETYPE=") + env + " runs the generic " + s.core +
                           " kernels on a CPU with " + simd_level_name(cpu) + " (respected; " +
                           openblas_cores_for(cpu).front() + " is the best core for it)");
  } else if (cpu.avx2_fma && is_generic_openblas_core(s.core)) {
    replace_generic_core(s, cpu);
  } else {
    s.reason = cpu.avx2_fma ? "from the CPU model" : "this CPU has no AVX2";
  }
  if (s.source != CoreSource::Tessera) s.matches_reference = sgemm_matches_reference();
  return s;
}
#endif

BlasSelection select_blas() {
#ifdef OPENBLAS_VERSION
  BlasSelection s = select_openblas();
#else
  BlasSelection s;  // BLIS: chooses its kernels from the CPU's features itself
  s.library = "BLIS";
  s.reason = "BLIS chooses its kernels from the CPU's features";
  s.matches_reference = sgemm_matches_reference();
#endif
  if (!s.matches_reference)
    s.warnings.push_back("cblas_sgemm's results differ from a reference GEMM beyond fp32 rounding (" + s.library +
                         (s.core.empty() ? "" : ", core " + s.core) + ")");
  return s;
}

const char* source_words(CoreSource source) {
  switch (source) {
    case CoreSource::Library:
      return "detected by the library";
    case CoreSource::Tessera:
      return "chosen by tessera";
    case CoreSource::Environment:
      return "set by the environment";
  }
  return "";
}

}  // namespace

const BlasSelection& blas_selection() {
  static const BlasSelection selection = select_blas();
  return selection;
}

std::string describe(const BlasSelection& s) {
  std::string line = s.library;
  if (!s.core.empty()) line += ", core " + s.core;
  return line + ", " + source_words(s.source) + " (" + s.reason + ")";
}

}  // namespace tessera::cpu
