// Tests kernels/allocator.h: per-category accounting, peaks, zero-fill and block reuse.
#include "kernels/allocator.h"

#include <cstring>

#include "testing.h"

namespace tessera {

TEST(Allocator, CountsCurrentAndPeakPerCategory) {
  Allocator alloc;
  {
    Buffer a(alloc, DType::F32, {10, 10}, MemCategory::Activations);
    Buffer b(alloc, DType::F64, {5}, MemCategory::Gradients);
    EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 400u);
    EXPECT_EQ(alloc.counter(MemCategory::Gradients).current, 40u);
    EXPECT_EQ(alloc.total_current(), 440u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.tensor().data) % 64, 0u);
  }
  EXPECT_EQ(alloc.total_current(), 0u);
  EXPECT_EQ(alloc.counter(MemCategory::Activations).peak, 400u);
  EXPECT_EQ(alloc.total_peak(), 440u);
  alloc.reset_peaks();
  EXPECT_EQ(alloc.total_peak(), 0u);
}

TEST(Allocator, ReusesFreedBlocksZeroFilled) {
  Allocator alloc;
  void* first = nullptr;
  {
    Buffer a(alloc, DType::F32, {16}, MemCategory::Workspace);
    first = a.tensor().data;
    for (int i = 0; i < 16; ++i) a.ptr<float>()[i] = 1.0f;
  }
  EXPECT_EQ(alloc.cached_bytes(), 64u);
  Buffer b(alloc, DType::F32, {16}, MemCategory::Activations);
  EXPECT_EQ(b.tensor().data, first);  // same size: the cached block comes back
  for (int i = 0; i < 16; ++i) EXPECT_EQ(b.ptr<float>()[i], 0.0f);
  EXPECT_EQ(alloc.cached_bytes(), 0u);
  EXPECT_EQ(alloc.counter(MemCategory::Activations).current, 64u);
}

TEST(Allocator, BufferMovesOwnership) {
  Allocator alloc;
  Buffer a(alloc, DType::F32, {8}, MemCategory::Parameters);
  Buffer b = std::move(a);
  EXPECT_FALSE(a.defined());
  EXPECT_TRUE(b.defined());
  b.release();
  EXPECT_EQ(alloc.total_current(), 0u);
}

// Scratch (an op's short-lived buffer): from an allocator it is Workspace while it lives, comes back
// to the cache at its end, and the next one of the same size gets the same block as it was (not
// zero-filled: every byte is the op's to write); without an allocator it is heap memory.
TEST(Allocator, ScratchIsCachedWorkspaceNotZeroFilled) {
  Allocator alloc;
  void* first = nullptr;
  {
    Scratch s(&alloc, 100);
    first = s.as<void>();
    EXPECT_EQ(alloc.counter(MemCategory::Workspace).current, 100u);
    std::memset(s.as<unsigned char>(), 0xab, 100);
  }
  EXPECT_EQ(alloc.counter(MemCategory::Workspace).current, 0u);
  EXPECT_EQ(alloc.counter(MemCategory::Workspace).peak, 100u);
  {
    Scratch again(&alloc, 100);
    EXPECT_EQ(again.as<void>(), first);
    EXPECT_EQ(again.as<unsigned char>()[99], 0xab);
  }
  Buffer zeroed(alloc, DType::F32, {25}, MemCategory::Activations);  // a Buffer is still zero-filled
  EXPECT_EQ(zeroed.tensor().data, first);
  EXPECT_EQ(static_cast<unsigned char*>(zeroed.tensor().data)[99], 0);
  Scratch heap(nullptr, 100);
  std::memset(heap.as<unsigned char>(), 1, 100);
  EXPECT_EQ(alloc.counter(MemCategory::Workspace).current, 0u);
}

// A CUDA allocator where it cannot work says why: without the backend at construction; in a CUDA
// build on a machine without a GPU at the first allocation (CUDA's own message). Where a GPU is
// visible, tests/kernels/cuda/ tests the real thing.
TEST(Allocator, CudaWithoutABackendOrADeviceIsAnError) {
  if (!cuda_backend_built()) {
    try {
      Allocator alloc(Device::cuda(0));
      ADD_FAILURE() << "no Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("allocator for cuda:0: this build has no CUDA backend"), std::string::npos)
          << e.what();
    }
    return;
  }
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: tests/kernels/cuda/ covers the device allocator";
  Allocator alloc(Device::cuda(0));
  try {
    Buffer b(alloc, DType::F32, {8}, MemCategory::Activations);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device_malloc: "), std::string::npos) << e.what();
  }
  EXPECT_EQ(alloc.total_current(), 0u);
}

}  // namespace tessera
