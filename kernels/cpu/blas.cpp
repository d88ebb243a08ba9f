// cblas_sgemm behind tessera::cpu::sgemm, with the checks BLAS itself does not make.
#include "kernels/cpu/blas.h"

#include <cblas.h>

#include <algorithm>
#include <climits>

#include "kernels/check.h"

namespace tessera::cpu {
namespace {
int blas_int(const char* op, int64_t v) {
  TESSERA_CHECK(v <= INT_MAX, op, ": dimension ", v, " exceeds the BLAS integer range");
  return static_cast<int>(v);
}
}  // namespace

void sgemm(const char* op, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // BLAS requires leading dimensions >= 1 even for empty operands.
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              blas_int(op, m), blas_int(op, n), blas_int(op, k), alpha, a, blas_int(op, std::max<int64_t>(1, lda)), b,
              blas_int(op, std::max<int64_t>(1, ldb)), beta, c, blas_int(op, std::max<int64_t>(1, ldc)));
}

}  // namespace tessera::cpu
