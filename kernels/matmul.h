// Matrix multiplication: a general row-major GEMM and the Linear layer's forward/backward on top.
// F32 goes through the CPU BLAS (chosen by measurement, docs/performance.md); F64 through a plain
// triple-loop reference (the oracle for tests). Mixed precision: with F32 outputs, a GEMM operand
// (matmul's a or b, Linear's w) may be BF16, a bf16 copy; the GEMM then rounds its F32 operands
// to bf16 too and accumulates in fp32 (kernels/cpu/gemm_bf16.h), for every product of the call
// (Linear's backward: dx and dw). The gradients written stay F32.
#pragma once

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

// c (M, N) = alpha * op(a) · op(b) + beta * c, where op(a) is (M, K) and op(b) is (K, N);
// a is stored (M, K), or (K, M) when trans_a; b is stored (K, N), or (N, K) when trans_b.
void matmul(const Exec& ex, const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
            double alpha = 1.0, double beta = 0.0);

// y (N, Out) = x (N, In) · w (Out, In)^T + bias (Out). Leading dims of x and y are flattened into N,
// e.g. x (B, T, In) -> y (B, T, Out). bias may be an undefined Tensor (no bias).
void linear_forward(const Exec& ex, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias);

// dx (N, In) = dy (N, Out) · w (Out, In)            written; skipped when dx is undefined
// dw (Out, In) += dy^T · x                           accumulated (micro-batches, tied weights)
// dbias (Out) += sum over N of dy                    accumulated; skipped when undefined
void linear_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dy,
                     const Tensor& x, const Tensor& w);

}  // namespace tessera
