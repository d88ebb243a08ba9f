// The cuBLASLt twin (kernels/simt/cublaslt.cpp) against a naive triple loop in double: every
// transpose combination, odd sizes, leading dimensions above the rows, strided batches, alpha and
// beta, the bias and GELU epilogues, bf16 operands and results; and what it refuses.
#include <gtest/gtest.h>

#include <cublasLt.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

// ---- bf16 as the test sees it: round to nearest even, independent of the twin's code ----
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lower = u & 0xffffu, upper = u >> 16;
  const bool round_up = lower > 0x8000u || (lower == 0x8000u && (upper & 1u));
  return static_cast<uint16_t>(upper + (round_up ? 1u : 0u));
}
float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Device memory holding n elements of type t, each given as a float (rounded if bf16).
class DeviceMatrix {
 public:
  DeviceMatrix(cudaDataType_t t, const std::vector<float>& v) : type_(t), n_(v.size()) {
    const size_t bytes = n_ * (t == CUDA_R_16BF ? 2 : 4);
    EXPECT_EQ(cudaMalloc(&p_, bytes), cudaSuccess);
    if (t == CUDA_R_16BF) {
      std::vector<uint16_t> h(n_);
      for (size_t i = 0; i < n_; ++i) h[i] = to_bf16(v[i]);
      EXPECT_EQ(cudaMemcpy(p_, h.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    } else {
      EXPECT_EQ(cudaMemcpy(p_, v.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceMatrix() { cudaFree(p_); }
  DeviceMatrix(const DeviceMatrix&) = delete;
  DeviceMatrix& operator=(const DeviceMatrix&) = delete;
  void* get() const { return p_; }
  std::vector<float> read() const {
    std::vector<float> out(n_);
    if (type_ == CUDA_R_16BF) {
      std::vector<uint16_t> h(n_);
      EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n_; ++i) out[i] = from_bf16(h[i]);
    } else {
      EXPECT_EQ(cudaMemcpy(out.data(), p_, n_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }

 private:
  cudaDataType_t type_;
  size_t n_;
  void* p_ = nullptr;
};

// One column-major GEMM problem: D (m, n) = epi(alpha op(A) op(B) + beta C + bias).
struct Case {
  cudaDataType_t ab = CUDA_R_32F, cd = CUDA_R_32F;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int m = 7, n = 13, k = 17;
  int pad = 0;    // ld = rows + pad for every matrix
  int batch = 1;  // strided batches, each pad + 5 elements apart beyond the matrix
  float alpha = 1, beta = 0;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  cudaDataType_t bias_type = CUDA_R_32F;
};

struct Layout {
  int rows, cols, ld;
  int64_t stride;
  size_t elements(int batch) const { return size_t(stride) * size_t(batch - 1) + size_t(ld) * size_t(cols); }
};

Layout layout(int rows, int cols, const Case& c) {
  const int ld = rows + c.pad;
  return {rows, cols, ld, int64_t(ld) * cols + c.pad + 5};
}

std::vector<float> random_values(size_t n, std::mt19937& rng, cudaDataType_t t) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = t == CUDA_R_16BF ? from_bf16(to_bf16(u(rng))) : u(rng);
  return v;
}

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

void check(cublasStatus_t s, const char* what) {
  ASSERT_EQ(s, CUBLAS_STATUS_SUCCESS) << what << ": " << cublasGetStatusString(s);
}

// Runs c through the twin as kernels/cuda/matmul.cu drives cuBLASLt and compares each element
// of D with the double-precision loop. Tolerance: f32 accumulation of k products errs by at most
// about k * 2^-24 times the sum of their magnitudes (plus the terms of beta C and the bias); GELU's
// slope is below 1.13; a bf16 result adds half an ulp, 2^-8 relative.
void run(const Case& c) {
  SCOPED_TRACE("m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " ta " +
               std::to_string(c.ta) + " tb " + std::to_string(c.tb) + " batch " + std::to_string(c.batch));
  std::mt19937 rng(c.m * 1000 + c.n * 10 + c.k);
  const Layout la = c.ta == CUBLAS_OP_N ? layout(c.m, c.k, c) : layout(c.k, c.m, c);
  const Layout lb = c.tb == CUBLAS_OP_N ? layout(c.k, c.n, c) : layout(c.n, c.k, c);
  const Layout lc = layout(c.m, c.n, c);
  const auto a = random_values(la.elements(c.batch), rng, c.ab), b = random_values(lb.elements(c.batch), rng, c.ab);
  const auto c0 = random_values(lc.elements(c.batch), rng, c.cd), bias = random_values(size_t(c.m), rng, c.bias_type);
  DeviceMatrix da(c.ab, a), db(c.ab, b), dd(c.cd, c0), dbias(c.bias_type, bias);

  cublasLtHandle_t h = nullptr;
  check(cublasLtCreate(&h), "create");
  cublasLtMatmulDesc_t desc = nullptr;
  check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &c.ta, sizeof c.ta), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &c.tb, sizeof c.tb), "TRANSB");
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi, sizeof c.epi), "epilogue");
  const bool has_bias = c.epi == CUBLASLT_EPILOGUE_BIAS || c.epi == CUBLASLT_EPILOGUE_GELU_BIAS;
  const bool has_gelu = c.epi == CUBLASLT_EPILOGUE_GELU || c.epi == CUBLASLT_EPILOGUE_GELU_BIAS;
  if (has_bias) {
    const void* bp = dbias.get();
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp), "bias");
    check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c.bias_type, sizeof c.bias_type),
          "bias type");
  }
  cublasLtMatrixLayout_t lts[3] = {};
  const Layout* ls[3] = {&la, &lb, &lc};
  const cudaDataType_t types[3] = {c.ab, c.ab, c.cd};
  for (int i = 0; i < 3; ++i) {
    check(cublasLtMatrixLayoutCreate(&lts[i], types[i], ls[i]->rows, ls[i]->cols, ls[i]->ld), "layout");
    if (c.batch > 1) {
      check(cublasLtMatrixLayoutSetAttribute(lts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c.batch, sizeof c.batch),
            "batch");
      check(cublasLtMatrixLayoutSetAttribute(lts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &ls[i]->stride,
                                             sizeof ls[i]->stride),
            "stride");
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const uint64_t ws = 1 << 20;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "ws");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  check(cublasLtMatmulAlgoGetHeuristic(h, desc, lts[0], lts[1], lts[2], lts[2], pref, 1, &result, &found), "heuristic");
  ASSERT_EQ(found, 1);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  check(cublasLtMatmul(h, desc, &c.alpha, da.get(), lts[0], db.get(), lts[1], &c.beta, dd.get(), lts[2], dd.get(),
                       lts[2], &result.algo, nullptr, 0, s),
        "matmul");
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  const std::vector<float> d = dd.read();

  for (int bt = 0; bt < c.batch; ++bt)
    for (int j = 0; j < c.n; ++j)
      for (int i = 0; i < c.m; ++i) {
        double sum = 0, mag = 0;
        for (int l = 0; l < c.k; ++l) {
          const double x = c.ta == CUBLAS_OP_N ? a[bt * la.stride + i + size_t(l) * la.ld] : a[bt * la.stride + l + size_t(i) * la.ld];
          const double y = c.tb == CUBLAS_OP_N ? b[bt * lb.stride + l + size_t(j) * lb.ld] : b[bt * lb.stride + j + size_t(l) * lb.ld];
          sum += x * y;
          mag += std::fabs(x * y);
        }
        const size_t at = bt * lc.stride + i + size_t(j) * lc.ld;
        double v = c.alpha * sum + c.beta * double(c0[at]) + (has_bias ? bias[size_t(i)] : 0.0);
        mag = std::fabs(c.alpha) * mag + std::fabs(c.beta * c0[at]) + (has_bias ? std::fabs(bias[size_t(i)]) : 0.0);
        double tol = (c.k + 3) * std::ldexp(mag, -24) * (has_gelu ? 1.13 : 1.0);
        if (has_gelu) v = gelu(v);
        tol += 4 * std::ldexp(std::fabs(v), -24) + 1e-30;
        if (c.cd == CUDA_R_16BF) tol += std::ldexp(std::fabs(v), -8);
        ASSERT_NEAR(d[at], v, tol) << "batch " << bt << " D(" << i << ", " << j << ")";
      }
  // Elements between the matrices (the ld padding, the gaps between batches) are untouched.
  for (int bt = 0; bt < c.batch; ++bt)
    for (int j = 0; j < c.n; ++j)
      for (int i = c.m; i < lc.ld; ++i) {
        const size_t at = bt * lc.stride + i + size_t(j) * lc.ld;
        ASSERT_EQ(d[at], c0[at]);
      }

  cudaStreamDestroy(s);
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto l : lts) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
}

