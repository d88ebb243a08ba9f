// Per-device allocator that counts current and peak bytes per category, and Buffer, the RAII
// owner of one allocation. These counts are what the training log and the memory tests report.
// Freed blocks are cached by size and reused: a training step allocates the same shapes every
// time, and returning them to the OS each step costs page faults on every touch.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

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
  explicit Allocator(Device device = Device::cpu()) : device_(device) {}
  ~Allocator() { release_cache(); }
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // 64-byte aligned, zero-filled.
  void* allocate(size_t bytes, MemCategory cat);
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
  Device device_;
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

std::string format_bytes(size_t bytes);  // "1.50 MiB"

}  // namespace tessera
