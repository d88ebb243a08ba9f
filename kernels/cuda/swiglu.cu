// CUDA SwiGLU (kernels/swiglu.h): y = silu(gate) up, elementwise; the CPU's formula.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

__device__ inline float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void swiglu_forward_kernel(float* y, const float* gate, const float* up, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    y[i] = g * sigmoid(g) * up[i];
  }
}

// dup = dy silu(g); dgate = dy up sig (1 + g (1 - sig)). All reads of element i precede its writes.
__global__ void swiglu_backward_kernel(float* dgate, float* dup, const float* dy, const float* gate, const float* up,
                                       int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float d = dy[i], g = gate[i], u = up[i], sig = sigmoid(g);
    dup[i] = d * g * sig;
    dgate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
  }
}

}  // namespace

void swiglu_forward(const Exec& ex, const Tensor& y, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  require_f32(op, gate);
  use_device(op, ex);
  const int64_t n = gate.numel();
  swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(y.ptr<float>(), gate.ptr<float>(),
                                                                       up.ptr<float>(), n);
  check_launch(op);
}

void swiglu_backward(const Exec& ex, const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                     const Tensor& up) {
  const char* op = "swiglu_backward";
  require_f32(op, gate);
  use_device(op, ex);
  const int64_t n = gate.numel();
  swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(dgate.ptr<float>(), dup.ptr<float>(),
                                                                        dy.ptr<float>(), gate.ptr<float>(),
                                                                        up.ptr<float>(), n);
  check_launch(op);
}

}  // namespace tessera::cuda
