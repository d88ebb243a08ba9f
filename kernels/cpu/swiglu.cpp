// CPU SwiGLU, y = silu(gate) * up: a double reference and an OpenMP SIMD float path sharing one
// scalar formula (float with the vectorizable exp); each element is read before it is written.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd_math.h"

namespace tessera {
namespace {

// e^x: exact library exp for the double reference, the vectorizable polynomial for float.
inline double exp_of(double x) { return std::exp(x); }
inline float exp_of(float x) { return cpu::exp_polynomial(x); }

// 1 / (1 + e^-g): for g -> -inf, e^-g -> inf and the result -> 0 without NaN.
template <typename T>
inline T sigmoid(T g) {
  return T(1) / (T(1) + exp_of(-g));
}

// d silu(g) / dg = sig (1 + g (1 - sig)).
template <typename T>
inline void swiglu_grad(T dy, T g, T u, T& dgate, T& dup) {
  T sig = sigmoid(g);
  dup = dy * g * sig;
  dgate = dy * u * sig * (T(1) + g * (T(1) - sig));
}

namespace reference {
template <typename T>
void forward(T* y, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
}
template <typename T>
void backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) swiglu_grad(dy[i], gate[i], up[i], dgate[i], dup[i]);
}
}  // namespace reference

namespace simd {
void forward(float* y, const float* gate, const float* up, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
}
void backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float dg, du;
    swiglu_grad(dy[i], gate[i], up[i], dg, du);
    dgate[i] = dg;
    dup[i] = du;
  }
}
}  // namespace simd

}  // namespace

void cpu::swiglu_forward(const Exec&, const Tensor& y, const Tensor& gate, const Tensor& up) {
  if (gate.dtype == DType::F64)
    reference::forward(y.ptr<double>(), gate.ptr<double>(), up.ptr<double>(), gate.numel());
  else
    simd::forward(y.ptr<float>(), gate.ptr<float>(), up.ptr<float>(), gate.numel());
}

void cpu::swiglu_backward(const Exec&, const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                          const Tensor& up) {
  if (gate.dtype == DType::F64)
    reference::backward(dgate.ptr<double>(), dup.ptr<double>(), dy.ptr<double>(), gate.ptr<double>(), up.ptr<double>(),
                        gate.numel());
  else
    simd::backward(dgate.ptr<float>(), dup.ptr<float>(), dy.ptr<float>(), gate.ptr<float>(), up.ptr<float>(),
                   gate.numel());
}

}  // namespace tessera
