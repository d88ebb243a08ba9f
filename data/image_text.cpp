// The image-text HDF5 format: checks, writer, reader (HDF5 C API, serial access) and the dataset.
#include "data/image_text.h"

#include <hdf5.h>

#include <algorithm>
#include <utility>

#include "kernels/check.h"

namespace tessera {

namespace {
constexpr const char* kFormat = "tessera-image-text";
constexpr int64_t kVersion = 1;

// An HDF5 id closed on scope exit.
class H5Id {
 public:
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5Id() {
    if (id_ >= 0) close_(id_);
  }
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints its own error stack by default; our messages say what is wrong.
struct QuietHdf5 {
  H5E_auto2_t func = nullptr;
  void* data = nullptr;
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func, &data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func, data); }
};

void write_dataset(hid_t file, const char* name, hid_t type, const std::vector<hsize_t>& dims, const void* data,
                   const std::string& path) {
  H5Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Id ds(H5Dcreate2(file, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  TESSERA_CHECK(ds.ok(), path, ": cannot create dataset /", name);
  TESSERA_CHECK(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0, path, ": cannot write /", name);
}

void write_int_attr(hid_t obj, const char* name, int64_t v) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id a(H5Acreate2(obj, name, H5T_NATIVE_INT64, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Awrite(a.get(), H5T_NATIVE_INT64, &v);
}

void write_string_attr(hid_t obj, const char* name, const std::string& v) {
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(1, v.size()));
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id a(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Awrite(a.get(), type.get(), v.empty() ? " " : v.c_str());
}

// Reads /name, which must have `rank` dimensions of the type class `cls`, into out (as mem).
template <typename T>
std::vector<hsize_t> read_dataset(hid_t file, const char* name, int rank, H5T_class_t cls, hid_t mem, bool is_signed,
                                  size_t bytes, std::vector<T>& out, const std::string& path) {
  TESSERA_CHECK(H5Lexists(file, name, H5P_DEFAULT) > 0, path, ": no dataset /", name);
  H5Id ds(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  TESSERA_CHECK(ds.ok(), path, ": /", name, " is not a dataset");
  H5Id type(H5Dget_type(ds.get()), H5Tclose);
  const bool sign_ok = H5Tget_class(type.get()) != H5T_INTEGER || (H5Tget_sign(type.get()) == H5T_SGN_2) == is_signed;
  TESSERA_CHECK(H5Tget_class(type.get()) == cls && H5Tget_size(type.get()) == bytes && sign_ok, path, ": /", name,
                " has the wrong element type; expected ", is_signed ? "int" : "uint", bytes * 8);
  H5Id space(H5Dget_space(ds.get()), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(space.get());
  TESSERA_CHECK(nd == rank, path, ": /", name, " has ", nd, " dimensions; expected ", rank);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  size_t n = 1;
  for (hsize_t d : dims) n *= d;
  out.resize(n);
  if (n > 0)
    TESSERA_CHECK(H5Dread(ds.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0, path, ": cannot read /",
                  name);
  return dims;
}

H5Id open_attr(hid_t obj, const char* name, const std::string& path) {
  TESSERA_CHECK(H5Aexists(obj, name) > 0, path, ": no attribute ", name, " on the root group");
  return H5Id(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
}

int64_t read_int_attr(hid_t obj, const char* name, const std::string& path) {
  H5Id a = open_attr(obj, name, path);
  H5Id type(H5Aget_type(a.get()), H5Tclose);
  TESSERA_CHECK(H5Tget_class(type.get()) == H5T_INTEGER, path, ": attribute ", name, " is not an integer");
  int64_t v = 0;
  H5Aread(a.get(), H5T_NATIVE_INT64, &v);
  return v;
}

std::string read_string_attr(hid_t obj, const char* name, const std::string& path) {
  H5Id a = open_attr(obj, name, path);
  H5Id type(H5Aget_type(a.get()), H5Tclose);
  TESSERA_CHECK(H5Tget_class(type.get()) == H5T_STRING && !H5Tis_variable_str(type.get()), path, ": attribute ", name,
                " is not a fixed-length string");
  std::string v(H5Tget_size(type.get()), '\0');
  H5Aread(a.get(), type.get(), v.data());
  v.erase(std::find(v.begin(), v.end(), '\0'), v.end());
  return v;
}
}  // namespace

void check_image_text(const ImageTextData& d, const std::string& where) {
  const ImageShape& s = d.image_shape;
  TESSERA_CHECK(s.height > 0 && s.width > 0 && s.channels > 0, where, ": /images: every dimension of (N, H, W, C) ",
                "must be positive, got H = ", s.height, ", W = ", s.width, ", C = ", s.channels);
  TESSERA_CHECK(static_cast<int64_t>(d.images.size()) % s.numel() == 0, where, ": /images: ", d.images.size(),
                " bytes are not whole images of ", s.numel());
  TESSERA_CHECK(d.vocab_size > 0, where, ": attribute vocab_size must be positive, got ", d.vocab_size);
  TESSERA_CHECK(d.placeholder_id >= 0 && d.placeholder_id < d.vocab_size, where, ": attribute placeholder_id = ",
                d.placeholder_id, " is outside the vocabulary [0, ", d.vocab_size, ")");
  TESSERA_CHECK(d.pad_id >= 0 && d.pad_id < d.vocab_size && d.pad_id != d.placeholder_id, where,
                ": attribute pad_id = ", d.pad_id, " must be a token id other than placeholder_id");
  TESSERA_CHECK(!d.tokenizer.empty(), where, ": attribute tokenizer is empty");
  const int64_t S = d.num_samples(), M = static_cast<int64_t>(d.tokens.size()), N = d.num_images();
  TESSERA_CHECK(static_cast<int64_t>(d.offsets.size()) == S + 1, where, ": /offsets has ", d.offsets.size(),
                " entries; expected S + 1 = ", S + 1, " for the ", S, " samples of /image_index");
  TESSERA_CHECK(d.offsets.front() == 0 && d.offsets.back() == M, where, ": /offsets must run from 0 to the ", M,
                " entries of /tokens, got ", d.offsets.front(), " to ", d.offsets.back());
  for (int64_t i = 0; i < M; ++i)
    TESSERA_CHECK(d.tokens[i] >= 0 && d.tokens[i] < d.vocab_size, where, ": /tokens[", i, "] = ", d.tokens[i],
                  " is outside the vocabulary [0, ", d.vocab_size, ")");
  int64_t run_length = 0;
  for (int64_t sm = 0; sm < S; ++sm) {
    const int64_t a = d.offsets[sm], b = d.offsets[sm + 1];
    TESSERA_CHECK(a <= b, where, ": /offsets decreases at sample ", sm, " (", a, " then ", b, ")");
    const int64_t img = d.image_index[sm];
    TESSERA_CHECK(img >= -1 && img < N, where, ": /image_index[", sm, "] = ", img, " is neither -1 nor an image [0, ",
                  N, ")");
    int64_t first = -1, count = 0;
    for (int64_t i = a; i < b; ++i)
      if (d.tokens[i] == d.placeholder_id) {
        if (first < 0) first = i;
        ++count;
        TESSERA_CHECK(i == first + count - 1, where, ": /tokens: sample ", sm, "'s placeholder tokens (id ",
                      d.placeholder_id, ") are not one run");
      }
    if (img < 0) {
      TESSERA_CHECK(count == 0, where, ": /tokens: sample ", sm, " is text only (/image_index -1) but holds ", count,
                    " placeholder tokens");
      continue;
    }
    TESSERA_CHECK(count > 0, where, ": /tokens: sample ", sm, " has image ", img, " but no placeholder token (id ",
                  d.placeholder_id, ")");
    TESSERA_CHECK(run_length == 0 || count == run_length, where, ": /tokens: sample ", sm, " has ", count,
                  " placeholder tokens, earlier image samples ", run_length, "; every image takes the same number");
    run_length = count;
  }
}

void write_image_text(const std::string& path, const ImageTextData& d) {
  check_image_text(d, path);
  const QuietHdf5 quiet;
  H5Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  TESSERA_CHECK(file.ok(), path, ": cannot create the file");
  const ImageShape& s = d.image_shape;
  write_dataset(file.get(), "images", H5T_NATIVE_UINT8,
                {static_cast<hsize_t>(d.num_images()), static_cast<hsize_t>(s.height), static_cast<hsize_t>(s.width),
                 static_cast<hsize_t>(s.channels)},
                d.images.data(), path);
  write_dataset(file.get(), "tokens", H5T_NATIVE_INT32, {d.tokens.size()}, d.tokens.data(), path);
  write_dataset(file.get(), "offsets", H5T_NATIVE_INT64, {d.offsets.size()}, d.offsets.data(), path);
  write_dataset(file.get(), "image_index", H5T_NATIVE_INT64, {d.image_index.size()}, d.image_index.data(), path);
  write_string_attr(file.get(), "format", kFormat);
  write_int_attr(file.get(), "version", kVersion);
  write_string_attr(file.get(), "tokenizer", d.tokenizer);
  write_int_attr(file.get(), "vocab_size", d.vocab_size);
  write_int_attr(file.get(), "placeholder_id", d.placeholder_id);
  write_int_attr(file.get(), "pad_id", d.pad_id);
}

ImageTextData read_image_text(const std::string& path) {
  const QuietHdf5 quiet;
  TESSERA_CHECK(H5Fis_hdf5(path.c_str()) > 0, path, ": not an HDF5 file (or not readable)");
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  TESSERA_CHECK(file.ok(), path, ": cannot open");
  const std::string format = read_string_attr(file.get(), "format", path);
  TESSERA_CHECK(format == kFormat, path, ": attribute format = \"", format, "\"; expected \"", kFormat, "\"");
  const int64_t version = read_int_attr(file.get(), "version", path);
  TESSERA_CHECK(version == kVersion, path, ": attribute version = ", version, "; this build reads ", kVersion);
  ImageTextData d;
  d.tokenizer = read_string_attr(file.get(), "tokenizer", path);
  d.vocab_size = read_int_attr(file.get(), "vocab_size", path);
  const int64_t placeholder = read_int_attr(file.get(), "placeholder_id", path);
  const int64_t pad = read_int_attr(file.get(), "pad_id", path);
  TESSERA_CHECK(d.vocab_size > 0 && d.vocab_size <= (int64_t(1) << 31), path, ": attribute vocab_size = ", d.vocab_size,
                " is not in [1, 2^31]");
  TESSERA_CHECK(placeholder >= 0 && placeholder < d.vocab_size, path, ": attribute placeholder_id = ", placeholder,
                " is outside the vocabulary [0, ", d.vocab_size, ")");
  TESSERA_CHECK(pad >= 0 && pad < d.vocab_size, path, ": attribute pad_id = ", pad, " is outside the vocabulary [0, ",
                d.vocab_size, ")");
  d.placeholder_id = static_cast<int32_t>(placeholder);
  d.pad_id = static_cast<int32_t>(pad);
  const auto dims = read_dataset(file.get(), "images", 4, H5T_INTEGER, H5T_NATIVE_UINT8, false, 1, d.images, path);
  d.image_shape = {static_cast<int64_t>(dims[1]), static_cast<int64_t>(dims[2]), static_cast<int64_t>(dims[3])};
  read_dataset(file.get(), "tokens", 1, H5T_INTEGER, H5T_NATIVE_INT32, true, 4, d.tokens, path);
  read_dataset(file.get(), "offsets", 1, H5T_INTEGER, H5T_NATIVE_INT64, true, 8, d.offsets, path);
  read_dataset(file.get(), "image_index", 1, H5T_INTEGER, H5T_NATIVE_INT64, true, 8, d.image_index, path);
  TESSERA_CHECK(!d.offsets.empty(), path, ": /offsets is empty; it holds S + 1 entries");
  check_image_text(d, path);
  return d;
}

ImageTextDataset::ImageTextDataset(ImageTextData data, int64_t seq_len, std::string name)
    : data_(std::move(data)), seq_len_(seq_len), name_(std::move(name)) {
  check_image_text(data_, name_);
  for (int64_t s = 0; s < data_.num_samples(); ++s) {
    if (data_.image_index[s] < 0) continue;
    const auto begin = data_.tokens.begin() + data_.offsets[s], end = data_.tokens.begin() + data_.offsets[s + 1];
    const int64_t last = static_cast<int64_t>(std::find(std::make_reverse_iterator(end), std::make_reverse_iterator(begin),
                                                        data_.placeholder_id).base() - begin) - 1;
    TESSERA_CHECK(last < seq_len_, name_, ": sample ", s, "'s image placeholders end at position ", last,
                  ", beyond train.seq_len = ", seq_len_, "; raise train.seq_len");
  }
}

void ImageTextDataset::get(int64_t index, int32_t* out, uint8_t* loss_mask) const {
  const int64_t a = data_.offsets[index], n = std::min(data_.offsets[index + 1] - a, seq_len_ + 1);
  for (int64_t t = 0; t <= seq_len_; ++t) {
    const bool real = t < n;
    out[t] = real ? data_.tokens[a + t] : data_.pad_id;
    if (loss_mask) loss_mask[t] = real && out[t] != data_.placeholder_id ? 1 : 0;
  }
}

bool ImageTextDataset::get_image(int64_t index, uint8_t* out) const {
  const int64_t img = data_.image_index[index];
  if (img < 0) return false;
  const int64_t n = data_.image_shape.numel();
  std::copy(data_.images.begin() + img * n, data_.images.begin() + (img + 1) * n, out);
  return true;
}

}  // namespace tessera
