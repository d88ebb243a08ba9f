// Checkpoint file writer and reader. The writer first agrees on a plan (the union of tensors over
// ranks, checked for exact cover) and then runs each collective HDF5 step inside `together`, so a
// failure on any rank ends the write on every rank at the same point with the same message.
#include "app/checkpoint_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <type_traits>

#include "kernels/check.h"
#include "parallel/mpi.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;

// Target chunk size in elements (1 MiB of float32): the unit of the Fletcher32 checksum and of
// parallel I/O. Small enough to keep read-modify-write of partly written chunks cheap.
constexpr int64_t kChunkElements = 1 << 18;

const char* const kMetaFields[] = {"format_version", "tessera_version", "step", "tokens_seen", "consumed_samples",
                                   "config"};

// ---- serialization of plans and metadata between ranks ----

class ByteWriter {
 public:
  void i64(int64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void f64(double v) { out_.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    out_ += s;
  }
  void shape(const Shape& s) {
    i64(s.ndim());
    for (int i = 0; i < s.ndim(); ++i) i64(s[i]);
  }
  void attr(const AttrValue& v) {
    i64(static_cast<int64_t>(v.index()));
    if (v.index() == 0) i64(std::get<int64_t>(v));
    if (v.index() == 1) f64(std::get<double>(v));
    if (v.index() == 2) str(std::get<std::string>(v));
  }
  void attrs(const AttrMap& m) {
    i64(static_cast<int64_t>(m.size()));
    for (const auto& [k, v] : m) {
      str(k);
      attr(v);
    }
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(const std::string& in) : in_(in) {}
  int64_t i64() { return take<int64_t>(); }
  double f64() { return take<double>(); }
  std::string str() {
    const auto n = static_cast<size_t>(i64());
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  Shape shape() {
    Shape s;
    const int64_t n = i64();
    for (int64_t i = 0; i < n; ++i) s.push_back(i64());
    return s;
  }
  AttrValue attr() {
    const int64_t kind = i64();
    if (kind == 0) return i64();
    if (kind == 1) return f64();
    return str();
  }
  AttrMap attrs() {
    AttrMap m;
    for (int64_t n = i64(); n > 0; --n) {
      std::string k = str();
      m[k] = attr();
    }
    return m;
  }

 private:
  template <typename T>
  T take() {
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  const std::string& in_;
  size_t pos_ = 0;
};

// Runs f on this rank, then makes every rank agree: if f threw anywhere, all ranks throw the
// message of the lowest failing rank. Every collective HDF5 step goes through here.
template <typename F>
void together(MPI_Comm comm, F&& f) {
  std::string error;
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  throw_if_any_failed(comm, error);
}

std::string join(const std::vector<std::string>& lines, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) out += (i ? sep : "") + lines[i];
  return out;
}

// ---- slices and the write plan ----

// A box in a tensor's index space: [start[i], start[i] + count[i]) along each dimension.
struct Box {
  std::vector<int64_t> start, count;
  int64_t volume() const {
    int64_t v = 1;
    for (int64_t c : count) v *= c;
    return v;
  }
  bool overlaps(const Box& o) const {
    for (size_t i = 0; i < start.size(); ++i)
      if (start[i] + count[i] <= o.start[i] || o.start[i] + o.count[i] <= start[i]) return false;
    return volume() > 0 && o.volume() > 0;
  }
};

std::string check_path(const std::string& path) {
  if (path.size() < 2 || path.front() != '/' || path.back() == '/' || path.find("//") != std::string::npos)
    return "tensor path \"" + path + "\" must be absolute, like /model/wte.weight";
  if (path == "/meta" || path.rfind("/meta/", 0) == 0) return "tensor path " + path + " is inside /meta, which is reserved";
  return "";
}

// "" when the slice is consistent, else what is wrong with it.
std::string check_slice(const TensorSlice& s) {
  if (std::string e = check_path(s.path); !e.empty()) return e;
  const Shape& g = s.global_shape;
  const std::string name = "tensor " + s.path + " " + g.str();
  if (g.ndim() < 1) return name + ": tensors need at least one dimension";
  for (int i = 0; i < g.ndim(); ++i)
    if (g[i] <= 0) return name + ": every dimension must be positive";
  if (s.dim == -1) {
    if (s.local_shape.ndim() != 0 && !(s.local_shape == g))
      return name + ": a whole-tensor slice (dim = -1) has local shape " + s.local_shape.str();
  } else {
    if (s.dim < 0 || s.dim >= g.ndim()) return name + ": slice dimension " + std::to_string(s.dim) + " is out of range";
    if (s.local_shape.ndim() != g.ndim()) return name + ": local shape " + s.local_shape.str() + " has the wrong rank";
    for (int i = 0; i < g.ndim(); ++i)
      if (i != s.dim && s.local_shape[i] != g[i])
        return name + ": local shape " + s.local_shape.str() + " differs from the global one outside dimension " +
               std::to_string(s.dim);
    if (s.start < 0 || s.local_shape[s.dim] < 0 || s.start + s.local_shape[s.dim] > g[s.dim])
      return name + ": slice [" + std::to_string(s.start) + ", " + std::to_string(s.start + s.local_shape[s.dim]) +
             ") along dimension " + std::to_string(s.dim) + " is out of range";
  }
  const int64_t n = s.dim == -1 ? g.numel() : s.local_shape.numel();
  if (s.write && n > 0 && s.data == nullptr) return name + ": slice to write has no data";
  return "";
}

Box box_of(const TensorSlice& s) {
  Box b;
  for (int i = 0; i < s.global_shape.ndim(); ++i) {
    const bool sliced = i == s.dim;
    b.start.push_back(sliced ? s.start : 0);
    b.count.push_back(sliced ? s.local_shape[i] : s.global_shape[i]);
  }
  return b;
}

struct DatasetPlan {
  Shape shape;
  std::vector<std::vector<Box>> boxes;  // by rank, in each rank's slice order
  size_t rounds() const {
    size_t r = 0;
    for (const auto& b : boxes) r = std::max(r, b.size());
    return r;
  }
};
using WritePlan = std::map<std::string, DatasetPlan>;  // sorted by path: the same order on every rank

std::string encode_slices(const std::vector<TensorSlice>& slices) {
  ByteWriter w;
  w.i64(static_cast<int64_t>(slices.size()));
  for (const TensorSlice& s : slices) {
    w.str(s.path);
    w.shape(s.global_shape);
    w.i64(s.write ? 1 : 0);
    const Box b = box_of(s);
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
    Box b;
    for (int i = 0; i < shape.ndim(); ++i) {
      b.start.push_back(r.i64());
      b.count.push_back(r.i64());
    }
    auto [it, fresh] = plan.try_emplace(path, DatasetPlan{shape, std::vector<std::vector<Box>>(nranks)});
    if (!fresh && !(it->second.shape == shape))
      return "tensor " + path + " is declared with shape " + it->second.shape.str() + " and, on rank " +
             std::to_string(rank) + ", " + shape.str();
    if (write) it->second.boxes[static_cast<size_t>(rank)].push_back(b);
  }
  return "";
}

// Each element of each tensor must be written by exactly one slice: a gap would leave garbage in
// the file, an overlap means two replicas both think they own the data.
std::string check_cover(const std::string& path, const DatasetPlan& d) {
  std::vector<std::pair<int, const Box*>> all;
  int64_t total = 0;
  for (size_t rank = 0; rank < d.boxes.size(); ++rank)
    for (const Box& b : d.boxes[rank]) {
      all.emplace_back(static_cast<int>(rank), &b);
      total += b.volume();
    }
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = i + 1; j < all.size(); ++j)
      if (all[i].second->overlaps(*all[j].second))
        return "tensor " + path + ": slices written by rank " + std::to_string(all[i].first) + " and rank " +
               std::to_string(all[j].first) + " overlap (mark replicas with write = false)";
  if (total != d.shape.numel())
    return "tensor " + path + " " + d.shape.str() + ": the written slices cover " + std::to_string(total) + " of " +
           std::to_string(d.shape.numel()) + " elements";
  return "";
}

std::string check_plan(const WritePlan& plan, const GroupAttributes& groups) {
  std::vector<std::string> errors;
  for (const auto& [path, d] : plan)
    if (std::string e = check_cover(path, d); !e.empty()) errors.push_back(e);
  for (auto it = plan.begin(); it != plan.end(); ++it) {
    auto next = std::next(it);
    if (next != plan.end() && next->first.rfind(it->first + "/", 0) == 0)
      errors.push_back("tensor path " + it->first + " is also a group (of " + next->first + ")");
  }
  for (const auto& [group, attrs] : groups) {
    if (plan.count(group)) errors.push_back("attribute group " + group + " is also a tensor");
    if (group != "/" && !check_path(group).empty()) errors.push_back("attribute group \"" + group + "\" is not a valid path");
  }
  return join(errors, "; ");
}

WritePlan make_plan(const std::vector<TensorSlice>& slices, const GroupAttributes& groups, MPI_Comm comm) {
  std::string local_error;
  for (const TensorSlice& s : slices)
    if (local_error.empty()) local_error = check_slice(s);
  throw_if_any_failed(comm, local_error);
  const auto all = allgather_bytes(comm, encode_slices(slices));
  WritePlan plan;
  std::string error;
  for (int r = 0; r < static_cast<int>(all.size()) && error.empty(); ++r)
    error = add_rank_slices(plan, all[static_cast<size_t>(r)], r, static_cast<int>(all.size()));
  if (error.empty()) error = check_plan(plan, groups);
  throw_if_any_failed(comm, error);
  return plan;
}

// Every rank writes rank 0's metadata: parallel HDF5 needs identical metadata calls everywhere.
std::pair<CheckpointMeta, GroupAttributes> broadcast_meta(const CheckpointMeta& meta, const GroupAttributes& groups,
                                                          MPI_Comm comm) {
  ByteWriter w;
  w.i64(meta.format_version);
  w.str(meta.tessera_version);
  w.i64(meta.step);
  w.i64(meta.tokens_seen);
  w.i64(meta.consumed_samples);
  w.str(meta.config_toml);
  w.attrs(meta.extra);
  w.i64(static_cast<int64_t>(groups.size()));
  for (const auto& [g, attrs] : groups) {
    w.str(g);
    w.attrs(attrs);
  }
  const std::string bytes = broadcast_bytes(comm, w.bytes(), 0);
  ByteReader r(bytes);
  CheckpointMeta m;
  m.format_version = r.i64();
  m.tessera_version = r.str();
  m.step = r.i64();
  m.tokens_seen = r.i64();
  m.consumed_samples = r.i64();
  m.config_toml = r.str();
  m.extra = r.attrs();
  GroupAttributes gs;
  for (int64_t n = r.i64(); n > 0; --n) {
    std::string g = r.str();
    gs[g] = r.attrs();
  }
  return {m, gs};
}

// ---- HDF5 writing ----

H5File create_file(const std::string& path, MPI_Comm comm) {
  const std::string what = "cannot create checkpoint file " + path;
  H5PropList fapl(h5_check_id(H5Pcreate(H5P_FILE_ACCESS), what));
  h5_check(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), what);
  // The 1.8 file format (indexed links for groups with many tensors); h5py and HDF5 >= 1.8 read it.
  h5_check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V110), what);
  return H5File(h5_check_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), what));
}

