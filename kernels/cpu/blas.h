// The one place tessera calls the CPU BLAS (cblas_sgemm): matmul/linear and the attention tiles
// both go through it. Row-major with explicit leading dimensions, so a caller can multiply a head's
// rows of a (B, T, H, D) tensor in place, and transposes cost no copies.
#pragma once

#include <cstdint>

namespace tessera::cpu {

// C (m, n) = alpha op(A) op(B) + beta C; op(A) is (m, k), op(B) is (k, n); lda, ldb, ldc are the
// row strides of A, B and C as stored. beta == 0 does not read C. `op` names the caller in the
// error raised when a dimension exceeds the BLAS integer range. From inside an active OpenMP
// parallel region the (OpenMP-built) BLAS runs on the calling thread.
void sgemm(const char* op, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace tessera::cpu
