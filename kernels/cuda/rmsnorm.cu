// CUDA RMSNorm (kernels/rmsnorm.h): one block per row for the forward and for dx; dw as a
// deterministic column sum (common.cuh). Float arithmetic, as the CPU's float path.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

// Block n: y[n, :] = x rstd w, rstd[n] = 1 / sqrt(mean(x^2) + eps).
__global__ void rmsnorm_forward_kernel(float* y, float* rstd, const float* x, const float* w, int64_t C, float eps) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const float* xr = x + n * C;  // (C)
  float* yr = y + n * C;        // (C)
  float ss = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
  const float r = 1.0f / sqrtf(block_sum(ss, shared) / float(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = xr[c] * r * w[c];
  if (threadIdx.x == 0) rstd[n] = r;
}

// Block n: dx[n, :] += rstd (g - xhat mean(g xhat)), g = dy w, xhat = x rstd.
__global__ void rmsnorm_dx_kernel(float* dx, const float* dy, const float* x, const float* w, const float* rstd,
                                  int64_t C) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const float* xr = x + n * C;
  const float* gr = dy + n * C;
  float* dxr = dx + n * C;
  const float r = rstd[n];
  float gx_sum = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) gx_sum += gr[c] * w[c] * xr[c] * r;
  const float gx_mean = block_sum(gx_sum, shared) / float(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dxr[c] += r * (gr[c] * w[c] - xr[c] * r * gx_mean);
}

// dw's term dy xhat.
struct DyXhat {
  const float *dy, *x, *rstd;
  int64_t C;
  __device__ double operator()(int64_t n, int64_t c) const {
    return double(dy[n * C + c]) * double(x[n * C + c] * rstd[n]);
  }
};

}  // namespace

void rmsnorm_forward(const Exec& ex, const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w,
                     double eps) {
  const char* op = "rmsnorm_forward";
  require_f32(op, x);
  use_device(op, ex);
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (N == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_of(ex)>>>(
      y.ptr<float>(), rstd.ptr<float>(), x.ptr<float>(), w.ptr<float>(), C, static_cast<float>(eps));
  check_launch(op);
}

void rmsnorm_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  require_f32(op, x);
  use_device(op, ex);
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (N == 0) return;
  column_sums(op, ex, dw.ptr<float>(), DyXhat{dy.ptr<float>(), x.ptr<float>(), rstd.ptr<float>(), C}, N, C);
  rmsnorm_dx_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_of(ex)>>>(
      dx.ptr<float>(), dy.ptr<float>(), x.ptr<float>(), w.ptr<float>(), rstd.ptr<float>(), C);
  check_launch(op);
}

}  // namespace tessera::cuda
