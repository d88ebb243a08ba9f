// Small elementwise ops and reductions the model and optimizer need on any device: zero-fill,
// copy, the residual add and its backward, scaling and the squared L2 norm.
#pragma once

#include "kernels/tensor.h"

namespace tessera {

void fill_zero(const Tensor& t);
// dst = src (same numel and dtype).
void copy(const Tensor& dst, const Tensor& src);
// A block of columns, for cutting and pasting along an inner dimension (heads, sequence chunks):
// dst (N, w) = src (N, W)[:, col0 : col0 + w]. Both 2-D, same dtype, any dtype.
void copy_columns(const Tensor& dst, const Tensor& src, int64_t col0);
// dst (N, W)[:, col0 : col0 + w] = src (N, w).
void paste_columns(const Tensor& dst, const Tensor& src, int64_t col0);
// y = a + b (the residual connection). y may alias a or b.
void residual_forward(const Tensor& y, const Tensor& a, const Tensor& b);
// da += dy, db += dy (either may be undefined). A residual's two inputs each receive dy.
void residual_backward(const Tensor& da, const Tensor& db, const Tensor& dy);
// dst += src.
void accumulate(const Tensor& dst, const Tensor& src);
// t *= s.
void scale(const Tensor& t, double s);
// sum of all elements, accumulated in double.
double sum(const Tensor& t);
// number of elements of an I32 tensor that differ from value (e.g. targets that carry a loss).
int64_t count_not_equal(const Tensor& ids, int32_t value);
// sum of squares, accumulated in double (the gradient norm for clipping).
double squared_norm(const Tensor& t);

}  // namespace tessera
