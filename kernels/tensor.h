// Tensor: a non-owning view (pointer, dtype, shape, device). Memory is owned elsewhere
// (kernels/allocator.h Buffer); ops take views and never allocate behind the caller's back.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels/check.h"

namespace tessera {

// F64 exists for the reference path (finite-difference tests); BF16 for mixed precision later.
// I8: the codes of int8-compressed activations (kernels/activation_compression.h).
enum class DType : uint8_t { F32, F64, BF16, I32, I8 };
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int8_t>() { return DType::I8; }

enum class DeviceKind : uint8_t { CPU, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  static constexpr Device cpu() { return {DeviceKind::CPU, 0}; }
  static constexpr Device cuda(int i) { return {DeviceKind::CUDA, i}; }
  constexpr bool is_cpu() const { return kind == DeviceKind::CPU; }
  // Spelled out, not `= default`: nvcc compiles kernels/cuda/*.cu, which include this, as C++17.
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  std::string str() const;
};

// Shape with up to kMaxDims dimensions, stored inline (no heap).
class Shape {
 public:
  static constexpr int kMaxDims = 6;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[norm(i)]; }
  int64_t& operator[](int i) { return dims_[norm(i)]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string str() const;  // "(2, 3, 4)"
  void push_back(int64_t d);

 private:
  int norm(int i) const;
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device;

  Tensor() = default;
  Tensor(void* d, DType dt, Shape s, Device dev = Device::cpu()) : data(d), dtype(dt), shape(s), device(dev) {}

  int ndim() const { return shape.ndim(); }
  int64_t dim(int i) const { return shape[i]; }
  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool defined() const { return data != nullptr; }

  // Typed pointer; checks that T matches the dtype.
  template <typename T>
  T* ptr() const {
    TESSERA_CHECK(dtype == dtype_of<T>(), "tensor has dtype ", dtype_name(dtype), ", accessed as ",
                  dtype_name(dtype_of<T>()));
    return static_cast<T*>(data);
  }
  // Same memory, new shape with the same element count.
  Tensor view(Shape s) const;
  // Rows [begin, end) of the first dimension.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  std::string str() const;  // "f32(2, 3) cpu"
};

// Argument checks used by the op fronts (kernels/front.h); each names the op and the argument.
void check_shape(const char* op, const char* arg, const Tensor& t, const Shape& expected);
void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_cpu(const char* op, const Tensor& t);

}  // namespace tessera
