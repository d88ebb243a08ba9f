// Exec: where an op runs. Every launcher takes one as its first argument, as llm.c passes a
// cudaStream_t to every kernel launcher: the device, and on CUDA the stream the op is queued on.
// The CPU's is trivial (Exec::cpu(), or a default-constructed one); no CUDA header is needed here.
#pragma once

#include <cstddef>

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

// The stream a trainer's ops and its allocator share (RAII). On a CUDA device: a stream of its
// own, created non-blocking (it never waits for the legacy default stream), synchronized and
// destroyed with this object; on the CPU: nothing (stream() is null). A CUDA device in a build
// without the backend is an Error naming it. Movable, not copyable.
class ComputeStream {
 public:
  explicit ComputeStream(Device device = Device::cpu());
  ~ComputeStream();
  ComputeStream(ComputeStream&& o) noexcept;
  ComputeStream& operator=(ComputeStream&& o) noexcept;
  ComputeStream(const ComputeStream&) = delete;
  ComputeStream& operator=(const ComputeStream&) = delete;
  Device device() const { return device_; }
  CUstream_st* stream() const { return stream_; }

 private:
  Device device_;
  CUstream_st* stream_ = nullptr;
};

// Host memory for staging a device's tensors (the MPI communicator on device tensors): for a CUDA
// device page-locked (cudaHostAlloc), so copies to and from it run at the link's speed; for the CPU
// plain 64-byte aligned heap memory (the same staging path, exercised by CPU tests). Freed with
// host_staging_free for the same device. bytes > 0.
void* host_staging_alloc(Device device, size_t bytes);
void host_staging_free(Device device, void* p) noexcept;

// Whether this build has the CUDA backend (kernels/cuda/ compiled and linked: TESSERA_CUDA=ON).
bool cuda_backend_built();
// CUDA devices visible to this process: 0 without the backend, a driver or a GPU.
int cuda_device_count();

}  // namespace tessera
