// Exec: where an op runs. Every launcher takes one as its first argument, as llm.c passes a
// cudaStream_t to every kernel launcher: the device, and on CUDA the stream the op is queued on.
// The CPU's is trivial (Exec::cpu(), or a default-constructed one); no CUDA header is needed here.
#pragma once

#include "kernels/tensor.h"

// CUDA's stream type: cudaStream_t is `CUstream_st*`. Declared, not defined, so that this public
// header stays free of CUDA headers; only kernels/cuda/ dereferences it.
struct CUstream_st;

namespace tessera {

class Allocator;

struct Exec {
  Device device = Device::cpu();
  // CUDA only: the stream every op of this context is queued on, in call order (null: the
  // device's default stream). Ops return before they finish; synchronize() waits.
  CUstream_st* stream = nullptr;
  // CPU only: where ops take their short-lived buffers (the bf16 GEMM's rounded operands), counted
  // as Workspace and cached by size, so a step's repeated shapes reuse their blocks instead of
  // taking fresh pages from the OS every call (the trainer's allocator). Null: the heap.
  Allocator* workspace = nullptr;

  static constexpr Exec cpu() { return {}; }
  static constexpr Exec cuda(int index, CUstream_st* s = nullptr) { return {Device::cuda(index), s}; }
};

// Waits until every op queued on ex has finished (CPU: they already have). read_scalar and the
// other host reads (kernels/elementwise.h) call it; model code never needs to.
void synchronize(const Exec& ex);

// Whether this build has the CUDA backend (kernels/cuda/ compiled and linked: TESSERA_CUDA=ON).
bool cuda_backend_built();
// CUDA devices visible to this process: 0 without the backend, a driver or a GPU.
int cuda_device_count();

}  // namespace tessera
