// A small read-only HDF5 reader for test fixtures (tests/reference/*.h5): datasets as double or
// int32 vectors with their shape, and scalar attributes. RAII over the HDF5 C handles.
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

#include "kernels/check.h"

namespace tessera::testing {

class H5Handle {
 public:
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Handle() {
    if (id_ >= 0) close_(id_);
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  hid_t get() const { return id_; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

template <typename T>
struct H5Array {
  std::vector<T> values;
  std::vector<int64_t> shape;
};

class H5Reader {
 public:
  explicit H5Reader(const std::string& path) : path_(path), file_(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose) {
    TESSERA_CHECK(file_.get() >= 0, "cannot open HDF5 fixture ", path);
  }
  bool exists(const std::string& name) const { return H5Lexists(file_.get(), name.c_str(), H5P_DEFAULT) > 0; }

  template <typename T>
  H5Array<T> read(const std::string& name) const {
    H5Handle ds(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    TESSERA_CHECK(ds.get() >= 0, path_, ": no dataset ", name);
    H5Handle space(H5Dget_space(ds.get()), H5Sclose);
    int nd = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> dims(static_cast<size_t>(nd));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    H5Array<T> out;
    size_t n = 1;
    for (hsize_t d : dims) {
      out.shape.push_back(static_cast<int64_t>(d));
      n *= d;
    }
    out.values.resize(n);
    hid_t mem = std::is_same_v<T, double> ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT32;
    TESSERA_CHECK(H5Dread(ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.values.data()) >= 0, path_,
                  ": cannot read ", name);
    return out;
  }

  double attr_double(const std::string& obj, const std::string& attr) const {
    double v = 0;
    read_attr(obj, attr, H5T_NATIVE_DOUBLE, &v);
    return v;
  }
  int64_t attr_int(const std::string& obj, const std::string& attr) const {
    int64_t v = 0;
    read_attr(obj, attr, H5T_NATIVE_INT64, &v);
    return v;
  }
  std::string attr_string(const std::string& obj, const std::string& attr) const {
    H5Handle a(H5Aopen_by_name(file_.get(), obj.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    TESSERA_CHECK(a.get() >= 0, path_, ": no attribute ", obj, "@", attr);
    H5Handle type(H5Aget_type(a.get()), H5Tclose);
    if (H5Tis_variable_str(type.get()) > 0) {
      char* s = nullptr;
      H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem.get(), H5T_VARIABLE);
      H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
      H5Aread(a.get(), mem.get(), &s);
      std::string out = s ? s : "";
      H5free_memory(s);
      return out;
    }
    std::string out(H5Tget_size(type.get()), '\0');
    H5Aread(a.get(), type.get(), out.data());
    return out.c_str();
  }

 private:
  void read_attr(const std::string& obj, const std::string& attr, hid_t mem, void* dst) const {
    H5Handle a(H5Aopen_by_name(file_.get(), obj.c_str(), attr.c_str(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    TESSERA_CHECK(a.get() >= 0, path_, ": no attribute ", obj, "@", attr);
    TESSERA_CHECK(H5Aread(a.get(), mem, dst) >= 0, path_, ": cannot read attribute ", obj, "@", attr);
  }
  std::string path_;
  H5Handle file_;
};

}  // namespace tessera::testing
