// The CPU twin of cuBLASLt (kernels/simt/include/cublasLt.h): the subset kernels/cuda/matmul.cu
// uses, validated as cuBLASLt documents it, computed on the stream's worker as
// D = epilogue(alpha op(A) op(B) + beta C [+ bias]) with f32 accumulation (cblas_sgemm; bf16
// operands widened to f32 first, which is exact, so their products are too) and one rounding to
// D's type at the end. Anything outside the subset is refused, naming what.
#include <cblas.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cublasLt.h"
#include "kernels/simt/host_bf16.h"
#include "kernels/simt/stream.h"
#include "kernels/simt/twin.h"

struct cublasLtContext {
  int device = 0;
};

struct cublasLtMatmulDescOpaque_t {
  int32_t compute = CUBLAS_COMPUTE_32F;
  int32_t scale = CUDA_R_32F;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // D's type
};

struct cublasLtMatrixLayoutOpaque_t {
  int32_t type = CUDA_R_32F;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;  // elements between batches
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace = 0;
  uint32_t alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
};

namespace tessera::simt {
namespace {

constexpr uint64_t kAlgoTag = 0x7e55e4a51a7ull;  // marks an algorithm from this twin's heuristic

// Refuses or rejects a call: the message names the call and the value, and becomes the text of
// the status (cublasGetStatusString).
cublasStatus_t refuse(cublasStatus_t s, const std::string& message) {
  report("cublas", s, "cuBLASLt " + message);
  return s;
}

const char* type_name(int32_t t) {
  switch (t) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_32I: return "CUDA_R_32I";
    case CUDA_R_16BF: return "CUDA_R_16BF";
  }
  return "an unknown cudaDataType";
}

size_t element_bytes(int32_t t) { return t == CUDA_R_16BF ? 2 : 4; }

bool computed_type(int32_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

std::string epilogue_name(uint32_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "CUBLASLT_EPILOGUE_DEFAULT";
    case CUBLASLT_EPILOGUE_RELU: return "CUBLASLT_EPILOGUE_RELU";
    case CUBLASLT_EPILOGUE_BIAS: return "CUBLASLT_EPILOGUE_BIAS";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "CUBLASLT_EPILOGUE_RELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU: return "CUBLASLT_EPILOGUE_GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "CUBLASLT_EPILOGUE_GELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU_AUX: return "CUBLASLT_EPILOGUE_RELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "CUBLASLT_EPILOGUE_GELU_AUX";
    case CUBLASLT_EPILOGUE_DGELU: return "CUBLASLT_EPILOGUE_DGELU";
    case CUBLASLT_EPILOGUE_BGRADA: return "CUBLASLT_EPILOGUE_BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB: return "CUBLASLT_EPILOGUE_BGRADB";
  }
  return "epilogue " + std::to_string(e);
}

bool has_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS; }
bool has_gelu(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS; }

// Copies an attribute of type T out of (buf, size), as cuBLASLt does: the size must be T's.
template <class T>
bool read_attribute(const void* buf, size_t size, T& out) {
  if (!buf || size != sizeof(T)) return false;
  std::memcpy(&out, buf, sizeof(T));
  return true;
}

float load(const void* p, int32_t type, size_t i) {
  return type == CUDA_R_16BF ? bf16_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}
void store(void* p, int32_t type, size_t i, float v) {
  if (type == CUDA_R_16BF)
    static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
  else
    static_cast<float*>(p)[i] = v;
}

// The tanh approximation of GELU, as cuBLASLt's epilogue.
float gelu(float x) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

// One GEMM, as checked: the shapes (column-major, before the transposes), pointers and scalars.
struct Problem {
  cublasLtMatmulDescOpaque_t desc;
  cublasLtMatrixLayoutOpaque_t a, b, c, d;
  uint64_t m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const void *A = nullptr, *B = nullptr, *C = nullptr;
  void* D = nullptr;
  int32_t bias_type = CUDA_R_32F;
};

// The span of a layout's batches, in bytes: the last element's end.
size_t span_bytes(const cublasLtMatrixLayoutOpaque_t& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  const uint64_t last = uint64_t(l.ld) * (l.cols - 1) + l.rows + uint64_t(l.batch - 1) * uint64_t(l.stride);
  return last * element_bytes(l.type);
}

