// RMSNorm's front: the argument checks, then the backend of the tensors' device (kernels/front.h).
#include "kernels/rmsnorm.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {

void rmsnorm_forward(const Exec& ex, const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w,
                     double eps) {
  const char* op = "rmsnorm_forward";
  const Device d = front::device_of(op, ex, {{"y", y}, {"rstd", rstd}, {"x", x}, {"w", w}});
  int64_t C = front::check_norm_input(op, x, w), N = x.numel() / C;
  front::check_like(op, "y", y, x);
  front::check_numel(op, "rstd", rstd, x.dtype, N);
  if (d.is_cpu()) return cpu::rmsnorm_forward(ex, y, rstd, x, w, eps);
  TESSERA_CUDA_CALL(op, cuda::rmsnorm_forward(ex, y, rstd, x, w, eps));
}

void rmsnorm_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  const Device d = front::device_of(op, ex, {{"dx", dx}, {"dw", dw}, {"dy", dy}, {"x", x}, {"w", w}, {"rstd", rstd}});
  int64_t C = front::check_norm_input(op, x, w), N = x.numel() / C;
  front::check_like(op, "dx", dx, x);
  front::check_like(op, "dy", dy, x);
  front::check_vector(op, "dw", dw, x.dtype, C);
  front::check_numel(op, "rstd", rstd, x.dtype, N);
  if (d.is_cpu()) return cpu::rmsnorm_backward(ex, dx, dw, dy, x, w, rstd);
  TESSERA_CUDA_CALL(op, cuda::rmsnorm_backward(ex, dx, dw, dy, x, w, rstd));
}

}  // namespace tessera
