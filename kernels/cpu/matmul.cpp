// CPU matmul and Linear: F64 runs a plain triple-loop reference (the test oracle), F32 calls
// the CPU BLAS (kernels/cpu/blas.h). The Linear layer is written once over a typed gemm() for both.
#include "kernels/matmul.h"

#include "kernels/cpu/blas.h"


#include <algorithm>
#include <cstdint>

namespace tessera {
namespace {

// Row-major GEMM operands: c (m, n) = alpha * op(a) (m, k) · op(b) (k, n) + beta * c.
// a is stored (m, k), or (k, m) when trans_a; b is stored (k, n), or (n, k) when trans_b.
struct GemmDims {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
};

namespace reference {
// Straightforward loops, accumulating in T. beta == 0 does not read c (BLAS convention), so c
// may hold garbage such as NaN from an uninitialised buffer.
template <typename T>
void gemm(const GemmDims& d, T alpha, const T* a, const T* b, T beta, T* c) {
  for (int64_t i = 0; i < d.m; ++i) {
    for (int64_t j = 0; j < d.n; ++j) {
      T acc = 0;
      for (int64_t p = 0; p < d.k; ++p) {
        T av = d.trans_a ? a[p * d.m + i] : a[i * d.k + p];
        T bv = d.trans_b ? b[j * d.k + p] : b[p * d.n + j];
        acc += av * bv;
      }
      T& out = c[i * d.n + j];
      out = beta == T(0) ? alpha * acc : alpha * acc + beta * out;
    }
  }
}
}  // namespace reference

namespace blas {
void gemm(const char* op, const GemmDims& d, float alpha, const float* a, const float* b, float beta, float* c) {
  // Leading dimensions of contiguous row-major storage.
  cpu::sgemm(op, d.trans_a, d.trans_b, d.m, d.n, d.k, alpha, a, d.trans_a ? d.m : d.k, b, d.trans_b ? d.k : d.n,
             beta, c, d.n);
}
}  // namespace blas

// The typed entry point the launchers share: double -> reference, float -> BLAS.
void gemm(const char* op, const GemmDims& d, double alpha, const double* a, const double* b, double beta,
          double* c) {
  reference::gemm(d, alpha, a, b, beta, c);
}
void gemm(const char* op, const GemmDims& d, double alpha, const float* a, const float* b, double beta, float* c) {
  blas::gemm(op, d, static_cast<float>(alpha), a, b, static_cast<float>(beta), c);
}

// y (n, out): every row = bias (out).
template <typename T>
void broadcast_rows(T* y, const T* bias, int64_t n, int64_t out) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) std::copy(bias, bias + out, y + i * out);
}

// dbias (out) += sum over rows of dy (n, out). Threads split the columns in blocks; each block
// walks the rows contiguously and sums in double, so the float path loses nothing to long sums.
template <typename T>
void accumulate_column_sums(T* dbias, const T* dy, int64_t n, int64_t out) {
  constexpr int64_t kBlock = 64;
  int64_t blocks = (out + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t begin = blk * kBlock, width = std::min(kBlock, out - begin);
    double acc[kBlock] = {};
    for (int64_t i = 0; i < n; ++i) {
      const T* row = dy + i * out + begin;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) acc[j] += static_cast<double>(row[j]);
    }
    for (int64_t j = 0; j < width; ++j) dbias[begin + j] = static_cast<T>(dbias[begin + j] + acc[j]);
  }
}

void check_float_dtype(const char* op, const Tensor& t) {
  TESSERA_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, op, ": unsupported dtype ", dtype_name(t.dtype),
                " (F32 or F64)");
}

// Checks arg is a defined CPU tensor of dtype like ref.
void check_operand(const char* op, const char* arg, const Tensor& t, const Tensor& ref) {
  TESSERA_CHECK(t.defined(), op, ": ", arg, " is undefined");
  check_cpu(op, t);
  check_dtype(op, arg, t, ref.dtype);
}

void check_ndim(const char* op, const char* arg, const Tensor& t, int ndim) {
  TESSERA_CHECK(t.ndim() == ndim, op, ": ", arg, " has shape ", t.shape.str(), ", expected ", ndim, " dims");
}

// x's shape with the last dimension replaced by last.
Shape with_last_dim(const Shape& s, int64_t last) {
  Shape r = s;
  r[-1] = last;
  return r;
}