cublasStatus_t check_layout(const char* name, const cublasLtMatrixLayoutOpaque_t& l) {
  if (!computed_type(l.type))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string("matrix ") + name + ": data type " + type_name(l.type) +
                                                   " (the twin computes CUDA_R_32F and CUDA_R_16BF)");
  if (l.order != CUBLASLT_ORDER_COL)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string("matrix ") + name + ": order " + std::to_string(l.order) +
                                                   " (the twin has CUBLASLT_ORDER_COL only)");
  if (l.ld < 1 || uint64_t(l.ld) < l.rows)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string("matrix ") + name + ": ld " + std::to_string(l.ld) +
                                                   " is below its rows " + std::to_string(l.rows));
  if (l.batch < 1 || l.stride < 0)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string("matrix ") + name + ": batch count " +
                                                   std::to_string(l.batch) + ", stride " + std::to_string(l.stride));
  if (l.rows > INT_MAX || l.cols > INT_MAX || l.ld > INT_MAX)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string("matrix ") + name + ": a dimension above INT_MAX");
  return CUBLAS_STATUS_SUCCESS;
}

// The checks of cublasLtMatmulAlgoGetHeuristic and cublasLtMatmul: a supported problem of
// consistent shapes. Fills p's m, n, k and bias type.
cublasStatus_t check_problem(const char* call, Problem& p) {
  const auto& d = p.desc;
  if (d.compute != CUBLAS_COMPUTE_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string(call) + ": compute type " + std::to_string(d.compute) +
                                                   " (the twin has CUBLAS_COMPUTE_32F only)");
  if (d.scale != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string(call) + ": scale type " + type_name(d.scale) +
                                                   " (the twin has CUDA_R_32F only)");
  for (const auto& [name, l] : {std::pair{"A", &p.a}, {"B", &p.b}, {"C", &p.c}, {"D", &p.d}})
    if (const cublasStatus_t s = check_layout(name, *l)) return s;
  if (p.a.type != p.b.type || p.c.type != p.d.type || (p.a.type == CUDA_R_32F && p.d.type != CUDA_R_32F))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string(call) + ": A, B, C, D of types " + type_name(p.a.type) +
                                                   ", " + type_name(p.b.type) + ", " + type_name(p.c.type) + ", " +
                                                   type_name(p.d.type) +
                                                   " (the twin has f32 x f32 -> f32 and bf16 x bf16 -> bf16 or f32)");
  p.m = p.d.rows;
  p.n = p.d.cols;
  p.k = d.transa == CUBLAS_OP_N ? p.a.cols : p.a.rows;
  const uint64_t a_rows = d.transa == CUBLAS_OP_N ? p.m : p.k, b_rows = d.transb == CUBLAS_OP_N ? p.k : p.n;
  const uint64_t b_cols = d.transb == CUBLAS_OP_N ? p.n : p.k;
  auto dims = [](const cublasLtMatrixLayoutOpaque_t& l) {
    std::string s = "(";  // appended, not "(" + string: GCC 12's -Wrestrict misfires on that
    s += std::to_string(l.rows) + ", " + std::to_string(l.cols) + ")";
    return s;
  };
  if (p.a.rows != a_rows || p.b.rows != b_rows || p.b.cols != b_cols || p.c.rows != p.m || p.c.cols != p.n)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(call) + ": shapes do not agree: A " + dims(p.a) + ", B " +
                                                   dims(p.b) + ", C " + dims(p.c) + ", D " + dims(p.d) + " with TRANSA " +
                                                   std::to_string(d.transa) + ", TRANSB " + std::to_string(d.transb));
  if (p.a.batch != p.d.batch || p.b.batch != p.d.batch || p.c.batch != p.d.batch)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string(call) + ": batch counts of A, B, C, D differ (" +
                                                   std::to_string(p.a.batch) + ", " + std::to_string(p.b.batch) + ", " +
                                                   std::to_string(p.c.batch) + ", " + std::to_string(p.d.batch) + ")");
  if (has_bias(d.epilogue)) {
    p.bias_type = d.bias_type == -1 ? p.d.type : d.bias_type;
    if (!computed_type(p.bias_type))
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string(call) + ": bias data type " + type_name(p.bias_type));
  }
  return CUBLAS_STATUS_SUCCESS;
}

// op(X) of one batch as a column-major f32 matrix cblas can read: X itself when f32, else X
// widened into `scratch` (ld = rows).
const float* as_f32(const void* x, const cublasLtMatrixLayoutOpaque_t& l, std::vector<float>& scratch, int& ld) {
  if (l.type == CUDA_R_32F) {
    ld = int(l.ld);
    return static_cast<const float*>(x);
  }
  scratch.resize(l.rows * l.cols);
  for (uint64_t j = 0; j < l.cols; ++j)
    for (uint64_t i = 0; i < l.rows; ++i) scratch[i + j * l.rows] = load(x, l.type, i + j * uint64_t(l.ld));
  ld = int(l.rows > 0 ? l.rows : 1);
  return scratch.data();
}

