// The CUDA backend: one function per public launcher (kernels/<family>.h), called by the family's
// front (kernels/<family>.cpp) for tensors on a CUDA device, in a TESSERA_CUDA=ON build. Arguments
// are checked by the front, as for the CPU backend (kernels/cpu/cpu_ops.h); the backend checks
// what needs the data (ids in range) and its dtype (f32; the CPU's f64 reference path has no
// CUDA twin). Every op is queued on ex.stream and returns before it finishes. Plain C++
// declarations: the fronts include this without CUDA headers. Each family's kernels are
// kernels/cuda/<family>.cu. An op with no CUDA kernel is refused by its front
// (front::no_cuda_implementation): attention's document masking is the one left.
#pragma once

#include <cstdint>

#include "kernels/adamw.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "kernels/vocab_shard.h"

namespace tessera::cuda {

// exec.h: cudaStreamSynchronize(ex.stream).
void synchronize(const Exec& ex);

// matmul.h (cuBLASLt, fp32 compute)
void matmul(const Exec& ex, const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
            double beta);
void linear_forward(const Exec& ex, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias);
void linear_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dy,
                     const Tensor& x, const Tensor& w);

// The general cuBLASLt GEMM under matmul and Linear, with what the public API does not expose
// yet: bf16 inputs (a, b BF16; c F32 or BF16; fp32 accumulation) and the fused epilogues
// (bias (N) added to every row of c, GELU (tanh) applied last).
//   c (M, N) = epilogue(alpha op(a) op(b) + beta c [+ bias]), shapes as matmul's.
enum class GemmEpilogue { None, Bias, Gelu, GeluBias };
struct GemmArgs {
  Tensor c, a, b;
  bool trans_a = false, trans_b = false;
  double alpha = 1.0, beta = 0.0;
  Tensor bias;  // (N), c's dtype; defined exactly for Bias and GeluBias
  GemmEpilogue epilogue = GemmEpilogue::None;
};
void gemm(const char* op, const Exec& ex, const GemmArgs& g);

// layernorm.h, rmsnorm.h
void layernorm_forward(const Exec& ex, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                       const Tensor& w, const Tensor& b, double eps);
void layernorm_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                        const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd);
void rmsnorm_forward(const Exec& ex, const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, double eps);
void rmsnorm_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd);

// gelu.h, swiglu.h, rope.h
void gelu_forward(const Exec& ex, const Tensor& y, const Tensor& x);
void gelu_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(const Exec& ex, const Tensor& y, const Tensor& gate, const Tensor& up);
void swiglu_backward(const Exec& ex, const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                     const Tensor& up);
void rope_forward(const Exec& ex, const Tensor& y, const Tensor& x, int64_t pos_offset, double theta);
void rope_backward(const Exec& ex, const Tensor& dx, const Tensor& dy, int64_t pos_offset, double theta);

// embedding.h: token ids are checked here (one wait for the check's result).
void embedding_forward(const Exec& ex, const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, const VocabShard& shard);
void embedding_backward(const Exec& ex, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, int64_t pos_offset, const VocabShard& shard);

// cross_entropy.h: target ids are checked here, as token ids above.
void cross_entropy_forward(const Exec& ex, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                           const Tensor& targets);
void cross_entropy_backward(const Exec& ex, const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                            const Tensor& targets, double loss_scale, const VocabShard& shard);
void cross_entropy_shard_forward(const Exec& ex, const Tensor& lse_part, const Tensor& target_logit,
                                 const Tensor& logits, const Tensor& targets, const VocabShard& shard);
void cross_entropy_combine(const Exec& ex, const Tensor& losses, const Tensor& lse, const Tensor& lse_parts,
                           const Tensor& target_logit, const Tensor& targets);

// elementwise.h (residual_backward is two accumulates, composed in the front)
void fill_zero(const Exec& ex, const Tensor& t);                  // cudaMemsetAsync
void copy(const Exec& ex, const Tensor& dst, const Tensor& src);  // cudaMemcpyAsync, any direction
void convert(const Exec& ex, const Tensor& dst, const Tensor& src);  // F32 -> BF16, nearest even
void copy_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0);   // cudaMemcpy2DAsync
void paste_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0);  // cudaMemcpy2DAsync
void residual_forward(const Exec& ex, const Tensor& y, const Tensor& a, const Tensor& b);
void accumulate(const Exec& ex, const Tensor& dst, const Tensor& src);
void scale(const Exec& ex, const Tensor& t, double s);
// Deterministic reductions into one F64 element (fixed grid for a size, partials in double).
void sum(const Exec& ex, const Tensor& out, const Tensor& t);
void count_not_equal(const Exec& ex, const Tensor& out, const Tensor& ids, int32_t value);
void squared_norm(const Exec& ex, const Tensor& out, const Tensor& t);  // the global gradient norm's square

// adamw.h (fp32 master weights, gradients and moments)
void adamw_update(const Exec& ex, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const AdamWStep& s, const Tensor& compute);

// attention.h (kernels/cuda/attention.cu): F32 (simple, exact exp) or BF16 (tensor cores, lse F32,
// the backward's dq, dk, dv F32 accumulators, head dims 64 and 128, 16-byte aligned tensors); the
// launch limits in kernels/cuda/attention_limits.h. attention_merge: F32, the CPU's formula in double.
void attention_forward(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, int64_t q_offset, int64_t k_offset);
void attention_backward(const Exec& ex, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        int64_t q_offset, int64_t k_offset);
void attention_merge(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse);

}  // namespace tessera::cuda
