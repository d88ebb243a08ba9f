// CUDA runtime queries. Links cudart, cuBLAS, cuBLASLt, cuDNN and NCCL so that every CUDA build
// proves the toolkit works; the op kernels arrive in kernels/cuda/<family>.cu with the CUDA issue.
#include "kernels/cuda/runtime.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <sstream>

namespace tessera::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string library_versions() {
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  int nccl = 0;
  ncclGetVersion(&nccl);
  std::ostringstream os;
  os << "cudart " << rt << ", cublasLt " << cublasLtGetVersion() << ", cudnn " << cudnnGetVersion()
     << ", nccl " << nccl << ", cublas " << CUBLAS_VERSION;
  return os.str();
}

}  // namespace tessera::cuda
