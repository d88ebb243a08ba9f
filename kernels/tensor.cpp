// Tensor and Shape helpers: printing, views and the argument checks the op launchers share.
#include "kernels/tensor.h"

#include <sstream>

namespace tessera {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I8: return "i8";
  }
  return "?";
}

std::string Device::str() const {
  return kind == DeviceKind::CPU ? "cpu" : "cuda:" + std::to_string(index);
}

Shape::Shape(std::initializer_list<int64_t> dims) {
  TESSERA_CHECK(dims.size() <= kMaxDims, "shape has ", dims.size(), " dims, at most ", kMaxDims);
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  TESSERA_CHECK(ndim_ < kMaxDims, "shape has more than ", kMaxDims, " dims");
  TESSERA_CHECK(d >= 0, "negative dimension ", d);
  dims_[ndim_++] = d;
}

int Shape::norm(int i) const {
  int j = i < 0 ? i + ndim_ : i;
  TESSERA_CHECK(j >= 0 && j < ndim_, "dimension index ", i, " out of range for ", ndim_, " dims");
  return j;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << dims_[i];
  os << ")";
  return os.str();
}

Tensor Tensor::view(Shape s) const {
  TESSERA_CHECK(s.numel() == numel(), "cannot view ", shape.str(), " as ", s.str());
  return Tensor(data, dtype, s, device);
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  TESSERA_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "slice_rows [", begin, ", ", end,
                ") out of range for ", shape.str());
  Shape s = shape;
  s[0] = end - begin;
  size_t row_bytes = dim(0) ? nbytes() / static_cast<size_t>(dim(0)) : 0;
  return Tensor(static_cast<char*>(data) + begin * row_bytes, dtype, s, device);
}

std::string Tensor::str() const { return std::string(dtype_name(dtype)) + shape.str() + " " + device.str(); }

void check_shape(const char* op, const char* arg, const Tensor& t, const Shape& expected) {
  TESSERA_CHECK(t.shape == expected, op, ": ", arg, " has shape ", t.shape.str(), ", expected ", expected.str());
}

void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected) {
  TESSERA_CHECK(t.dtype == expected, op, ": ", arg, " has dtype ", dtype_name(t.dtype), ", expected ",
                dtype_name(expected));
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  TESSERA_CHECK(a.dtype == b.dtype, op, ": mixed dtypes ", dtype_name(a.dtype), " and ", dtype_name(b.dtype));
}

void check_cpu(const char* op, const Tensor& t) {
  TESSERA_CHECK(t.device.is_cpu(), op, ": tensor on ", t.device.str(), " but this backend is not built");
}

}  // namespace tessera
