// SIMT stand-in for CUDA's <library_types.h> (-DTESSERA_SIMT=ON only): the data types the
// library twins name, with CUDA's values. Only CUDA_R_32F and CUDA_R_16BF are computed on.
#pragma once

enum cudaDataType_t : int {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10,
  CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;