// Opens the group at `path`, creating it (and its parents) if needed.
H5Group open_or_create_group(hid_t file, const std::string& path, const std::string& where) {
  const std::string what = "cannot create group " + path + " in " + where;
  std::string prefix;
  std::stringstream parts(path);
  for (std::string part; std::getline(parts, part, '/');) {
    if (part.empty()) continue;
    prefix += "/" + part;
    const htri_t exists = H5Lexists(file, prefix.c_str(), H5P_DEFAULT);
    h5_check(exists, what);
    if (!exists) H5Group(h5_check_id(H5Gcreate2(file, prefix.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), what));
  }
  return H5Group(h5_check_id(H5Gopen2(file, path.c_str(), H5P_DEFAULT), what));
}

// The same on every rank (it checks rank 0's metadata), so it may throw without agreement.
void check_meta(const CheckpointMeta& m, const GroupAttributes& groups) {
  for (const auto& [key, value] : m.extra)
    TESSERA_CHECK(!key.empty() && std::find(std::begin(kMetaFields), std::end(kMetaFields), key) == std::end(kMetaFields),
                  "extra metadata \"", key, "\" is empty or the name of a fixed /meta attribute");
  for (const auto& [group, attrs] : groups)
    for (const auto& [key, value] : attrs) TESSERA_CHECK(!key.empty(), "group ", group, " has an attribute without a name");
}

