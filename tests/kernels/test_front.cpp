// Tests the op fronts (kernels/front.h): every op dispatches on its tensors' device, refuses
// tensors on different devices or a context for another device (naming the op and the argument),
// checks its arguments before any backend, and reports an op without a CUDA implementation. No
// GPU is needed: a front throws before a backend could touch the (fake) device pointers.
#include <functional>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "op_testing.h"

namespace tessera {
using testing::expect_error;
using testing::HostTensor;
using testing::kCpu;

namespace {

constexpr Exec kCuda = Exec::cuda(0);

// A tensor "on" cuda:0: a view of host memory labelled with the device. Fronts never dereference
// it, so it stands for device memory in tests of what they refuse.
template <typename T>
Tensor on_cuda(const HostTensor<T>& h) {
  Tensor t = h.t();
  t.device = Device::cuda(0);
  return t;
}

}  // namespace

TEST(Front, TensorsOnDifferentDevicesNameTheOpAndArgument) {
  HostTensor<float> x({4, 8}), y({4, 8});
  expect_error([&] { gelu_forward(kCpu, on_cuda(y), x.t()); },
               {"gelu_forward: x is on cpu but y on cuda:0", "share a device"});
  HostTensor<float> w({8}), b({8}), mean({4}), rstd({4});
  expect_error([&] { layernorm_forward(kCpu, y.t(), mean.t(), rstd.t(), x.t(), w.t(), on_cuda(b), 1e-5); },
               {"layernorm_forward: b is on cuda:0 but y on cpu"});
  // An undefined optional argument (no bias) has no device and is not compared.
  layernorm_forward(kCpu, y.t(), mean.t(), rstd.t(), x.t(), w.t(), Tensor(), 1e-5);
}

TEST(Front, TheContextMustBeForTheTensorsDevice) {
  HostTensor<float> x({4, 8}), y({4, 8});
  expect_error([&] { gelu_forward(kCuda, y.t(), x.t()); },
               {"gelu_forward: y is on cpu but the execution context is for cuda:0"});
  expect_error([&] { gelu_forward(kCpu, on_cuda(y), on_cuda(x)); },
               {"gelu_forward: y is on cuda:0 but the execution context is for cpu"});
}

// Shapes and dtypes are checked once, in the front, whatever the device: a CUDA call with a bad
// shape reports the shape, as a CPU one does.
TEST(Front, ArgumentsAreCheckedBeforeAnyBackend) {
  HostTensor<float> x({4, 8}), y({4, 9});
  expect_error([&] { gelu_forward(kCuda, on_cuda(y), on_cuda(x)); }, {"gelu_forward: sizes differ", "(4, 9)"});
  HostTensor<float> a({3, 5}), b({6, 2}), c({3, 2});
  expect_error([&] { matmul(kCuda, on_cuda(c), on_cuda(a), on_cuda(b), false, false); }, {"matmul", "b", "(6, 2)"});
}

// Without the CUDA backend every family's front refuses a CUDA tensor, naming the op. With it, every
// op here has a CUDA kernel (the last, attention_merge, came with context parallelism on CUDA) and
// would run on the GPU, and these tensors are host memory: tests/kernels/cuda/ runs them on real
// device memory, so the test has nothing to check in a CUDA build.
TEST(Front, OpsWithoutACudaKernelSaySo) {
  HostTensor<float> x({2, 4, 2, 8}), y({2, 4, 2, 8}), w({8}), r({8}), lse({2, 2, 4}), g({8}), m({8}), v({8});
  HostTensor<float> logits({8, 8}), losses({8}), rows({8});
  HostTensor<int32_t> tokens({2, 4}), targets({8});
  HostTensor<float> wte({8, 8}), emb({2, 4, 8}), mat({8, 8});
  HostTensor<double> out({1});
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"matmul", [&] { matmul(kCuda, on_cuda(mat), on_cuda(mat), on_cuda(mat), false, false); }},
      {"linear_forward", [&] { linear_forward(kCuda, on_cuda(mat), on_cuda(mat), on_cuda(mat), Tensor()); }},
      {"layernorm_forward",
       [&] {
         layernorm_forward(kCuda, on_cuda(mat), on_cuda(rows), on_cuda(r), on_cuda(mat), on_cuda(w), Tensor(), 1e-5);
       }},
      {"rmsnorm_forward", [&] { rmsnorm_forward(kCuda, on_cuda(mat), on_cuda(r), on_cuda(mat), on_cuda(w), 1e-5); }},
      {"gelu_forward", [&] { gelu_forward(kCuda, on_cuda(y), on_cuda(x)); }},
      {"swiglu_forward", [&] { swiglu_forward(kCuda, on_cuda(y), on_cuda(x), on_cuda(x)); }},
      {"rope_forward", [&] { rope_forward(kCuda, on_cuda(y), on_cuda(x), 0, 10000.0); }},
      {"attention_forward",
       [&] { attention_forward(kCuda, on_cuda(y), on_cuda(lse), on_cuda(x), on_cuda(x), on_cuda(x), 0, 0); }},
      {"attention_merge",
       [&] { attention_merge(kCuda, on_cuda(y), on_cuda(lse), on_cuda(y), on_cuda(lse)); }},
      {"embedding_forward",
       [&] { embedding_forward(kCuda, on_cuda(emb), on_cuda(tokens), on_cuda(wte), Tensor(), 0); }},
      {"cross_entropy_forward",
       [&] { cross_entropy_forward(kCuda, on_cuda(losses), on_cuda(rows), on_cuda(logits), on_cuda(targets)); }},
      {"residual_forward", [&] { residual_forward(kCuda, on_cuda(y), on_cuda(x), on_cuda(x)); }},
      {"squared_norm", [&] { squared_norm(kCuda, on_cuda(out), on_cuda(x)); }},
      {"adamw_update", [&] { adamw_update(kCuda, on_cuda(g), on_cuda(g), on_cuda(m), on_cuda(v), AdamWStep{}); }},
  };
  if (cuda_backend_built()) GTEST_SKIP() << "every op here has a CUDA kernel in this build";
  for (const auto& [op, call] : calls) {
    SCOPED_TRACE(op);
    expect_error(call, {op, ": no CUDA implementation in this build"});
  }
}

