// The elementwise fronts: argument checks, then the backend of the tensors' device
// (kernels/front.h); copy, the one op across devices, and the host reads built on it.
#include "kernels/elementwise.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/front.h"

namespace tessera {
namespace {

void check_pair(const char* op, const Tensor& a, const Tensor& b) {
  check_same_dtype(op, a, b);
  TESSERA_CHECK(a.numel() == b.numel(), op, ": sizes differ, ", a.shape.str(), " vs ", b.shape.str());
}

void check_float_dtype(const char* op, const Tensor& t) {
  TESSERA_CHECK(t.dtype == DType::F32 || t.dtype == DType::F64, op, ": unsupported dtype ", dtype_name(t.dtype));
}

// A reduction's out: one defined F64 element.
void check_scalar_out(const char* op, const Tensor& out) { front::check_numel(op, "out", out, DType::F64, 1); }

// The device a copy runs on: the device side's when one tensor is on the host (an upload or a
// read), else the one device of both; it must be ex's.
Device copy_device(const char* op, const Exec& ex, const Tensor& dst, const Tensor& src) {
  if (dst.device.is_cpu() != src.device.is_cpu()) {
    const bool dst_on_host = dst.device.is_cpu();
    return front::device_of(op, ex, {{dst_on_host ? "src" : "dst", dst_on_host ? src : dst}});
  }
  return front::device_of(op, ex, {{"dst", dst}, {"src", src}});
}

// Copies w columns per row between a narrow (N, w) and a wide (N, W) matrix at column col0: checks.
void check_column_block(const char* op, const Tensor& narrow, const Tensor& wide, int64_t col0) {
  check_same_dtype(op, narrow, wide);
  TESSERA_CHECK(narrow.ndim() == 2 && wide.ndim() == 2 && narrow.dim(0) == wide.dim(0), op,
                ": expected (N, w) and (N, W), got ", narrow.shape.str(), " and ", wide.shape.str());
  const int64_t w = narrow.dim(1), W = wide.dim(1);
  TESSERA_CHECK(col0 >= 0 && col0 + w <= W, op, ": columns [", col0, ", ", col0 + w, ") outside the ", W, " of ",
                wide.shape.str());
}

}  // namespace

void fill_zero(const Exec& ex, const Tensor& t) {
  const char* op = "fill_zero";
  const Device d = front::device_of(op, ex, {{"t", t}});
  if (!t.defined()) return;  // nothing to zero (an empty buffer)
  if (d.is_cpu()) return cpu::fill_zero(ex, t);
  TESSERA_CUDA_CALL(op, cuda::fill_zero(ex, t));
}

void copy(const Exec& ex, const Tensor& dst, const Tensor& src) {
  const char* op = "copy";
  check_pair(op, dst, src);
  const Device d = copy_device(op, ex, dst, src);
  if (d.is_cpu()) return cpu::copy(ex, dst, src);
  TESSERA_CUDA_CALL(op, cuda::copy(ex, dst, src));
}

void convert(const Exec& ex, const Tensor& dst, const Tensor& src) {
  const char* op = "convert";
  const Device d = front::device_of(op, ex, {{"dst", dst}, {"src", src}});
  front::check_defined(op, "dst", dst);
  front::check_defined(op, "src", src);
  check_dtype(op, "dst", dst, DType::BF16);
  check_dtype(op, "src", src, DType::F32);
  TESSERA_CHECK(dst.numel() == src.numel(), op, ": dst has ", dst.numel(), " elements, src ", src.numel());
  if (d.is_cpu()) return cpu::convert(ex, dst, src);
  TESSERA_CUDA_CALL(op, cuda::convert(ex, dst, src));
}

void copy_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0) {
  const char* op = "copy_columns";
  const Device d = front::device_of(op, ex, {{"dst", dst}, {"src", src}});
  check_column_block(op, dst, src, col0);
  if (d.is_cpu()) return cpu::copy_columns(ex, dst, src, col0);
  TESSERA_CUDA_CALL(op, cuda::copy_columns(ex, dst, src, col0));
}

