// synchronize() dispatched like an op; whether the CUDA backend was compiled in.
#include "kernels/exec.h"

#include <cstdlib>
#include <utility>

#include "kernels/cuda/cuda_ops.h"
#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif
#include "kernels/front.h"

namespace tessera {

void synchronize(const Exec& ex) {
  if (ex.device.is_cpu()) return;  // CPU ops run to completion before they return
  TESSERA_CUDA_CALL("synchronize", cuda::synchronize(ex));
}

ComputeStream::ComputeStream(Device device) : device_(device) {
  if (device.is_cpu()) return;
#ifdef TESSERA_WITH_CUDA
  stream_ = cuda::create_stream(device.index);
#else
  TESSERA_CHECK(false, "a compute stream on ", device.str(), ": this build has no CUDA backend (TESSERA_CUDA=OFF)");
#endif
}

ComputeStream::~ComputeStream() {
#ifdef TESSERA_WITH_CUDA
  if (stream_) cuda::destroy_stream(device_.index, stream_);
#endif
}

ComputeStream::ComputeStream(ComputeStream&& o) noexcept
    : device_(o.device_), stream_(std::exchange(o.stream_, nullptr)) {}

ComputeStream& ComputeStream::operator=(ComputeStream&& o) noexcept {
  if (this != &o) {
    ComputeStream old(std::move(*this));  // the stream held until now goes with old
    device_ = o.device_;
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

void* host_staging_alloc(Device device, size_t bytes) {
  if (device.is_cpu()) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    TESSERA_CHECK(p, "host_staging_alloc: out of host memory for ", bytes, " bytes");
    return p;
  }
#ifdef TESSERA_WITH_CUDA
  return cuda::pinned_alloc(bytes);
#else
  TESSERA_CHECK(false, "host staging for ", device.str(), ": this build has no CUDA backend (TESSERA_CUDA=OFF)");
  return nullptr;
#endif
}

void host_staging_free(Device device, void* p) noexcept {
  if (device.is_cpu()) return std::free(p);
#ifdef TESSERA_WITH_CUDA
  cuda::pinned_free(p);
#endif
}

bool cuda_backend_built() {
#ifdef TESSERA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef TESSERA_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace tessera
