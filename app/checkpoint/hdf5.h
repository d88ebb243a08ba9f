// Small RAII layer over the HDF5 C API: one handle template parameterized by its close function,
// error checks that throw tessera::Error naming the file and object (with HDF5's innermost reason,
// never its printed stack), and scalar attributes as int64 / double / string.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace tessera {

// Owns one HDF5 identifier; Close is the matching H5?close function.
template <herr_t (*Close)(hid_t)>
class H5Handle {
 public:
  H5Handle() = default;
  explicit H5Handle(hid_t id) : id_(id) {}
  ~H5Handle() { close(); }
  H5Handle(H5Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      close();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now (idempotent); returns the close status so callers that must know can check it.
  herr_t close() {
    herr_t rc = id_ >= 0 ? Close(id_) : 0;
    id_ = H5I_INVALID_HID;
    return rc;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// H5Fclose, remembering a failure: HDF5 1.10 cannot close such a file again (h5_shutdown).
herr_t h5_close_file(hid_t file);
// Remembers that a file's metadata failed HDF5's own checksum: HDF5 1.10.8 keeps the bad entry in
// its cache and loops at shutdown ("infinite loop closing library"), so h5_shutdown then declines.
void h5_mark_corrupt_metadata_seen();

using H5File = H5Handle<h5_close_file>;
using H5Group = H5Handle<H5Gclose>;
using H5Dataset = H5Handle<H5Dclose>;
using H5Space = H5Handle<H5Sclose>;
using H5PropList = H5Handle<H5Pclose>;
using H5Attribute = H5Handle<H5Aclose>;
using H5Type = H5Handle<H5Tclose>;
using H5Object = H5Handle<H5Oclose>;  // a group or dataset opened by H5Oopen

// Closes every HDF5 object still open and shuts the library down. main() calls it before
// MPI_Finalize: parallel HDF5 hooks its own shutdown into MPI_Finalize, and a file still open
// there is closed after its MPI-IO handle is gone (a crash). Returns false when HDF5 cannot be
// shut down safely because a file failed to close (its half-destroyed state crashes any later
// close, HDF5's own at exit included); the process must then end without MPI_Finalize or atexit
// handlers (std::_Exit).
// CorruptMetadataSeen: the files closed, but a corrupt file's metadata stays in HDF5's cache, and
// shutting HDF5 down would loop on it; the process ends the same way, with its own exit code.
enum class H5Shutdown { Clean, CloseFailed, CorruptMetadataSeen };
H5Shutdown h5_shutdown();

// While alive, HDF5 does not print its error stack (H5Eset_auto off); restores the previous
// setting on destruction. Every public entry point of the checkpoint layer holds one, so users
// see one tessera::Error, not a trace.
class H5QuietErrors {
 public:
  H5QuietErrors();
  ~H5QuietErrors();
  H5QuietErrors(const H5QuietErrors&) = delete;
  H5QuietErrors& operator=(const H5QuietErrors&) = delete;

 private:
  H5E_auto2_t old_func_ = nullptr;
  void* old_data_ = nullptr;
};

// The descriptions on HDF5's current error stack, outermost (the API call) first. Must be called
// right after the failing call: the next HDF5 call clears the stack.
std::vector<std::string> h5_error_messages();
// The innermost description ("truncated file: eof = ...", "file signature not found"); "" if none.
std::string h5_error_reason();

// Throw tessera::Error("<what>: <innermost HDF5 reason>") when the call failed.
hid_t h5_check_id(hid_t id, const std::string& what);
void h5_check(herr_t rc, const std::string& what);

// Scalar attribute values. Strings are stored as fixed-length UTF-8, NUL-padded (the text sits in
// the attribute, covered by HDF5's metadata checksums; h5py reads them as bytes); reads also
// accept variable-length strings (checkpoints written before, h5py's default).
using H5Scalar = std::variant<int64_t, double, std::string>;
// Creates (or replaces) attribute `name` on the object `obj`; `where` names the object in errors.
void h5_write_attribute(hid_t obj, const std::string& name, const H5Scalar& value, const std::string& where);
// Reads any integer, float or string scalar attribute; other types are an error naming it.
H5Scalar h5_read_attribute(hid_t obj, const std::string& name, const std::string& where);
std::vector<std::string> h5_attribute_names(hid_t obj, const std::string& where);

// The dimensions of a simple dataspace.
std::vector<hsize_t> h5_dims(hid_t space);

}  // namespace tessera
