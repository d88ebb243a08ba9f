// Checkpoint file writer and reader. The writer first agrees on a plan (app/checkpoint/checkpoint_plan.h: the
// union of tensors over ranks, checked for exact cover) and then runs each collective HDF5 step
// inside `together`, so a failure on any rank ends the write on every rank at the same point with
// the same message.
#include "app/checkpoint/checkpoint_io.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <type_traits>

#include "app/checkpoint/atomic_file.h"
#include "app/checkpoint/checkpoint_plan.h"
#include "kernels/check.h"
#include "parallel/mpi.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;
using ckpt::Box;
using ckpt::ByteReader;
using ckpt::ByteWriter;
using ckpt::WritePlan;

const char* const kMetaFields[] = {"format_version", "tessera_version", "step", "tokens_seen", "consumed_samples",
                                   "config", "checksum"};
// /meta@checksum: "fnv1a64:<16 hex digits>" over the metadata (metadata_checksum).
constexpr const char* kChecksumAttr = "checksum";
constexpr const char* kChecksumPrefix = "fnv1a64:";

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

// ---- metadata checksum ----

// FNV-1a (64-bit) over a canonical little-endian serialization. Each step is a bijection of the
// state for a given byte, so a change confined to one byte always changes the result.
class Fnv1a64 {
 public:
  void byte(uint8_t b) { h_ = (h_ ^ b) * 0x100000001b3ULL; }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u64(s.size());
    for (unsigned char c : s) byte(c);
  }
  void attrs(const AttrMap& m) {
    u64(m.size());
    for (const auto& [key, v] : m) {
      str(key);
      u64(v.index());
      if (const auto* i = std::get_if<int64_t>(&v)) u64(static_cast<uint64_t>(*i));
      if (const auto* d = std::get_if<double>(&v)) u64(std::bit_cast<uint64_t>(*d));
      if (const auto* t = std::get_if<std::string>(&v)) str(*t);
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

// The checksum of everything a reader trusts besides the tensors' values (whose chunks carry
// Fletcher32): /meta, the attributes of every other group, and every tensor's path, shape and
// type. Variable-length strings (the config) live in HDF5's global heap, which has no checksum of
// its own: without this, a flipped bit in the config would load as a different model.
std::string metadata_checksum(const CheckpointMeta& m, const GroupAttributes& groups,
                              std::vector<TensorInfo> tensors) {
  Fnv1a64 h;
  h.u64(static_cast<uint64_t>(m.format_version));
  h.str(m.tessera_version);
  h.u64(static_cast<uint64_t>(m.step));
  h.u64(static_cast<uint64_t>(m.tokens_seen));
  h.u64(static_cast<uint64_t>(m.consumed_samples));
  h.str(m.config_toml);
  h.attrs(m.extra);
  for (const auto& [path, attrs] : groups) {
    if (attrs.empty()) continue;  // a reader lists only groups that have attributes
    h.str(path);
    h.attrs(attrs);
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) { return a.path < b.path; });
  h.u64(tensors.size());
  for (const TensorInfo& t : tensors) {
    h.str(t.path);
    h.u64(static_cast<uint64_t>(t.shape.ndim()));
    for (int i = 0; i < t.shape.ndim(); ++i) h.u64(static_cast<uint64_t>(t.shape[i]));
    h.str(t.dtype);
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016" PRIx64, kChecksumPrefix, h.value());
  return buf;
}

std::vector<TensorInfo> planned_tensors(const WritePlan& plan) {
  std::vector<TensorInfo> out;
  for (const auto& [path, d] : plan) out.push_back({path, d.shape, "float32"});
  return out;
}

// ---- HDF5 writing ----

// The format every checkpoint is written in: 1.8 (indexed links for groups with many tensors);
// h5py and HDF5 >= 1.8 read it.
void set_file_format(hid_t fapl, const std::string& what) {
  h5_check(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V110), what);
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

[[noreturn]] void fail_no_space(const std::string& path, int64_t bytes, const std::string& reason) {
  struct statvfs vfs {};
  const fs::path dir = fs::path(path).parent_path();
  std::string free_text;
  if (::statvfs(dir.empty() ? "." : dir.c_str(), &vfs) == 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ", %.1f MiB free", mib(static_cast<int64_t>(vfs.f_bavail) * vfs.f_frsize));
    free_text = buf;
  }
  char need[64];
  std::snprintf(need, sizeof need, "%.1f MiB", mib(bytes));
  detail::fail("not enough space to save checkpoint ", path, ": it needs up to ", need, free_text, " (", reason, ")");
}

// Reserves `bytes` of disk for the open file fd without changing its size (FALLOC_FL_KEEP_SIZE),
// so that HDF5's writes below that offset cannot run out of space. Where the file system cannot
// reserve (EOPNOTSUPP), compares with its free space instead: a check, not a guarantee.
void reserve_space(int fd, int64_t bytes, const std::string& path) {
  struct rlimit limit {};
  // RLIMIT_FSIZE (ulimit -f) is not checked by a KEEP_SIZE reservation, only by the writes.
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      static_cast<uint64_t>(bytes) > static_cast<uint64_t>(limit.rlim_cur))
    fail_no_space(path, bytes, "the file size limit, ulimit -f, is " + std::to_string(limit.rlim_cur) + " bytes");
  if (::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, bytes) == 0) return;
  const int err = errno;
  if (err != EOPNOTSUPP && err != ENOSYS) fail_no_space(path, bytes, std::strerror(err));
  struct statvfs vfs {};
  if (::fstatvfs(fd, &vfs) == 0 && static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < static_cast<uint64_t>(bytes))
    fail_no_space(path, bytes, std::strerror(ENOSPC));
}

