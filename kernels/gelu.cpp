// GELU's front: the argument checks, then the backend of the tensors' device (kernels/front.h).
#include "kernels/gelu.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {
namespace {

void check_args(const char* op, const Tensor& a, const Tensor& b) {
  check_same_dtype(op, a, b);
  TESSERA_CHECK(a.numel() == b.numel(), op, ": sizes differ, ", a.shape.str(), " vs ", b.shape.str());
  TESSERA_CHECK(a.dtype == DType::F32 || a.dtype == DType::F64, op, ": unsupported dtype ", dtype_name(a.dtype));
}

}  // namespace

void gelu_forward(const Exec& ex, const Tensor& y, const Tensor& x) {
  const char* op = "gelu_forward";
  const Device d = front::device_of(op, ex, {{"y", y}, {"x", x}});
  check_args(op, y, x);
  if (d.is_cpu()) return cpu::gelu_forward(ex, y, x);
  TESSERA_CUDA_CALL(op, cuda::gelu_forward(ex, y, x));
}

void gelu_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const char* op = "gelu_backward";
  const Device d = front::device_of(op, ex, {{"dx", dx}, {"dy", dy}, {"x", x}});
  check_args(op, dx, x);
  check_args(op, dy, x);
  if (d.is_cpu()) return cpu::gelu_backward(ex, dx, dy, x);
  TESSERA_CUDA_CALL(op, cuda::gelu_backward(ex, dx, dy, x));
}

}  // namespace tessera
