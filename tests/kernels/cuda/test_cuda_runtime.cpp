// The CUDA runtime pieces against what they promise: the device allocator's accounting, cache and
// zero-fill, its out-of-memory Error; copies between host and device; the backend's errors
// (ids out of range read on the device, f64 refused). Skipped where no GPU is visible.
#include <cstring>
#include <limits>
#include <vector>

#include "gpu_testing.h"
#include "kernels/allocator.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gelu.h"
#include "op_testing.h"

namespace tessera::testing {
namespace {

const Exec kGpu = Exec::cuda(0);

std::vector<float> read_floats(const Tensor& t) {
  std::vector<float> host(static_cast<size_t>(t.numel()));
  copy(kGpu, Tensor(host.data(), DType::F32, t.shape), t);
  synchronize(kGpu);
  return host;
}

TEST(CudaAllocator, CountsPerCategoryAndPeakAsTheHostOne) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  {
    Buffer p(alloc, DType::F32, {1000}, MemCategory::Parameters);
    Buffer g(alloc, DType::F32, {1000}, MemCategory::Gradients);
    EXPECT_EQ(p.tensor().device, Device::cuda(0));
    EXPECT_EQ(alloc.counter(MemCategory::Parameters).current, 4000u);
    EXPECT_EQ(alloc.counter(MemCategory::Gradients).current, 4000u);
    EXPECT_EQ(alloc.total_peak(), 8000u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.tensor().data) % 256, 0u);
  }
  EXPECT_EQ(alloc.total_current(), 0u);
  EXPECT_EQ(alloc.total_peak(), 8000u);
  EXPECT_EQ(alloc.cached_bytes(), 2 * 4096u);  // 4000 rounded up to 256 bytes, twice
  alloc.release_cache();
  EXPECT_EQ(alloc.cached_bytes(), 0u);
}

// A freed block comes back for the next request of its size, zero-filled again.
TEST(CudaAllocator, ReusesFreedBlocksZeroFilled) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  void* first = nullptr;
  {
    Buffer b(alloc, DType::F32, {300}, MemCategory::Activations);
    first = b.tensor().data;
    std::vector<float> ones(300, 1.0f);
    copy(kGpu, b, Tensor(ones.data(), DType::F32, {300}));
    EXPECT_EQ(read_floats(b), ones);
  }
  Buffer again(alloc, DType::F32, {300}, MemCategory::Activations);
  EXPECT_EQ(again.tensor().data, first);
  EXPECT_EQ(read_floats(again), std::vector<float>(300, 0.0f));
}

TEST(CudaAllocator, OutOfMemoryIsAnErrorNamingTheRequest) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  expect_error([&] { Buffer huge(alloc, DType::F32, {int64_t(1) << 48}, MemCategory::Activations); },
               {"out of cuda:0 memory", "1024.00 TiB", "acts"});
  Buffer fine(alloc, DType::F32, {10}, MemCategory::Activations);  // the allocator still works
  EXPECT_TRUE(fine.defined());
}

// Host -> device -> device -> host returns the values unchanged, through a stream of our own.
TEST(CudaCopy, RoundTripsThroughTheDeviceOnAStream) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  std::vector<float> host(1237);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.5f * float(i) - 7.0f;
  Buffer a = upload(kGpu, alloc, Tensor(host.data(), DType::F32, {1237}), MemCategory::Workspace);
  Buffer b(alloc, DType::F32, {1237}, MemCategory::Workspace);
  copy(kGpu, b, a);
  EXPECT_EQ(read_floats(b), host);
}

// convert (f32 -> bf16, the weights' bf16 copy in train.dtype = "bf16") on the device gives the
// CPU's bits: round to nearest even, ties both ways, infinities, subnormals and NaNs (kept quiet,
// sign and payload as the CPU's f32_to_bf16), over more elements than one grid-stride pass.
TEST(CudaCopy, ConvertToBf16GivesTheCpusBits) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0x7f800000u, 0xff800000u,
                                0x00008000u, 0x00018000u, 0x80000001u, 0x7fc00001u, 0xffa00000u, 0x00000000u};
  uint32_t x = 12345;
  while (bits.size() < 70001) bits.push_back(x = x * 1664525u + 1013904223u);  // every pattern, NaNs too
  std::vector<float> host(bits.size());
  std::memcpy(host.data(), bits.data(), bits.size() * 4);
  const Shape shape{int64_t(host.size())};
  std::vector<uint16_t> want(host.size()), got(host.size());
  convert(kCpu, Tensor(want.data(), DType::BF16, shape), Tensor(host.data(), DType::F32, shape));
  Buffer src = upload(kGpu, alloc, Tensor(host.data(), DType::F32, shape), MemCategory::Workspace);
  Buffer dst(alloc, DType::BF16, shape, MemCategory::Workspace);
  convert(kGpu, dst, src);
  copy(kGpu, Tensor(got.data(), DType::BF16, shape), dst);
  synchronize(kGpu);
  for (size_t i = 0; i < host.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i << " bits 0x" << std::hex << bits[i];
}

TEST(CudaErrors, TokenAndTargetIdsOutOfRangeAreErrorsNamingThem) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  std::vector<int32_t> ids = {1, 2, 3, 11, 0, 12};  // 11 and 12 outside [0, 11); 11 comes first
  Buffer tokens = upload(kGpu, alloc, Tensor(ids.data(), DType::I32, {2, 3}), MemCategory::Workspace);
  Buffer wte(alloc, DType::F32, {11, 4}, MemCategory::Parameters), out(alloc, DType::F32, {2, 3, 4},
                                                                         MemCategory::Activations);
  expect_error([&] { embedding_forward(kGpu, out, tokens, wte, Tensor(), 0); },
               {"embedding_forward", "token id 11 at (b=1, t=0)", "[0, 11)"});
  Buffer logits(alloc, DType::F32, {6, 11}, MemCategory::Activations);
  Buffer losses(alloc, DType::F32, {6}, MemCategory::Activations), lse(alloc, DType::F32, {6}, MemCategory::Activations);
  expect_error([&] { cross_entropy_forward(kGpu, losses, lse, logits, tokens.tensor().view({6})); },
               {"cross_entropy_forward", "target 11 at row 3"});
}

// B x T above INT_MAX (CUB's item count, int32 positions) is refused before any tensor is read:
// the tensors here are views of a few bytes with the shapes of 2 x 2^30 positions.
TEST(CudaErrors, EmbeddingBackwardRefusesMorePositionsThanAnInt) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  Buffer small(alloc, DType::F32, {64}, MemCategory::Workspace), wte(alloc, DType::F32, {11, 1}, MemCategory::Parameters);
  const int64_t B = 2, T = int64_t(1) << 30;
  const Tensor tokens(small.tensor().data, DType::I32, {B, T}, Device::cuda(0));
  const Tensor dout(small.tensor().data, DType::F32, {B, T, 1}, Device::cuda(0));
  expect_error([&] { embedding_backward(kGpu, wte, Tensor(), dout, tokens, 0); },
               {"embedding_backward", "B x T = 2 x 1073741824 = 2147483648", "2147483647"});
}

TEST(CudaErrors, F64IsTheCpuReferenceOnly) {
  TESSERA_REQUIRE_GPU();
  Allocator alloc(Device::cuda(0));
  Buffer x(alloc, DType::F64, {8}, MemCategory::Activations), y(alloc, DType::F64, {8}, MemCategory::Activations);
  expect_error([&] { gelu_forward(kGpu, y, x); }, {"gelu_forward", "computes in f32", "f64"});
}

}  // namespace
}  // namespace tessera::testing