// Rank 0, before any rank opens the file: creates it exclusively (a file or symlink already at
// path is refused, never followed) and reserves space for all of it. A full disk is then found
// here, at a point all ranks agree on, and not inside HDF5's collective calls, where a rank
// failing alone leaves the others waiting forever (parallel HDF5 writes metadata from rank 0
// only, so rank 0 can hit ENOSPC where the others do not).
void prepare_file(const std::string& path, int64_t bytes) {
  const int fd = create_exclusive(path);
  try {
    reserve_space(fd, bytes, path);
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  TESSERA_CHECK(::close(fd) == 0, "cannot create ", path, ": ", std::strerror(errno));
}

// All ranks open rank 0's prepared file for parallel writing (MPI-IO). It is still empty (the
// reservation keeps its size at 0), so H5F_ACC_TRUNC truncates nothing and the reserved blocks
// stay with it.
H5File create_file(const std::string& path, MPI_Comm comm) {
  const std::string what = "cannot create checkpoint file " + path;
  H5PropList fapl(h5_check_id(H5Pcreate(H5P_FILE_ACCESS), what));
  h5_check(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), what);
  set_file_format(fapl.get(), what);
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

void write_meta(hid_t file, const CheckpointMeta& m, const GroupAttributes& groups, const std::string& checksum,
                const std::string& where) {
  H5Group meta = open_or_create_group(file, "/meta", where);
  const std::string obj = "/meta in " + where;
  h5_write_attribute(meta.get(), "format_version", m.format_version, obj);
  h5_write_attribute(meta.get(), "tessera_version", m.tessera_version, obj);
  h5_write_attribute(meta.get(), "step", m.step, obj);
  h5_write_attribute(meta.get(), "tokens_seen", m.tokens_seen, obj);
  h5_write_attribute(meta.get(), "consumed_samples", m.consumed_samples, obj);
  h5_write_attribute(meta.get(), "config", m.config_toml, obj);
  for (const auto& [key, value] : m.extra) h5_write_attribute(meta.get(), key, value, obj);
  h5_write_attribute(meta.get(), kChecksumAttr, checksum, obj);
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

H5Dataset create_dataset(hid_t file, const std::string& path, const Shape& shape, const std::string& where) {
  const std::string what = "cannot create tensor " + path + " " + shape.str() + " in " + where;
  const auto dims = to_hsize(shape);
  const auto chunk_elements = ckpt::chunk_shape(shape);
  const std::vector<hsize_t> chunk(chunk_elements.begin(), chunk_elements.end());
  H5Space space(h5_check_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), what));
  H5PropList lcpl(h5_check_id(H5Pcreate(H5P_LINK_CREATE), what));
  h5_check(H5Pset_create_intermediate_group(lcpl.get(), 1), what);
  H5PropList dcpl(h5_check_id(H5Pcreate(H5P_DATASET_CREATE), what));
  h5_check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), what);
  h5_check(H5Pset_fletcher32(dcpl.get()), what);
  // Every element is written once, so writing fill values first would be wasted I/O.
  h5_check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), what);
  return H5Dataset(h5_check_id(
      H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT), what));
}

