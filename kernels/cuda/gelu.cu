// CUDA GELU (kernels/gelu.h), tanh approximation, elementwise; the same formula as the CPU's.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;

// y may alias x: each element is read, then written, by one thread.
__global__ void gelu_forward_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + 0.044715f * v * v * v);
    y[i] = 0.5f * v * (1.0f + tanhf(u));
  }
}

// dx = dy gelu'(x); dx may alias dy.
__global__ void gelu_backward_kernel(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i], v2 = v * v;
    const float th = tanhf(kSqrt2OverPi * (v + 0.044715f * v2 * v));
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * v * sech2 * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v2);
    dx[i] = dy[i] * grad;
  }
}

}  // namespace

void gelu_forward(const Exec& ex, const Tensor& y, const Tensor& x) {
  const char* op = "gelu_forward";
  require_f32(op, x);
  use_device(op, ex);
  const int64_t n = x.numel();
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(y.ptr<float>(), x.ptr<float>(), n);
  check_launch(op);
}

void gelu_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const char* op = "gelu_backward";
  require_f32(op, x);
  use_device(op, ex);
  const int64_t n = x.numel();
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(dx.ptr<float>(), dy.ptr<float>(),
                                                                      x.ptr<float>(), n);
  check_launch(op);
}

}  // namespace tessera::cuda
