// Fuzzes the checkpoint reader (app/checkpoint/checkpoint_io.h, and `tessera ckpt inspect`) on well-formed
// HDF5 files of any content: the input is a little program that writes a file through the HDF5
// API (groups, attributes and datasets of any type, shape and layout, links), so the fuzzer reaches
// tessera's own checks behind HDF5's metadata checksums, which byte mutations (the checkpoint
// target) rarely get past. Written serially (sec2 driver) with the 1.8 file format, as tessera's
// writer uses; read as `ckpt inspect` does, on MPI_COMM_SELF.
#include <hdf5.h>
#include <mpi.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "app/checkpoint/checkpoint_io.h"
#include "app/checkpoint/ckpt_commands.h"
#include "app/config.h"
#include "fuzz_common.h"

namespace tf = tessera::fuzz;
using namespace tessera;

namespace {

// The input as a stream of choices; reads past the end give zeros.
class Choices {
 public:
  Choices(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool done() const { return p_ >= end_; }
  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  template <size_t N>
  const char* pick(const std::array<const char*, N>& names) { return names[byte() % N]; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{byte()} << (8 * i);
    return v;
  }
  // A dimension: mostly small, sometimes a power of two up to 2^62, sometimes anything.
  hsize_t dim() {
    const uint8_t b = byte();
    if (b < 200) return b % 6;
    if (b < 250) return hsize_t{1} << (b - 200 + 13);
    return u64();
  }
  std::string text(size_t max) {
    std::string s;
    for (size_t n = byte() % (max + 1); n > 0 && !done(); --n) s.push_back(static_cast<char>(byte()));
    return s;
  }
  void bytes(void* out, size_t n) {
    auto* o = static_cast<uint8_t*>(out);
    for (size_t i = 0; i < n; ++i) o[i] = byte();
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

constexpr std::array<const char*, 12> kPaths = {
    "/meta", "/model", "/optim", "/model/wte.weight", "/model/h.0", "/model/h.0/attn.weight",
    "/optim/m", "/optim/step", "/x", "/meta/config", "/model/h.0/h.1", "/"};
constexpr std::array<const char*, 12> kAttributes = {
    "format_version", "tessera_version", "step", "tokens_seen", "consumed_samples", "config",
    "seed", "data_seed", "rng", "format_version", "config", "x y"};

// Closes an HDF5 id of any kind at scope end (ids that failed are negative and skipped).
struct Id {
  hid_t id;
  explicit Id(hid_t i) : id(i) {}
  ~Id() {
    if (id >= 0) H5Idec_ref(id);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
};

// A datatype chosen by the input, or -1.
hid_t make_type(Choices& in) {
  switch (in.byte() % 14) {
    case 0: return H5Tcopy(H5T_STD_I8LE);
    case 1: return H5Tcopy(H5T_STD_U8LE);
    case 2: return H5Tcopy(H5T_STD_I32LE);
    case 3: return H5Tcopy(H5T_STD_I64LE);
    case 4: return H5Tcopy(H5T_STD_U64LE);
    case 5: return H5Tcopy(H5T_IEEE_F32LE);
    case 6: return H5Tcopy(H5T_IEEE_F64BE);
    case 7: {  // fixed-length string of 1..64 bytes, any padding and character set
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, 1 + in.byte() % 64);
      H5Tset_strpad(t, static_cast<H5T_str_t>(in.byte() % 3));
      H5Tset_cset(t, in.byte() % 2 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
      return t;
    }
    case 8: {
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      H5Tset_cset(t, in.byte() % 2 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
      return t;
    }
    case 9: {
      const hid_t t = H5Tcreate(H5T_COMPOUND, 12);
      H5Tinsert(t, "a", 0, H5T_STD_I32LE);
      H5Tinsert(t, "b", 4, H5T_IEEE_F64LE);
      return t;
    }
    case 10: {
      const hsize_t n = 1 + in.byte() % 3;
      return H5Tarray_create2(H5T_STD_I64LE, 1, &n);
    }
    case 11: {
      const hid_t t = H5Tenum_create(H5T_STD_I16LE);
      const int16_t a = 0, b = 1;
      H5Tenum_insert(t, "a", &a);
      H5Tenum_insert(t, "b", &b);
      return t;
    }
    case 12: return H5Tcopy(H5T_STD_B16LE);
    default: {
      const hid_t t = H5Tcreate(H5T_OPAQUE, 1 + in.byte() % 8);
      return t;
    }
  }
}

// A dataspace chosen by the input: scalar, null, or simple of rank 0..8.
hid_t make_space(Choices& in, bool small) {
  const uint8_t kind = in.byte() % 4;
  if (kind == 0) return H5Screate(H5S_SCALAR);
  if (kind == 1) return H5Screate(H5S_NULL);
  const int rank = 1 + in.byte() % 8;
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), max(dims.size());
  for (int i = 0; i < rank; ++i) {
    dims[i] = small ? in.byte() % 3 : in.dim();
    max[i] = dims[i] == 0 || in.byte() % 4 == 0 ? H5S_UNLIMITED : dims[i];
  }
  return H5Screate_simple(rank, dims.data(), max.data());
}

// Writes the value of an attribute or a small dataset: bytes from the input, and for variable-
// length strings a pointer to input text (or a null pointer).
template <typename Write>
void write_value(Choices& in, hid_t type, hid_t space, Write&& write) {
  const hssize_t n = H5Sget_select_npoints(space);
  if (n < 0 || n > 4096) return;
  const size_t count = static_cast<size_t>(n);
  if (H5Tis_variable_str(type) > 0) {
    std::vector<std::string> texts(count);
    std::vector<const char*> ptrs(count);
    for (size_t i = 0; i < count; ++i) {
      texts[i] = in.text(40);
      ptrs[i] = in.byte() % 8 == 0 ? nullptr : texts[i].c_str();
    }
    write(type, static_cast<const void*>(ptrs.data()));
    return;
  }
  const size_t size = H5Tget_size(type);
  if (size == 0) return;
  std::vector<uint8_t> buf(size * (count ? count : 1));
  in.bytes(buf.data(), buf.size());
  write(type, static_cast<const void*>(buf.data()));
}

hid_t open_object(hid_t file, const char* path) {
  if (H5Lexists(file, path, H5P_DEFAULT) <= 0 && std::strcmp(path, "/") != 0) return -1;
  return H5Oopen(file, path, H5P_DEFAULT);
}

void add_attribute(Choices& in, hid_t file) {
  Id obj(open_object(file, in.pick(kPaths)));
  const char* name = in.pick(kAttributes);
  Id type(make_type(in));
  Id space(make_space(in, true));
  if (obj.id < 0 || type.id < 0 || space.id < 0) return;
  if (H5Aexists(obj.id, name) > 0) H5Adelete(obj.id, name);
  Id attr(H5Acreate2(obj.id, name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT));
  if (attr.id < 0) return;
  write_value(in, type.id, space.id, [&](hid_t t, const void* v) { H5Awrite(attr.id, t, v); });
}

void add_dataset(Choices& in, hid_t file, hid_t lcpl) {
  const char* path = in.pick(kPaths);
  Id type(in.byte() % 2 ? H5Tcopy(H5T_IEEE_F32LE) : make_type(in));
  Id space(make_space(in, false));
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (type.id < 0 || space.id < 0 || dcpl.id < 0) return;
  const int rank = H5Sget_simple_extent_ndims(space.id);
  const uint8_t layout = in.byte() % 3;
  if (layout == 0 && rank > 0) {  // chunked, as tessera writes, optionally with Fletcher32
    std::vector<hsize_t> chunk(static_cast<size_t>(rank));
    for (auto& c : chunk) c = 1 + in.byte() % 4;
    H5Pset_chunk(dcpl.id, rank, chunk.data());
    if (in.byte() % 2) H5Pset_fletcher32(dcpl.id);
  } else if (layout == 1) {
    H5Pset_layout(dcpl.id, H5D_COMPACT);
  }
  Id ds(H5Dcreate2(file, path, type.id, space.id, lcpl, dcpl.id, H5P_DEFAULT));
  if (ds.id < 0 || in.byte() % 4 == 0) return;  // sometimes left unwritten (fill values)
  write_value(in, type.id, space.id, [&](hid_t t, const void* v) { H5Dwrite(ds.id, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v); });
}

void add_link(Choices& in, hid_t file, hid_t lcpl) {
  const char* from = in.pick(kPaths);
  const char* to = in.pick(kPaths);
  switch (in.byte() % 3) {
    case 0: H5Lcreate_hard(file, to, file, from, lcpl, H5P_DEFAULT); break;
    case 1: H5Lcreate_soft(to, file, from, lcpl, H5P_DEFAULT); break;
    default: H5Lcreate_external("missing.h5", to, file, from, lcpl, H5P_DEFAULT); break;
  }
}

// Writes the file that the input describes. Most HDF5 calls may fail (a path taken, a bad
// combination): the program goes on with what was made.
void write_file(const std::string& path, Choices& in) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_libver_bounds(fapl.id, H5F_LIBVER_V18, H5F_LIBVER_V110);
  Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id));
  if (file.id < 0) tf::finding("cannot create " + path);
  Id lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.id, 1);
  for (int op = 0; op < 64 && !in.done(); ++op) {
    switch (in.byte() % 4) {
      case 0: {
        const Id group(H5Gcreate2(file.id, in.pick(kPaths), lcpl.id, H5P_DEFAULT, H5P_DEFAULT));
        break;
      }
      case 1: add_attribute(in, file.id); break;
      case 2: add_dataset(in, file.id, lcpl.id); break;
      default: add_link(in, file.id, lcpl.id); break;
    }
  }
}

// ckpt inspect runs on files whose tensors hold at most this many elements in all.
constexpr int64_t kInspectElements = int64_t{1} << 22;

// The elements of all tensors, or kInspectElements + 1 when that is more.
int64_t total_elements(const CheckpointReader& r) {
  int64_t total = 0;
  for (const TensorInfo& t : r.tensors()) {
    const int64_t n = t.shape.numel();
    if (n > kInspectElements || (total += n) > kInspectElements) return kInspectElements + 1;
  }
  return total;
}

void read_tensors(const CheckpointReader& r) {
  for (const TensorInfo& t : r.tensors()) {
    if (t.dtype != "float32" || t.shape.numel() > (int64_t{1} << 20)) continue;
    (void)r.read_all(t.path);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  MPI_Init(nullptr, nullptr);
  std::atexit([] {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  });
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // the writer's expected failures stay quiet
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tf::ScratchDir dir("checkpoint_objects");
  static const std::string path = dir / "step_00000001.h5";
  Choices in(data, size);
  write_file(path, in);
  bool small = false;
  tf::expect_clean("CheckpointReader", [&] {
    const CheckpointReader r(path, MPI_COMM_SELF);
    small = total_elements(r) <= kInspectElements;
    read_tensors(r);
    // What generate does with the stored config.
    tf::expect_clean("the stored config", [&] { (void)parse_config_string(r.meta().config_toml, "stored config"); });
  });
  // inspect reads every element: of a declared (3, 2^30) tensor with no data, that is only slow.
  if (small) {
    tf::expect_clean("ckpt inspect", [&] {
      std::ostringstream out;
      run_ckpt_inspect(CkptInspectArgs{path, true}, out);
    });
  }
  return 0;
}
