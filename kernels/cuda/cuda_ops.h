// The CUDA backend: the launchers kernels/cuda/ implements so far, called by the fronts
// (kernels/<family>.cpp) for tensors on a CUDA device, in a TESSERA_CUDA=ON build. Arguments are
// checked by the front, as for the CPU backend (kernels/cpu/cpu_ops.h); every op is queued on
// ex.stream. Plain C++ declarations: the fronts include this without CUDA headers. The op kernels
// (one kernels/cuda/<family>.cu per family) arrive with the CUDA issue.
#pragma once

#include <cstdint>

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera::cuda {

// exec.h: cudaStreamSynchronize(ex.stream).
void synchronize(const Exec& ex);

// elementwise.h
void fill_zero(const Exec& ex, const Tensor& t);                  // cudaMemsetAsync
void copy(const Exec& ex, const Tensor& dst, const Tensor& src);  // cudaMemcpyAsync, any direction

// attention.h (kernels/cuda/attention.cu): F32 (simple, exact exp) or BF16 (tensor cores, lse F32,
// head dims 64 and 128, 16-byte aligned tensors).
void attention_forward(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, int64_t q_offset, int64_t k_offset);
void attention_backward(const Exec& ex, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        int64_t q_offset, int64_t k_offset);

}  // namespace tessera::cuda
