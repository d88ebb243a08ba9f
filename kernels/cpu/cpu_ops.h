// The CPU backend: one function per public launcher (kernels/<family>.h), called by the family's
// front (kernels/<family>.cpp) after it checked the arguments and found the tensors on the CPU.
// Arguments mean what they mean in the public header; shapes, dtypes and devices are valid.
// Each family's implementation is kernels/cpu/<family>.cpp: a double reference (F64, the test
// oracle) and a float path (F32: OpenMP + SIMD, or the BLAS). Internal to kernels/.
#pragma once

#include <cstdint>

#include "kernels/adamw.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"
#include "kernels/vocab_shard.h"

namespace tessera::cpu {

// matmul.h
void matmul(const Exec& ex, const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
            double beta);
void linear_forward(const Exec& ex, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias);
void linear_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dy,
                     const Tensor& x, const Tensor& w);

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

// attention.h
void attention_forward(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, int64_t q_offset, int64_t k_offset, const Tensor& doc_start);
void attention_backward(const Exec& ex, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        int64_t q_offset, int64_t k_offset, const Tensor& doc_start);
void attention_merge(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse);

// embedding.h: token ids are checked here (reading them is the backend's job).
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
void fill_zero(const Exec& ex, const Tensor& t);
void copy(const Exec& ex, const Tensor& dst, const Tensor& src);
void convert(const Exec& ex, const Tensor& dst, const Tensor& src);
void copy_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0);
void paste_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0);
void residual_forward(const Exec& ex, const Tensor& y, const Tensor& a, const Tensor& b);
void accumulate(const Exec& ex, const Tensor& dst, const Tensor& src);
void scale(const Exec& ex, const Tensor& t, double s);
void sum(const Exec& ex, const Tensor& out, const Tensor& t);
void count_not_equal(const Exec& ex, const Tensor& out, const Tensor& ids, int32_t value);
void squared_norm(const Exec& ex, const Tensor& out, const Tensor& t);

// adamw.h
void adamw_update(const Exec& ex, const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                  const AdamWStep& s, const Tensor& compute);

}  // namespace tessera::cpu