const cublasOperation_t kOps[] = {CUBLAS_OP_N, CUBLAS_OP_T};

TEST(CublasLtTwin, AllTransposesOddSizesF32) {
  for (auto ta : kOps)
    for (auto tb : kOps) {
      run(Case{.ta = ta, .tb = tb, .m = 7, .n = 13, .k = 17});
      run(Case{.ta = ta, .tb = tb, .m = 65, .n = 33, .k = 129});
    }
}

TEST(CublasLtTwin, LeadingDimensionsAboveTheRows) {
  for (auto ta : kOps)
    for (auto tb : kOps) run(Case{.ta = ta, .tb = tb, .m = 9, .n = 11, .k = 5, .pad = 3});
}

TEST(CublasLtTwin, AlphaBeta) {
  run(Case{.m = 7, .n = 13, .k = 17, .alpha = 0.5f, .beta = 1.f});
  run(Case{.ta = CUBLAS_OP_T, .m = 65, .n = 33, .k = 129, .pad = 2, .alpha = -2.f, .beta = 0.25f});
}

TEST(CublasLtTwin, StridedBatch) {
  run(Case{.ta = CUBLAS_OP_T, .m = 7, .n = 13, .k = 17, .pad = 1, .batch = 3, .beta = 0.5f});
  run(Case{.ab = CUDA_R_16BF, .tb = CUBLAS_OP_T, .m = 5, .n = 4, .k = 9, .batch = 2});
}

