// CUDA elementwise ops and reductions (kernels/elementwise.h): fills and copies are runtime calls,
// the rest one grid-stride kernel each. Reductions are deterministic: a fixed grid for a given
// size, partial sums in double per block, then one block adding the partials in a fixed order.
#include <cuda_runtime.h>

#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace tessera::cuda {
namespace {

// y[i] = a[i] + b[i]; y may alias a or b (each element read before it is written, by one thread).
template <typename T>
__global__ void add_kernel(T* y, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = a[i] + b[i];
}

// y[i] = x[i] rounded to bf16, nearest even (NaN stays NaN): the CPU's f32_to_bf16, bit for bit.
__global__ void to_bf16_kernel(uint16_t* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = bf16_bits(x[i]);
}

__global__ void scale_kernel(float* t, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    t[i] *= s;
}

// The per-element terms of the reductions, summed in double.
template <typename T>
struct SumOf {
  const T* x;
  __device__ double operator()(int64_t i) const { return double(x[i]); }
};
struct SquareOf {
  const float* x;
  __device__ double operator()(int64_t i) const { return double(x[i]) * double(x[i]); }
};
struct NotEqual {
  const int32_t* ids;
  int32_t value;
  __device__ double operator()(int64_t i) const { return ids[i] != value ? 1.0 : 0.0; }
};

constexpr int kMaxPartials = 1024;  // blocks of a reduction's first stage

// partial[blockIdx.x] = sum of term(i) over this block's grid-stride share of [0, n).
template <typename Term>
__global__ void partial_sums_kernel(double* partial, Term term, int64_t n) {
  __shared__ double shared[32];
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    s += term(i);
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] = sum of partial[0 .. count), one block.
__global__ void final_sum_kernel(double* out, const double* partial, int count) {
  __shared__ double shared[32];
  double s = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) out[0] = s;
}

template <typename Term>
void reduce(const char* op, const Exec& ex, const Tensor& out, Term term, int64_t n) {
  use_device(op, ex);
  unsigned blocks = blocks_for(n);
  if (blocks > kMaxPartials) blocks = kMaxPartials;
  Scratch partial(op, ex, blocks * sizeof(double));
  partial_sums_kernel<<<blocks, kThreads, 0, stream_of(ex)>>>(partial.as<double>(), term, n);
  check_launch(op);
  final_sum_kernel<<<1, kThreads, 0, stream_of(ex)>>>(static_cast<double*>(out.data), partial.as<double>(),
                                                     static_cast<int>(blocks));
  check_launch(op);
}

// first[0] = min over i of i where ids[i] is out of range (stays ULLONG_MAX when none is).
__global__ void bad_id_kernel(unsigned long long* first, const int32_t* ids, int64_t n, int64_t limit,
                              bool allow_ignore, int32_t ignore) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t v = ids[i];
    if ((allow_ignore && v == ignore) || (v >= 0 && v < limit)) continue;
    atomicMin(first, static_cast<unsigned long long>(i));  // integer: order-independent
  }
}

}  // namespace

void synchronize(const Exec& ex) {
  use_device("synchronize", ex);
  check_cuda("synchronize", cudaStreamSynchronize(stream_of(ex)));
}

void fill_zero(const Exec& ex, const Tensor& t) {
  use_device("fill_zero", ex);
  check_cuda("fill_zero", cudaMemsetAsync(t.data, 0, t.nbytes(), stream_of(ex)));
}

void copy(const Exec& ex, const Tensor& dst, const Tensor& src) {
  if (dst.data == src.data) return;
  use_device("copy", ex);
  // cudaMemcpyDefault: the direction follows from the pointers (unified addressing), so one call
  // serves uploads, reads and device-to-device copies.
  check_cuda("copy", cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDefault, stream_of(ex)));
}

void convert(const Exec& ex, const Tensor& dst, const Tensor& src) {
  const char* op = "convert";
  use_device(op, ex);
  const int64_t n = src.numel();
  if (n == 0) return;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(static_cast<uint16_t*>(dst.data), src.ptr<float>(), n);
  check_launch(op);
}

