// ParameterStore: registration, flat allocation and layout-independent initialization.
#include "model/parameters.h"

#include "kernels/elementwise.h"
#include "kernels/philox.h"

#include <algorithm>
#include <type_traits>

namespace tessera {

ParameterStore::ParameterStore(Allocator& alloc, DType dtype, ShardLayout layout)
    : alloc_(alloc), dtype_(dtype), layout_(layout) {
  TESSERA_CHECK(dtype == DType::F32 || dtype == DType::F64, "parameters must be f32 or f64, got ", dtype_name(dtype));
}

int ParameterStore::add(ParamSpec spec) {
  TESSERA_CHECK(!finalized_, "parameter ", spec.name, " registered after finalize()");
  TESSERA_CHECK(!by_name_.count(spec.name), "parameter ", spec.name, " registered twice");
  ParamEntry e;
  e.local_shape = spec.global_shape;
  if (spec.shard.axis == GridAxis::Tp && layout_.tp_size > 1) {
    int d = spec.shard.dim;
    int64_t global = spec.global_shape[d];
    TESSERA_CHECK(spec.shard.padded || global % layout_.tp_size == 0, "parameter ", spec.name, " dimension ", d, " (",
                  global, ") is not divisible by tensor-parallel size ", layout_.tp_size);
    e.local_shape[d] = (global + layout_.tp_size - 1) / layout_.tp_size;
    e.shard_start = e.local_shape[d] * layout_.tp_rank;
    e.shard_valid = std::clamp<int64_t>(global - e.shard_start, 0, e.local_shape[d]);
  } else if (spec.shard.axis != GridAxis::None) {
    e.shard_valid = spec.global_shape[spec.shard.dim];
  }
  e.offset = total_;
  total_ += e.local_shape.numel();
  e.spec = std::move(spec);
  int id = static_cast<int>(entries_.size());
  by_name_[e.spec.name] = id;
  entries_.push_back(std::move(e));
  return id;
}

void ParameterStore::freeze(int id) {
  TESSERA_CHECK(!finalized_, "parameter ", entry(id).spec.name, " frozen after finalize()");
  entries_.at(static_cast<size_t>(id)).frozen = true;
}

void ParameterStore::finalize(int64_t pad_multiple) {
  TESSERA_CHECK(!finalized_, "ParameterStore::finalize() called twice");
  TESSERA_CHECK(pad_multiple >= 1, "ParameterStore::finalize: pad_multiple = ", pad_multiple);
  // Frozen without a gradient, frozen with one, then trainable, each in registration order.
  int64_t at = 0;
  auto place = [&](auto&& belongs) {
    for (ParamEntry& e : entries_)
      if (belongs(e)) e.offset = at, at += e.local_shape.numel();
  };
  place([](const ParamEntry& e) { return !e.has_grad(); });
  no_grad_total_ = at;
  place([](const ParamEntry& e) { return e.frozen && e.has_grad(); });
  frozen_total_ = at;
  place([](const ParamEntry& e) { return !e.frozen; });
  const int64_t trainable = total_ - frozen_total_;
  const int64_t padded = frozen_total_ + (trainable + pad_multiple - 1) / pad_multiple * pad_multiple;
  params_ = Buffer(alloc_, dtype_, {padded}, MemCategory::Parameters);
  grads_ = Buffer(alloc_, dtype_, {padded - no_grad_total_}, MemCategory::Gradients);
  flat_params_ = params_.tensor().slice_rows(0, total_);
  flat_grads_ = grads_.tensor().slice_rows(0, total_ - no_grad_total_);
  finalized_ = true;
}

Tensor ParameterStore::trainable_flat_compute() const {
  if (!compute_.defined()) return Tensor();
  return compute_.tensor().slice_rows(frozen_total_, total_);
}

Tensor ParameterStore::padded_trainable_flat_params() const {
  return params_.tensor().slice_rows(frozen_total_, params_.tensor().numel());
}

Tensor ParameterStore::padded_trainable_flat_grads() const {
  return grads_.tensor().slice_rows(frozen_total_ - no_grad_total_, grads_.tensor().numel());
}

Tensor ParameterStore::param(int id) const {
  const ParamEntry& e = entry(id);
  TESSERA_CHECK(finalized_, "parameter ", e.spec.name, " used before finalize()");
  return Tensor(static_cast<char*>(params_.tensor().data) + e.offset * dtype_size(dtype_), dtype_, e.local_shape,
                alloc_.device());
}

Tensor ParameterStore::grad(int id) const {
  const ParamEntry& e = entry(id);
  TESSERA_CHECK(finalized_, "gradient of ", e.spec.name, " used before finalize()");
  if (!e.has_grad()) return Tensor();
  return Tensor(static_cast<char*>(grads_.tensor().data) + (e.offset - no_grad_total_) * dtype_size(dtype_), dtype_,
                e.local_shape,
                alloc_.device());
}

void ParameterStore::enable_compute_copy(DType dt) {
  TESSERA_CHECK(finalized_, "ParameterStore::enable_compute_copy before finalize()");
  TESSERA_CHECK(dt == DType::BF16 && dtype_ == DType::F32, "a ", dtype_name(dt), " compute copy of ",
                dtype_name(dtype_), " parameters is not supported (bf16 of f32 only)");
  compute_ = Buffer(alloc_, dt, params_.tensor().shape, MemCategory::Parameters);
}

void ParameterStore::refresh_compute_copy(const Exec& ex) {
  if (compute_.defined()) convert(ex, compute_.tensor(), params_.tensor());
}

Tensor ParameterStore::compute_param(int id) const {
  if (!compute_.defined()) return param(id);
  const ParamEntry& e = entry(id);
  const DType dt = compute_.tensor().dtype;
  return Tensor(static_cast<char*>(compute_.tensor().data) + e.offset * dtype_size(dt), dt, e.local_shape,
                alloc_.device());
}

int ParameterStore::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

int64_t ParameterStore::global_numel() const {
  int64_t n = 0;
  for (const ParamEntry& e : entries_)
    if (!e.spec.stage_copy) n += e.spec.global_shape.numel();
  return n;
}

void ParameterStore::zero_grads(const Exec& ex) { fill_zero(ex, grads_.tensor()); }  // padding included

Shape ParamEntry::stored_shape() const {
  Shape s = local_shape;
  if (spec.shard.axis != GridAxis::None) s[spec.shard.dim] = shard_valid;
  return s;
}

bool ParamEntry::is_padding(int64_t local) const {
  if (!spec.shard.padded || spec.shard.axis == GridAxis::None) return false;
  const int d = spec.shard.dim;
  int64_t inner = 1;
  for (int i = d + 1; i < local_shape.ndim(); ++i) inner *= local_shape[i];
  return (local / inner) % local_shape[d] >= shard_valid;
}

int64_t global_index(const ParamEntry& e, int64_t local) {
  const Shape& ls = e.local_shape;
  const Shape& gs = e.spec.global_shape;
  int64_t g = 0, rem = local, stride_l = ls.numel();
  for (int d = 0; d < ls.ndim(); ++d) {
    stride_l /= ls[d];
    int64_t i = rem / stride_l;
    rem -= i * stride_l;
    if (d == e.spec.shard.dim && e.spec.shard.axis != GridAxis::None) i += e.shard_start;
    g = g * gs[d] + i;
  }
  return g;
}

// Element i of e is v(i) = init value at global index global_index(e, i) (0 in padding rows),
// drawn on the host into `staging` (one chunk at a time: it holds a few MiB, not the largest
// parameter) and copied to the parameter on its device.
void ParameterStore::initialize_entry(const Exec& ex, int id, uint64_t seed, const Tensor& staging) {
  const ParamEntry& e = entry(id);
  const int64_t n = e.local_shape.numel(), chunk = staging.numel();
  const philox::Key key = philox::make_key(seed, e.spec.name.c_str());
  const Tensor dst = param(id).view({n});
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t len = std::min(chunk, n - begin);
    auto fill = [&](auto* p) {
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < len; ++j) {
        const int64_t i = begin + j;
        double v = 0.0;
        if (e.is_padding(i)) {
          p[j] = 0;
          continue;
        }
        switch (e.spec.init) {
          case InitKind::Zeros: v = 0.0; break;
          case InitKind::Ones: v = 1.0; break;
          case InitKind::Normal:
            v = e.spec.init_std * philox::normal(key, static_cast<uint64_t>(global_index(e, i)));
            break;
          case InitKind::Uniform:
            v = e.spec.init_std * philox::uniform_symmetric(key, static_cast<uint64_t>(global_index(e, i)));
            break;
        }
        p[j] = static_cast<std::remove_pointer_t<decltype(p)>>(v);
      }
    };
    if (dtype_ == DType::F32)
      fill(staging.ptr<float>());
    else
      fill(staging.ptr<double>());
    // A host source may be reused as soon as copy returns (kernels/elementwise.h).
    copy(ex, dst.slice_rows(begin, begin + len), staging.slice_rows(0, len));
  }
}

void ParameterStore::initialize(const Exec& ex, uint64_t seed) {
  TESSERA_CHECK(finalized_, "ParameterStore::initialize() before finalize()");
  // Host staging: 1 Mi elements, or the largest parameter when smaller.
  int64_t largest = 0;
  for (const ParamEntry& e : entries_) largest = std::max(largest, e.local_shape.numel());
  Allocator host(Device::cpu());
  const Buffer staging(host, dtype_, {std::min<int64_t>(largest, int64_t(1) << 20)}, MemCategory::Workspace);
  for (int id = 0; id < size(); ++id) initialize_entry(ex, id, seed, staging);
}

}  // namespace tessera