const void* offset(const void* p, const cublasLtMatrixLayoutOpaque_t& l, int batch) {
  return static_cast<const char*>(p) + size_t(batch) * size_t(l.stride) * element_bytes(l.type);
}

// Runs on the stream's worker: per batch, acc = alpha op(A) op(B) by cblas_sgemm, then
// D = epilogue(acc + beta C + bias), rounded once to D's type. C is not read when beta is 0.
void compute(const Problem& p) {
  const int m = int(p.m), n = int(p.n), k = int(p.k);
  std::vector<float> a32, b32, acc(p.m * p.n);
  for (int batch = 0; batch < p.d.batch; ++batch) {
    int lda = 0, ldb = 0;
    const float* a = as_f32(offset(p.A, p.a, batch), p.a, a32, lda);
    const float* b = as_f32(offset(p.B, p.b, batch), p.b, b32, ldb);
    std::fill(acc.begin(), acc.end(), 0.f);
    if (k > 0)
      cblas_sgemm(CblasColMajor, p.desc.transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                  p.desc.transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, p.alpha, a, lda, b, ldb, 0.f,
                  acc.data(), m);
    const void* c = offset(p.C, p.c, batch);
    void* d = const_cast<void*>(offset(p.D, p.d, batch));
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float v = acc[size_t(i) + size_t(j) * size_t(m)];
        if (p.beta != 0.f) v += p.beta * load(c, p.c.type, size_t(i) + size_t(j) * size_t(p.c.ld));
        if (has_bias(p.desc.epilogue)) v += load(p.desc.bias, p.bias_type, size_t(i));
        if (has_gelu(p.desc.epilogue)) v = gelu(v);
        store(d, p.d.type, size_t(i) + size_t(j) * size_t(p.d.ld), v);
      }
  }
}

uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

}  // namespace
}  // namespace tessera::simt

using tessera::simt::refuse;

const char* cublasGetStatusString(cublasStatus_t status) {
  if (const char* m = tessera::simt::reported("cublas", status)) return m;
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
  }
  return "unknown error";
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

