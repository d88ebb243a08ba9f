// CPU merge of two key blocks' attention results by their log-sum-exp (kernels/attention.h): one
// templated loop for F32 and F64, computed in double per row (a row's weights are two exps).
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/cpu_ops.h"

namespace tessera {
namespace {

template <typename T>
void merge(const Tensor& out, const Tensor& lse, const Tensor& block_out, const Tensor& block_lse) {
  const int64_t B = out.dim(0), Tn = out.dim(1), H = out.dim(2), D = out.dim(3);
  T* po = out.ptr<T>();
  T* pl = lse.ptr<T>();
  const T* pbo = block_out.ptr<T>();
  const T* pbl = block_lse.ptr<T>();
  const double neg_inf = -std::numeric_limits<double>::infinity();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tn; ++t) {
        const int64_t l = (b * H + h) * Tn + t;  // (B, H, T)
        const double a = pl[l], c = pbl[l];
        if (c == neg_inf) continue;  // the block saw no key: nothing changes
        const double m = std::max(a, c);
        const double merged = m + std::log(std::exp(a - m) + std::exp(c - m));
        const double wa = std::exp(a - merged), wc = std::exp(c - merged);  // wa = 0 when a = -inf
        T* o = po + ((b * Tn + t) * H + h) * D;
        const T* bo = pbo + ((b * Tn + t) * H + h) * D;
        for (int64_t i = 0; i < D; ++i) o[i] = static_cast<T>(wa * o[i] + wc * bo[i]);
        pl[l] = static_cast<T>(merged);
      }
}

}  // namespace

void cpu::attention_merge(const Exec&, const Tensor& out, const Tensor& lse, const Tensor& block_out,
                          const Tensor& block_lse) {
  if (out.dtype == DType::F64)
    merge<double>(out, lse, block_out, block_lse);
  else
    merge<float>(out, lse, block_out, block_lse);
}

}  // namespace tessera
