// A description of the compiled backends: CPU features, BLAS, OpenMP threads, CUDA devices.
#pragma once

#include <string>

namespace tessera {

std::string kernels_backend_info();
// Number of CUDA devices visible (0 when CUDA is not built or no GPU is present).
int cuda_device_count();

}  // namespace tessera