void write_meta(hid_t file, const CheckpointMeta& m, const GroupAttributes& groups, const std::string& where) {
  H5Group meta = open_or_create_group(file, "/meta", where);
  const std::string obj = "/meta in " + where;
  h5_write_attribute(meta.get(), "format_version", m.format_version, obj);
  h5_write_attribute(meta.get(), "tessera_version", m.tessera_version, obj);
  h5_write_attribute(meta.get(), "step", m.step, obj);
  h5_write_attribute(meta.get(), "tokens_seen", m.tokens_seen, obj);
  h5_write_attribute(meta.get(), "consumed_samples", m.consumed_samples, obj);
  h5_write_attribute(meta.get(), "config", m.config_toml, obj);
  for (const auto& [key, value] : m.extra) h5_write_attribute(meta.get(), key, value, obj);
  for (const auto& [path, attrs] : groups) {
    H5Group g = open_or_create_group(file, path, where);
    for (const auto& [key, value] : attrs) h5_write_attribute(g.get(), key, value, path + " in " + where);
  }
}

std::vector<hsize_t> to_hsize(const Shape& s) {
  std::vector<hsize_t> d;
  for (int i = 0; i < s.ndim(); ++i) d.push_back(static_cast<hsize_t>(s[i]));
  return d;
}

