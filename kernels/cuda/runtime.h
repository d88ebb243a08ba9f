// CUDA runtime queries compiled by nvcc. Host-callable, safe on a machine without a GPU.
#pragma once

#include <string>

namespace tessera::cuda {

// Visible devices; 0 when the driver or a GPU is absent.
int device_count();
// "cudart 13000, cublas 130000, cublasLt ..., cudnn ..., nccl ...": proves every library links.
std::string library_versions();

}  // namespace tessera::cuda