// Selects the union of boxes in a dataset's file space. Its elements, in HDF5's row-major
// iteration order, are the boxes concatenated: the memory layout of the slice.
void select_boxes(hid_t space, const std::vector<Box>& boxes, const std::string& what) {
  h5_check(H5Sselect_none(space), what);
  for (const Box& b : boxes) {
    std::vector<hsize_t> start(b.start.begin(), b.start.end()), count(b.count.begin(), b.count.end());
    h5_check(H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr), what);
  }
}

// The memory dataspace for a selection of n elements made of `boxes`. A single box gets a memory
// space of the box's own shape, so HDF5 maps it to the file selection chunk by chunk (the
// "same shape" path); a 1-D space would make it walk the selection element by element, which
// measured ~10x slower on a GPT-2 124M checkpoint (docs/performance.md).
H5Space memory_space(const std::vector<Box>& boxes, hsize_t n, const std::string& what) {
  if (boxes.size() == 1) {
    std::vector<hsize_t> count(boxes[0].count.begin(), boxes[0].count.end());
    return H5Space(h5_check_id(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), what));
  }
  return H5Space(h5_check_id(H5Screate_simple(1, &n, nullptr), what));
}

// One collective H5Dwrite: this rank's selection (or nothing) of dataset ds.
void write_round(hid_t ds, const std::vector<Box>* boxes, const float* data, const std::string& what) {
  H5Space file_space(h5_check_id(H5Dget_space(ds), what));
  H5PropList dxpl(h5_check_id(H5Pcreate(H5P_DATASET_XFER), what));
  h5_check(H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE), what);
  int64_t n = 0;
  if (boxes != nullptr)
    for (const Box& b : *boxes) n += b.volume();
  const float dummy = 0;
  const hsize_t mem_n = static_cast<hsize_t>(std::max<int64_t>(n, 1));
  H5Space mem = n == 0 ? H5Space(h5_check_id(H5Screate_simple(1, &mem_n, nullptr), what))
                       : memory_space(*boxes, mem_n, what);
  if (n == 0) {  // take part in the collective call with nothing to write
    h5_check(H5Sselect_none(mem.get()), what);
    h5_check(H5Sselect_none(file_space.get()), what);
    data = &dummy;
  } else {
    select_boxes(file_space.get(), *boxes, what);
  }
  h5_check(H5Dwrite(ds, H5T_NATIVE_FLOAT, mem.get(), file_space.get(), dxpl.get(), data), what);
}

// This rank's slices of `path` to write, in call order (matching plan.writes[rank]).
std::vector<const TensorSlice*> local_writes(const std::vector<TensorSlice>& slices, const std::string& path) {
  std::vector<const TensorSlice*> out;
  for (const TensorSlice& s : slices)
    if (s.write && s.path == path) out.push_back(&s);
  return out;
}

void write_tensors(hid_t file, const WritePlan& plan, const std::vector<TensorSlice>& slices, MPI_Comm comm,
                   const std::string& where, const TensorProducer* produce) {
  const int rank = comm_rank(comm);
  for (const auto& entry : plan) {
    // Named references, not a structured binding: lambdas cannot capture those before clang 16
    // (the fuzz build, docs/fuzzing.md, uses Debian's clang 14).
    const std::string& path = entry.first;
    const auto& d = entry.second;
    H5Dataset ds;
    together(comm, [&] { ds = create_dataset(file, path, d.shape, where); });
    const auto mine = local_writes(slices, path);
    const auto& writes = d.writes[static_cast<size_t>(rank)];
    const std::string what = "cannot write tensor " + path + " to " + where;
    std::vector<float> produced;  // streamed: this tensor only, made just before it is written
    if (produce) {
      together(comm, [&] {
        produced = (*produce)(path);
        TESSERA_CHECK(static_cast<int64_t>(produced.size()) == d.shape.numel(), "the tensor made for ", path, " has ",
                      produced.size(), " elements, its shape ", d.shape.str(), " holds ", d.shape.numel());
      });
    }
    for (size_t round = 0; round < d.rounds(); ++round) {
      together(comm, [&] {
        const bool have = round < writes.size();
        const float* data = !have ? nullptr : produce ? produced.data() : mine[round]->data;
        write_round(ds.get(), have ? &writes[round] : nullptr, data, what);
      });
    }
    together(comm, [&] { h5_check(ds.close(), "cannot close tensor " + path + " in " + where); });
  }
}

