// CPU matmul and Linear: F64 runs a plain triple-loop reference (the test oracle), F32 calls
// the CPU BLAS (kernels/cpu/blas.h), a BF16 operand the bf16 GEMM (kernels/cpu/gemm_bf16.h). The Linear layer is written once over a typed gemm() for both.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/allocator.h"
#include "kernels/cpu/gemm_bf16.h"

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

// Linear's GEMM sizes from checked shapes: x (N.., In), w (Out, In); m = N, n = Out, k = In.
GemmDims linear_dims(const Tensor& x, const Tensor& w) {
  GemmDims d;
  d.n = w.dim(0);
  d.k = w.dim(1);
  Shape rows = x.shape;
  rows[-1] = 1;
  d.m = rows.numel();  // N: the flattened leading dims
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

// Mixed precision (w is a bf16 copy): the same products through the bf16 GEMM, fp32 outputs.
namespace mixed {
cpu::GemmOperand operand(const Tensor& t, int64_t ld, bool trans) { return {t.data, t.dtype, ld, trans}; }

void gemm(const Exec& ex, const char* op, const GemmDims& d, double alpha, const Tensor& a, const Tensor& b,
          double beta, float* c) {
  cpu::gemm_bf16(op, d.m, d.n, d.k, static_cast<float>(alpha), operand(a, d.trans_a ? d.m : d.k, d.trans_a),
                 operand(b, d.trans_b ? d.k : d.n, d.trans_b), static_cast<float>(beta), c, d.n,
                 cpu::Bf16Kernel::Auto, ex.workspace);
}

void linear_forward(const Exec& ex, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias, GemmDims d) {
  d.trans_b = true;
  double beta = 0.0;
  if (bias.defined()) {
    broadcast_rows(y.ptr<float>(), bias.ptr<float>(), d.m, d.n);
    beta = 1.0;
  }
  gemm(ex, "linear_forward", d, 1.0, x, w, beta, y.ptr<float>());
}

void linear_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                     const Tensor& w, const GemmDims& d) {
  const char* op = "linear_backward";
  const int64_t n = d.m, in = d.k, out = d.n;
  // dy feeds both GEMMs: rounded to bf16 once (the LM head's is N x V), not once per GEMM.
  const Scratch dy_bf16(ex.workspace, static_cast<size_t>(dy.numel()) * sizeof(uint16_t));
  cpu::f32_to_bf16(dy_bf16.as<uint16_t>(), dy.ptr<float>(), dy.numel());
  const Tensor dyh(dy_bf16.as<uint16_t>(), DType::BF16, dy.shape, dy.device);
  if (dx.defined()) gemm(ex, op, GemmDims{n, in, out, false, false}, 1.0, dyh, w, 0.0, dx.ptr<float>());
  gemm(ex, op, GemmDims{out, in, n, true, false}, 1.0, dyh, x, 1.0, dw.ptr<float>());
  if (dbias.defined()) accumulate_column_sums(dbias.ptr<float>(), dy.ptr<float>(), n, out);
}
}  // namespace mixed

}  // namespace

void cpu::matmul(const Exec& ex, const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                 double alpha, double beta) {
  const char* op = "matmul";
  const GemmDims d{c.dim(0), c.dim(1), trans_a ? a.dim(0) : a.dim(1), trans_a, trans_b};
  if (a.dtype == DType::BF16 || b.dtype == DType::BF16)
    mixed::gemm(ex, op, d, alpha, a, b, beta, c.ptr<float>());
  else if (c.dtype == DType::F64)
    gemm(op, d, alpha, a.ptr<double>(), b.ptr<double>(), beta, c.ptr<double>());
  else
    gemm(op, d, alpha, a.ptr<float>(), b.ptr<float>(), beta, c.ptr<float>());
}

void cpu::linear_forward(const Exec& ex, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const GemmDims d = linear_dims(x, w);
  if (w.dtype == DType::BF16)
    mixed::linear_forward(ex, y, x, w, bias, d);
  else if (x.dtype == DType::F64)
    linear_forward_typed<double>(y, x, w, bias, d);
  else
    linear_forward_typed<float>(y, x, w, bias, d);
}

void cpu::linear_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dy,
                          const Tensor& x, const Tensor& w) {
  const GemmDims d = linear_dims(x, w);
  if (w.dtype == DType::BF16)
    mixed::linear_backward(ex, dx, dw, dbias, dy, x, w, d);
  else if (x.dtype == DType::F64)
    linear_backward_typed<double>(dx, dw, dbias, dy, x, w, d);
  else
    linear_backward_typed<float>(dx, dw, dbias, dy, x, w, d);
}

}  // namespace tessera
