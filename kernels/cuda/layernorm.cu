// CUDA LayerNorm (kernels/layernorm.h): one block per row for the forward and for dx; dw and db as
// deterministic column sums (common.cuh). Two passes over a row (mean, then the variance of
// x - mean), in float as the CPU's float path.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

// Block n: y[n, :] = (x - mean) rstd w + b; mean[n], rstd[n].
__global__ void layernorm_forward_kernel(float* y, float* mean, float* rstd, const float* x, const float* w,
                                         const float* b, int64_t C, float eps) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const float* xr = x + n * C;  // (C)
  float* yr = y + n * C;        // (C)
  float s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
  const float m = block_sum(s, shared) / float(C);
  float v = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) v += (xr[c] - m) * (xr[c] - m);
  const float r = 1.0f / sqrtf(block_sum(v, shared) / float(C) + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = (xr[c] - m) * r * w[c] + (b ? b[c] : 0.0f);
  if (threadIdx.x == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// Block n: dx[n, :] += rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, xhat = (x - mean) rstd.
// Each thread reads then writes its own columns, after the block's sums.
__global__ void layernorm_dx_kernel(float* dx, const float* dy, const float* x, const float* w, const float* mean,
                                    const float* rstd, int64_t C) {
  __shared__ float shared[32];
  const int64_t n = blockIdx.x;
  const float* xr = x + n * C;
  const float* gr = dy + n * C;
  float* dxr = dx + n * C;
  const float m = mean[n], r = rstd[n];
  float g_sum = 0, gx_sum = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = gr[c] * w[c];
    g_sum += g;
    gx_sum += g * (xr[c] - m) * r;
  }
  const float g_mean = block_sum(g_sum, shared) / float(C);
  const float gx_mean = block_sum(gx_sum, shared) / float(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float xh = (xr[c] - m) * r;
    dxr[c] += r * (gr[c] * w[c] - g_mean - xh * gx_mean);
  }
}

// dw's term dy xhat and db's term dy.
struct DyXhat {
  const float *dy, *x, *mean, *rstd;
  int64_t C;
  __device__ double operator()(int64_t n, int64_t c) const {
    return double(dy[n * C + c]) * double((x[n * C + c] - mean[n]) * rstd[n]);
  }
};
struct Dy {
  const float* dy;
  int64_t C;
  __device__ double operator()(int64_t n, int64_t c) const { return double(dy[n * C + c]); }
};

}  // namespace

void layernorm_forward(const Exec& ex, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& w, const Tensor& b, double eps) {
  const char* op = "layernorm_forward";
  require_f32(op, x);
  use_device(op, ex);
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (N == 0) return;
  layernorm_forward_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_of(ex)>>>(
      y.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), x.ptr<float>(), w.ptr<float>(),
      b.defined() ? b.ptr<float>() : nullptr, C, static_cast<float>(eps));
  check_launch(op);
}

void layernorm_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                        const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  require_f32(op, x);
  use_device(op, ex);
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (N == 0) return;
  // dw and db first: they read dy, which dx may alias.
  column_sums(op, ex, dw.ptr<float>(), DyXhat{dy.ptr<float>(), x.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), C},
              N, C);
  if (db.defined()) column_sums(op, ex, db.ptr<float>(), Dy{dy.ptr<float>(), C}, N, C);
  layernorm_dx_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream_of(ex)>>>(
      dx.ptr<float>(), dy.ptr<float>(), x.ptr<float>(), w.ptr<float>(), mean.ptr<float>(), rstd.ptr<float>(), C);
  check_launch(op);
}

}  // namespace tessera::cuda
