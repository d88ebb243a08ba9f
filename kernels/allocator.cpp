// Allocator accounting. CPU memory comes from aligned_alloc; a CUDA allocator plugs in here later
// with the same counters.
#include "kernels/allocator.h"

#include <cstdio>
#include <cstdlib>
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
size_t round_up(size_t bytes) { return (bytes + 63) / 64 * 64; }
}  // namespace

void* Allocator::allocate(size_t bytes, MemCategory cat) {
  TESSERA_CHECK(device_.is_cpu(), "allocator for ", device_.str(), " is not built");
  if (bytes == 0) return nullptr;
  const size_t rounded = round_up(bytes);
  void* p = nullptr;
  auto it = free_blocks_.find(rounded);
  if (it != free_blocks_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= rounded;
  } else {
    p = std::aligned_alloc(64, rounded);
    if (!p && cached_bytes_ > 0) {  // memory is tight: give the cache back and try once more
      release_cache();
      p = std::aligned_alloc(64, rounded);
    }
    TESSERA_CHECK(p != nullptr, "out of host memory allocating ", format_bytes(bytes), " for ",
                  mem_category_name(cat));
  }
  std::memset(p, 0, rounded);
  MemCounter& c = counters_[static_cast<int>(cat)];
  c.current += bytes;
  if (c.current > c.peak) c.peak = c.current;
  size_t total = total_current();
  if (total > total_peak_) total_peak_ = total;
  return p;
}

void Allocator::deallocate(void* p, size_t bytes, MemCategory cat) {
  if (!p) return;
  const size_t rounded = round_up(bytes);
  free_blocks_[rounded].push_back(p);
  cached_bytes_ += rounded;
  counters_[static_cast<int>(cat)].current -= bytes;
}

void Allocator::release_cache() {
  for (auto& [size, blocks] : free_blocks_)
    for (void* p : blocks) std::free(p);
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