size_t cublasLtGetVersion() { return CUBLAS_VERSION; }

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (!lightHandle) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: the handle pointer is null");
  *lightHandle = new cublasLtContext{tessera::simt::current_device()};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (!lightHandle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: a null handle");
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  if (!matmulDesc) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: the pointer is null");
  if (computeType != CUBLAS_COMPUTE_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescCreate: compute type " + std::to_string(computeType) +
                                                   " (the twin has CUBLAS_COMPUTE_32F only)");
  if (scaleType != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string("cublasLtMatmulDescCreate: scale type ") +
                                                   tessera::simt::type_name(scaleType) + " (the twin has CUDA_R_32F only)");
  *matmulDesc = new cublasLtMatmulDescOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
  using tessera::simt::read_attribute;
  const std::string call = "cublasLtMatmulDescSetAttribute: ";
  if (!matmulDesc) return refuse(CUBLAS_STATUS_INVALID_VALUE, call + "a null descriptor");
  cublasLtMatmulDescOpaque_t& d = *matmulDesc;
  auto bad_size = [&](const char* name) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call + name + " given " + std::to_string(sizeInBytes) + " bytes");
  };
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      int32_t op = 0;
      if (!read_attribute(buf, sizeInBytes, op)) return bad_size("TRANSA/TRANSB");
      if (op != CUBLAS_OP_N && op != CUBLAS_OP_T)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call + "operation " + std::to_string(op) +
                                                       " (the twin has CUBLAS_OP_N and CUBLAS_OP_T)");
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d.transa : d.transb) = op;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      uint32_t e = 0;
      if (!read_attribute(buf, sizeInBytes, e)) return bad_size("EPILOGUE");
      if (e != CUBLASLT_EPILOGUE_DEFAULT && !tessera::simt::has_bias(e) && !tessera::simt::has_gelu(e))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call + tessera::simt::epilogue_name(e) +
                                                       " (the twin has DEFAULT, BIAS, GELU and GELU_BIAS)");
      d.epilogue = e;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (!read_attribute(buf, sizeInBytes, d.bias)) return bad_size("BIAS_POINTER");
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      int32_t t = 0;
      if (!read_attribute(buf, sizeInBytes, t)) return bad_size("BIAS_DATA_TYPE");
      if (t != -1 && !tessera::simt::computed_type(t))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      call + "bias data type " + tessera::simt::type_name(t) + " (the twin has CUDA_R_32F and CUDA_R_16BF)");
      d.bias_type = t;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: {
      int32_t t = 0;
      if (!read_attribute(buf, sizeInBytes, t)) return bad_size("COMPUTE_TYPE/SCALE_TYPE");
      const bool compute = attr == CUBLASLT_MATMUL_DESC_COMPUTE_TYPE;
      if (t != (compute ? int32_t(CUBLAS_COMPUTE_32F) : int32_t(CUDA_R_32F)))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call + (compute ? "compute type " : "scale type ") +
                                                       std::to_string(t) + " (the twin has COMPUTE_32F, CUDA_R_32F)");
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: {
      int32_t mode = 0;
      if (!read_attribute(buf, sizeInBytes, mode)) return bad_size("POINTER_MODE");
      if (mode != CUBLASLT_POINTER_MODE_HOST)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      call + "pointer mode " + std::to_string(mode) + " (the twin has CUBLASLT_POINTER_MODE_HOST)");
      return CUBLAS_STATUS_SUCCESS;
    }
    default: break;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call + "attribute " + std::to_string(int(attr)) +
                                                 " (the twin has TRANSA, TRANSB, EPILOGUE, BIAS_POINTER, "
                                                 "BIAS_DATA_TYPE, COMPUTE_TYPE, SCALE_TYPE, POINTER_MODE)");
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!matLayout) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: the pointer is null");
  if (!tessera::simt::computed_type(type))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, std::string("cublasLtMatrixLayoutCreate: data type ") +
                                                   tessera::simt::type_name(type) + " (the twin has CUDA_R_32F and CUDA_R_16BF)");
  if (ld < 1 || uint64_t(ld) < rows)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: ld " + std::to_string(ld) +
                                                   " is below rows " + std::to_string(rows));
  auto* l = new cublasLtMatrixLayoutOpaque_t{};
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *matLayout = l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
  using tessera::simt::read_attribute;
  const std::string call = "cublasLtMatrixLayoutSetAttribute: ";
  if (!matLayout) return refuse(CUBLAS_STATUS_INVALID_VALUE, call + "a null layout");
  cublasLtMatrixLayoutOpaque_t& l = *matLayout;
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: {
      uint32_t t = 0;
      ok = read_attribute(buf, sizeInBytes, t);
      if (ok) l.type = int32_t(t);
      break;
    }
    case CUBLASLT_MATRIX_LAYOUT_ORDER: ok = read_attribute(buf, sizeInBytes, l.order); break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: ok = read_attribute(buf, sizeInBytes, l.rows); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: ok = read_attribute(buf, sizeInBytes, l.cols); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: ok = read_attribute(buf, sizeInBytes, l.ld); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ok = read_attribute(buf, sizeInBytes, l.batch); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: ok = read_attribute(buf, sizeInBytes, l.stride); break;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call + "attribute " + std::to_string(int(attr)) +
                                                     " (the twin has TYPE, ORDER, ROWS, COLS, LD, BATCH_COUNT, "
                                                     "STRIDED_BATCH_OFFSET)");
  }
  if (!ok)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  call + "attribute " + std::to_string(int(attr)) + " given " + std::to_string(sizeInBytes) + " bytes");
  return CUBLAS_STATUS_SUCCESS;  // the values are checked where the layout is used
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: the pointer is null");
  *pref = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
  using tessera::simt::read_attribute;
  const std::string call = "cublasLtMatmulPreferenceSetAttribute: ";
  if (!pref) return refuse(CUBLAS_STATUS_INVALID_VALUE, call + "a null preference");
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: ok = read_attribute(buf, sizeInBytes, pref->max_workspace); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      ok = read_attribute(buf, sizeInBytes, pref->alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES]);
      break;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call + "attribute " + std::to_string(int(attr)) +
                                                     " (the twin has MAX_WORKSPACE_BYTES and MIN_ALIGNMENT_*)");
  }
  if (!ok)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  call + "attribute " + std::to_string(int(attr)) + " given " + std::to_string(sizeInBytes) + " bytes");
  return CUBLAS_STATUS_SUCCESS;
}

