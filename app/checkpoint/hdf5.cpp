// HDF5 error capture and scalar attributes. Error reasons are read from HDF5's error stack right
// after a failed call (the next call clears it), so checks run before any handle is closed.
#include "app/checkpoint/hdf5.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/check.h"

namespace tessera {

namespace {
// Whether any H5Fclose failed, and whether a file's metadata failed HDF5's checksum. HDF5's state
// is process-wide, and so are these facts about it.
std::atomic<bool> g_file_close_failed{false};
std::atomic<bool> g_corrupt_metadata_seen{false};
}  // namespace

void h5_mark_corrupt_metadata_seen() { g_corrupt_metadata_seen.store(true); }

herr_t h5_close_file(hid_t file) {
  const herr_t rc = H5Fclose(file);
  if (rc < 0) g_file_close_failed.store(true);
  return rc;
}

H5Shutdown h5_shutdown() {
  if (g_file_close_failed.load()) return H5Shutdown::CloseFailed;
  if (g_corrupt_metadata_seen.load()) return H5Shutdown::CorruptMetadataSeen;
  // H5close closes whatever is still open (files last) while MPI is still alive; afterwards
  // HDF5's hooks in MPI_Finalize and atexit find nothing to do.
  return H5close() >= 0 ? H5Shutdown::Clean : H5Shutdown::CloseFailed;
}

H5QuietErrors::H5QuietErrors() {
  H5Eget_auto2(H5E_DEFAULT, &old_func_, &old_data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

H5QuietErrors::~H5QuietErrors() { H5Eset_auto2(H5E_DEFAULT, old_func_, old_data_); }

namespace {
herr_t collect_error(unsigned /*n*/, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (err->desc && *err->desc) out->emplace_back(err->desc);
  return 0;
}
}  // namespace

std::vector<std::string> h5_error_messages() {
  std::vector<std::string> out;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &out);
  return out;
}

std::string h5_error_reason() {
  auto messages = h5_error_messages();
  return messages.empty() ? std::string() : messages.back();
}

namespace {
[[noreturn]] void fail_with_reason(const std::string& what) {
  std::string reason = h5_error_reason();
  throw Error(reason.empty() ? what : what + ": " + reason);
}
}  // namespace

hid_t h5_check_id(hid_t id, const std::string& what) {
  if (id < 0) fail_with_reason(what);
  return id;
}

void h5_check(herr_t rc, const std::string& what) {
  if (rc < 0) fail_with_reason(what);
}

namespace {
H5Type string_type(size_t size) {
  H5Type t(h5_check_id(H5Tcopy(H5T_C_S1), "cannot create a string type"));
  h5_check(H5Tset_size(t.get(), size), "cannot size a string type");
  h5_check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "cannot set a string type's character set");
  const H5T_str_t pad = size == H5T_VARIABLE ? H5T_STR_NULLTERM : H5T_STR_NULLPAD;
  h5_check(H5Tset_strpad(t.get(), pad), "cannot set a string type's padding");
  return t;
}

void write_raw_attribute(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type, const void* data,
                         const std::string& where) {
  const std::string what = "cannot write attribute " + name + " of " + where;
  if (H5Aexists(obj, name.c_str()) > 0) h5_check(H5Adelete(obj, name.c_str()), what);
  H5Space space(h5_check_id(H5Screate(H5S_SCALAR), what));
  H5Attribute attr(h5_check_id(H5Acreate2(obj, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), what));
  h5_check(H5Awrite(attr.get(), mem_type, data), what);
}

std::string read_string_attribute(hid_t attr, hid_t file_type, const std::string& what) {
  if (H5Tis_variable_str(file_type) > 0) {
    H5Type mem(h5_check_id(H5Tcopy(H5T_C_S1), what));
    h5_check(H5Tset_size(mem.get(), H5T_VARIABLE), what);
    h5_check(H5Tset_cset(mem.get(), H5Tget_cset(file_type)), what);
    char* s = nullptr;
    h5_check(H5Aread(attr, mem.get(), &s), what);
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t n = H5Tget_size(file_type);
  std::string out(n, '\0');
  H5Type mem = string_type(n);
  h5_check(H5Aread(attr, mem.get(), out.data()), what);
  out.resize(std::strlen(out.c_str()));  // drop the padding
  return out;
}
}  // namespace

void h5_write_attribute(hid_t obj, const std::string& name, const H5Scalar& value, const std::string& where) {
  if (const auto* i = std::get_if<int64_t>(&value)) {
    write_raw_attribute(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, i, where);
  } else if (const auto* d = std::get_if<double>(&value)) {
    write_raw_attribute(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, d, where);
  } else {
    const std::string& s = std::get<std::string>(value);
    TESSERA_CHECK(s.find('\0') == std::string::npos, "string attribute ", name, " of ", where, " contains a NUL byte");
    // Fixed-length (the text inside the attribute, under HDF5's metadata checksums), not
    // variable-length: that text lives in the global heap, which has no checksum, and HDF5 1.10.8
    // loops forever on some corrupted heaps (docs/fuzzing.md). One byte at least: HDF5 has no
    // empty fixed-length type; the NUL pad reads back as "".
    H5Type t = string_type(std::max<size_t>(s.size(), 1));
    write_raw_attribute(obj, name, t.get(), t.get(), s.c_str(), where);
  }
}

H5Scalar h5_read_attribute(hid_t obj, const std::string& name, const std::string& where) {
  const std::string what = "cannot read attribute " + name + " of " + where;
  H5Attribute attr(h5_check_id(H5Aopen(obj, name.c_str(), H5P_DEFAULT), what));
  H5Type type(h5_check_id(H5Aget_type(attr.get()), what));
  H5Space space(h5_check_id(H5Aget_space(attr.get()), what));
  TESSERA_CHECK(H5Sget_simple_extent_npoints(space.get()) == 1, "attribute ", name, " of ", where,
                " is not a scalar");
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER: {
      int64_t v = 0;
      h5_check(H5Aread(attr.get(), H5T_NATIVE_INT64, &v), what);
      return v;
    }
    case H5T_FLOAT: {
      double v = 0;
      h5_check(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &v), what);
      return v;
    }
    case H5T_STRING:
      return read_string_attribute(attr.get(), type.get(), what);
    default:
      detail::fail("attribute ", name, " of ", where, " has an unsupported type (expected an integer, float or string)");
  }
}

namespace {
herr_t collect_attribute_name(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> h5_attribute_names(hid_t obj, const std::string& where) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  h5_check(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, collect_attribute_name, &names),
           "cannot list the attributes of " + where);
  return names;
}

std::vector<hsize_t> h5_dims(hid_t space) {
  const int n = H5Sget_simple_extent_ndims(space);
  h5_check(n, "cannot read a dataspace's rank");
  std::vector<hsize_t> dims(static_cast<size_t>(n));
  h5_check(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "cannot read a dataspace's dimensions");
  return dims;
}

}  // namespace tessera