TEST(CublasLtTwin, BiasAndGeluEpilogues) {
  for (auto epi : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS}) {
    run(Case{.tb = CUBLAS_OP_T, .m = 65, .n = 33, .k = 129, .epi = epi});
    run(Case{.ab = CUDA_R_16BF, .cd = CUDA_R_16BF, .tb = CUBLAS_OP_T, .m = 7, .n = 13, .k = 17, .beta = 0.5f,
             .epi = epi, .bias_type = CUDA_R_16BF});
  }
}

TEST(CublasLtTwin, Bf16OperandsF32AndBf16Results) {
  for (auto ta : kOps)
    for (auto tb : kOps) {
      run(Case{.ab = CUDA_R_16BF, .cd = CUDA_R_32F, .ta = ta, .tb = tb, .m = 65, .n = 33, .k = 129});
      run(Case{.ab = CUDA_R_16BF, .cd = CUDA_R_16BF, .ta = ta, .tb = tb, .m = 7, .n = 13, .k = 17, .pad = 2});
    }
}

// The f32 results 1 + 2^-8 and 1 + 3 2^-8 lie halfway between bf16 neighbours (spacing 2^-7 at
// 1): to nearest even they round down to 1 and up to 1 + 2^-6; 1 + 2^-8 + 2^-16, just above
// halfway, rounds up to 1 + 2^-7.
TEST(CublasLtTwin, Bf16ResultRoundsToNearestEven) {
  // A (3, 3) bf16 with rows [1, x, y]; B (3, 1) = [1, 1, 1]: D = 1 + x + y, exact in f32.
  const float q = std::ldexp(1.f, -8);
  const std::vector<float> a = {1, 1, 1, q, 3 * q, q, 0, 0, std::ldexp(1.f, -16)};  // column-major (3, 3)
  for (float v : a) ASSERT_EQ(from_bf16(to_bf16(v)), v);                         // every operand exact in bf16
  DeviceMatrix da(CUDA_R_16BF, a), db(CUDA_R_16BF, {1, 1, 1}), dd(CUDA_R_16BF, {0, 0, 0});
  cublasLtHandle_t h = nullptr;
  check(cublasLtCreate(&h), "create");
  cublasLtMatmulDesc_t desc = nullptr;
  check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  cublasLtMatrixLayout_t la, lb, ld;
  check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, 3, 3, 3), "A");
  check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, 3, 1, 3), "B");
  check(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, 3, 1, 3), "D");
  const float alpha = 1, beta = 0;
  check(cublasLtMatmul(h, desc, &alpha, da.get(), la, db.get(), lb, &beta, dd.get(), ld, dd.get(), ld, nullptr, nullptr,
                       0, nullptr),
        "matmul");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto d = dd.read();
  EXPECT_EQ(d[0], 1.f);
  EXPECT_EQ(d[1], 1.f + std::ldexp(1.f, -6));
  EXPECT_EQ(d[2], 1.f + std::ldexp(1.f, -7));
  for (auto l : {la, lb, ld}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
}