// Chunks of about kChunkElements: whole along the trailing dimensions, as many leading rows as fit.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims) {
  std::vector<hsize_t> chunk(dims.size(), 1);
  hsize_t inner = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    const hsize_t fit = std::max<hsize_t>(1, static_cast<hsize_t>(kChunkElements) / inner);
    chunk[i] = std::min(dims[i], fit);
    if (chunk[i] < dims[i]) break;  // dimensions before i stay 1
    inner *= dims[i];
  }
  return chunk;
}

H5Dataset create_dataset(hid_t file, const std::string& path, const Shape& shape, const std::string& where) {
  const std::string what = "cannot create tensor " + path + " " + shape.str() + " in " + where;
  const auto dims = to_hsize(shape);
  const auto chunk = chunk_dims(dims);
  H5Space space(h5_check_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), what));
  H5PropList lcpl(h5_check_id(H5Pcreate(H5P_LINK_CREATE), what));
  h5_check(H5Pset_create_intermediate_group(lcpl.get(), 1), what);
  H5PropList dcpl(h5_check_id(H5Pcreate(H5P_DATASET_CREATE), what));
  h5_check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), what);
  h5_check(H5Pset_fletcher32(dcpl.get()), what);
  // Every element is written, so no fill values (parallel filtered writes require this anyway).
  h5_check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), what);
  return H5Dataset(h5_check_id(
      H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT), what));
}

// One collective H5Dwrite: this rank's box (or nothing) of dataset ds.
void write_round(hid_t ds, const Box* box, const float* data, const std::string& what) {
  H5Space file_space(h5_check_id(H5Dget_space(ds), what));
  H5PropList dxpl(h5_check_id(H5Pcreate(H5P_DATASET_XFER), what));
  h5_check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), what);
  if (box == nullptr || box->volume() == 0) {
    const hsize_t one = 1;
    H5Space mem(h5_check_id(H5Screate_simple(1, &one, nullptr), what));
    h5_check(H5Sselect_none(mem.get()), what);
    h5_check(H5Sselect_none(file_space.get()), what);
    const float dummy = 0;
    h5_check(H5Dwrite(ds, H5T_NATIVE_FLOAT, mem.get(), file_space.get(), dxpl.get(), &dummy), what);
    return;
  }
  std::vector<hsize_t> start(box->start.begin(), box->start.end()), count(box->count.begin(), box->count.end());
  h5_check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), what);
  H5Space mem(h5_check_id(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), what));
  h5_check(H5Dwrite(ds, H5T_NATIVE_FLOAT, mem.get(), file_space.get(), dxpl.get(), data), what);
}

// This rank's slices of `path` to write, in call order (matching plan.boxes[rank]).
std::vector<const TensorSlice*> local_writes(const std::vector<TensorSlice>& slices, const std::string& path) {
  std::vector<const TensorSlice*> out;
  for (const TensorSlice& s : slices)
    if (s.write && s.path == path) out.push_back(&s);
  return out;
}

