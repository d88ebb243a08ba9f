// matmul's and Linear's fronts: the argument checks, then the backend of the tensors' device
// (kernels/front.h).
#include "kernels/matmul.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {
namespace {

void check_float_dtype(const char* op, const Tensor& t) {
  TESSERA_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, op, ": unsupported dtype ", dtype_name(t.dtype),
                " (F32 or F64)");
}

// Checks arg is a defined tensor of dtype like ref.
void check_operand(const char* op, const char* arg, const Tensor& t, const Tensor& ref) {
  front::check_defined(op, arg, t);
  check_dtype(op, arg, t, ref.dtype);
}

void check_ndim(const char* op, const char* arg, const Tensor& t, int ndim) {
  TESSERA_CHECK(t.ndim() == ndim, op, ": ", arg, " has shape ", t.shape.str(), ", expected ", ndim, " dims");
}

// An operand that may be a bf16 copy: dtype like ref, or BF16 when ref is F32 (mixed precision:
// the GEMM rounds the F32 operands to bf16 and sums in fp32).
void check_gemm_operand(const char* op, const char* arg, const Tensor& t, const Tensor& ref) {
  front::check_defined(op, arg, t);
  if (t.dtype == DType::BF16 && ref.dtype == DType::F32) return;
  TESSERA_CHECK(t.dtype == ref.dtype, op, ": ", arg, " is ", dtype_name(t.dtype), ", expected ", dtype_name(ref.dtype),
                ref.dtype == DType::F32 ? " or bf16" : "");
}

// x's shape with the last dimension replaced by last.
Shape with_last_dim(const Shape& s, int64_t last) {
  Shape r = s;
  r[-1] = last;
  return r;
}

// Validates Linear shapes, x (N.., In), w (Out, In), y (N.., Out); returns Out.
int64_t check_linear_shapes(const char* op, const char* y_name, const Tensor& y, const Tensor& x, const Tensor& w) {
  check_ndim(op, "w", w, 2);
  TESSERA_CHECK(x.ndim() >= 1, op, ": x has shape ", x.shape.str(), ", expected at least 1 dim");
  int64_t out = w.dim(0), in = w.dim(1);
  check_shape(op, "x", x, with_last_dim(x.shape, in));  // names x when its last dim is not w's In
  check_shape(op, y_name, y, with_last_dim(x.shape, out));
  return out;
}

}  // namespace

void matmul(const Exec& ex, const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
            double beta) {
  const char* op = "matmul";
  const Device d = front::device_of(op, ex, {{"c", c}, {"a", a}, {"b", b}});
  check_operand(op, "c", c, c);
  check_float_dtype(op, c);
  check_gemm_operand(op, "a", a, c);
  check_gemm_operand(op, "b", b, c);
  check_ndim(op, "c", c, 2);
  check_ndim(op, "a", a, 2);
  check_ndim(op, "b", b, 2);
  const int64_t M = c.dim(0), N = c.dim(1), K = trans_a ? a.dim(0) : a.dim(1);
  check_shape(op, "a", a, trans_a ? Shape{K, M} : Shape{M, K});
  check_shape(op, "b", b, trans_b ? Shape{N, K} : Shape{K, N});
  if (d.is_cpu()) return cpu::matmul(ex, c, a, b, trans_a, trans_b, alpha, beta);
  TESSERA_CUDA_CALL(op, cuda::matmul(ex, c, a, b, trans_a, trans_b, alpha, beta));
}

void linear_forward(const Exec& ex, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const char* op = "linear_forward";
  const Device d = front::device_of(op, ex, {{"y", y}, {"x", x}, {"w", w}, {"bias", bias}});
  check_operand(op, "x", x, x);
  check_float_dtype(op, x);
  check_operand(op, "y", y, x);
  check_gemm_operand(op, "w", w, x);
  const int64_t out = check_linear_shapes(op, "y", y, x, w);
  if (bias.defined()) {
    check_operand(op, "bias", bias, x);
    check_shape(op, "bias", bias, Shape{out});
  }
  if (d.is_cpu()) return cpu::linear_forward(ex, y, x, w, bias);
  TESSERA_CUDA_CALL(op, cuda::linear_forward(ex, y, x, w, bias));
}

void linear_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dy,
                     const Tensor& x, const Tensor& w) {
  const char* op = "linear_backward";
  const Device d = front::device_of(op, ex, {{"dx", dx}, {"dw", dw}, {"dbias", dbias}, {"dy", dy}, {"x", x}, {"w", w}});
  check_operand(op, "x", x, x);
  check_float_dtype(op, x);
  check_operand(op, "dy", dy, x);
  check_gemm_operand(op, "w", w, x);
  check_operand(op, "dw", dw, x);
  const int64_t out = check_linear_shapes(op, "dy", dy, x, w);
  check_shape(op, "dw", dw, w.shape);
  if (dx.defined()) {
    check_operand(op, "dx", dx, x);
    check_shape(op, "dx", dx, x.shape);
  }
  if (dbias.defined()) {
    check_operand(op, "dbias", dbias, x);
    check_shape(op, "dbias", dbias, Shape{out});
  }
  if (d.is_cpu()) return cpu::linear_backward(ex, dx, dw, dbias, dy, x, w);
  TESSERA_CUDA_CALL(op, cuda::linear_backward(ex, dx, dw, dbias, dy, x, w));
}

}  // namespace tessera