// Rank 0, once every rank has closed the file: gives back the reserved space past its end (a
// truncation to its own size frees preallocated blocks) and syncs it to disk.
void finish_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  TESSERA_CHECK(fd >= 0, "cannot open ", path, " to sync it: ", std::strerror(errno));
  struct stat st {};
  int rc = ::fstat(fd, &st);
  if (rc == 0) rc = ::ftruncate(fd, st.st_size);
  if (rc == 0) rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  TESSERA_CHECK(rc == 0, "cannot sync ", path, " to disk: ", std::strerror(err));
}

void write_file(const std::string& path, const CheckpointMeta& meta, const GroupAttributes& groups,
                const WritePlan& plan, const std::vector<TensorSlice>& slices, MPI_Comm comm, bool& created,
                const TensorProducer* produce) {
  const bool lead = comm_rank(comm) == 0;
  together(comm, [&] {
    if (lead) prepare_file(path, ckpt::estimated_file_bytes(plan, meta, groups));
  });
  created = true;
  H5File file;
  together(comm, [&] { file = create_file(path, comm); });
  const std::string checksum = metadata_checksum(meta, groups, planned_tensors(plan));
  together(comm, [&] { write_meta(file.get(), meta, groups, checksum, path); });
  write_tensors(file.get(), plan, slices, comm, path, produce);
  together(comm, [&] {
    h5_check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "cannot flush checkpoint file " + path);
    h5_check(file.close(), "cannot close checkpoint file " + path);
  });
  together(comm, [&] {
    if (lead) finish_file(path);
  });
}

}  // namespace

namespace {

void write_checkpoint(const std::string& path, const CheckpointMeta& meta, const std::vector<TensorSlice>& slices,
                      MPI_Comm comm, const GroupAttributes& groups, const TensorProducer* produce) {
  H5QuietErrors quiet;
  const WritePlan plan = ckpt::make_write_plan(slices, groups, comm);
  const auto [m, g] = broadcast_meta(meta, groups, comm);
  check_meta(m, g);
  bool created = false;
  try {
    write_file(path, m, g, plan, slices, comm, created, produce);
  } catch (const Error&) {
    // Every rank is here (errors are agreed) and the file is closed: leave no half-written file.
    if (created && comm_rank(comm) == 0) {
      std::error_code ec;
      fs::remove(path, ec);
    }
    throw;
  }
}

}  // namespace

void write_checkpoint_file(const std::string& path, const CheckpointMeta& meta, const std::vector<TensorSlice>& slices,
                           MPI_Comm comm, const GroupAttributes& groups) {
  write_checkpoint(path, meta, slices, comm, groups, nullptr);
}

