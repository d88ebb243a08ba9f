// CUDA RoPE (kernels/rope.h), "rotate half": one thread per (b, t, h, i < D/2) pair of elements.
// The angle (pos_offset + t) theta^(-2i/D) and its cos/sin in double, rounded once to float, as
// the CPU's table, so positions far into a sequence lose nothing to the angle.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

// x, y (B, T, H, D), half = D / 2; sign +1 forward, -1 backward. Reads both elements of its pair
// before writing them, so y may alias x.
__global__ void rope_kernel(float* y, const float* x, int64_t T, int64_t H, int64_t half, int64_t pairs,
                            int64_t pos_offset, double theta, float sign) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < pairs; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = p % half, row = p / half;  // row = (b T + t) H + h
    const int64_t t = (row / H) % T;
    const double freq = pow(theta, -2.0 * double(i) / double(2 * half));
    double s, c;
    sincos(double(pos_offset + t) * freq, &s, &c);
    const float cf = float(c), sf = sign * float(s);
    const int64_t base = row * 2 * half;
    const float x1 = x[base + i], x2 = x[base + i + half];
    y[base + i] = x1 * cf - x2 * sf;
    y[base + i + half] = x2 * cf + x1 * sf;
  }
}

void rotate(const char* op, const Exec& ex, const Tensor& y, const Tensor& x, int64_t pos_offset, double theta,
            float sign) {
  require_f32(op, x);
  use_device(op, ex);
  const int64_t T = x.dim(1), H = x.dim(2), half = x.dim(3) / 2, pairs = x.numel() / 2;
  if (pairs == 0) return;
  rope_kernel<<<blocks_for(pairs), kThreads, 0, stream_of(ex)>>>(y.ptr<float>(), x.ptr<float>(), T, H, half, pairs,
                                                                 pos_offset, theta, sign);
  check_launch(op);
}

}  // namespace

void rope_forward(const Exec& ex, const Tensor& y, const Tensor& x, int64_t pos_offset, double theta) {
  rotate("rope_forward", ex, y, x, pos_offset, theta, 1.0f);
}

void rope_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, int64_t pos_offset, double theta) {
  rotate("rope_backward", ex, dx, dy, pos_offset, theta, -1.0f);
}

}  // namespace tessera::cuda
