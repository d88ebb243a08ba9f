// CUDA runtime services compiled by nvcc, host-callable from plain C++ (no CUDA headers here):
// device queries, device memory for the Allocator (kernels/allocator.h), the device of a rank.
// Safe on a machine without a GPU: the queries say 0 devices, nothing else is called there.
#pragma once

#include <cstddef>
#include <string>

struct CUstream_st;

namespace tessera::cuda {

// Visible devices; 0 when the driver or a GPU is absent.
int device_count();
// "cudart 13000, cublas 130000, cublasLt ..., cudnn ..., nccl ...": proves every library links.
std::string library_versions();
// "NVIDIA H200 (sm_90, 139.8 GiB)" of device i.
std::string device_name(int device);
// Device i's memory in bytes (cudaDeviceProp::totalGlobalMem).
size_t device_memory(int device);

// ---- Device memory (the Allocator's CUDA side) ----
// bytes of device memory on `device`, or nullptr when the device is out of memory (the Allocator
// then gives its cache back and tries once more). Other failures throw.
void* device_malloc(int device, size_t bytes);
// Returns p to the device. Never throws (called from destructors); a failure is printed.
void device_free(int device, void* p) noexcept;
// Zeroes bytes at p, queued on stream (null: the default stream), in order with the ops there.
void device_zero(int device, void* p, size_t bytes, CUstream_st* stream);

// ---- Streams (kernels/exec.h: ComputeStream) ----
// A new non-blocking stream on `device` (it does not wait for the legacy default stream); throws
// naming the device when CUDA refuses.
CUstream_st* create_stream(int device);
// Waits for the stream's work, then destroys it. Never throws (called from destructors).
void destroy_stream(int device, CUstream_st* stream) noexcept;

// ---- Page-locked host memory (kernels/exec.h: host_staging_alloc) ----
// bytes of pinned host memory (cudaHostAlloc), for copies that overlap; throws when refused.
void* pinned_alloc(size_t bytes);
// Never throws (destructors); a failure is printed.
void pinned_free(void* p) noexcept;

}  // namespace tessera::cuda
