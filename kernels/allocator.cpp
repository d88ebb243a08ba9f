// Allocator accounting. CPU memory comes from aligned_alloc, CUDA memory from cudaMalloc
// (kernels/cuda/runtime.h), both behind the same cache and counters.
#include "kernels/allocator.h"

#ifdef TESSERA_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

#include <cstdio>
#include <cstdlib>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <cstring>
#include <sstream>

namespace tessera {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Parameters: return "params";
    case MemCategory::Gradients: return "grads";
    case MemCategory::OptimizerState: return "optim";
    case MemCategory::Activations: return "acts";
    case MemCategory::Workspace: return "workspace";
    case MemCategory::Communication: return "comm";
  }
  return "?";
}

namespace {
// Block sizes: multiples of the alignment, so that a cached block serves any request of its size.
size_t round_up(size_t bytes, Device d) {
  const size_t align = d.is_cpu() ? 64 : 256;
  return (bytes + align - 1) / align * align;
}
}  // namespace

Allocator::Allocator(Device device, CUstream_st* stream) : device_(device), stream_(stream) {
#ifndef TESSERA_WITH_CUDA
  TESSERA_CHECK(device.is_cpu(), "allocator for ", device.str(), ": this build has no CUDA backend (TESSERA_CUDA=OFF)");
#endif
}

void* Allocator::fresh_block(size_t rounded) {
  if (device_.is_cpu()) return std::aligned_alloc(64, rounded);
#ifdef TESSERA_WITH_CUDA
  return cuda::device_malloc(device_.index, rounded);
#else
  return nullptr;  // unreachable: the constructor refused the device
#endif
}

void Allocator::free_block(void* p) noexcept {
  if (device_.is_cpu()) return std::free(p);
#ifdef TESSERA_WITH_CUDA
  cuda::device_free(device_.index, p);
#endif
}

void* Allocator::allocate(size_t bytes, MemCategory cat, bool zero_fill) {
  if (bytes == 0) return nullptr;
  const size_t rounded = round_up(bytes, device_);
  void* p = nullptr;
  auto it = free_blocks_.find(rounded);
  if (it != free_blocks_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= rounded;
  } else {
    p = fresh_block(rounded);
    if (!p && cached_bytes_ > 0) {  // memory is tight: give the cache back and try once more
      release_cache();
      p = fresh_block(rounded);
    }
    TESSERA_CHECK(p != nullptr, "out of ", device_.is_cpu() ? "host" : device_.str(), " memory allocating ",
                  format_bytes(bytes), " for ", mem_category_name(cat), " (in use: ", summary(), ")");
  }
  if (device_.is_cpu()) {
    if (zero_fill) std::memset(p, 0, rounded);
  } else {
#ifdef TESSERA_WITH_CUDA
    cuda::device_zero(device_.index, p, rounded, stream_);
#endif
  }
  MemCounter& c = counters_[static_cast<int>(cat)];
  c.current += bytes;
  if (c.current > c.peak) c.peak = c.current;
  size_t total = total_current();
  if (total > total_peak_) total_peak_ = total;
  return p;
}

void Allocator::deallocate(void* p, size_t bytes, MemCategory cat) {
  if (!p) return;
  const size_t rounded = round_up(bytes, device_);
  free_blocks_[rounded].push_back(p);
  cached_bytes_ += rounded;
  counters_[static_cast<int>(cat)].current -= bytes;
}

void Allocator::release_cache() {
  for (auto& [size, blocks] : free_blocks_)
    for (void* p : blocks) free_block(p);
  free_blocks_.clear();
  cached_bytes_ = 0;
}

size_t Allocator::total_current() const {
  size_t t = 0;
  for (const auto& c : counters_) t += c.current;
  return t;
}

void Allocator::reset_peaks() {
  for (auto& c : counters_) c.peak = c.current;
  total_peak_ = total_current();
}

std::string Allocator::summary() const {
  std::ostringstream os;
  for (int i = 0; i < kNumMemCategories; ++i) {
    const MemCounter& c = counters_[i];
    if (c.peak == 0) continue;
    os << mem_category_name(static_cast<MemCategory>(i)) << " " << format_bytes(c.current) << ", ";
  }
  os << "peak " << format_bytes(total_peak_);
  return os.str();
}

Buffer::Buffer(Allocator& alloc, DType dtype, Shape shape, MemCategory cat)
    : alloc_(&alloc), bytes_(static_cast<size_t>(shape.numel()) * dtype_size(dtype)), cat_(cat) {
  tensor_ = Tensor(alloc.allocate(bytes_, cat), dtype, shape, alloc.device());
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    alloc_ = o.alloc_;
    tensor_ = o.tensor_;
    bytes_ = o.bytes_;
    cat_ = o.cat_;
    o.alloc_ = nullptr;
    o.tensor_ = Tensor();
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::release() {
  if (alloc_) alloc_->deallocate(tensor_.data, bytes_, cat_);
  alloc_ = nullptr;
  tensor_ = Tensor();
  bytes_ = 0;
}

Scratch::Scratch(Allocator* alloc, size_t bytes) : alloc_(alloc), bytes_(bytes) {
  TESSERA_CHECK(!alloc || alloc->device().is_cpu(), "Scratch is host memory; the workspace allocator is on ",
                alloc->device().str());
  data_ = alloc ? alloc->allocate(bytes, MemCategory::Workspace, false) : ::operator new(bytes == 0 ? 1 : bytes);
}

Scratch::~Scratch() {
  if (alloc_)
    alloc_->deallocate(data_, bytes_, MemCategory::Workspace);
  else
    ::operator delete(data_);
}

bool keep_freed_host_memory() {
#if defined(__GLIBC__)
  // Setting either turns off glibc's dynamic thresholds, which would otherwise move them back.
  return mallopt(M_TRIM_THRESHOLD, int(kHeapTrimBytes)) == 1 && mallopt(M_MMAP_THRESHOLD, int(kHeapMmapBytes)) == 1;
#else
  return false;
#endif
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace tessera
