// Embedding's front: the argument checks, then the backend of the tensors' device (kernels/front.h).
// The token ids themselves are checked by the backend, which reads them.
#include "kernels/embedding.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {
namespace {

// tokens (B, T) I32.
void check_tokens(const char* op, const Tensor& tokens) {
  front::check_defined(op, "tokens", tokens);
  check_dtype(op, "tokens", tokens, DType::I32);
  TESSERA_CHECK(tokens.ndim() == 2, op, ": tokens must be (B, T), got ", tokens.shape.str());
}

// Positions pos_offset .. pos_offset + T - 1 must lie in [0, P).
void check_positions(const char* op, int64_t pos_offset, int64_t T, int64_t P) {
  TESSERA_CHECK(pos_offset >= 0, op, ": pos_offset ", pos_offset, " is negative");
  TESSERA_CHECK(T == 0 || pos_offset + T <= P, op, ": position ", pos_offset + T - 1, " (pos_offset ", pos_offset,
                " + T ", T, " - 1) is at or beyond the ", P, " positions of wpe");
}

// table (rows, C) 2-D of dtype dt; returns rows.
int64_t check_table(const char* op, const char* arg, const Tensor& table, DType dt, int64_t C) {
  front::check_float(op, arg, table);
  check_dtype(op, arg, table, dt);
  TESSERA_CHECK(table.ndim() == 2 && table.dim(1) == C, op, ": ", arg, " has shape ", table.shape.str(),
                ", expected (rows, ", C, ")");
  return table.dim(0);
}

// Validates the arguments of one call. wte is (V, C) forward, dwte backward; act is out or dout.
void check_args(const char* op, const Tensor& act, const char* act_name, const Tensor& tokens, const Tensor& wte,
                const char* wte_name, const Tensor& wpe, const char* wpe_name, int64_t pos_offset,
                const VocabShard& shard) {
  front::check_float(op, wte_name, wte);
  TESSERA_CHECK(wte.ndim() == 2, op, ": ", wte_name, " must be (V, C), got ", wte.shape.str());
  const VocabShard s = shard.resolved(wte.dim(0));
  TESSERA_CHECK(s.start >= 0 && s.valid >= 0 && s.valid <= wte.dim(0) && s.start + s.valid <= s.vocab, op,
                ": vocabulary shard [", s.start, ", ", s.start + s.valid, ") of ", s.vocab, " ids does not fit ",
                wte_name, " ", wte.shape.str());
  check_tokens(op, tokens);
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = wte.dim(1);
  front::check_defined(op, act_name, act);
  check_dtype(op, act_name, act, wte.dtype);
  check_shape(op, act_name, act, Shape{B, T, C});
  if (wpe.defined()) check_positions(op, pos_offset, T, check_table(op, wpe_name, wpe, wte.dtype, C));
}

}  // namespace

void embedding_forward(const Exec& ex, const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, const VocabShard& shard) {
  const char* op = "embedding_forward";
  const Device d = front::device_of(op, ex, {{"out", out}, {"tokens", tokens}, {"wte", wte}, {"wpe", wpe}});
  check_args(op, out, "out", tokens, wte, "wte", wpe, "wpe", pos_offset, shard);
  if (d.is_cpu()) return cpu::embedding_forward(ex, out, tokens, wte, wpe, pos_offset, shard);
  TESSERA_CUDA_CALL(op, cuda::embedding_forward(ex, out, tokens, wte, wpe, pos_offset, shard));
}

void embedding_backward(const Exec& ex, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, int64_t pos_offset, const VocabShard& shard) {
  const char* op = "embedding_backward";
  const Device d = front::device_of(op, ex, {{"dwte", dwte}, {"dwpe", dwpe}, {"dout", dout}, {"tokens", tokens}});
  check_args(op, dout, "dout", tokens, dwte, "dwte", dwpe, "dwpe", pos_offset, shard);
  if (d.is_cpu()) return cpu::embedding_backward(ex, dwte, dwpe, dout, tokens, pos_offset, shard);
  TESSERA_CUDA_CALL(op, cuda::embedding_backward(ex, dwte, dwpe, dout, tokens, pos_offset, shard));
}

}  // namespace tessera