// A strided 2-D copy: rows of w elements between (N, w) and (N, W) at column col0.
void copy_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0) {
  use_device("copy_columns", ex);
  const size_t es = dtype_size(dst.dtype), rows = size_t(dst.dim(0)), w = size_t(dst.dim(1));
  if (rows == 0 || w == 0) return;
  const char* from = static_cast<const char*>(src.data) + size_t(col0) * es;
  check_cuda("copy_columns", cudaMemcpy2DAsync(dst.data, w * es, from, size_t(src.dim(1)) * es, w * es, rows,
                                               cudaMemcpyDeviceToDevice, stream_of(ex)));
}

void paste_columns(const Exec& ex, const Tensor& dst, const Tensor& src, int64_t col0) {
  use_device("paste_columns", ex);
  const size_t es = dtype_size(dst.dtype), rows = size_t(src.dim(0)), w = size_t(src.dim(1));
  if (rows == 0 || w == 0) return;
  char* to = static_cast<char*>(dst.data) + size_t(col0) * es;
  check_cuda("paste_columns", cudaMemcpy2DAsync(to, size_t(dst.dim(1)) * es, src.data, w * es, w * es, rows,
                                                cudaMemcpyDeviceToDevice, stream_of(ex)));
}

void residual_forward(const Exec& ex, const Tensor& y, const Tensor& a, const Tensor& b) {
  const char* op = "residual_forward";
  require_f32(op, y);
  use_device(op, ex);
  const int64_t n = y.numel();
  add_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(y.ptr<float>(), a.ptr<float>(), b.ptr<float>(), n);
  check_launch(op);
}

// F32, and F64 for the reductions' results (a step's loss sums added up over its micro-batches).
void accumulate(const Exec& ex, const Tensor& dst, const Tensor& src) {
  const char* op = "accumulate";
  use_device(op, ex);
  const int64_t n = dst.numel();
  if (dst.dtype == DType::F64) {
    add_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(dst.ptr<double>(), dst.ptr<double>(),
                                                               src.ptr<double>(), n);
  } else {
    require_f32(op, dst);
    add_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(dst.ptr<float>(), dst.ptr<float>(), src.ptr<float>(), n);
  }
  check_launch(op);
}

void scale(const Exec& ex, const Tensor& t, double s) {
  const char* op = "scale";
  require_f32(op, t);
  use_device(op, ex);
  const int64_t n = t.numel();
  scale_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(t.ptr<float>(), static_cast<float>(s), n);
  check_launch(op);
}

// F32, and F64 for the reductions' results (the gradient norm's per-run sums of squares).
void sum(const Exec& ex, const Tensor& out, const Tensor& t) {
  if (t.dtype == DType::F64) return reduce("sum", ex, out, SumOf<double>{t.ptr<double>()}, t.numel());
  require_f32("sum", t);
  reduce("sum", ex, out, SumOf<float>{t.ptr<float>()}, t.numel());
}

void count_not_equal(const Exec& ex, const Tensor& out, const Tensor& ids, int32_t value) {
  reduce("count_not_equal", ex, out, NotEqual{ids.ptr<int32_t>(), value}, ids.numel());
}

void squared_norm(const Exec& ex, const Tensor& out, const Tensor& t) {
  require_f32("squared_norm", t);
  reduce("squared_norm", ex, out, SquareOf{t.ptr<float>()}, t.numel());
}

BadId first_bad_id(const char* op, const Exec& ex, const Tensor& ids, int64_t limit, bool allow_ignore,
                   int32_t ignore) {
  BadId bad;
  const int64_t n = ids.numel();
  if (n == 0) return bad;
  use_device(op, ex);
  Scratch first(op, ex, sizeof(unsigned long long));
  check_cuda(op, cudaMemsetAsync(first.as<void>(), 0xff, sizeof(unsigned long long), stream_of(ex)));
  bad_id_kernel<<<blocks_for(n), kThreads, 0, stream_of(ex)>>>(first.as<unsigned long long>(), ids.ptr<int32_t>(), n,
                                                               limit, allow_ignore, ignore);
  check_launch(op);
  unsigned long long index = ULLONG_MAX;
  check_cuda(op, cudaMemcpyAsync(&index, first.as<void>(), sizeof index, cudaMemcpyDeviceToHost, stream_of(ex)));
  check_cuda(op, cudaStreamSynchronize(stream_of(ex)));
  if (index == ULLONG_MAX) return bad;
  bad.index = static_cast<int64_t>(index);
  check_cuda(op, cudaMemcpy(&bad.value, ids.ptr<int32_t>() + bad.index, sizeof(int32_t), cudaMemcpyDeviceToHost));
  return bad;
}

}  // namespace tessera::cuda
