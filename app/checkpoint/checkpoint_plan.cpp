// Slice geometry and the write plan. Exact cover is checked as total volume = numel plus pairwise
// disjoint boxes, with a sweep over dim 0 so that many row-wise shards stay cheap to compare.
#include "app/checkpoint/checkpoint_plan.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "parallel/mpi.h"

namespace tessera::ckpt {

// ---- boxes and selections ----

int64_t Box::volume() const {
  int64_t v = 1;
  for (int64_t c : count) v *= c;
  return v;
}

bool Box::overlaps(const Box& o) const {
  for (size_t i = 0; i < start.size(); ++i)
    if (start[i] + count[i] <= o.start[i] || o.start[i] + o.count[i] <= start[i]) return false;
  return volume() > 0 && o.volume() > 0;
}

namespace {

std::string range(int64_t begin, int64_t end) {
  std::string out = "[";
  out += std::to_string(begin);
  out += ", ";
  out += std::to_string(end);
  return out + ")";
}

// Elements [begin, end) of the row-major flattening of `g` as boxes: at each position, the
// coarsest block aligned there (whole trailing dimensions, a run along one dimension, single
// indices before it). At most 2 ndim - 1 boxes.
std::vector<Box> flat_boxes(const Shape& g, int64_t begin, int64_t end) {
  const int nd = g.ndim();
  std::vector<int64_t> stride(static_cast<size_t>(nd), 1);
  for (int d = nd - 2; d >= 0; --d) stride[d] = stride[d + 1] * g[d + 1];
  std::vector<Box> out;
  while (begin < end) {
    std::vector<int64_t> idx(static_cast<size_t>(nd));
    for (int d = 0; d < nd; ++d) idx[d] = (begin / stride[d]) % g[d];
    int d = nd - 1;
    while (d > 0 && idx[d] == 0) --d;  // idx[k] = 0 for all k > d: aligned to stride[d]
    int64_t n = 0;
    for (; d < nd; ++d)
      if ((n = std::min(g[d] - idx[d], (end - begin) / stride[d])) > 0) break;
    Box b;
    for (int k = 0; k < nd; ++k) {
      b.start.push_back(idx[k]);
      b.count.push_back(k < d ? 1 : k == d ? n : g[k]);
    }
    out.push_back(std::move(b));
    begin += n * stride[d];
  }
  return out;
}

}  // namespace

std::string selection_problem(const Shape& g, int dim, int64_t start, const Shape& local) {
  if (dim == TensorSlice::kWhole) {
    if (local.ndim() != 0 && !(local == g)) return "shape " + local.str() + " was asked for";
    return "";
  }
  if (dim == TensorSlice::kFlat) {
    if (local.ndim() != 1) return "a flat slice needs a one-dimensional shape, not " + local.str();
    if (start < 0 || local[0] < 0 || start + local[0] > g.numel())
      return "the flat slice " + range(start, start + local[0]) + " is out of range";
    return "";
  }
  if (dim < 0 || dim >= g.ndim()) return "slice dimension " + std::to_string(dim) + " is out of range";
  bool fits = local.ndim() == g.ndim();
  for (int i = 0; fits && i < g.ndim(); ++i) fits = i == dim || local[i] == g[i];
  if (!fits) return "a slice of shape " + local.str() + " along dimension " + std::to_string(dim) + " was asked for";
  if (start < 0 || local[dim] < 0 || start + local[dim] > g[dim])
    return "slice " + range(start, start + local[dim]) + " along dimension " + std::to_string(dim) + " is out of range";
  return "";
}

int64_t selection_size(const Shape& g, int dim, const Shape& local) {
  return dim == TensorSlice::kWhole ? g.numel() : local.numel();
}

std::vector<Box> selection_boxes(const Shape& g, int dim, int64_t start, const Shape& local) {
  if (dim == TensorSlice::kFlat) return flat_boxes(g, start, start + local[0]);
  Box b;
  for (int i = 0; i < g.ndim(); ++i) {
    b.start.push_back(i == dim ? start : 0);
    b.count.push_back(i == dim ? local[i] : g[i]);
  }
  return {b};
}

std::string path_problem(const std::string& path) {
  if (path.size() < 2 || path.front() != '/' || path.back() == '/' || path.find("//") != std::string::npos)
    return "path \"" + path + "\" must be absolute, like /model/wte.weight";
  if (path == "/meta" || path.rfind("/meta/", 0) == 0) return "path " + path + " is inside /meta, which is reserved";
  return "";
}

// ---- the write plan ----

size_t DatasetPlan::rounds() const {
  size_t r = 0;
  for (const auto& w : writes) r = std::max(r, w.size());
  return r;
}

namespace {

// "" when the slice is consistent, else what is wrong with it.
std::string slice_problem(const TensorSlice& s) {
  if (std::string e = path_problem(s.path); !e.empty()) return "tensor " + e;
  const Shape& g = s.global_shape;
  const std::string name = "tensor " + s.path + " " + g.str() + ": ";
  if (g.ndim() < 1) return name + "tensors need at least one dimension";
  for (int i = 0; i < g.ndim(); ++i)
    if (g[i] <= 0) return name + "every dimension must be positive";
  if (s.dim == TensorSlice::kWhole && s.local_shape.ndim() != 0 && !(s.local_shape == g))
    return name + "a whole-tensor slice has local shape " + s.local_shape.str();
  if (std::string e = selection_problem(g, s.dim, s.start, s.local_shape); !e.empty()) return name + e;
  if (s.write && selection_size(g, s.dim, s.local_shape) > 0 && s.data == nullptr) return name + "slice to write has no data";
  return "";
}

std::string encode_slices(const std::vector<TensorSlice>& slices) {
  ByteWriter w;
  w.i64(static_cast<int64_t>(slices.size()));
  for (const TensorSlice& s : slices) {
    w.str(s.path);
    w.shape(s.global_shape);
    w.i64(s.write ? 1 : 0);
    const auto boxes = selection_boxes(s.global_shape, s.dim, s.start, s.local_shape);
    w.i64(static_cast<int64_t>(boxes.size()));
    for (const Box& b : boxes)
      for (size_t i = 0; i < b.start.size(); ++i) {
        w.i64(b.start[i]);
        w.i64(b.count[i]);
      }
  }
  return w.bytes();
}

// Adds one rank's slices to the plan; "" or the first inconsistency with other ranks.
std::string add_rank_slices(WritePlan& plan, const std::string& bytes, int rank, int nranks) {
  ByteReader r(bytes);
  for (int64_t n = r.i64(); n > 0; --n) {
    const std::string path = r.str();
    const Shape shape = r.shape();
    const bool write = r.i64() != 0;
    std::vector<Box> boxes(static_cast<size_t>(r.i64()));
    for (Box& b : boxes)
      for (int i = 0; i < shape.ndim(); ++i) {
        b.start.push_back(r.i64());
        b.count.push_back(r.i64());
      }
    auto [it, fresh] = plan.try_emplace(path, DatasetPlan{shape, std::vector<std::vector<std::vector<Box>>>(nranks)});
    if (!fresh && !(it->second.shape == shape))
      return "tensor " + path + " is declared with shape " + it->second.shape.str() + " and, on rank " +
             std::to_string(rank) + ", " + shape.str();
    if (write) it->second.writes[static_cast<size_t>(rank)].push_back(std::move(boxes));
  }
  return "";
}

// Each element of each tensor must be written by exactly one slice: a gap would leave garbage in
// the file, an overlap means two replicas both think they own the data.
std::string cover_problem(const std::string& path, const DatasetPlan& d) {
  struct Owned {
    const Box* box;
    int rank;
  };
  std::vector<Owned> all;
  int64_t total = 0;
  for (size_t rank = 0; rank < d.writes.size(); ++rank)
    for (const auto& selection : d.writes[rank])
      for (const Box& b : selection) {
        all.push_back({&b, static_cast<int>(rank)});
        total += b.volume();
      }
  std::sort(all.begin(), all.end(), [](const Owned& a, const Owned& b) { return a.box->start[0] < b.box->start[0]; });
  for (size_t i = 0; i < all.size(); ++i) {
    const int64_t end0 = all[i].box->start[0] + all[i].box->count[0];
    for (size_t j = i + 1; j < all.size() && all[j].box->start[0] < end0; ++j)
      if (all[i].box->overlaps(*all[j].box))
        return "tensor " + path + ": slices written by rank " + std::to_string(std::min(all[i].rank, all[j].rank)) +
               " and rank " + std::to_string(std::max(all[i].rank, all[j].rank)) +
               " overlap (mark replicas with write = false)";
  }
  if (total != d.shape.numel())
    return "tensor " + path + " " + d.shape.str() + ": the written slices cover " + std::to_string(total) + " of " +
           std::to_string(d.shape.numel()) + " elements";
  return "";
}

std::string plan_problem(const WritePlan& plan, const GroupAttributes& groups) {
  std::vector<std::string> errors;
  for (const auto& [path, d] : plan)
    if (std::string e = cover_problem(path, d); !e.empty()) errors.push_back(e);
  for (auto it = plan.begin(); it != plan.end(); ++it) {
    auto next = std::next(it);
    if (next != plan.end() && next->first.rfind(it->first + "/", 0) == 0)
      errors.push_back("tensor path " + it->first + " is also a group (of " + next->first + ")");
  }
  for (const auto& [group, attrs] : groups) {
    if (plan.count(group)) errors.push_back("attribute group " + group + " is also a tensor");
    if (group != "/" && !path_problem(group).empty()) errors.push_back("attribute group " + path_problem(group));
  }
  return join(errors, "; ");
}

}  // namespace

WritePlan make_write_plan(const std::vector<TensorSlice>& slices, const GroupAttributes& groups, MPI_Comm comm) {
  std::string local_error;
  for (const TensorSlice& s : slices)
    if (local_error.empty()) local_error = slice_problem(s);
  throw_if_any_failed(comm, local_error);
  const auto all = allgather_bytes(comm, encode_slices(slices));
  WritePlan plan;
  std::string error;
  for (int r = 0; r < static_cast<int>(all.size()) && error.empty(); ++r)
    error = add_rank_slices(plan, all[static_cast<size_t>(r)], r, static_cast<int>(all.size()));
  if (error.empty()) error = plan_problem(plan, groups);
  throw_if_any_failed(comm, error);
  return plan;
}

// ---- file size ----

std::vector<int64_t> chunk_shape(const Shape& shape) {
  std::vector<int64_t> chunk(static_cast<size_t>(shape.ndim()), 1);
  int64_t inner = 1;
  for (int i = shape.ndim(); i-- > 0;) {
    const int64_t fit = std::max<int64_t>(1, kChunkElements / inner);
    chunk[static_cast<size_t>(i)] = std::min(shape[i], fit);
    if (chunk[static_cast<size_t>(i)] < shape[i]) break;  // dimensions before i stay 1
    inner *= shape[i];
  }
  return chunk;
}

namespace {

// Bounds on HDF5 1.10 structures (file format with low bound 1.8), measured against h5stat on
// real checkpoints and then roughly doubled: the reservation must never fall short, while a few
// KiB per tensor are nothing next to the tensors themselves.
constexpr int64_t kFixedBytes = 32 << 10;         // superblock, root group, aggregator slack
constexpr int64_t kObjectHeaderBytes = 1024;      // a dataset's or group's header (measured ~300)
constexpr int64_t kLinkBytes = 128;               // a link in its group, plus 2x its name
constexpr int64_t kDenseStorageBytes = 32 << 10;  // fractal heap + v2 B-tree of a group with > 8 links
constexpr int64_t kAttributeBytes = 128;          // an attribute message, plus 2x its name
constexpr int64_t kGlobalHeapBytes = 8 << 10;     // a global heap collection (strings live there)

// A v1 B-tree node indexing the chunks of a rank-r dataset: 24 header bytes, 2K + 1 keys of
// (size, filter mask, r + 1 offsets) and 2K children, K = 32 (HDF5's default).
int64_t btree_node_bytes(int rank) { return 24 + 65 * (8 + 8 * (rank + 1)) + 64 * 8; }

int64_t attribute_bytes(const std::string& name, const AttrValue& v) {
  const auto* s = std::get_if<std::string>(&v);
  return kAttributeBytes + 2 * static_cast<int64_t>(name.size()) + (s ? 2 * static_cast<int64_t>(s->size()) + 32 : 8);
}

int64_t attributes_bytes(const AttrMap& attrs) {
  int64_t n = attrs.size() > 8 ? kDenseStorageBytes : 0;
  for (const auto& [name, v] : attrs) n += attribute_bytes(name, v);
  return n;
}

}  // namespace

int64_t estimated_file_bytes(const WritePlan& plan, const CheckpointMeta& meta, const GroupAttributes& groups) {
  int64_t raw = 0, structure = kFixedBytes + kGlobalHeapBytes;
  std::map<std::string, int64_t> links;  // group -> links in it
  std::set<std::string> group_paths = {"/", "/meta"};
  auto add_parents = [&](const std::string& path) {
    for (std::string child = path; child != "/";) {
      const size_t slash = child.rfind('/');
      const std::string parent = slash == 0 ? "/" : child.substr(0, slash);
      ++links[parent];
      structure += kLinkBytes + 2 * static_cast<int64_t>(child.size() - slash);
      if (!group_paths.insert(parent).second) break;  // its own parents are counted already
      child = parent;
    }
  };
  add_parents("/meta");
  for (const auto& [path, d] : plan) {
    const auto chunk = chunk_shape(d.shape);
    int64_t chunks = 1, chunk_elements = 1;
    for (int i = 0; i < d.shape.ndim(); ++i) {
      chunks *= (d.shape[i] + chunk[static_cast<size_t>(i)] - 1) / chunk[static_cast<size_t>(i)];
      chunk_elements *= chunk[static_cast<size_t>(i)];
    }
    raw += chunks * (chunk_elements * 4 + 4);  // edge chunks are stored whole; 4 checksum bytes each
    const int64_t nodes = chunks <= 64 ? 1 : 1 + 2 * ((chunks + 31) / 32);  // split nodes are half full
    structure += kObjectHeaderBytes + nodes * btree_node_bytes(d.shape.ndim());
    add_parents(path);
  }
  for (const auto& [group, attrs] : groups) {
    if (group != "/") add_parents(group);
    structure += attributes_bytes(attrs);
  }
  for (const std::string& g : group_paths) structure += kObjectHeaderBytes + (links[g] > 8 ? kDenseStorageBytes : 0);
  AttrMap fixed = meta.extra;
  fixed["format_version"] = meta.format_version;
  fixed["tessera_version"] = meta.tessera_version;
  fixed["step"] = meta.step;
  fixed["tokens_seen"] = meta.tokens_seen;
  fixed["consumed_samples"] = meta.consumed_samples;
  fixed["config"] = meta.config_toml;
  fixed["checksum"] = std::string(32, 'x');
  structure += attributes_bytes(fixed);
  return raw + structure;
}

// ---- byte encoding ----

void ByteWriter::i64(int64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
void ByteWriter::f64(double v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }

void ByteWriter::str(const std::string& s) {
  i64(static_cast<int64_t>(s.size()));
  out_ += s;
}

void ByteWriter::shape(const Shape& s) {
  i64(s.ndim());
  for (int i = 0; i < s.ndim(); ++i) i64(s[i]);
}

void ByteWriter::attrs(const AttrMap& m) {
  i64(static_cast<int64_t>(m.size()));
  for (const auto& [k, v] : m) {
    str(k);
    i64(static_cast<int64_t>(v.index()));
    if (const auto* i = std::get_if<int64_t>(&v)) i64(*i);
    if (const auto* d = std::get_if<double>(&v)) f64(*d);
    if (const auto* s = std::get_if<std::string>(&v)) str(*s);
  }
}

int64_t ByteReader::i64() {
  int64_t v;
  std::memcpy(&v, in_.data() + pos_, sizeof v);
  pos_ += sizeof v;
  return v;
}

double ByteReader::f64() {
  double v;
  std::memcpy(&v, in_.data() + pos_, sizeof v);
  pos_ += sizeof v;
  return v;
}

std::string ByteReader::str() {
  const auto n = static_cast<size_t>(i64());
  std::string s = in_.substr(pos_, n);
  pos_ += n;
  return s;
}

Shape ByteReader::shape() {
  Shape s;
  for (int64_t n = i64(); n > 0; --n) s.push_back(i64());
  return s;
}

AttrMap ByteReader::attrs() {
  AttrMap m;
  for (int64_t n = i64(); n > 0; --n) {
    std::string k = str();
    const int64_t kind = i64();
    if (kind == 0) m[k] = i64();
    if (kind == 1) m[k] = f64();
    if (kind == 2) m[k] = str();
  }
  return m;
}

std::string join(const std::vector<std::string>& lines, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += sep;
    out += lines[i];
  }
  return out;
}

}  // namespace tessera::ckpt
