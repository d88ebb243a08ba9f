// A description of the compiled backends: CPU features, BLAS, OpenMP threads, CUDA devices.
#pragma once

#include <string>

namespace tessera {

std::string kernels_backend_info();
// Measured fp32 FMA throughput of this CPU with all OpenMP threads (a ~50 ms register-only loop):
// the denominator of MFU on the CPU backend.
double measure_cpu_peak_gflops();
// Number of CUDA devices visible (0 when CUDA is not built or no GPU is present).
int cuda_device_count();

}  // namespace tessera
