// The host-and-device types of the CUDA stand-in headers (kernels/simt/include): launch shapes,
// vector types, the error codes and the opaque stream and event handles. Built only with
// -DTESSERA_SIMT=ON, where kernels/cuda/*.cu compile as C++ against these instead of CUDA's
// headers (docs/cuda.md, "The SIMT emulator").
#pragma once

#include <cstddef>
#include <cstdint>

// dim3: as CUDA's, 1 for every dimension not given.
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
using uint3 = dim3;  // threadIdx / blockIdx read as uint3 in CUDA; dim3 carries the same members

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }

// The CUDA runtime's error codes that tessera meets, with CUDA's numeric values.
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorUnknown = 999,
};
using cudaError = cudaError_t;

// Opaque handles, as in CUDA (kernels/cuda/runtime.h forward-declares CUstream_st).
struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
