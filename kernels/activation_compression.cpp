// Compressed saved activations: the CPU implementation of the three methods (see the header for
// the method of each and the work it follows).
#include "kernels/activation_compression.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/cpu/gemm_bf16.h"
#include "kernels/int8_rows.h"
#include "kernels/matmul.h"
#include "kernels/philox.h"

namespace tessera {

namespace {

// Omega's Philox stream: fixed, so a run's compression is reproducible (and every tensor of a
// given width sees the same sketch).
constexpr philox::Key kSketchKey = {0x5EC7C0DEu, 0xAC7C0411u};
// A sketch column whose residual after orthogonalization falls below this fraction of its norm
// adds no new direction (X has lower rank than r): it is zeroed instead of normalized.
constexpr double kDependentColumn = 1e-5;

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

struct Matrix {
  int64_t n = 0, m = 0;
};

Matrix as_matrix(const Shape& s) {
  const int64_t m = s.ndim() > 0 ? s[-1] : 1;
  return {m > 0 ? s.numel() / m : 0, m};
}

void check_host_f32(const char* op, const Tensor& x, CompressionMethod method) {
  TESSERA_CHECK(x.device.is_cpu(), op, ": model.activation_compression = \"", compression_name(method),
                "\" is built for the CPU only; the tensor is on ", x.device.str());
  TESSERA_CHECK(x.dtype == DType::F32, op, ": model.activation_compression = \"", compression_name(method),
                "\" compresses F32 activations, got ", dtype_name(x.dtype));
}

// ---- Bf16 ----

void bf16_compress(CompressedTensor& c, Allocator& alloc, const Tensor& x) {
  const int64_t n = x.numel();
  c.data = Buffer(alloc, DType::BF16, {round_up(n, 2)}, MemCategory::Activations);
  cpu::f32_to_bf16(static_cast<uint16_t*>(c.data.tensor().data), x.ptr<float>(), n);
}

void bf16_decompress(const CompressedTensor& c, const Tensor& x) {
  const uint16_t* h = static_cast<const uint16_t*>(c.data.tensor().data);
  float* out = x.ptr<float>();
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = cpu::bf16_to_f32(h[i]);
}

// ---- Int8 ----

void int8_compress(CompressedTensor& c, Allocator& alloc, const Tensor& x) {
  const Matrix mx = as_matrix(x.shape);
  c.data = Buffer(alloc, DType::I8, {round_up(mx.n * mx.m, 4)}, MemCategory::Activations);
  c.aux = Buffer(alloc, DType::F32, {mx.n}, MemCategory::Activations);
  const float* in = x.ptr<float>();
  int8_t* q = c.data.ptr<int8_t>();
  float* scales = c.aux.ptr<float>();
#pragma omp parallel for schedule(static) if (mx.n * mx.m > (1 << 16))
  for (int64_t i = 0; i < mx.n; ++i) scales[i] = quantize_row_int8(in + i * mx.m, mx.m, q + i * mx.m);
}

void int8_decompress(const CompressedTensor& c, const Tensor& x) {
  const Matrix mx = as_matrix(x.shape);
  const int8_t* q = c.data.ptr<int8_t>();
  const float* scales = c.aux.ptr<float>();
  float* out = x.ptr<float>();
#pragma omp parallel for schedule(static) if (mx.n * mx.m > (1 << 16))
  for (int64_t i = 0; i < mx.n; ++i) dequantize_row_int8(q + i * mx.m, mx.m, scales[i], out + i * mx.m);
}

// ---- LowRank ----

// Omega (m, r): standard normals of the fixed stream, element (j, k) at index j r + k.
void fill_sketch(const Tensor& omega) {
  float* o = omega.ptr<float>();
  const int64_t count = omega.numel();
  for (int64_t i = 0; i < count; ++i) o[i] = static_cast<float>(philox::normal(kSketchKey, static_cast<uint64_t>(i)));
}

double column_dot(const float* q, int64_t n, int64_t r, int64_t a, int64_t b) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(q[i * r + a]) * q[i * r + b];
  return s;
}

// Q (n, r) in place: its columns made orthonormal, first to last (modified Gram-Schmidt, each
// column orthogonalized twice: "twice is enough" for fp32), dependent ones zeroed.
void orthonormalize(const Tensor& qt) {
  float* q = qt.ptr<float>();
  const int64_t n = qt.dim(0), r = qt.dim(1);
  for (int64_t j = 0; j < r; ++j) {
    const double before = std::sqrt(column_dot(q, n, r, j, j));
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t k = 0; k < j; ++k) {
        const double d = column_dot(q, n, r, j, k);
        if (d == 0.0) continue;
        for (int64_t i = 0; i < n; ++i) q[i * r + j] -= static_cast<float>(d * q[i * r + k]);
      }
    const double after = std::sqrt(column_dot(q, n, r, j, j));
    const bool dependent = before == 0.0 || after <= kDependentColumn * before;
    const float inv = dependent ? 0.0f : static_cast<float>(1.0 / after);
    for (int64_t i = 0; i < n; ++i) q[i * r + j] *= inv;
  }
}

