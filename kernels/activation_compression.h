// Lossy storage of saved activations (model.activation_compression; docs/training.md,
// "Compression"): a tensor a forward keeps for its backward is stored compressed and restored just
// before the backward reads it. A tensor is seen as a matrix X (n rows, m columns): its last
// dimension is m, the others flatten into n (a (B, T, C) activation is (B T, C)).
//
// - Bf16: every element rounded to bfloat16, nearest even (the format of mixed precision's GEMM
//   operands). A BF16 tensor is kept as it is (nothing to round).
// - Int8: per-row absmax quantization, the scheme of ActNN (Chen et al., "ActNN: Reducing Training
//   Memory Footprint via 2-Bit Activation Compressed Training", ICML 2021) at 8 bits and without its
//   stochastic rounding: scale_i = max_j |X_ij| / 127 (fp32, one per row), q_ij = round(X_ij /
//   scale_i) in [-127, 127], X^_ij = q_ij scale_i; |X - X^| <= max_j |X_ij| / 254 per row.
// - LowRank: the randomized range finder of Halko, Martinsson and Tropp ("Finding structure with
//   randomness", SIAM Review 2011, Algorithm 4.1): Y = X Omega with Omega (m, r) Gaussian from a
//   fixed Philox seed, Q (n, r) = an orthonormal basis of Y's columns (Gram-Schmidt, twice), and
//   R = Q^T X (r, m) are kept; X^ = Q R, the projection of X onto Q's range. Exact (to rounding)
//   when rank(X) <= r; otherwise it keeps the part of X a Gaussian sketch sees, as the
//   random-projection activation compression of CompAct (Shamshoum et al., "CompAct: Compressed
//   Activations for Memory-Efficient LLM Training", NAACL 2025) does for the weight gradient.
//   r is min(rank, n, m).
//
// Sizes (exact: what compress_activation allocates, in bytes, for an F32 tensor of n x m):
// Bf16 2 n m rounded up to a multiple of 4; Int8 n m rounded up to a multiple of 4, plus 4 n;
// LowRank 4 r (n + m), plus 4 m r of workspace (Omega) while it compresses.
// CPU only, F32 tensors (Bf16 also takes BF16 ones): a CUDA tensor is an Error.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

enum class CompressionMethod : uint8_t { None, Bf16, Int8, LowRank };

// "none", "bf16", "int8", "lowrank" (the names model.activation_compression takes).
const char* compression_name(CompressionMethod m);
// The method of a name; an Error naming `key`, the value and the choices otherwise.
CompressionMethod compression_method(const std::string& name, const std::string& key);

struct ActivationCompression {
  CompressionMethod method = CompressionMethod::None;
  int64_t rank = 0;  // LowRank only: r (>= 1)
  bool active() const { return method != CompressionMethod::None; }
  bool operator==(const ActivationCompression&) const = default;
};

// A tensor in compressed form; owns its memory (Activations). Move-only.
struct CompressedTensor {
  CompressionMethod method = CompressionMethod::None;
  Shape shape;                // the original's
  DType dtype = DType::F32;   // the original's
  Buffer data;  // Bf16: the rounded values (n m, padded to even) BF16, or the BF16 original itself;
                // Int8: the codes (n m, padded to a multiple of 4) I8; LowRank: Q (n, r) F32
  Buffer aux;   // Int8: the row scales (n) F32; LowRank: R (r, m) F32
  bool defined() const { return data.defined(); }
};

// x compressed with c; x is released once its compressed form is allocated and written (the order
// model/memory.cpp counts: both exist for a moment). c must be active.
CompressedTensor compress_activation(const Exec& ex, Allocator& alloc, Buffer&& x, const ActivationCompression& c);
// The tensor back (shape and dtype of the original, Activations), then the compressed form released.
Buffer decompress_activation(const Exec& ex, Allocator& alloc, CompressedTensor&& c);

// Bytes compress_activation keeps for an F32 (n, m) tensor under c (None: the tensor itself).
int64_t compressed_bytes(const ActivationCompression& c, int64_t n, int64_t m);
// The workspace bytes it holds while compressing, beside x and the compressed form (LowRank: Omega).
int64_t compression_workspace_bytes(const ActivationCompression& c, int64_t n, int64_t m);
// r of LowRank for an (n, m) tensor: min(c.rank, n, m).
int64_t lowrank_rank(const ActivationCompression& c, int64_t n, int64_t m);

}  // namespace tessera
