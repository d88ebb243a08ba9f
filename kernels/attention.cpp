// Attention's front: the argument checks, then the backend of the tensors' device (kernels/front.h).
#include "kernels/attention.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {
namespace {

// Checks shapes and dtypes of the forward's operands (shared by the backward). BF16 runs on CUDA
// only, with an F32 lse; F32 and F64 everywhere (the CUDA backend refuses F64).
void check_forward_args(const char* op, const Device& d, const Tensor& out, const Tensor& lse, const Tensor& q,
                        const Tensor& k, const Tensor& v) {
  for (const Tensor* t : {&out, &q, &k, &v}) check_same_dtype(op, *t, q);
  TESSERA_CHECK(q.dtype == DType::F32 || q.dtype == DType::F64 || q.dtype == DType::BF16, op, ": unsupported dtype ",
                dtype_name(q.dtype));
  TESSERA_CHECK(q.dtype != DType::BF16 || !d.is_cpu(), op,
                ": bf16 attention runs on CUDA only (the CPU computes in f32 or f64)");
  check_dtype(op, "lse", lse, q.dtype == DType::BF16 ? DType::F32 : q.dtype);
  TESSERA_CHECK(q.ndim() == 4, op, ": q must be (B, T, H, D), got ", q.shape.str());
  TESSERA_CHECK(k.ndim() == 4, op, ": k must be (B, S, KV, D), got ", k.shape.str());
  const int64_t B = q.dim(0), T = q.dim(1), S = k.dim(1), H = q.dim(2), KV = k.dim(2), D = q.dim(3);
  TESSERA_CHECK(D > 0, op, ": head dim D must be positive");
  TESSERA_CHECK(KV > 0 && H % KV == 0, op, ": query heads ", H, " not a multiple of kv heads ", KV);
  check_shape(op, "k", k, Shape{B, S, KV, D});
  check_shape(op, "v", v, k.shape);
  check_shape(op, "out", out, q.shape);
  check_shape(op, "lse", lse, Shape{B, H, T});
}

// doc_start (B, T) I32 of the queries (kernels/attention.h), or undefined; CPU only: the CUDA
// kernels have no document mask.
void check_doc_start(const char* op, const Device& d, const Tensor& doc_start, const Tensor& q) {
  if (!doc_start.defined()) return;
  TESSERA_CHECK(d.is_cpu(), op, ": document masking (data.document_mask) has no CUDA kernel; it runs on the CPU");
  TESSERA_CHECK(doc_start.device.is_cpu(), op, ": doc_start must be on the CPU with the other operands");
  check_dtype(op, "doc_start", doc_start, DType::I32);
  check_shape(op, "doc_start", doc_start, Shape{q.dim(0), q.dim(1)});
}

}  // namespace

void attention_forward(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, int64_t q_offset, int64_t k_offset, const Tensor& doc_start) {
  const char* op = "attention_forward";
  const Device d = front::device_of(op, ex, {{"out", out}, {"lse", lse}, {"q", q}, {"k", k}, {"v", v}});
  check_forward_args(op, d, out, lse, q, k, v);
  check_doc_start(op, d, doc_start, q);
  if (d.is_cpu()) return cpu::attention_forward(ex, out, lse, q, k, v, q_offset, k_offset, doc_start);
  TESSERA_CUDA_CALL(op, cuda::attention_forward(ex, out, lse, q, k, v, q_offset, k_offset));
}

void attention_backward(const Exec& ex, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        int64_t q_offset, int64_t k_offset, const Tensor& doc_start) {
  const char* op = "attention_backward";
  const Device d = front::device_of(
      op, ex,
      {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dout", dout}, {"q", q}, {"k", k}, {"v", v}, {"out", out}, {"lse", lse}});
  check_forward_args(op, d, out, lse, q, k, v);
  check_same_dtype(op, dout, q);
  // BF16: dq, dk, dv are F32 accumulators (repeated calls round in f32, not bf16); else q's dtype.
  const DType grad = q.dtype == DType::BF16 ? DType::F32 : q.dtype;
  check_dtype(op, "dq", dq, grad);
  check_dtype(op, "dk", dk, grad);
  check_dtype(op, "dv", dv, grad);
  check_shape(op, "dq", dq, q.shape);
  check_shape(op, "dout", dout, q.shape);
  check_shape(op, "dk", dk, k.shape);
  check_shape(op, "dv", dv, k.shape);
  check_doc_start(op, d, doc_start, q);
  if (d.is_cpu())
    return cpu::attention_backward(ex, dq, dk, dv, dout, q, k, v, out, lse, q_offset, k_offset, doc_start);
  TESSERA_CUDA_CALL(op, cuda::attention_backward(ex, dq, dk, dv, dout, q, k, v, out, lse, q_offset, k_offset));
}

void attention_merge(const Exec& ex, const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse) {
  const char* op = "attention_merge";
  const Device d = front::device_of(op, ex, {{"out", out}, {"lse", lse}, {"block_out", block_out}, {"block_lse", block_lse}});
  for (const Tensor* t : {&lse, &block_out, &block_lse}) check_same_dtype(op, *t, out);
  TESSERA_CHECK(out.dtype == DType::F32 || out.dtype == DType::F64, op, ": unsupported dtype ", dtype_name(out.dtype));
  TESSERA_CHECK(out.ndim() == 4, op, ": out must be (B, T, H, D), got ", out.shape.str());
  check_shape(op, "block_out", block_out, out.shape);
  check_shape(op, "lse", lse, Shape{out.dim(0), out.dim(2), out.dim(1)});
  check_shape(op, "block_lse", block_lse, lse.shape);
  if (d.is_cpu()) return cpu::attention_merge(ex, out, lse, block_out, block_lse);
  TESSERA_CUDA_CALL(op, cuda::attention_merge(ex, out, lse, block_out, block_lse));
}

}  // namespace tessera