TEST(CublasLtTwin, RefusesWhatItDoesNotHave) {
  testing::internal::CaptureStderr();
  cublasLtMatmulDesc_t desc = nullptr;
  EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)).find("compute type 77"), std::string::npos);
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasLtEpilogue_t relu = CUBLASLT_EPILOGUE_RELU;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &relu, sizeof relu),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)).find("CUBLASLT_EPILOGUE_RELU"),
            std::string::npos);
  const int64_t wrong_size = 4;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &wrong_size, sizeof wrong_size),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatrixLayout_t l = nullptr;
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_16F, 4, 4, 4), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)).find("CUDA_R_16F"), std::string::npos);
  EXPECT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 4, 3), CUBLAS_STATUS_INVALID_VALUE);  // ld < rows
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("tessera simt: cuBLASLt cublasLtMatmulDescSetAttribute: CUBLASLT_EPILOGUE_RELU"),
            std::string::npos)
      << printed;
  cublasLtMatmulDescDestroy(desc);
}

// Shapes that disagree, and an operand less aligned than the algorithm was chosen for.
TEST(CublasLtTwin, RejectsInconsistentProblems) {
  testing::internal::CaptureStderr();
  DeviceMatrix a(CUDA_R_32F, std::vector<float>(64, 1.f)), b(CUDA_R_32F, std::vector<float>(64, 1.f)),
      d(CUDA_R_32F, std::vector<float>(64, 0.f));
  cublasLtHandle_t h = nullptr;
  cublasLtCreate(&h);
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatrixLayout_t la, lb, lb_wrong, ld;
  cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 4, 3, 4);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 3, 5, 3);
  cublasLtMatrixLayoutCreate(&lb_wrong, CUDA_R_32F, 4, 5, 4);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 4, 5, 4);
  const float alpha = 1, beta = 0;
  EXPECT_EQ(cublasLtMatmul(h, desc, &alpha, a.get(), la, b.get(), lb_wrong, &beta, d.get(), ld, d.get(), ld, nullptr,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulPreferenceCreate(&pref);  // alignments default to 256 bytes
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &r, &found), CUBLAS_STATUS_SUCCESS);
  const float* a_view = static_cast<const float*>(a.get()) + 1;  // 4-byte aligned
  EXPECT_EQ(cublasLtMatmul(h, desc, &alpha, a_view, la, b.get(), lb, &beta, d.get(), ld, d.get(), ld, &r.algo, nullptr,
                           0, nullptr),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)).find("MIN_ALIGNMENT_A"), std::string::npos);
  const uint32_t four = 4;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &four, sizeof four);
  ASSERT_EQ(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &r, &found), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmul(h, desc, &alpha, a_view, la, b.get(), lb, &beta, d.get(), ld, d.get(), ld, &r.algo, nullptr,
                           0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  std::vector<float> host(64);  // not device memory
  EXPECT_EQ(cublasLtMatmul(h, desc, &alpha, host.data(), la, b.get(), lb, &beta, d.get(), ld, d.get(), ld, nullptr,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  testing::internal::GetCapturedStderr();
  cublasLtMatmulPreferenceDestroy(pref);
  for (auto l : {la, lb, lb_wrong, ld}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
}

TEST(CublasLtTwin, Versions) {
  EXPECT_EQ(cublasLtGetVersion(), size_t(CUBLAS_VERSION));
  EXPECT_STREQ(cublasGetStatusString(CUBLAS_STATUS_SUCCESS), "success");
}

}  // namespace