// copy is the one op across devices: host to device and back run on the device side's context;
// without the CUDA backend that is the no-implementation error, and the context must still match.
TEST(Front, CopyCrossesDevicesOnTheDeviceSidesContext) {
  HostTensor<float> host({6}), dev({6});
  expect_error([&] { copy(kCpu, on_cuda(dev), host.t()); },
               {"copy: dst is on cuda:0 but the execution context is for cpu"});
  expect_error([&] { copy(kCuda, host.t(), host.t()); },
               {"copy: dst is on cpu but the execution context is for cuda:0"});
  HostTensor<float> other({6});
  Tensor elsewhere = other.t();
  elsewhere.device = Device::cuda(1);
  expect_error([&] { copy(kCuda, on_cuda(dev), elsewhere); }, {"copy: src is on cuda:1 but dst on cuda:0"});
  if (cuda_backend_built()) GTEST_SKIP() << "a CUDA build would run these copies on the GPU";
  expect_error([&] { copy(kCuda, on_cuda(dev), host.t()); }, {"copy: no CUDA implementation in this build"});
  expect_error([&] { fill_zero(kCuda, on_cuda(dev)); }, {"fill_zero: no CUDA implementation in this build"});
}

// The host reads: a reduction's result comes back through copy (and a synchronize).
TEST(Front, ReadScalarAndValues) {
  HostTensor<double> v({3});
  v[0] = 1.5;
  v[1] = -2.0;
  v[2] = 4.0;
  EXPECT_EQ(read_values(kCpu, v.t()), (std::vector<double>{1.5, -2.0, 4.0}));
  EXPECT_EQ(read_scalar(kCpu, v.t().slice_rows(2, 3)), 4.0);
  expect_error([&] { read_scalar(kCpu, v.t()); }, {"read_scalar", "expected 1 elements"});
  HostTensor<float> f({1});
  expect_error([&] { read_scalar(kCpu, f.t()); }, {"read_scalar", "f32"});
}

}  // namespace tessera