void write_tensors(hid_t file, const WritePlan& plan, const std::vector<TensorSlice>& slices, MPI_Comm comm,
                   const std::string& where) {
  const int rank = comm_rank(comm);
  for (const auto& [path, d] : plan) {
    H5Dataset ds;
    together(comm, [&] { ds = create_dataset(file, path, d.shape, where); });
    const auto mine = local_writes(slices, path);
    const auto& boxes = d.boxes[static_cast<size_t>(rank)];
    const std::string what = "cannot write tensor " + path + " to " + where;
    for (size_t round = 0; round < d.rounds(); ++round) {
      together(comm, [&] {
        const bool have = round < boxes.size();
        write_round(ds.get(), have ? &boxes[round] : nullptr, have ? mine[round]->data : nullptr, what);
      });
    }
    together(comm, [&] { h5_check(ds.close(), "cannot close tensor " + path + " in " + where); });
  }
}

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  TESSERA_CHECK(fd >= 0, "cannot open ", path, " to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  TESSERA_CHECK(rc == 0, "cannot sync ", path, " to disk: ", std::strerror(err));
}

void write_file(const std::string& path, const CheckpointMeta& meta, const GroupAttributes& groups,
                const WritePlan& plan, const std::vector<TensorSlice>& slices, MPI_Comm comm, bool& created) {
  H5File file;
  together(comm, [&] { file = create_file(path, comm); });
  created = true;
  together(comm, [&] { write_meta(file.get(), meta, groups, path); });
  write_tensors(file.get(), plan, slices, comm, path);
  together(comm, [&] {
    h5_check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "cannot flush checkpoint file " + path);
    h5_check(file.close(), "cannot close checkpoint file " + path);
  });
  together(comm, [&] {
    if (comm_rank(comm) == 0) fsync_file(path);
  });
}

}  // namespace

void write_checkpoint_file(const std::string& path, const CheckpointMeta& meta, const std::vector<TensorSlice>& slices,
                           MPI_Comm comm, const GroupAttributes& groups) {
  H5QuietErrors quiet;
  const WritePlan plan = make_plan(slices, groups, comm);
  const auto [m, g] = broadcast_meta(meta, groups, comm);
  check_meta(m, g);
  bool created = false;
  try {
    write_file(path, m, g, plan, slices, comm, created);
  } catch (const Error&) {
    // Every rank is here (errors are agreed) and the file is closed: leave no half-written file.
    if (created && comm_rank(comm) == 0) {
      std::error_code ec;
      fs::remove(path, ec);
    }
    throw;
  }
}

// ---- reading ----

namespace {

std::string dtype_name(hid_t type) {
  const size_t bits = 8 * H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_FLOAT:
      return "float" + std::to_string(bits);
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_STRING:
      return "string";
    default:
      return "other";
  }
}

Shape to_shape(const std::vector<hsize_t>& dims, const std::string& what) {
  TESSERA_CHECK(static_cast<int>(dims.size()) <= Shape::kMaxDims, what, " has ", dims.size(),
                " dimensions; tessera reads at most ", Shape::kMaxDims);
  Shape s;
  for (hsize_t d : dims) s.push_back(static_cast<int64_t>(d));
  return s;
}

struct VisitState {
  std::string file;
  std::vector<TensorInfo> tensors;
  GroupAttributes groups;
  std::string error;  // HDF5 callbacks must not throw: the first error is kept here
};

void visit_object(hid_t root, const std::string& path, VisitState& st) {
  const std::string where = path + " in " + st.file;
  H5Object obj(h5_check_id(H5Oopen(root, path.c_str(), H5P_DEFAULT), "cannot open " + where));
  const H5I_type_t kind = H5Iget_type(obj.get());
  if (kind == H5I_DATASET) {
    H5Space space(h5_check_id(H5Dget_space(obj.get()), "cannot read the shape of " + where));
    H5Type type(h5_check_id(H5Dget_type(obj.get()), "cannot read the type of " + where));
    st.tensors.push_back({path, to_shape(h5_dims(space.get()), where), dtype_name(type.get())});
  } else if (kind == H5I_GROUP && path != "/meta") {
    AttrMap attrs;
    for (const std::string& name : h5_attribute_names(obj.get(), where))
      attrs[name] = h5_read_attribute(obj.get(), name, where);
    if (!attrs.empty()) st.groups[path] = std::move(attrs);
  }
}

herr_t visit_link(hid_t root, const char* name, const H5L_info_t* info, void* data) {
  if (info->type != H5L_TYPE_HARD) return 0;  // soft/external links are not part of the format
  auto& st = *static_cast<VisitState*>(data);
  try {
    visit_object(root, std::string("/") + name, st);
  } catch (const Error& e) {
    st.error = e.what();
    return -1;
  }
  return 0;
}