void write_checkpoint_file_streamed(const std::string& path, const CheckpointMeta& meta,
                                    const std::vector<std::pair<std::string, Shape>>& tensors,
                                    const TensorProducer& produce, const GroupAttributes& groups) {
  // The plan checks that a slice to write has data; the real data is produced tensor by tensor.
  static const float kProducedLater = 0.0f;
  std::vector<TensorSlice> slices;
  for (const auto& [name, shape] : tensors)
    slices.push_back({name, shape, TensorSlice::kWhole, 0, shape, &kProducedLater, true});
  write_checkpoint(path, meta, slices, MPI_COMM_SELF, groups, &produce);
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

// HDF5 accepts declared shapes whose element count overflows int64 (chunks are allocated only
// when written); tessera counts elements in int64 and bytes in size_t.
constexpr hsize_t kMaxElements = hsize_t{1} << 60;

bool plausible(const std::vector<hsize_t>& dims) {
  if (std::find(dims.begin(), dims.end(), 0) != dims.end())
    return std::all_of(dims.begin(), dims.end(), [](hsize_t d) { return d <= kMaxElements; });
  hsize_t elements = 1;
  for (hsize_t d : dims) {
    if (elements > kMaxElements / d) return false;
    elements *= d;
  }
  return true;
}

Shape to_shape(const std::vector<hsize_t>& dims, const std::string& what) {
  TESSERA_CHECK(static_cast<int>(dims.size()) <= Shape::kMaxDims, what, " has ", dims.size(),
                " dimensions; tessera reads at most ", Shape::kMaxDims);
  std::string shown;
  for (hsize_t d : dims) shown += (shown.empty() ? "" : ", ") + std::to_string(d);
  TESSERA_CHECK(plausible(dims), what, " has an implausible shape (", shown, "): over 2^60 elements");
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

// The /meta group; `checksum` gets its stored checksum ("" in files written before there was one).
CheckpointMeta read_meta(hid_t file, const std::string& path, std::string& checksum) {
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
  checksum = attrs.count(kChecksumAttr) ? meta_field<std::string>(attrs, kChecksumAttr, path) : "";
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

bool has_fletcher32(hid_t dcpl) {
  const int n = H5Pget_nfilters(dcpl);
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, config = 0;
    size_t nvalues = 0;
    if (H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nvalues, nullptr, 0, nullptr, &config) ==
        H5Z_FILTER_FLETCHER32)
      return true;
  }
  return false;
}

// HDF5 1.10.8 trusts the stored size of each chunk that the chunk index records (in the 1.8 file
// format a version-1 B-tree, which has no checksum): a Fletcher32 chunk recorded as shorter than
// its 4-byte checksum makes H5Dread run past its buffer and crash (found by tests/fuzz's
// checkpoint target). So the chunks a read touches are looked up first (a B-tree lookup each).
void check_chunk_sizes(hid_t ds, const std::vector<Box>& boxes, const std::string& where) {
  const std::string what = "cannot read the chunk index of " + where;
  H5PropList dcpl(h5_check_id(H5Dget_create_plist(ds), what));
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED || !has_fletcher32(dcpl.get())) return;
  std::vector<hsize_t> chunk(static_cast<size_t>(Shape::kMaxDims));
  const int rank = H5Pget_chunk(dcpl.get(), Shape::kMaxDims, chunk.data());
  h5_check(rank, what);
  chunk.resize(static_cast<size_t>(rank));
  for (const Box& b : boxes) {
    if (b.start.size() != chunk.size() || b.volume() == 0) continue;
    // Chunk coordinates [first, last] along each dimension, visited like an odometer.
    std::vector<hsize_t> first(chunk.size()), last(chunk.size()), at(chunk.size()), offset(chunk.size());
    for (size_t d = 0; d < chunk.size(); ++d) {
      first[d] = static_cast<hsize_t>(b.start[d]) / chunk[d];
      last[d] = static_cast<hsize_t>(b.start[d] + b.count[d] - 1) / chunk[d];
    }
    at = first;
    while (true) {
      for (size_t d = 0; d < chunk.size(); ++d) offset[d] = at[d] * chunk[d];
      unsigned filter_mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      h5_check(H5Dget_chunk_info_by_coord(ds, offset.data(), &filter_mask, &addr, &size), what);
      TESSERA_CHECK(addr == HADDR_UNDEF || size >= 4, where, ": the file's chunk index records a chunk of ", size,
                    " bytes, less than its checksum: the file is corrupted");
      size_t d = chunk.size();  // the next chunk: the last dimension moves fastest
      for (; d > 0 && at[d - 1] == last[d - 1]; --d) at[d - 1] = first[d - 1];
      if (d == 0) break;
      ++at[d - 1];
    }
  }
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
  const std::string corrupted =
      "checksum mismatch in the metadata of " + path + " (/meta, group attributes, tensor names and shapes): the file is corrupted";
  together(comm, [&] {
    file_ = open_file(path);
    std::string stored_checksum;
    try {
      meta_ = read_meta(file_.get(), path, stored_checksum);
      VisitState st{path, {}, {}, {}};
      if (H5Lvisit(file_.get(), H5_INDEX_NAME, H5_ITER_INC, visit_link, &st) < 0)
        detail::fail(st.error.empty() ? "cannot list the contents of " + path : st.error);
      tensors_ = std::move(st.tensors);
      groups_ = std::move(st.groups);
      AttrMap root;
      for (const std::string& name : h5_attribute_names(file_.get(), "/ in " + path))
        root[name] = h5_read_attribute(file_.get(), name, "/ in " + path);
      if (!root.empty()) groups_["/"] = std::move(root);
    } catch (const Error& e) {
      // Attributes live in object headers, which HDF5 checksums itself: a flipped bit there fails
      // HDF5's check before tessera's, and is the same corruption to the user.
      if (mentions_checksum({e.what()})) {
        h5_mark_corrupt_metadata_seen();
        detail::fail(corrupted, " (", e.what(), ")");
      }
      throw;
    }
    // Files written before the checksum existed have none; they load as before.
    TESSERA_CHECK(stored_checksum.empty() || stored_checksum == metadata_checksum(meta_, groups_, tensors_), corrupted);
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

void CheckpointReader::use_model_base(std::unique_ptr<CheckpointReader> base) {
  for (const TensorInfo& t : base->tensors())
    if (t.path.rfind("/model/", 0) == 0 && !has(t.path)) {
      tensors_.push_back(t);
      from_base_.insert(t.path);
    }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) { return a.path < b.path; });
  base_ = std::move(base);
}

void CheckpointReader::read(const std::string& path, int dim, int64_t start, const Shape& local_shape,
                            float* out) const {
  if (from_base(path)) return base_->read(path, dim, start, local_shape, out);
  H5QuietErrors quiet;
  const TensorInfo& t = info(path);
  TESSERA_CHECK(t.dtype == "float32", path, " in ", path_, " has dtype ", t.dtype, "; tessera tensors are float32");
  const std::string bad = ckpt::selection_problem(t.shape, dim, start, local_shape);
  TESSERA_CHECK(bad.empty(), path, " in ", path_, " has shape ", t.shape.str(), ", but ", bad);
  const hsize_t n = static_cast<hsize_t>(ckpt::selection_size(t.shape, dim, local_shape));
  if (n == 0) return;
  const std::string what = "cannot read " + path + " from " + path_;
  H5Dataset ds(h5_check_id(H5Dopen2(file_.get(), path.c_str(), H5P_DEFAULT), what));
  H5Space file_space(h5_check_id(H5Dget_space(ds.get()), what));
  const auto boxes = ckpt::selection_boxes(t.shape, dim, start, local_shape);
  check_chunk_sizes(ds.get(), boxes, path + " in " + path_);
  select_boxes(file_space.get(), boxes, what);
  H5Space mem = memory_space(boxes, n, what);
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
  read(path, TensorSlice::kWhole, 0, s, out.data());
  return out;
}

void verify_tensors(const CheckpointReader& reader, MPI_Comm comm) {
  constexpr int64_t kBlockElements = int64_t{16} << 20;
  const int rank = comm_rank(comm), size = comm_size(comm);
  // Largest first, each to the rank with the fewest bytes so far: the same on every rank, since
  // all read the same list.
  std::vector<const TensorInfo*> order;
  for (const TensorInfo& t : reader.tensors())
    if (t.dtype == "float32" && t.shape.numel() > 0) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const TensorInfo* a, const TensorInfo* b) { return a->shape.numel() > b->shape.numel(); });
  std::vector<int64_t> load(static_cast<size_t>(size), 0);
  together(comm, [&] {
    std::vector<float> buf;
    for (const TensorInfo* t : order) {
      const auto owner = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[owner] += t->shape.numel();
      if (static_cast<int>(owner) != rank) continue;
      const Shape& s = t->shape;
      const int64_t row = s.numel() / s[0];
      const int64_t rows_per_block = std::max<int64_t>(1, kBlockElements / row);
      for (int64_t r0 = 0; r0 < s[0]; r0 += rows_per_block) {
        Shape part = s;
        part[0] = std::min(rows_per_block, s[0] - r0);
        buf.resize(static_cast<size_t>(part.numel()));
        reader.read(t->path, 0, r0, part, buf.data());
      }
    }
  });
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
                mismatches.size() == 1 ? " mismatch" : " mismatches", "):\n  ", ckpt::join(mismatches, "\n  "));
}

}  // namespace tessera
