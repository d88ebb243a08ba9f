// CPU AdamW (PyTorch's formula): a templated reference for F64 and an OpenMP SIMD float path.
// Both take the step's scalars (bias corrections, decay factor) computed once in double.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_bf16.h"

namespace tessera {
namespace {

// Per-step scalars, derived once from AdamWStep in double and cast to the element type.
template <typename T>
struct AdamWScalars {
  T decay;         // 1 - lr * weight_decay
  T beta1, one_minus_beta1;
  T beta2, one_minus_beta2;
  T step_size;     // lr / (1 - beta1^step)
  T inv_bc2_sqrt;  // 1 / sqrt(1 - beta2^step)
  T eps;
  T grad_scale;

  explicit AdamWScalars(const AdamWStep& s) {
    double t = static_cast<double>(s.step);
    decay = static_cast<T>(1.0 - s.lr * s.weight_decay);
    beta1 = static_cast<T>(s.beta1);
    one_minus_beta1 = static_cast<T>(1.0 - s.beta1);
    beta2 = static_cast<T>(s.beta2);
    one_minus_beta2 = static_cast<T>(1.0 - s.beta2);
    step_size = static_cast<T>(s.lr / (1.0 - std::pow(s.beta1, t)));
    inv_bc2_sqrt = static_cast<T>(1.0 / std::sqrt(1.0 - std::pow(s.beta2, t)));
    eps = static_cast<T>(s.eps);
    grad_scale = static_cast<T>(s.grad_scale);
  }
};

// One element's update, shared by both paths.
template <typename T>
inline void adamw_element(T& p, T grad, T& m, T& v, const AdamWScalars<T>& k) {
  T g = k.grad_scale * grad;
  p *= k.decay;
  m = k.beta1 * m + k.one_minus_beta1 * g;
  v = k.beta2 * v + k.one_minus_beta2 * g * g;
  p -= k.step_size * m / (std::sqrt(v) * k.inv_bc2_sqrt + k.eps);
}

namespace reference {
template <typename T>
void update(T* p, const T* g, T* m, T* v, int64_t n, const AdamWScalars<T>& k) {
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], g[i], m[i], v[i], k);
}
}  // namespace reference

namespace simd {
void update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars<float>& k) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], g[i], m[i], v[i], k);
}

// The update, and the updated param rounded into the bf16 copy c in the same vectorized loop (the
// rounding is branch-free): one pass over the state, as fast as the update alone (memory-bound).
void update_and_round(float* p, const float* g, float* m, float* v, uint16_t* c, int64_t n,
                      const AdamWScalars<float>& k) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    adamw_element(p[i], g[i], m[i], v[i], k);
    c[i] = cpu::f32_to_bf16(p[i]);
  }
}
}  // namespace simd

}  // namespace

void cpu::adamw_update(const Exec&, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                       const AdamWStep& s, const Tensor& compute) {
  if (compute.defined())
    simd::update_and_round(params.ptr<float>(), grads.ptr<float>(), m.ptr<float>(), v.ptr<float>(),
                           static_cast<uint16_t*>(compute.data), params.numel(), AdamWScalars<float>(s));
  else if (params.dtype == DType::F64)
    reference::update(params.ptr<double>(), grads.ptr<double>(), m.ptr<double>(), v.ptr<double>(), params.numel(),
                      AdamWScalars<double>(s));
  else
    simd::update(params.ptr<float>(), grads.ptr<float>(), m.ptr<float>(), v.ptr<float>(), params.numel(),
                 AdamWScalars<float>(s));
}

}  // namespace tessera
