// CUDA GEMMs (kernels/matmul.h) through cuBLASLt: fp32 (true fp32: CUBLAS_COMPUTE_32F, no TF32)
// and bf16 inputs with fp32 accumulation, with cuBLASLt's bias and GELU epilogues and one
// workspace per (device, stream), reused by every call.
//
// Row-major to cuBLASLt's column-major: a row-major (r, c) matrix is a column-major (c, r) one, so
// the row-major C (M, N) = op(a) (M, K) op(b) (K, N) is the column-major C^T (N, M) =
// op(b)^T (N, K) op(a)^T (K, M): cuBLASLt's "A" is our b and its "B" our a, with the same
// transpose flags; the bias of an epilogue then runs along C^T's rows, our N (output features).
#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

void check_lt(const char* op, cublasStatus_t s, const char* what) {
  TESSERA_CHECK(s == CUBLAS_STATUS_SUCCESS, op, ": cuBLASLt ", what, " failed: ", cublasGetStatusString(s), " (",
                int(s), ")");
}

// A cuBLASLt handle and a workspace, for the GEMMs queued on one stream of one device.
struct LtResources {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

// The resources of ex's (device, stream), created on first use and kept for the process (the
// handle and workspace live as long as the CUDA context; freeing them at exit would race the
// driver's own teardown). The backend's one process-wide cache, guarded by a mutex; a workspace
// per stream, so GEMMs on two streams never share scratch memory.
const LtResources& lt_resources(const char* op, const Exec& ex) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, LtResources> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(ex.device.index, stream_of(ex));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  LtResources r;
  check_lt(op, cublasLtCreate(&r.handle), "handle creation");
  check_cuda(op, cudaMalloc(&r.workspace, kWorkspaceBytes));
  return cache.emplace(key, r).first->second;
}

cudaDataType_t lt_type(const char* op, DType dt) {
  switch (dt) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: break;
  }
  detail::fail(op, ": cuBLASLt GEMMs take f32 or bf16, got ", dtype_name(dt));
}

// RAII owners of the cuBLASLt descriptors of one call.
struct Desc {
  cublasLtMatmulDesc_t d = nullptr;
  ~Desc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() {
    if (l) cublasLtMatrixLayoutDestroy(l);
  }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
};

// The largest power of two (at most 256) that divides p's address.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::Gelu: return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::GeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

}  // namespace

