// CUDA runtime queries and the device memory under the Allocator. Links cudart, cuBLAS, cuBLASLt,
// cuDNN and NCCL so that every CUDA build proves the toolkit works.
#include "kernels/cuda/runtime.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <cstdio>
#include <sstream>

#include "kernels/cuda/common.cuh"

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

std::string device_name(int device) {
  cudaDeviceProp p{};
  check_cuda("device_name", cudaGetDeviceProperties(&p, device));
  std::ostringstream os;
  os << p.name << " (sm_" << p.major << p.minor << ", " << static_cast<double>(p.totalGlobalMem) / (1 << 30)
     << " GiB)";
  return os.str();
}

size_t device_memory(int device) {
  cudaDeviceProp p{};
  check_cuda("device_memory", cudaGetDeviceProperties(&p, device));
  return p.totalGlobalMem;
}

void* device_malloc(int device, size_t bytes) {
  check_cuda("device_malloc", cudaSetDevice(device));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // not sticky, but cleared so that the next check does not see it
    return nullptr;
  }
  check_cuda("device_malloc", e);
  return p;
}

void device_free(int device, void* p) noexcept {
  if (!p) return;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaFree(p);
  if (e != cudaSuccess) std::fprintf(stderr, "tessera: cudaFree on cuda:%d failed: %s\n", device, cudaGetErrorString(e));
}

void device_zero(int device, void* p, size_t bytes, CUstream_st* stream) {
  check_cuda("device_zero", cudaSetDevice(device));
  check_cuda("device_zero", cudaMemsetAsync(p, 0, bytes, stream));
}

CUstream_st* create_stream(int device) {
  check_cuda("create_stream", cudaSetDevice(device));
  cudaStream_t s = nullptr;
  check_cuda("create_stream", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void destroy_stream(int device, CUstream_st* stream) noexcept {
  if (!stream) return;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  const cudaError_t d = cudaStreamDestroy(stream);
  if (e == cudaSuccess) e = d;
  if (e != cudaSuccess)
    std::fprintf(stderr, "tessera: destroying a stream on cuda:%d failed: %s\n", device, cudaGetErrorString(e));
}

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  check_cuda("pinned_alloc", cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return p;
}

void pinned_free(void* p) noexcept {
  if (!p) return;
  const cudaError_t e = cudaFreeHost(p);
  if (e != cudaSuccess) std::fprintf(stderr, "tessera: cudaFreeHost failed: %s\n", cudaGetErrorString(e));
}

}  // namespace tessera::cuda
