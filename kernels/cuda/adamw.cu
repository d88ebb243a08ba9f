// CUDA AdamW (kernels/adamw.h) over flat fp32 buffers (master weights, gradients, moments): one
// thread per element, the step's scalars computed once on the host in double, as the CPU's.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

struct Scalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, inv_bc2_sqrt, eps, grad_scale;
};

Scalars scalars_of(const AdamWStep& s) {
  const double t = static_cast<double>(s.step);
  return {static_cast<float>(1.0 - s.lr * s.weight_decay),
          static_cast<float>(s.beta1),
          static_cast<float>(1.0 - s.beta1),
          static_cast<float>(s.beta2),
          static_cast<float>(1.0 - s.beta2),
          static_cast<float>(s.lr / (1.0 - std::pow(s.beta1, t))),
          static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(s.beta2, t))),
          static_cast<float>(s.eps),
          static_cast<float>(s.grad_scale)};
}

// The CPU's adamw_element, per i; compute (optional): the updated p rounded to bf16.
__global__ void adamw_kernel(float* p, const float* grads, float* m, float* v, uint16_t* compute, int64_t n,
                             Scalars k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = k.grad_scale * grads[i];
    float pi = p[i] * k.decay;
    const float mi = k.beta1 * m[i] + k.one_minus_beta1 * g;
    const float vi = k.beta2 * v[i] + k.one_minus_beta2 * g * g;
    pi -= k.step_size * mi / (sqrtf(vi) * k.inv_bc2_sqrt + k.eps);
    p[i] = pi;
    if (compute) compute[i] = bf16_bits(pi);
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adamw_update(const Exec& ex, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const AdamWStep& s, const Tensor& compute) {
  const char* op = "adamw_update";
  require_f32(op, params);
  use_device(op, ex);
  const int64_t n = params.numel();
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(params.ptr<float>(), grads.ptr<float>(),
                                                              m.ptr<float>(), v.ptr<float>(),
                                                              static_cast<uint16_t*>(compute.data), n, scalars_of(s));
  check_launch(op);
}

}  // namespace tessera::cuda