void gemm(const char* op, const Exec& ex, const GemmArgs& g) {
  use_device(op, ex);
  const int64_t M = g.c.dim(0), N = g.c.dim(1), K = g.trans_a ? g.a.dim(0) : g.a.dim(1);
  TESSERA_CHECK(g.a.dtype == g.b.dtype, op, ": a is ", dtype_name(g.a.dtype), " but b ", dtype_name(g.b.dtype));
  const bool needs_bias = g.epilogue == GemmEpilogue::Bias || g.epilogue == GemmEpilogue::GeluBias;
  TESSERA_CHECK(needs_bias == g.bias.defined(), op, ": the epilogue ", needs_bias ? "needs" : "takes no", " bias");
  if (M == 0 || N == 0) return;
  if (K == 0 && g.epilogue == GemmEpilogue::None && g.c.dtype == DType::F32) {  // no products: c = beta c
    if (g.beta == 0.0) return fill_zero(ex, g.c);
    return scale(ex, g.c, g.beta);
  }
  TESSERA_CHECK(K > 0, op, ": an empty inner dimension (K = 0) with an epilogue or a bf16 result is not supported");
  const cudaDataType_t ab = lt_type(op, g.a.dtype), cd = lt_type(op, g.c.dtype);
  const LtResources& r = lt_resources(op, ex);

  Desc desc;
  check_lt(op, cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t op_lt_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our b
  const cublasOperation_t op_lt_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our a
  check_lt(op, cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof op_lt_a),
           "TRANSA");
  check_lt(op, cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof op_lt_b),
           "TRANSB");
  const cublasLtEpilogue_t epi = lt_epilogue(g.epilogue);
  check_lt(op, cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "epilogue");
  if (needs_bias) {
    const void* bias = g.bias.data;
    check_lt(op, cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
             "bias pointer");
    const cudaDataType_t bt = lt_type(op, g.bias.dtype);
    check_lt(op, cublasLtMatmulDescSetAttribute(desc.d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
             "bias dtype");
  }

  // Stored column-major shapes (rows, cols, leading dimension) before the transposes.
  Layout la, lb, lc;
  if (g.trans_b)  // b stored row-major (N, K): column-major (K, N)
    check_lt(op, cublasLtMatrixLayoutCreate(&la.l, ab, K, N, K), "layout of b");
  else  // b stored (K, N): column-major (N, K)
    check_lt(op, cublasLtMatrixLayoutCreate(&la.l, ab, N, K, N), "layout of b");
  if (g.trans_a)  // a stored (K, M): column-major (M, K)
    check_lt(op, cublasLtMatrixLayoutCreate(&lb.l, ab, M, K, M), "layout of a");
  else  // a stored (M, K): column-major (K, M)
    check_lt(op, cublasLtMatrixLayoutCreate(&lb.l, ab, K, M, K), "layout of a");
  check_lt(op, cublasLtMatrixLayoutCreate(&lc.l, cd, N, M, N), "layout of c");  // c (M, N): column-major (N, M)

  Preference pref;
  check_lt(op, cublasLtMatmulPreferenceCreate(&pref.p), "preference");
  const size_t ws = kWorkspaceBytes;
  check_lt(op, cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "workspace size");
  // The operands' true alignments: cuBLASLt's heuristic otherwise assumes 256 bytes and may pick
  // a kernel that faults on a view into the middle of a buffer.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const void*> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.b.data}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.a.data},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.c.data}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.c.data}};
  for (const auto& [attr, ptr] : aligns) {
    const uint32_t align = alignment_of(ptr);
    check_lt(op, cublasLtMatmulPreferenceSetAttribute(pref.p, attr, &align, sizeof align), "alignment");
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check_lt(op, cublasLtMatmulAlgoGetHeuristic(r.handle, desc.d, la.l, lb.l, lc.l, lc.l, pref.p, 1, &heuristic, &found),
           "heuristic");
  TESSERA_CHECK(found > 0, op, ": cuBLASLt has no algorithm for (", M, ", ", K, ") x (", K, ", ", N, ") ",
                dtype_name(g.a.dtype), " -> ", dtype_name(g.c.dtype));
  const float alpha = static_cast<float>(g.alpha), beta = static_cast<float>(g.beta);
  check_lt(op, cublasLtMatmul(r.handle, desc.d, &alpha, g.b.data, la.l, g.a.data, lb.l, &beta, g.c.data, lc.l,
                              g.c.data, lc.l, &heuristic.algo, r.workspace, kWorkspaceBytes, stream_of(ex)),
           "matmul");
}

namespace {
// Mixed precision (train.dtype = "bf16": a weight's bf16 copy beside f32 activations): an f32
// operand of a GEMM with a bf16 one rounded to bf16 (nearest even) in scratch, as the CPU's bf16
// GEMM rounds it; the products are exact in f32 and accumulate in f32 (cuBLASLt, CUBLAS_COMPUTE_32F).
Tensor as_bf16(const char* op, const Exec& ex, const Tensor& t, std::unique_ptr<Scratch>& scratch) {
  if (t.dtype == DType::BF16) return t;
  require_f32(op, t);
  scratch = std::make_unique<Scratch>(op, ex, static_cast<size_t>(t.numel()) * 2);
  const Tensor r(scratch->as<void>(), DType::BF16, t.shape, t.device);
  cuda::convert(ex, r, t);
  return r;
}
}  // namespace

void matmul(const Exec& ex, const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha,
            double beta) {
  require_f32("matmul", c);
  if (a.dtype != b.dtype) {  // one bf16 operand: both in bf16
    std::unique_ptr<Scratch> sa, sb;
    const Tensor a16 = as_bf16("matmul", ex, a, sa), b16 = as_bf16("matmul", ex, b, sb);
    return gemm("matmul", ex, GemmArgs{c, a16, b16, trans_a, trans_b, alpha, beta, Tensor(), GemmEpilogue::None});
  }
  gemm("matmul", ex, GemmArgs{c, a, b, trans_a, trans_b, alpha, beta, Tensor(), GemmEpilogue::None});
}

namespace {
// The last dimension's size and the rest flattened: x (N.., In) as (N, In).
Tensor as_2d(const Tensor& t) { return t.view(Shape{t.numel() / t.dim(-1), t.dim(-1)}); }

// dbias's term: dy[n, c].
struct Rows {
  const float* dy;
  int64_t C;
  __device__ double operator()(int64_t n, int64_t c) const { return double(dy[n * C + c]); }
};
}  // namespace

void linear_forward(const Exec& ex, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  const char* op = "linear_forward";
  require_f32(op, x);
  std::unique_ptr<Scratch> xs;
  const Tensor xin = w.dtype == DType::BF16 ? as_bf16(op, ex, x, xs) : x;
  gemm(op, ex, GemmArgs{as_2d(y), as_2d(xin), w, false, true, 1.0, 0.0, bias,
                        bias.defined() ? GemmEpilogue::Bias : GemmEpilogue::None});
}

void linear_backward(const Exec& ex, const Tensor& dx, const Tensor& dw, const Tensor& dbias, const Tensor& dy,
                     const Tensor& x, const Tensor& w) {
  const char* op = "linear_backward";
  require_f32(op, x);
  // With a bf16 weight copy dy is rounded once for both GEMMs (the CPU's order), and x for dw.
  std::unique_ptr<Scratch> dys, xs;
  const bool mixed = w.dtype == DType::BF16;
  const Tensor dy2 = as_2d(mixed ? as_bf16(op, ex, dy, dys) : dy), x2 = as_2d(mixed ? as_bf16(op, ex, x, xs) : x);
  if (dx.defined()) gemm(op, ex, GemmArgs{as_2d(dx), dy2, w, false, false, 1.0, 0.0, Tensor(), GemmEpilogue::None});  // dx = dy w
  gemm(op, ex, GemmArgs{dw, dy2, x2, true, false, 1.0, 1.0, Tensor(), GemmEpilogue::None});  // dw += dy^T x
  if (dbias.defined()) {
    use_device(op, ex);
    const Tensor dyf = as_2d(dy);  // the f32 gradient, as the CPU sums it
    column_sums(op, ex, dbias.ptr<float>(), Rows{dyf.ptr<float>(), dyf.dim(1)}, dyf.dim(0), dyf.dim(1));
  }
}

}  // namespace tessera::cuda
