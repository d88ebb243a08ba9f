// A description of the compiled backends: CPU features, BLAS, OpenMP threads, CUDA devices.
#pragma once

#include <string>

namespace tessera {

std::string kernels_backend_info();
// The OpenMP threads this process's CPU kernels run (omp_get_max_threads).
int cpu_threads();
// Nominal fp32 peak of this CPU with all OpenMP threads: threads x clock (cpu MHz of
// /proc/cpuinfo, often the base clock) x fp32 FLOPs per cycle (2 FMA pipes x SIMD width x 2: 64
// with AVX-512, 32 with AVX2+FMA, 8 otherwise). 0 when the clock is unknown.
double cpu_nominal_peak_gflops();
// The denominator of MFU on the CPU backend: the larger of the nominal peak and a measured FMA
// loop, so a turbo clock above the nominal one never inflates MFU, and a busy machine (which
// slows the measurement) falls back to the nominal figure.
double cpu_peak_gflops();
// Measured fp32 FMA throughput with all OpenMP threads (a ~50 ms register-only loop); shown by
// `tessera info` next to the nominal peak. Noisy when other processes share the cores.
double measure_cpu_peak_gflops();
// cuda_device_count(): kernels/exec.h, beside cuda_backend_built().
// CUDA device `index`'s name as its runtime reports it: the GPU's name, compute capability and
// memory, e.g. "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)". An error in a build without the backend.
std::string cuda_device_name(int index);
// CUDA device `index`'s memory in bytes, as its runtime reports it (totalGlobalMem). An error in a
// build without the backend.
size_t cuda_device_memory(int index);
// The kernel train.dtype = "bf16" runs its CPU GEMMs with: "AVX512_BF16 (vdpbf16ps)", or the
// portable fallback on a CPU without AVX512_BF16 (kernels/cpu/gemm_bf16.h).
std::string cpu_bf16_gemm_kernel();

}  // namespace tessera
