// What the CUDA kernels share, internal to kernels/cuda/: error checks naming the op, the launch
// shape of elementwise and per-row kernels, block-wide sums, stream-ordered scratch memory and the
// check of id tensors (token ids, targets) that the CPU backend does on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/check.h"
#include "kernels/exec.h"
#include "kernels/tensor.h"

namespace tessera::cuda {

// Throws tessera::Error "<op>: <CUDA's message>" unless e is cudaSuccess.
inline void check_cuda(const char* op, cudaError_t e) {
  TESSERA_CHECK(e == cudaSuccess, op, ": ", cudaGetErrorString(e));
}
// After a launch: a bad configuration shows here, a fault in the kernel at the next sync.
inline void check_launch(const char* op) { check_cuda(op, cudaGetLastError()); }

inline cudaStream_t stream_of(const Exec& ex) { return ex.stream; }

// Makes ex's device current (the runtime's per-thread current device) before queueing on it.
inline void use_device(const char* op, const Exec& ex) { check_cuda(op, cudaSetDevice(ex.device.index)); }

// The float path is the CUDA backend's only one: F64 (the CPU's reference dtype) is refused.
inline void require_f32(const char* op, const Tensor& t) {
  TESSERA_CHECK(t.dtype == DType::F32, op, ": the CUDA backend computes in f32, got ", dtype_name(t.dtype),
                " (f64 is the CPU's reference path)");
}

constexpr int kThreads = 256;  // threads per block of the simple kernels

// Blocks for n elements at kThreads each, one element per thread, capped (grid-stride loops cover
// the rest): at most 65535 * 8 blocks keeps every index in int64 arithmetic well away from limits.
inline unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 65535 * 8) b = 65535 * 8;
  return static_cast<unsigned>(b);
}

// Sum over the block of every thread's v, returned to every thread. blockDim.x a multiple of 32
// and at most 1024; `shared` holds 32 T. Ends with a barrier, so it may be called again at once.
template <typename T>
__device__ inline T block_sum(T v, T* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < warps; ++w) total += shared[w];  // same order in every thread: same result
  __syncthreads();
  return total;
}

// Maximum over the block, as block_sum.
__device__ inline float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float m = shared[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, shared[w]);
  __syncthreads();
  return m;
}

// Scratch device memory for one op, from the stream-ordered allocator: freed in stream order when
// this goes out of scope, so the kernels queued before that still see it.
class Scratch {
 public:
  Scratch(const char* op, const Exec& ex, size_t bytes) : stream_(stream_of(ex)) {
    if (bytes > 0) check_cuda(op, cudaMallocAsync(&p_, bytes, stream_));
  }
  ~Scratch() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T> T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

// The first (lowest-index) value of an I32 tensor outside [0, limit), ignoring `ignore` when
// allow_ignore: one kernel, then a wait for its result, since an id out of range must be an Error
// naming it, not a wild read. index -1: every id is valid.
struct BadId {
  int64_t index = -1;
  int32_t value = 0;
};
BadId first_bad_id(const char* op, const Exec& ex, const Tensor& ids, int64_t limit, bool allow_ignore,
                   int32_t ignore);

// ---- bf16 rounding ----
// The CPU's f32_to_bf16 (kernels/cpu/gemm_bf16.h), bit for bit: round to nearest even in integer
// arithmetic, a NaN kept quiet (__float2bfloat16_rn would give a canonical NaN instead).
__device__ inline uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace tessera::cuda

namespace tessera::cuda {

// ---- Deterministic column sums: out[c] += sum over rows n of term(n, c), in double ----
// Used for the parameter gradients of per-row ops (norm weights, biases), which sum over all
// B T rows: no atomics, so every run adds in the same order. Stage one: a (column block, row
// chunk) grid where each thread sums its column over the chunk's rows in order; stage two: one
// thread per column adds the chunks in order.

constexpr int64_t kRowsPerChunk = 64;
constexpr int64_t kMaxChunks = 512;

template <typename Term>
__global__ void column_partials_kernel(double* partial, Term term, int64_t N, int64_t C, int64_t rows_per_chunk) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  double s = 0;
  for (int64_t n = r0; n < r1; ++n) s += term(n, c);
  partial[blockIdx.y * C + c] = s;
}

template <typename T>
__global__ void column_finish_kernel(T* out, const double* partial, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  double s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * C + c];
  out[c] = static_cast<T>(double(out[c]) + s);
}

// out (C) += column sums of term over N rows.
template <typename Term>
void column_sums(const char* op, const Exec& ex, float* out, Term term, int64_t N, int64_t C) {
  if (N == 0 || C == 0) return;
  int64_t rows = kRowsPerChunk, chunks = (N + rows - 1) / rows;
  if (chunks > kMaxChunks) {
    chunks = kMaxChunks;
    rows = (N + chunks - 1) / chunks;
    chunks = (N + rows - 1) / rows;
  }
  Scratch partial(op, ex, size_t(chunks * C) * sizeof(double));
  const unsigned col_blocks = static_cast<unsigned>((C + kThreads - 1) / kThreads);
  column_partials_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0, stream_of(ex)>>>(
      partial.as<double>(), term, N, C, rows);
  check_launch(op);
  column_finish_kernel<<<col_blocks, kThreads, 0, stream_of(ex)>>>(out, partial.as<double>(), chunks, C);
  check_launch(op);
}

}  // namespace tessera::cuda
