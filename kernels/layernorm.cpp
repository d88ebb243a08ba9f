// LayerNorm's front: the argument checks, then the backend of the tensors' device (kernels/front.h).
#include "kernels/layernorm.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {

void layernorm_forward(const Exec& ex, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& w, const Tensor& b, double eps) {
  const char* op = "layernorm_forward";
  const Device d = front::device_of(op, ex, {{"y", y}, {"mean", mean}, {"rstd", rstd}, {"x", x}, {"w", w}, {"b", b}});
  int64_t C = front::check_norm_input(op, x, w), N = x.numel() / C;
  front::check_like(op, "y", y, x);
  front::check_numel(op, "mean", mean, x.dtype, N);
  front::check_numel(op, "rstd", rstd, x.dtype, N);
  if (b.defined()) front::check_vector(op, "b", b, x.dtype, C);
  if (d.is_cpu()) return cpu::layernorm_forward(ex, y, mean, rstd, x, w, b, eps);
  TESSERA_CUDA_CALL(op, cuda::layernorm_forward(ex, y, mean, rstd, x, w, b, eps));
}

void layernorm_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                        const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  const char* op = "layernorm_backward";
  const Device d = front::device_of(
      op, ex, {{"dx", dx}, {"dw", dw}, {"db", db}, {"dy", dy}, {"x", x}, {"w", w}, {"mean", mean}, {"rstd", rstd}});
  int64_t C = front::check_norm_input(op, x, w), N = x.numel() / C;
  front::check_like(op, "dx", dx, x);
  front::check_like(op, "dy", dy, x);
  front::check_vector(op, "dw", dw, x.dtype, C);
  front::check_numel(op, "mean", mean, x.dtype, N);
  front::check_numel(op, "rstd", rstd, x.dtype, N);
  if (db.defined()) front::check_vector(op, "db", db, x.dtype, C);
  if (d.is_cpu()) return cpu::layernorm_backward(ex, dx, dw, db, dy, x, w, mean, rstd);
  TESSERA_CUDA_CALL(op, cuda::layernorm_backward(ex, dx, dw, db, dy, x, w, mean, rstd));
}

}  // namespace tessera
