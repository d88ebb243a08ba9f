// Small elementwise ops and reductions the model and optimizer need on any device: zero-fill,
// copy (also between the host and a device), the residual add and its backward, scaling, sums
// and the squared L2 norm. Reductions write their result into a tensor on the same device, so a
// step can queue them all and read the few host numbers it needs once (read_scalar).
#pragma once

#include <vector>

#include "kernels/allocator.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera {

void fill_zero(const Exec& ex, const Tensor& t);
// dst = src (same numel and dtype). The one op whose tensors may sit on different devices: a host
// tensor to a device one and back (uploads and reads); ex is the device side's context. A host
// src may be reused or freed as soon as copy returns; a host dst holds the values after
// synchronize(ex) (read_values does both).
void copy(const Exec& ex, const Tensor& dst, const Tensor& src);
// dst (BF16) = src (F32) rounded to nearest even, same numel and device: the bf16 copy of the
// weights that mixed precision's GEMMs read (train.dtype = "bf16"). NaN stays NaN.
void convert(const Exec& ex, const Tensor& dst, const Tensor& src);
// A block of columns, for cutting and pasting along an inner dimension (heads, sequence chunks):
// dst (N, w) = src (N, W)[:, col0 : col0 + w]. Both 2-D, same dtype, any dtype.
void copy_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0);
// dst (N, W)[:, col0 : col0 + w] = src (N, w).
void paste_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0);
// y = a + b (the residual connection). y may alias a or b.
void residual_forward(const Exec& ex, const Tensor& y, const Tensor& a, const Tensor& b);
// da += dy, db += dy (either may be undefined). A residual's two inputs each receive dy.
void residual_backward(const Exec& ex, const Tensor& da, const Tensor& db, const Tensor& dy);
// dst += src.
void accumulate(const Exec& ex, const Tensor& dst, const Tensor& src);
// t *= s.
void scale(const Exec& ex, const Tensor& t, double s);

// ---- Reductions: out is one F64 element on t's device (a scalar, or a slot of a small vector:
// v.slice_rows(i, i + 1)), written. Nothing is read back to the host. ----

// out = sum of all elements of t (F32 or F64), accumulated in double.
void sum(const Exec& ex, const Tensor& out, const Tensor& t);
// out = number of elements of an I32 tensor that differ from value (e.g. targets that carry a loss).
void count_not_equal(const Exec& ex, const Tensor& out, const Tensor& ids, int32_t value);
// out = sum of squares of t (F32 or F64), accumulated in double (the gradient norm for clipping).
void squared_norm(const Exec& ex, const Tensor& out, const Tensor& t);

// A new buffer from alloc (on its device, category cat) holding a copy of the host tensor src: how
// host data (token ids from the data loader) reaches the model's device.
Buffer upload(const Exec& ex, Allocator& alloc, const Tensor& src, MemCategory cat);

// ---- Host reads: they wait for every op queued on ex (a device sync), so a training step calls
// them once for the numbers it needs on the host (loss, gradient norm), not per op. ----

// The value of a one-element F64 tensor on ex's device.
double read_scalar(const Exec& ex, const Tensor& t);
// The values of an F64 tensor on ex's device, in order.
std::vector<double> read_values(const Exec& ex, const Tensor& t);

}  // namespace tessera
