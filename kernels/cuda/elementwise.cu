// CUDA elementwise ops so far: zero-fill and copy, each one async runtime call on the context's
// stream. They prove the front -> backend seam links in a CUDA build; the kernels come later.
#include <cuda_runtime.h>

#include "kernels/check.h"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

cudaStream_t stream_of(const Exec& ex) { return ex.stream; }

void check_cuda(const char* op, cudaError_t e) { TESSERA_CHECK(e == cudaSuccess, op, ": ", cudaGetErrorString(e)); }

}  // namespace

void synchronize(const Exec& ex) {
  check_cuda("synchronize", cudaSetDevice(ex.device.index));
  check_cuda("synchronize", cudaStreamSynchronize(stream_of(ex)));
}

void fill_zero(const Exec& ex, const Tensor& t) {
  check_cuda("fill_zero", cudaSetDevice(ex.device.index));
  check_cuda("fill_zero", cudaMemsetAsync(t.data, 0, t.nbytes(), stream_of(ex)));
}

void copy(const Exec& ex, const Tensor& dst, const Tensor& src) {
  if (dst.data == src.data) return;
  check_cuda("copy", cudaSetDevice(ex.device.index));
  // cudaMemcpyDefault: the direction follows from the pointers (unified addressing), so one call
  // serves uploads, reads and device-to-device copies.
  check_cuda("copy", cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDefault, stream_of(ex)));
}

}  // namespace tessera::cuda
