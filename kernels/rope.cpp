// RoPE's front: the argument checks, then the backend of the tensors' device (kernels/front.h).
#include "kernels/rope.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {
namespace {

void check_args(const char* op, const Tensor& y, const Tensor& x, double theta) {
  check_same_dtype(op, y, x);
  TESSERA_CHECK(x.dtype == DType::F32 || x.dtype == DType::F64, op, ": unsupported dtype ", dtype_name(x.dtype));
  TESSERA_CHECK(x.ndim() == 4, op, ": expected (B, T, H, D), got ", x.shape.str());
  TESSERA_CHECK(x.dim(3) % 2 == 0, op, ": head dim D must be even, got ", x.dim(3));
  check_shape(op, "output", y, x.shape);
  TESSERA_CHECK(theta > 0, op, ": theta must be positive, got ", theta);
}

}  // namespace

void rope_forward(const Exec& ex, const Tensor& y, const Tensor& x, int64_t pos_offset, double theta) {
  const char* op = "rope_forward";
  const Device d = front::device_of(op, ex, {{"y", y}, {"x", x}});
  check_args(op, y, x, theta);
  if (d.is_cpu()) return cpu::rope_forward(ex, y, x, pos_offset, theta);
  TESSERA_CUDA_CALL(op, cuda::rope_forward(ex, y, x, pos_offset, theta));
}

void rope_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, int64_t pos_offset, double theta) {
  const char* op = "rope_backward";
  const Device d = front::device_of(op, ex, {{"dx", dx}, {"dy", dy}});
  check_args(op, dx, dy, theta);
  if (d.is_cpu()) return cpu::rope_backward(ex, dx, dy, pos_offset, theta);
  TESSERA_CUDA_CALL(op, cuda::rope_backward(ex, dx, dy, pos_offset, theta));
}

}  // namespace tessera
