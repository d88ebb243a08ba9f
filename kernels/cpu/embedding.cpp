// CPU token + position embedding: a double reference and a float path whose backward splits the
// channels (not the rows) over threads, so the scatter-add into dwte is deterministic without atomics.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"

namespace tessera {
namespace {

// Columns per task in the backward scatter: a task owns its columns, so no two threads write one.
constexpr int64_t kColBlock = 64;

// Sizes of one call: B batch, T sequence, C channels; V vocab and P positions (0 without wpe);
// the table holds ids [start, start + held) (the whole vocabulary unless vocabulary-parallel).
struct Dims {
  int64_t B, T, C, V, P;
  int64_t start = 0, held = 0;
  // The table row of a token id, or -1 when another rank holds it.
  int64_t row(int32_t id) const {
    const int64_t r = id - start;
    return r >= 0 && r < held ? r : -1;
  }
};

namespace reference {
template <typename T>
void forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t pos_offset, Dims d) {
  for (int64_t bt = 0; bt < d.B * d.T; ++bt) {
    const int64_t r = d.row(tokens[bt]);
    const T* e = r >= 0 ? wte + r * d.C : nullptr;                     // (C)
    const T* p = wpe ? wpe + (pos_offset + bt % d.T) * d.C : nullptr;  // (C)
    T* o = out + bt * d.C;                                             // (C)
    for (int64_t c = 0; c < d.C; ++c) o[c] = (e ? e[c] : T(0)) + (p ? p[c] : T(0));
  }
}
template <typename T>
void backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t pos_offset, Dims d) {
  for (int64_t bt = 0; bt < d.B * d.T; ++bt) {
    const T* g = dout + bt * d.C;  // (C)
    const int64_t r = d.row(tokens[bt]);
    if (r >= 0)
      for (int64_t c = 0; c < d.C; ++c) dwte[r * d.C + c] += g[c];
    if (!dwpe) continue;
    T* p = dwpe + (pos_offset + bt % d.T) * d.C;
    for (int64_t c = 0; c < d.C; ++c) p[c] += g[c];
  }
}
}  // namespace reference

namespace simd {
void forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t pos_offset, Dims d) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < d.B * d.T; ++bt) {
    const int64_t r = d.row(tokens[bt]);
    float* o = out + bt * d.C;  // (C)
    if (r < 0) {  // held by another rank: the position part only
      const float* p = wpe ? wpe + (pos_offset + bt % d.T) * d.C : nullptr;
#pragma omp simd
      for (int64_t c = 0; c < d.C; ++c) o[c] = p ? p[c] : 0.0f;
      continue;
    }
    const float* e = wte + r * d.C;  // (C)
    if (wpe) {
      const float* p = wpe + (pos_offset + bt % d.T) * d.C;
#pragma omp simd
      for (int64_t c = 0; c < d.C; ++c) o[c] = e[c] + p[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < d.C; ++c) o[c] = e[c];
    }
  }
}

// dwte[tokens[bt], c] += dout[bt, c]: column blocks in parallel, rows in order within each.
void token_grad(float* dwte, const float* dout, const int32_t* tokens, Dims d) {
  int64_t blocks = (d.C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    int64_t c0 = blk * kColBlock, nc = std::min(kColBlock, d.C - c0);
    for (int64_t bt = 0; bt < d.B * d.T; ++bt) {
      const int64_t r = d.row(tokens[bt]);
      if (r < 0) continue;
      const float* g = dout + bt * d.C + c0;
      float* e = dwte + r * d.C + c0;
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) e[j] += g[j];
    }
  }
}

// dwpe[pos_offset + t, c] += sum_b dout[b, t, c]: positions in parallel, b in order within each.
void position_grad(float* dwpe, const float* dout, int64_t pos_offset, Dims d) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < d.T; ++t) {
    float* p = dwpe + (pos_offset + t) * d.C;
    for (int64_t b = 0; b < d.B; ++b) {
      const float* g = dout + (b * d.T + t) * d.C;
#pragma omp simd
      for (int64_t c = 0; c < d.C; ++c) p[c] += g[c];
    }
  }
}
}  // namespace simd

// Every id of tokens (B, T) in [0, V): a check of the values, so the backend's (the front checked
// the shapes). The error names the first bad id and where it is.
void check_token_ids(const char* op, const Tensor& tokens, int64_t V) {
  const int32_t* ids = tokens.ptr<int32_t>();
  int64_t T = tokens.dim(1);
  for (int64_t i = 0; i < tokens.numel(); ++i)
    TESSERA_CHECK(ids[i] >= 0 && ids[i] < V, op, ": token id ", ids[i], " at (b=", i / T, ", t=", i % T,
                  ") is outside the vocabulary [0, ", V, ")");
}

// The sizes of one call, from checked arguments; wte is (V, C) forward, dwte backward. Checks the
// token ids.
Dims dims_of(const char* op, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const VocabShard& shard) {
  const VocabShard s = shard.resolved(wte.dim(0));
  check_token_ids(op, tokens, s.vocab);
  return Dims{tokens.dim(0), tokens.dim(1), wte.dim(1), s.vocab, wpe.defined() ? wpe.dim(0) : 0, s.start, s.valid};
}

}  // namespace

void cpu::embedding_forward(const Exec&, const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                            int64_t pos_offset, const VocabShard& shard) {
  Dims d = dims_of("embedding_forward", tokens, wte, wpe, shard);
  const int32_t* ids = tokens.ptr<int32_t>();
  if (wte.dtype == DType::F64)
    reference::forward(out.ptr<double>(), ids, wte.ptr<double>(), wpe.defined() ? wpe.ptr<double>() : nullptr,
                       pos_offset, d);
  else
    simd::forward(out.ptr<float>(), ids, wte.ptr<float>(), wpe.defined() ? wpe.ptr<float>() : nullptr, pos_offset, d);
}

void cpu::embedding_backward(const Exec&, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                             const Tensor& tokens, int64_t pos_offset, const VocabShard& shard) {
  Dims d = dims_of("embedding_backward", tokens, dwte, dwpe, shard);
  const int32_t* ids = tokens.ptr<int32_t>();
  if (dwte.dtype == DType::F64) {
    reference::backward(dwte.ptr<double>(), dwpe.defined() ? dwpe.ptr<double>() : nullptr, dout.ptr<double>(), ids,
                        pos_offset, d);
  } else {
    simd::token_grad(dwte.ptr<float>(), dout.ptr<float>(), ids, d);
    if (dwpe.defined()) simd::position_grad(dwpe.ptr<float>(), dout.ptr<float>(), pos_offset, d);
  }
}

}  // namespace tessera
