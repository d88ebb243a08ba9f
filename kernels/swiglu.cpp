// SwiGLU's front: the argument checks, then the backend of the tensors' device (kernels/front.h).
#include "kernels/swiglu.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {
namespace {

// t has gate's dtype and element count (any shape).
void check_same(const char* op, const char* arg, const Tensor& t, const Tensor& gate) {
  front::check_numel(op, arg, t, gate.dtype, gate.numel());
}

}  // namespace

void swiglu_forward(const Exec& ex, const Tensor& y, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  const Device d = front::device_of(op, ex, {{"y", y}, {"gate", gate}, {"up", up}});
  front::check_float(op, "gate", gate);
  check_same(op, "up", up, gate);
  check_same(op, "y", y, gate);
  if (d.is_cpu()) return cpu::swiglu_forward(ex, y, gate, up);
  TESSERA_CUDA_CALL(op, cuda::swiglu_forward(ex, y, gate, up));
}

void swiglu_backward(const Exec& ex, const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                     const Tensor& up) {
  const char* op = "swiglu_backward";
  const Device d = front::device_of(op, ex, {{"dgate", dgate}, {"dup", dup}, {"dy", dy}, {"gate", gate}, {"up", up}});
  front::check_float(op, "gate", gate);
  check_same(op, "up", up, gate);
  check_same(op, "dy", dy, gate);
  check_same(op, "dgate", dgate, gate);
  check_same(op, "dup", dup, gate);
  if (d.is_cpu()) return cpu::swiglu_backward(ex, dgate, dup, dy, gate, up);
  TESSERA_CUDA_CALL(op, cuda::swiglu_backward(ex, dgate, dup, dy, gate, up));
}

}  // namespace tessera
