// The cuBLASLt GEMM's paths that the public matmul/Linear API does not reach yet (the op cases
// cover those): bf16 inputs with fp32 accumulation into an fp32 or a bf16 result, and the bias and
// GELU epilogues, each against the CPU's double reference on the same (bf16-rounded) values.
// Skipped where no GPU is visible.
#include <string>
#include <tuple>
#include <vector>

#include "gpu_testing.h"
#include "kernels/allocator.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/elementwise.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"
#include "op_testing.h"

namespace tessera::testing {
namespace {

const Exec kGpu = Exec::cuda(0);

// A device tensor of dtype dt holding x's values (which the caller has made representable).
Buffer to_device(Allocator& alloc, const HostTensor<double>& x, DType dt) {
  if (dt == DType::BF16) {
    std::vector<uint16_t> h(static_cast<size_t>(x.numel()));
    for (int64_t i = 0; i < x.numel(); ++i) h[size_t(i)] = bf16_bits(float(x[i]));
    return upload(kGpu, alloc, Tensor(h.data(), DType::BF16, x.shape()), MemCategory::Workspace);
  }
  std::vector<float> h(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) h[size_t(i)] = float(x[i]);
  return upload(kGpu, alloc, Tensor(h.data(), DType::F32, x.shape()), MemCategory::Workspace);
}

HostTensor<double> to_host(const Tensor& t) {
  HostTensor<double> out(t.shape);
  if (t.dtype == DType::BF16) {
    std::vector<uint16_t> h(static_cast<size_t>(t.numel()));
    copy(kGpu, Tensor(h.data(), DType::BF16, t.shape), t);
    synchronize(kGpu);
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = bf16_value(h[size_t(i)]);
  } else {
    std::vector<float> h(static_cast<size_t>(t.numel()));
    copy(kGpu, Tensor(h.data(), DType::F32, t.shape), t);
    synchronize(kGpu);
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = h[size_t(i)];
  }
  return out;
}

// x rounded to bf16 (kept as double): the inputs both paths see.
HostTensor<double> bf16_rounded(HostTensor<double> x) {
  for (int64_t i = 0; i < x.numel(); ++i) x[i] = bf16_value(bf16_bits(float(x[i])));
  return x;
}

// y (M, N) = x (M, K) w (N, K)^T [+ bias] [then GELU] on the CPU's double path.
HostTensor<double> reference_linear(const HostTensor<double>& x, const HostTensor<double>& w,
                                    const HostTensor<double>* bias, bool gelu) {
  const int64_t M = x.shape()[0], N = w.shape()[0];
  HostTensor<double> y({M, N});
  linear_forward(Exec::cpu(), y.t(), x.t(), w.t(), bias ? bias->t() : Tensor());
  if (gelu) gelu_forward(Exec::cpu(), y.t(), y.t());
  return y;
}

struct Shapes {
  int64_t M = 133, N = 97, K = 261;  // no multiple of a tile
};

// bf16 products are exact in fp32 (8-bit significands), so with fp32 accumulation only the K = 261
// additions round: as the fp32 GEMM, ~sqrt(K) eps typically, K eps = 1.6e-5 at worst. 2e-5.
TEST(CudaGemm, Bf16InputsAccumulateInFp32) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  Shapes s;
  const HostTensor<double> x = bf16_rounded(HostTensor<double>::uniform({s.M, s.K}, 1, -1, 1));
  const HostTensor<double> w = bf16_rounded(HostTensor<double>::uniform({s.N, s.K}, 2, -1, 1));
  Buffer xd = to_device(alloc, x, DType::BF16), wd = to_device(alloc, w, DType::BF16);
  Buffer y(alloc, DType::F32, {s.M, s.N}, MemCategory::Workspace);
  cuda::gemm("test", kGpu, cuda::GemmArgs{y, xd, wd, false, true, 1.0, 0.0, Tensor(), cuda::GemmEpilogue::None});
  EXPECT_LE(max_rel_error(to_host(y), reference_linear(x, w, nullptr, false)), 2e-5);
}

// As above, then one rounding to bf16 of each output: 2^-9 = 2e-3 relative to the element, at
// most that of the largest. 4e-3.
TEST(CudaGemm, Bf16Result) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  Shapes s;
  const HostTensor<double> x = bf16_rounded(HostTensor<double>::uniform({s.M, s.K}, 3, -1, 1));
  const HostTensor<double> w = bf16_rounded(HostTensor<double>::uniform({s.N, s.K}, 4, -1, 1));
  Buffer xd = to_device(alloc, x, DType::BF16), wd = to_device(alloc, w, DType::BF16);
  Buffer y(alloc, DType::BF16, {s.M, s.N}, MemCategory::Workspace);
  cuda::gemm("test", kGpu, cuda::GemmArgs{y, xd, wd, false, true, 1.0, 0.0, Tensor(), cuda::GemmEpilogue::None});
  EXPECT_LE(max_rel_error(to_host(y), reference_linear(x, w, nullptr, false)), 4e-3);
}

// fp32 GEMM (K = 261: 2e-5 as above) with the bias epilogue, and with GELU after it: GELU is
// well conditioned (its float evaluation a few ulps, the gelu op case's 2e-6), so 2e-5 for both.
// cuBLASLt documents its GELU as the tanh approximation, which is GPT-2's and the CPU's.
TEST(CudaGemm, BiasAndGeluEpilogues) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  Shapes s;
  const HostTensor<double> x = float_rounded(HostTensor<double>::uniform({s.M, s.K}, 5, -1, 1));
  const HostTensor<double> w = float_rounded(HostTensor<double>::uniform({s.N, s.K}, 6, -1, 1));
  const HostTensor<double> b = float_rounded(HostTensor<double>::uniform({s.N}, 7, -1, 1));
  Buffer xd = to_device(alloc, x, DType::F32), wd = to_device(alloc, w, DType::F32), bd = to_device(alloc, b, DType::F32);
  for (const auto& [epi, gelu, name] :
       {std::tuple{cuda::GemmEpilogue::Bias, false, "bias"}, std::tuple{cuda::GemmEpilogue::GeluBias, true, "gelu_bias"}}) {
    Buffer y(alloc, DType::F32, {s.M, s.N}, MemCategory::Workspace);
    cuda::gemm("test", kGpu, cuda::GemmArgs{y, xd, wd, false, true, 1.0, 0.0, bd, epi});
    EXPECT_LE(max_rel_error(to_host(y), reference_linear(x, w, &b, gelu)), 2e-5) << name;
  }
}

}  // namespace
}  // namespace tessera::testing
