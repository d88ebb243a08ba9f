// AdamW's front: the argument checks, then the backend of the tensors' device (kernels/front.h).
#include "kernels/adamw.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {
namespace {

void check_args(const char* op, const char* arg, const Tensor& t, const Tensor& params) {
  front::check_defined(op, arg, t);
  check_dtype(op, arg, t, params.dtype);
  TESSERA_CHECK(t.numel() == params.numel(), op, ": ", arg, " has ", t.numel(), " elements, params has ",
                params.numel());
}

void check_step(const char* op, const AdamWStep& s) {
  TESSERA_CHECK(s.step >= 1, op, ": step is ", s.step, ", must be >= 1 (bias correction is 1-based)");
  TESSERA_CHECK(s.beta1 >= 0 && s.beta1 < 1, op, ": beta1 is ", s.beta1, ", must be in [0, 1)");
  TESSERA_CHECK(s.beta2 >= 0 && s.beta2 < 1, op, ": beta2 is ", s.beta2, ", must be in [0, 1)");
}

}  // namespace

void adamw_update(const Exec& ex, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const AdamWStep& s, const Tensor& compute) {
  const char* op = "adamw_update";
  const Device d = compute.defined() ? front::device_of(op, ex, {{"params", params}, {"grads", grads}, {"m", m}, {"v", v},
                                                                 {"compute", compute}})
                                     : front::device_of(op, ex, {{"params", params}, {"grads", grads}, {"m", m}, {"v", v}});
  check_args(op, "params", params, params);
  TESSERA_CHECK(params.dtype == DType::F32 || params.dtype == DType::F64, op, ": unsupported dtype ",
                dtype_name(params.dtype), " (F32 or F64)");
  check_args(op, "grads", grads, params);
  check_args(op, "m", m, params);
  check_args(op, "v", v, params);
  check_step(op, s);
  if (compute.defined()) {
    check_dtype(op, "compute", compute, DType::BF16);
    TESSERA_CHECK(params.dtype == DType::F32, op, ": a bf16 compute copy of ", dtype_name(params.dtype),
                  " params (bf16 of f32 only)");
    TESSERA_CHECK(compute.numel() == params.numel(), op, ": compute has ", compute.numel(), " elements, params has ",
                  params.numel());
  }
  if (d.is_cpu()) return cpu::adamw_update(ex, params, grads, m, v, s, compute);
  TESSERA_CUDA_CALL(op, cuda::adamw_update(ex, params, grads, m, v, s, compute));
}

}  // namespace tessera
