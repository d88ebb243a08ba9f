// Per-device allocator that counts current and peak bytes per category, and Buffer, the RAII
// owner of one allocation. These counts are what the training log and the memory tests report.
// Freed blocks are cached by size and reused: a training step allocates the same shapes every
// time, and returning them to the OS each step costs page faults on every touch (on a GPU,
// cudaMalloc/cudaFree, which synchronize the device).
//
// A CUDA allocator (Device::cuda(i), TESSERA_CUDA=ON builds) takes device memory with cudaMalloc
// and zero-fills it on its stream. Reusing a freed block is safe because every op that touched it
// was queued on that same stream before the free (stream order): an allocator serves one stream,
// the compute stream of its Exec. Blocks are 256-byte aligned (cudaMalloc's), host ones 64.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

enum class MemCategory : uint8_t { Parameters, Gradients, OptimizerState, Activations, Workspace, Communication };
constexpr int kNumMemCategories = 6;
const char* mem_category_name(MemCategory c);

struct MemCounter {
  size_t current = 0;
  size_t peak = 0;
};

class Allocator {
 public:
  // stream: CUDA only, the stream the memory is used on (null: the device's default stream).
  explicit Allocator(Device device = Device::cpu(), CUstream_st* stream = nullptr);
  ~Allocator() { release_cache(); }
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Aligned (64 bytes on the host, 256 on a device), zero-filled (on a device: queued on the
  // allocator's stream). A device allocation beyond the free memory is an Error naming the bytes,
  // the category and the device, after the cache was given back.
  void* allocate(size_t bytes, MemCategory cat) { return allocate(bytes, cat, true); }
  // zero_fill false: the bytes are whatever the block held (host only; a device block is always
  // zero-filled): for scratch every element of which is written before it is read.
  void* allocate(size_t bytes, MemCategory cat, bool zero_fill);
  void deallocate(void* p, size_t bytes, MemCategory cat);

  const MemCounter& counter(MemCategory cat) const { return counters_[static_cast<int>(cat)]; }
  size_t total_current() const;
  size_t total_peak() const { return total_peak_; }
  void reset_peaks();
  // Bytes held in the cache of freed blocks (not counted as in use), and giving them back.
  size_t cached_bytes() const { return cached_bytes_; }
  void release_cache();
  Device device() const { return device_; }
  std::string summary() const;  // one line: "params 1.2 MiB, grads ..., peak total ..."

 private:
  void* fresh_block(size_t rounded);  // new memory, nullptr when there is none
  void free_block(void* p) noexcept;

  Device device_;
  CUstream_st* stream_ = nullptr;
  std::array<MemCounter, kNumMemCategories> counters_{};
  size_t total_peak_ = 0;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;  // by rounded size
  size_t cached_bytes_ = 0;
};

// Owns one allocation from an Allocator; move-only; freed on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator& alloc, DType dtype, Shape shape, MemCategory cat);
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const Tensor& tensor() const { return tensor_; }
  operator const Tensor&() const { return tensor_; }
  template <typename T> T* ptr() const { return tensor_.ptr<T>(); }
  bool defined() const { return tensor_.defined(); }
  void release();

 private:
  Allocator* alloc_ = nullptr;
  Tensor tensor_;
  size_t bytes_ = 0;
  MemCategory cat_ = MemCategory::Workspace;
};

// Short-lived, uninitialized host bytes for one op (RAII): from `alloc` as Workspace when given
// (Exec::workspace: cached by size, no page faults once a step's shapes have been seen), else the
// heap. Every byte must be written before it is read.
class Scratch {
 public:
  Scratch(Allocator* alloc, size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T> T* as() const { return static_cast<T*>(data_); }

 private:
  Allocator* alloc_;
  size_t bytes_;
  void* data_ = nullptr;
};

std::string format_bytes(size_t bytes);  // "1.50 MiB"

// The process's malloc (glibc) keeps what is freed instead of giving it back to the OS at once: a
// free that leaves more than kHeapTrimBytes at the top of the heap shrinks it, and only blocks of
// kHeapMmapBytes or more are mapped on their own. Libraries allocate scratch per call that the
// Allocator above never sees: MPICH's non-blocking all-gather and reduce-scatter take a temporary
// buffer of the message's size each and free it when done, and with glibc's defaults each free
// shrank the heap and the next call faulted every page in again (27k page faults per step on tp 2 +
// sequence parallelism, a quarter of the step: docs/performance.md). Called once, first thing in
// main(); returns false where the C library has no such settings.
inline constexpr size_t kHeapTrimBytes = size_t{256} << 20, kHeapMmapBytes = size_t{32} << 20;
bool keep_freed_host_memory();

}  // namespace tessera