template <typename T>
T meta_field(const AttrMap& attrs, const std::string& key, const std::string& file) {
  auto it = attrs.find(key);
  TESSERA_CHECK(it != attrs.end(), file, ": /meta has no attribute ", key, " (damaged, or not a tessera checkpoint)");
  const T* v = std::get_if<T>(&it->second);
  TESSERA_CHECK(v != nullptr, file, ": /meta attribute ", key, " must be ",
                std::is_same_v<T, std::string> ? "a string" : "an integer");
  return *v;
}

CheckpointMeta read_meta(hid_t file, const std::string& path) {
  TESSERA_CHECK(H5Lexists(file, "/meta", H5P_DEFAULT) > 0, path, " has no /meta group: not a tessera checkpoint");
  const std::string where = "/meta in " + path;
  H5Group g(h5_check_id(H5Gopen2(file, "/meta", H5P_DEFAULT), "cannot open " + where));
  AttrMap attrs;
  for (const std::string& name : h5_attribute_names(g.get(), where)) attrs[name] = h5_read_attribute(g.get(), name, where);
  CheckpointMeta m;
  // The version first: a newer format may lack or change the fields below.
  m.format_version = meta_field<int64_t>(attrs, "format_version", path);
  TESSERA_CHECK(m.format_version <= kCheckpointFormatVersion, path, " was written by a newer tessera: format version ",
                m.format_version, ", this build reads up to ", kCheckpointFormatVersion);
  TESSERA_CHECK(m.format_version >= 1, path, " has an invalid format version ", m.format_version);
  m.tessera_version = meta_field<std::string>(attrs, "tessera_version", path);
  m.step = meta_field<int64_t>(attrs, "step", path);
  m.tokens_seen = meta_field<int64_t>(attrs, "tokens_seen", path);
  m.consumed_samples = meta_field<int64_t>(attrs, "consumed_samples", path);
  m.config_toml = meta_field<std::string>(attrs, "config", path);
  for (const char* key : kMetaFields) attrs.erase(key);
  m.extra = std::move(attrs);
  return m;
}

H5File open_file(const std::string& path) {
  TESSERA_CHECK(fs::exists(path), "checkpoint file ", path, " does not exist");
  TESSERA_CHECK(!fs::is_directory(path), "checkpoint ", path, " is a directory, not a file");
  H5PropList fapl(h5_check_id(H5Pcreate(H5P_FILE_ACCESS), "cannot open " + path));
  // Checkpoints are immutable once renamed into place; parallel file systems often lack flock.
  h5_check(H5Pset_file_locking(fapl.get(), false, true), "cannot open " + path);
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (id < 0) {
    const std::string reason = h5_error_reason();
    detail::fail(path, " is not a readable HDF5 file (truncated or not a checkpoint)",
                 reason.empty() ? "" : ": " + reason);
  }
  return H5File(id);
}

bool mentions_checksum(const std::vector<std::string>& messages) {
  for (std::string m : messages) {
    std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
    if (m.find("checksum") != std::string::npos) return true;
  }
  return false;
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path, MPI_Comm comm) : path_(path) {
  H5QuietErrors quiet;
  together(comm, [&] {
    file_ = open_file(path);
    meta_ = read_meta(file_.get(), path);
    VisitState st{path, {}, {}, {}};
    if (H5Lvisit(file_.get(), H5_INDEX_NAME, H5_ITER_INC, visit_link, &st) < 0)
      detail::fail(st.error.empty() ? "cannot list the contents of " + path : st.error);
    tensors_ = std::move(st.tensors);
    groups_ = std::move(st.groups);
    AttrMap root;
    for (const std::string& name : h5_attribute_names(file_.get(), "/ in " + path))
      root[name] = h5_read_attribute(file_.get(), name, "/ in " + path);
    if (!root.empty()) groups_["/"] = std::move(root);
  });
}

const TensorInfo& CheckpointReader::info(const std::string& path) const {
  for (const TensorInfo& t : tensors_)
    if (t.path == path) return t;
  detail::fail(path_, " has no tensor ", path);
}

bool CheckpointReader::has(const std::string& path) const {
  return std::any_of(tensors_.begin(), tensors_.end(), [&](const TensorInfo& t) { return t.path == path; });
}