void paste_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0) {
  const char* op = "paste_columns";
  const Device d = front::device_of(op, ex, {{"dst", dst}, {"src", src}});
  check_column_block(op, src, dst, col0);
  if (d.is_cpu()) return cpu::paste_columns(ex, dst, src, col0);
  TESSERA_CUDA_CALL(op, cuda::paste_columns(ex, dst, src, col0));
}

void residual_forward(const Exec& ex, const Tensor& y, const Tensor& a, const Tensor& b) {
  const char* op = "residual_forward";
  const Device d = front::device_of(op, ex, {{"y", y}, {"a", a}, {"b", b}});
  check_pair(op, y, a);
  check_pair(op, y, b);
  check_float_dtype(op, y);
  if (d.is_cpu()) return cpu::residual_forward(ex, y, a, b);
  TESSERA_CUDA_CALL(op, cuda::residual_forward(ex, y, a, b));
}

void accumulate(const Exec& ex, const Tensor& dst, const Tensor& src) {
  const char* op = "accumulate";
  const Device d = front::device_of(op, ex, {{"dst", dst}, {"src", src}});
  check_pair(op, dst, src);
  check_float_dtype(op, dst);
  if (d.is_cpu()) return cpu::accumulate(ex, dst, src);
  TESSERA_CUDA_CALL(op, cuda::accumulate(ex, dst, src));
}

// Two accumulates: a composition of ops, so no backend of its own.
void residual_backward(const Exec& ex, const Tensor& da, const Tensor& db, const Tensor& dy) {
  if (da.defined()) accumulate(ex, da, dy);
  if (db.defined()) accumulate(ex, db, dy);
}

void scale(const Exec& ex, const Tensor& t, double s) {
  const char* op = "scale";
  const Device d = front::device_of(op, ex, {{"t", t}});
  check_float_dtype(op, t);
  if (d.is_cpu()) return cpu::scale(ex, t, s);
  TESSERA_CUDA_CALL(op, cuda::scale(ex, t, s));
}

void sum(const Exec& ex, const Tensor& out, const Tensor& t) {
  const char* op = "sum";
  const Device d = front::device_of(op, ex, {{"out", out}, {"t", t}});
  check_scalar_out(op, out);
  check_float_dtype(op, t);
  if (d.is_cpu()) return cpu::sum(ex, out, t);
  TESSERA_CUDA_CALL(op, cuda::sum(ex, out, t));
}

void count_not_equal(const Exec& ex, const Tensor& out, const Tensor& ids, int32_t value) {
  const char* op = "count_not_equal";
  const Device d = front::device_of(op, ex, {{"out", out}, {"ids", ids}});
  check_scalar_out(op, out);
  check_dtype(op, "ids", ids, DType::I32);
  if (d.is_cpu()) return cpu::count_not_equal(ex, out, ids, value);
  TESSERA_CUDA_CALL(op, cuda::count_not_equal(ex, out, ids, value));
}

void squared_norm(const Exec& ex, const Tensor& out, const Tensor& t) {
  const char* op = "squared_norm";
  const Device d = front::device_of(op, ex, {{"out", out}, {"t", t}});
  check_scalar_out(op, out);
  check_float_dtype(op, t);
  if (d.is_cpu()) return cpu::squared_norm(ex, out, t);
  TESSERA_CUDA_CALL(op, cuda::squared_norm(ex, out, t));
}

Buffer upload(const Exec& ex, Allocator& alloc, const Tensor& src, MemCategory cat) {
  TESSERA_CHECK(src.device.is_cpu(), "upload: src is on ", src.device.str(), ", expected host memory");
  Buffer dst(alloc, src.dtype, src.shape, cat);
  copy(ex, dst, src);
  return dst;
}

double read_scalar(const Exec& ex, const Tensor& t) {
  front::check_numel("read_scalar", "t", t, DType::F64, 1);
  return read_values(ex, t)[0];
}

std::vector<double> read_values(const Exec& ex, const Tensor& t) {
  front::check_numel("read_values", "t", t, DType::F64, t.numel());
  std::vector<double> host(static_cast<size_t>(t.numel()));
  copy(ex, Tensor(host.data(), DType::F64, {t.numel()}), t.view({t.numel()}));
  synchronize(ex);  // the copy may still be queued behind the ops that compute t
  return host;
}

}  // namespace tessera