// The one algorithm, carrying the alignments it was chosen for (checked again by cublasLtMatmul).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
  const std::string call = "cublasLtMatmulAlgoGetHeuristic";
  if (!lightHandle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call + ": a null handle");
  if (!operationDesc || !Adesc || !Bdesc || !Cdesc || !Ddesc || !preference || requestedAlgoCount < 1 ||
      !heuristicResultsArray || !returnAlgoCount)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call + ": a null descriptor or result, or a request for no algorithm");
  *returnAlgoCount = 0;
  tessera::simt::Problem p{*operationDesc, *Adesc, *Bdesc, *Cdesc, *Ddesc};
  if (const cublasStatus_t s = tessera::simt::check_problem(call.c_str(), p)) return s;
  const cublasLtMatrixLayoutOpaque_t* layouts[4] = {Adesc, Bdesc, Cdesc, Ddesc};
  for (int i = 0; i < 4; ++i) {
    const uint32_t align = preference->alignment[i];
    if (align < tessera::simt::element_bytes(layouts[i]->type))
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call + ": no algorithm for matrix " + "ABCD"[i] + " aligned to " +
                                                     std::to_string(align) + " bytes, below its element size");
  }
  cublasLtMatmulHeuristicResult_t r{};
  r.algo.data[0] = tessera::simt::kAlgoTag;
  for (int i = 0; i < 4; ++i) r.algo.data[1 + i] = preference->alignment[i];
  r.workspaceSize = 0;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.f;
  heuristicResultsArray[0] = r;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
  (void)workspace, (void)workspaceSizeInBytes;  // the twin needs none
  const std::string call = "cublasLtMatmul";
  if (!lightHandle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call + ": a null handle");
  if (!computeDesc || !Adesc || !Bdesc || !Cdesc || !Ddesc || !alpha || !beta)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call + ": a null descriptor, alpha or beta");
  tessera::simt::Problem p{*computeDesc, *Adesc, *Bdesc, *Cdesc, *Ddesc};
  if (const cublasStatus_t s = tessera::simt::check_problem(call.c_str(), p)) return s;
  if (Cdesc != Ddesc && C == D && (Cdesc->ld != Ddesc->ld || Cdesc->type != Ddesc->type || Cdesc->stride != Ddesc->stride))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, call + ": in place (C == D) with different layouts of C and D");
  std::memcpy(&p.alpha, alpha, sizeof(float));  // CUBLASLT_POINTER_MODE_HOST: read now
  std::memcpy(&p.beta, beta, sizeof(float));
  p.A = A, p.B = B, p.C = C, p.D = D;
  const bool bias = tessera::simt::has_bias(p.desc.epilogue);
  if (bias && !p.desc.bias) return refuse(CUBLAS_STATUS_INVALID_VALUE, call + ": a bias epilogue without BIAS_POINTER");
  // Every operand lies in device memory, and at the alignment the algorithm was chosen for.
  struct Operand {
    const char* name;
    const void* ptr;
    size_t bytes;  // 0: not read (C when beta is 0, the bias without a bias epilogue, an empty matrix)
  };
  const Operand operands[] = {
      {"A", A, p.k > 0 ? tessera::simt::span_bytes(p.a) : 0},
      {"B", B, p.k > 0 ? tessera::simt::span_bytes(p.b) : 0},
      {"C", C, p.beta != 0.f ? tessera::simt::span_bytes(p.c) : 0},
      {"D", D, tessera::simt::span_bytes(p.d)},
      {"bias", p.desc.bias, bias ? p.m * tessera::simt::element_bytes(p.bias_type) : 0}};
  for (const Operand& o : operands) {
    if (o.bytes == 0) continue;
    if (!o.ptr || !tessera::simt::is_device_range(o.ptr, o.bytes))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, call + ": matrix " + o.name + " (" + std::to_string(o.bytes) +
                                                     " bytes) is not within one device allocation");
  }
  if (algo && algo->data[0] == tessera::simt::kAlgoTag) {
    for (int i = 0; i < 4; ++i) {
      const void* ptr = operands[i].ptr;
      if (!ptr || operands[i].bytes == 0) continue;
      const uint32_t have = tessera::simt::alignment_of(ptr);
      if (have < algo->data[1 + i])
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      call + ": matrix " + operands[i].name + " is aligned to " + std::to_string(have) +
                          " bytes, but the algorithm was chosen for " + std::to_string(algo->data[1 + i]) +
                          " (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_" + operands[i].name + "_BYTES)");
    }
  }
  if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
  tessera::simt::enqueue(stream, "cublasLtMatmul", [p] { tessera::simt::compute(p); });
  return CUBLAS_STATUS_SUCCESS;
}