// Validates Linear shapes, x (N.., In), w (Out, In), y (N.., Out); returns m = N, n = Out, k = In.
GemmDims linear_dims(const char* op, const char* y_name, const Tensor& y, const Tensor& x, const Tensor& w) {
  check_ndim(op, "w", w, 2);
  TESSERA_CHECK(x.ndim() >= 1, op, ": x has shape ", x.shape.str(), ", expected at least 1 dim");
  int64_t out = w.dim(0), in = w.dim(1);
  check_shape(op, "x", x, with_last_dim(x.shape, in));  // names x when its last dim is not w's In
  check_shape(op, y_name, y, with_last_dim(x.shape, out));
  GemmDims d;
  d.m = with_last_dim(x.shape, 1).numel();  // N: the flattened leading dims
  d.n = out;
  d.k = in;
  return d;
}

template <typename T>
void linear_forward_typed(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias, GemmDims d) {
  // y (N, Out) = x (N, In) · w (Out, In)^T [+ bias]: with a bias, y starts as the bias rows and
  // the GEMM adds onto it (beta = 1), so there is no second pass over y.
  d.trans_b = true;
  double beta = 0.0;
  if (bias.defined()) {
    broadcast_rows(y.ptr<T>(), bias.ptr<T>(), d.m, d.n);
    beta = 1.0;
  }
  gemm("linear_forward", d, 1.0, x.ptr<T>(), w.ptr<T>(), beta, y.ptr<T>());
}

template <typename T>
void linear_backward_typed(const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dy,
                           const Tensor& x, const Tensor& w, const GemmDims& d) {
  const char* op = "linear_backward";
  int64_t n = d.m, in = d.k, out = d.n;
  if (dx.defined()) {
    // dx (N, In) = dy (N, Out) · w (Out, In)
    GemmDims g{n, in, out, false, false};
    gemm(op, g, 1.0, dy.ptr<T>(), w.ptr<T>(), 0.0, dx.ptr<T>());
  }
  // dw (Out, In) += dy^T (Out, N) · x (N, In)
  GemmDims g{out, in, n, true, false};
  gemm(op, g, 1.0, dy.ptr<T>(), x.ptr<T>(), 1.0, dw.ptr<T>());
  if (dbias.defined()) accumulate_column_sums(dbias.ptr<T>(), dy.ptr<T>(), n, out);
}

}  // namespace

void matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
            double beta) {
  const char* op = "matmul";
  check_operand(op, "c", c, c);
  check_float_dtype(op, c);
  check_operand(op, "a", a, c);
  check_operand(op, "b", b, c);
  check_ndim(op, "c", c, 2);
  check_ndim(op, "a", a, 2);
  check_ndim(op, "b", b, 2);
  GemmDims d{c.dim(0), c.dim(1), trans_a ? a.dim(0) : a.dim(1), trans_a, trans_b};
  check_shape(op, "a", a, trans_a ? Shape{d.k, d.m} : Shape{d.m, d.k});
  check_shape(op, "b", b, trans_b ? Shape{d.n, d.k} : Shape{d.k, d.n});
  if (c.dtype == DType::F64)
    gemm(op, d, alpha, a.ptr<double>(), b.ptr<double>(), beta, c.ptr<double>());
  else
    gemm(op, d, alpha, a.ptr<float>(), b.ptr<float>(), beta, c.ptr<float>());
}

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const char* op = "linear_forward";
  check_operand(op, "x", x, x);
  check_float_dtype(op, x);
  check_operand(op, "y", y, x);
  check_operand(op, "w", w, x);
  GemmDims d = linear_dims(op, "y", y, x, w);
  if (bias.defined()) {
    check_operand(op, "bias", bias, x);
    check_shape(op, "bias", bias, Shape{d.n});
  }
  if (x.dtype == DType::F64)
    linear_forward_typed<double>(y, x, w, bias, d);
  else
    linear_forward_typed<float>(y, x, w, bias, d);
}

void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& w) {
  const char* op = "linear_backward";
  check_operand(op, "x", x, x);
  check_float_dtype(op, x);
  check_operand(op, "dy", dy, x);
  check_operand(op, "w", w, x);
  check_operand(op, "dw", dw, x);
  GemmDims d = linear_dims(op, "dy", dy, x, w);
  check_shape(op, "dw", dw, w.shape);
  if (dx.defined()) {
    check_operand(op, "dx", dx, x);
    check_shape(op, "dx", dx, x.shape);
  }
  if (dbias.defined()) {
    check_operand(op, "dbias", dbias, x);
    check_shape(op, "dbias", dbias, Shape{d.n});
  }
  if (x.dtype == DType::F64)
    linear_backward_typed<double>(dx, dw, dbias, dy, x, w, d);
  else
    linear_backward_typed<float>(dx, dw, dbias, dy, x, w, d);
}

}  // namespace tessera
