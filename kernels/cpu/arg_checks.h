// Argument checks shared by the CPU op launchers of kernels-b's families (norms, swiglu, embedding,
// cross-entropy); header-only, on top of tensor.h's checks, each message naming the op and argument.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace tessera::cpu {

// t is a defined CPU tensor.
inline void check_defined(const char* op, const char* arg, const Tensor& t) {
  TESSERA_CHECK(t.defined(), op, ": ", arg, " is undefined");
  check_cpu(op, t);
}

// t is F32 or F64: the dtypes with a CPU path (float) and a reference (double).
inline void check_float(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  TESSERA_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, op, ": ", arg, " has unsupported dtype ",
                dtype_name(t.dtype), " (f32 or f64)");
}

// t has dtype dt and n elements, any shape (leading dims flatten, e.g. (B, T) for (N)).
inline void check_numel(const char* op, const char* arg, const Tensor& t, DType dt, int64_t n) {
  check_defined(op, arg, t);
  check_dtype(op, arg, t, dt);
  TESSERA_CHECK(t.numel() == n, op, ": ", arg, " has shape ", t.shape.str(), ", expected ", n, " elements");
}

// t has exactly like's shape and dtype.
inline void check_like(const char* op, const char* arg, const Tensor& t, const Tensor& like) {
  check_numel(op, arg, t, like.dtype, like.numel());
  check_shape(op, arg, t, like.shape);
}

// t is a (C) vector of dtype dt.
inline void check_vector(const char* op, const char* arg, const Tensor& t, DType dt, int64_t C) {
  check_numel(op, arg, t, dt, C);
  check_shape(op, arg, t, Shape{C});
}

// x is a non-empty float (N, C) tensor (leading dims flatten into N); returns C.
inline int64_t check_rows(const char* op, const char* arg, const Tensor& x) {
  check_float(op, arg, x);
  TESSERA_CHECK(x.ndim() >= 1 && x.dim(-1) > 0, op, ": ", arg, " must be (N, C) with C > 0, got ", x.str());
  return x.dim(-1);
}

// A norm's input x (N, C) and weight w (C); returns C. Every other tensor is checked against these.
inline int64_t check_norm_input(const char* op, const Tensor& x, const Tensor& w) {
  int64_t C = check_rows(op, "x", x);
  check_vector(op, "w", w, x.dtype, C);
  return C;
}

}  // namespace tessera::cpu
