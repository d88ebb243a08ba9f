// Backend report. The only place outside kernels/cuda that knows whether CUDA was compiled in.
#include "kernels/backend_info.h"

#include <omp.h>

#include <cstdlib>
#include <sstream>

#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

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

int cuda_device_count() {
#ifdef TESSERA_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string kernels_backend_info() {
  std::ostringstream os;
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  os << "cpu: features" << cpu_features() << ", " << omp_get_max_threads() << " OpenMP threads\n";
  os << "blas: " << TESSERA_BLAS_NAME << (coretype ? std::string(" (OPENBLAS_CORETYPE=") + coretype + ")" : "") << "\n";
#ifdef TESSERA_WITH_CUDA
  os << "cuda: built (" << cuda::library_versions() << "), " << cuda::device_count() << " device(s) visible\n";
#else
  os << "cuda: not built\n";
#endif
  return os.str();
}

}  // namespace tessera
