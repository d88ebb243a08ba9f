// What the op fronts (kernels/<family>.cpp) share, internal to kernels/: the argument checks, each
// message naming the op and the argument, and the dispatch to a backend by the tensors' device.
// A front checks shapes, dtypes and devices once; the backends (kernels/cpu/, kernels/cuda/)
// assume valid arguments and check only what needs the data itself (ids in range).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera::front {

// ---- Dispatch ----

// One argument of a call, named as in the op's header.
struct Arg {
  const char* name;
  const Tensor& t;
};

// The device a call runs on: that of its defined tensors (undefined ones, such as an absent bias,
// are skipped), which must all be the same and must be ex's. The error names the op and the
// first argument on another device.
Device device_of(const char* op, const Exec& ex, std::initializer_list<Arg> args);

// The error of an op on a CUDA tensor when no CUDA implementation is linked: the op has none yet,
// or this build has no CUDA backend (TESSERA_CUDA=OFF).
[[noreturn]] void no_cuda_implementation(const char* op);

// ---- Checks ----

// t is a defined tensor.
inline void check_defined(const char* op, const char* arg, const Tensor& t) {
  TESSERA_CHECK(t.defined(), op, ": ", arg, " is undefined");
}

// t is F32 or F64: the dtypes with a float path and a double reference.
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

}  // namespace tessera::front

// The CUDA branch of a front: `call` (a function of kernels/cuda/cuda_ops.h) in a CUDA build, the
// no-implementation error otherwise. Fronts of ops without a CUDA kernel call
// front::no_cuda_implementation directly; the CUDA issue turns those into this.
#ifdef TESSERA_WITH_CUDA
#define TESSERA_CUDA_CALL(op, call) call
#else
#define TESSERA_CUDA_CALL(op, call) ::tessera::front::no_cuda_implementation(op)
#endif