void lowrank_compress(const Exec& ex, CompressedTensor& c, Allocator& alloc, const Tensor& x, int64_t rank) {
  const Matrix mx = as_matrix(x.shape);
  const int64_t r = rank;
  const Tensor xm = x.view({mx.n, mx.m});
  Buffer omega(alloc, DType::F32, {mx.m, r}, MemCategory::Workspace);
  c.data = Buffer(alloc, DType::F32, {mx.n, r}, MemCategory::Activations);  // Q
  c.aux = Buffer(alloc, DType::F32, {r, mx.m}, MemCategory::Activations);   // R
  fill_sketch(omega);
  matmul(ex, c.data, xm, omega, false, false);  // Y = X Omega (n, r)
  orthonormalize(c.data);
  matmul(ex, c.aux, c.data, xm, true, false);  // R = Q^T X (r, m)
}

void lowrank_decompress(const Exec& ex, const CompressedTensor& c, const Tensor& x) {
  const Matrix mx = as_matrix(x.shape);
  matmul(ex, x.view({mx.n, mx.m}), c.data, c.aux, false, false);  // X^ = Q R
}

}  // namespace

const char* compression_name(CompressionMethod m) {
  switch (m) {
    case CompressionMethod::None: return "none";
    case CompressionMethod::Bf16: return "bf16";
    case CompressionMethod::Int8: return "int8";
    case CompressionMethod::LowRank: return "lowrank";
  }
  return "?";
}

CompressionMethod compression_method(const std::string& name, const std::string& key) {
  for (CompressionMethod m : {CompressionMethod::None, CompressionMethod::Bf16, CompressionMethod::Int8,
                              CompressionMethod::LowRank})
    if (name == compression_name(m)) return m;
  TESSERA_CHECK(false, key, " = \"", name, "\" is not a compression; expected \"none\", \"bf16\", \"int8\" or \"lowrank\"");
  return CompressionMethod::None;
}

int64_t lowrank_rank(const ActivationCompression& c, int64_t n, int64_t m) {
  return std::max<int64_t>(0, std::min({c.rank, n, m}));
}

int64_t compressed_bytes(const ActivationCompression& c, int64_t n, int64_t m) {
  switch (c.method) {
    case CompressionMethod::None: return 4 * n * m;
    case CompressionMethod::Bf16: return 2 * round_up(n * m, 2);
    case CompressionMethod::Int8: return round_up(n * m, 4) + 4 * n;
    case CompressionMethod::LowRank: return 4 * lowrank_rank(c, n, m) * (n + m);
  }
  return 0;
}

int64_t compression_workspace_bytes(const ActivationCompression& c, int64_t n, int64_t m) {
  return c.method == CompressionMethod::LowRank ? 4 * m * lowrank_rank(c, n, m) : 0;
}

CompressedTensor compress_activation(const Exec& ex, Allocator& alloc, Buffer&& x, const ActivationCompression& c) {
  const char* op = "compress_activation";
  TESSERA_CHECK(c.active(), op, ": no compression method given");
  TESSERA_CHECK(x.defined(), op, ": no tensor to compress");
  CompressedTensor out;
  out.method = c.method;
  out.shape = x.tensor().shape;
  out.dtype = x.tensor().dtype;
  if (c.method == CompressionMethod::Bf16 && x.tensor().dtype == DType::BF16) {
    out.data = std::move(x);  // already bf16: kept as it is
    return out;
  }
  check_host_f32(op, x, c.method);
  const Matrix mx = as_matrix(x.tensor().shape);
  switch (c.method) {
    case CompressionMethod::Bf16: bf16_compress(out, alloc, x); break;
    case CompressionMethod::Int8: int8_compress(out, alloc, x); break;
    case CompressionMethod::LowRank:
      TESSERA_CHECK(c.rank >= 1, op, ": model.activation_compression_rank = ", c.rank, " must be >= 1");
      lowrank_compress(ex, out, alloc, x, lowrank_rank(c, mx.n, mx.m));
      break;
    case CompressionMethod::None: break;
  }
  x.release();
  return out;
}

Buffer decompress_activation(const Exec& ex, Allocator& alloc, CompressedTensor&& c) {
  TESSERA_CHECK(c.defined(), "decompress_activation: no compressed tensor (was the forward's context saved?)");
  if (c.method == CompressionMethod::Bf16 && c.dtype == DType::BF16) return std::move(c.data);
  Buffer x(alloc, c.dtype, c.shape, MemCategory::Activations);
  switch (c.method) {
    case CompressionMethod::Bf16: bf16_decompress(c, x); break;
    case CompressionMethod::Int8: int8_decompress(c, x); break;
    case CompressionMethod::LowRank: lowrank_decompress(ex, c, x); break;
    case CompressionMethod::None: break;
  }
  c.data.release();
  c.aux.release();
  return x;
}

}  // namespace tessera