Shape CheckpointReader::shape(const std::string& path) const { return info(path).shape; }

namespace {
// "" when (dim, start, local) selects a valid part of a tensor of shape `stored`.
std::string check_read(const Shape& stored, int dim, int64_t start, const Shape& local) {
  const std::string asked = " was asked for";
  if (dim == -1) return local == stored ? "" : "shape " + local.str() + asked;
  if (dim < 0 || dim >= stored.ndim() || local.ndim() != stored.ndim())
    return "a slice of shape " + local.str() + " along dimension " + std::to_string(dim) + asked;
  for (int i = 0; i < stored.ndim(); ++i)
    if (i != dim && local[i] != stored[i])
      return "a slice of shape " + local.str() + " along dimension " + std::to_string(dim) + asked;
  if (start < 0 || local[dim] < 0 || start + local[dim] > stored[dim])
    return "the slice [" + std::to_string(start) + ", " + std::to_string(start + local[dim]) + ") along dimension " +
           std::to_string(dim) + asked + ", out of range";
  return "";
}
}  // namespace

void CheckpointReader::read(const std::string& path, int dim, int64_t start, const Shape& local_shape,
                            float* out) const {
  H5QuietErrors quiet;
  const TensorInfo& t = info(path);
  TESSERA_CHECK(t.dtype == "float32", path, " in ", path_, " has dtype ", t.dtype, "; tessera tensors are float32");
  const std::string bad = check_read(t.shape, dim, start, local_shape);
  TESSERA_CHECK(bad.empty(), path, " in ", path_, " has shape ", t.shape.str(), ", but ", bad);
  if (local_shape.numel() == 0) return;
  const std::string what = "cannot read " + path + " from " + path_;
  H5Dataset ds(h5_check_id(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), what));
  H5Space file_space(h5_check_id(H5Dget_space(ds.get()), what));
  std::vector<hsize_t> first(static_cast<size_t>(t.shape.ndim()), 0), count = to_hsize(local_shape);
  if (dim >= 0) first[static_cast<size_t>(dim)] = static_cast<hsize_t>(start);
  h5_check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, first.data(), nullptr, count.data(), nullptr), what);
  H5Space mem(h5_check_id(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), what));
  if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, mem.get(), file_space.get(), H5P_DEFAULT, out) < 0) {
    const auto messages = h5_error_messages();
    TESSERA_CHECK(!mentions_checksum(messages), "checksum mismatch reading ", path, " in ", path_,
                  ": the file is corrupted");
    detail::fail(what, messages.empty() ? "" : ": " + messages.back());
  }
}

std::vector<float> CheckpointReader::read_all(const std::string& path) const {
  const Shape s = shape(path);
  std::vector<float> out(static_cast<size_t>(s.numel()));
  read(path, -1, 0, s, out.data());
  return out;
}

std::vector<std::string> compare_shapes(const CheckpointReader& reader,
                                        const std::vector<std::pair<std::string, Shape>>& expected) {
  std::vector<std::string> missing, wrong, unexpected;
  std::set<std::string> listed, top_groups;
  for (const auto& [path, shape] : expected) {
    listed.insert(path);
    top_groups.insert(path.substr(0, path.find('/', 1)));
    if (!reader.has(path)) {
      missing.push_back("missing " + path + " (expected " + shape.str() + ")");
    } else if (!(reader.shape(path) == shape)) {
      wrong.push_back(path + " has shape " + reader.shape(path).str() + " in the checkpoint, expected " + shape.str());
    }
  }
  for (const TensorInfo& t : reader.tensors())
    if (!listed.count(t.path) && top_groups.count(t.path.substr(0, t.path.find('/', 1))))
      unexpected.push_back("unexpected " + t.path + " " + t.shape.str());
  std::vector<std::string> out = std::move(missing);
  out.insert(out.end(), wrong.begin(), wrong.end());
  out.insert(out.end(), unexpected.begin(), unexpected.end());
  return out;
}

void check_shapes(const CheckpointReader& reader, const std::vector<std::pair<std::string, Shape>>& expected) {
  const auto mismatches = compare_shapes(reader, expected);
  TESSERA_CHECK(mismatches.empty(), reader.path(), " does not match the model (", mismatches.size(),
                mismatches.size() == 1 ? " mismatch" : " mismatches", "):\n  ", join(mismatches, "\n  "));
}

}  // namespace tessera
