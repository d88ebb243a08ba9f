// The device side of the SIMT emulator, included through the stand-in <cuda_runtime.h>
// (-DTESSERA_SIMT=ON only): CUDA's function qualifiers, the built-in thread and block indices,
// __syncthreads, the warp shuffles and __syncwarp, atomics, the device math tessera's kernels
// call, and the launch that kernels/simt/rewrite.py puts where a kernel's source has <<<...>>>.
// The semantics are CUDA's as documented (CUDA C++ Programming Guide: "Built-in Variables",
// "Synchronization Functions", "Warp Shuffle Functions", "Atomic Functions"); what cannot be
// emulated is listed in docs/cuda.md ("What the emulator proves").
#pragma once

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "kernels/simt/executor.h"
#include "kernels/simt/stream.h"
#include "kernels/simt/types.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict
#define __constant__

// The built-in variables: the running emulated thread's (kernels/simt/executor.h).
#define threadIdx (::tessera::simt::current_thread().thread_idx)
#define blockIdx (::tessera::simt::current_block().block_idx)
#define blockDim (::tessera::simt::current_block().block_dim)
#define gridDim (::tessera::simt::current_block().grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads() { ::tessera::simt::barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::tessera::simt::warp_sync(mask); }

namespace tessera::simt {

// A shuffle: the calling lane offers `var`, reads lane `src` of its warp (a lane index 0..31).
template <typename T>
T shuffle(unsigned mask, T var, int src) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "a shuffle moves at most 64 bits");
  uint64_t in = 0;
  std::memcpy(&in, &var, sizeof(T));
  const uint64_t got = warp_shuffle(mask, src, in);
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

inline int lane_id() { return current_thread().linear % kWarpSize; }

// The CUDA Programming Guide's source lane of each shuffle, with `width` sub-sections of the warp
// (a power of two up to 32): outside the caller's section a lane reads its own value.
inline int xor_source(int lane, int lane_mask, int width) {
  const int src = lane ^ lane_mask;
  return src >= ((lane & ~(width - 1)) + width) ? lane : src;
}

}  // namespace tessera::simt

template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  const int lane = ::tessera::simt::lane_id();
  return ::tessera::simt::shuffle(mask, var, ::tessera::simt::xor_source(lane, lane_mask, width));
}
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  const int lane = ::tessera::simt::lane_id();
  return ::tessera::simt::shuffle(mask, var, (lane & ~(width - 1)) + (src_lane & (width - 1)));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = ::tessera::simt::lane_id();
  const int src = (lane % width) + int(delta) < width ? lane + int(delta) : lane;
  return ::tessera::simt::shuffle(mask, var, src);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = ::tessera::simt::lane_id();
  const int src = (lane % width) >= int(delta) ? lane - int(delta) : lane;
  return ::tessera::simt::shuffle(mask, var, src);
}

// ---- atomics: real atomics (the OS-thread build runs a block's threads at once) ----
template <typename T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}
template <typename T>
T atomicMin(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (v < old && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <typename T>
T atomicMax(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (v > old && !r.compare_exchange_weak(old, v)) {
  }
  return old;
}
template <typename T>
T atomicExch(T* p, T v) {
  return std::atomic_ref<T>(*p).exchange(v);
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(compare, v);
  return compare;
}

// ---- device math: the host's functions (glibc's are correctly rounded or within 1 ulp; CUDA's
// expf, logf are within 2 ulp: results may differ from a GPU's in the last bits) ----
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline long long __double_as_longlong(double d) { return std::bit_cast<long long>(d); }
inline double __longlong_as_double(long long i) { return std::bit_cast<double>(i); }

// ---- kernel attributes and the launch ----
enum cudaFuncAttribute : int {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

namespace tessera::simt {

// Per-kernel attributes set with cudaFuncSetAttribute, as the CUDA runtime keeps them for the
// process: the emulator's one other process-wide record (a launch reads its kernel's limit).
class KernelAttributes {
 public:
  static KernelAttributes& get() {
    static KernelAttributes a;
    return a;
  }
  void set_max_dynamic_smem(const void* kernel, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    max_dynamic_smem_[kernel] = bytes;
  }
  size_t max_dynamic_smem(const void* kernel) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = max_dynamic_smem_.find(kernel);
    return it == max_dynamic_smem_.end() ? kDefaultDynamicSmem : it->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<const void*, size_t> max_dynamic_smem_;
};

// The <<<grid, block, shared bytes, stream>>> of a launch.
struct LaunchConfig {
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
};
inline LaunchConfig launch_config(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr) {
  return LaunchConfig{grid, block, smem, stream};
}

// kernel<<<cfg>>>(args) becomes launcher("kernel", kernel, cfg)(args) (a kernel template whose
// arguments are deduced: a generic lambda calling it). The arguments are copied by value (as CUDA
// copies them), the shape is checked as an sm_90 GPU checks it (a refusal is the launch's error:
// cudaGetLastError returns it, nothing is queued), and the grid is queued on the stream.
template <typename Fn>
class Launcher {
 public:
  Launcher(const char* name, Fn fn, const void* key, LaunchConfig cfg) : name_(name), fn_(fn), key_(key), cfg_(cfg) {}

  template <typename... A>
  void operator()(A&&... args) const {
    const size_t limit = key_ ? KernelAttributes::get().max_dynamic_smem(key_) : kDefaultDynamicSmem;
    const LaunchShape shape{cfg_.grid, cfg_.block, cfg_.smem, limit};
    const std::string refusal = launch_refusal(shape);
    if (!refusal.empty()) {
      set_last_error(cudaErrorInvalidConfiguration, std::string("kernel ") + name_ + ": " + refusal);
      return;
    }
    record_launch(name_);
    std::tuple<std::decay_t<A>...> params(std::forward<A>(args)...);
    const char* name = name_;
    Fn fn = fn_;
    enqueue(cfg_.stream, std::string("kernel ") + name_, [name, shape, fn, params] {
      run_grid(name, shape, [&] { std::apply(fn, params); });
    });
  }

 private:
  const char* name_;
  Fn fn_;
  const void* key_;
  LaunchConfig cfg_;
};

template <typename... P>
Launcher<void (*)(P...)> launcher(const char* name, void (*kernel)(P...), LaunchConfig cfg) {
  return Launcher<void (*)(P...)>(name, kernel, reinterpret_cast<const void*>(kernel), cfg);
}
template <typename Fn>
Launcher<Fn> launcher(const char* name, Fn fn, LaunchConfig cfg) {
  return Launcher<Fn>(name, fn, nullptr, cfg);
}

// A static __shared__ T name[...] of the current block (rewrite.py turns the declaration into a
// reference to this).
template <typename T>
T& shared_array(const void* key) {
  return *static_cast<T*>(static_shared(key, sizeof(T), alignof(T)));
}

// The extern __shared__ array of the launch's dynamic shared memory.
template <typename T>
T* dynamic_shared_as() {
  return static_cast<T*>(dynamic_shared());
}

// One warp's mma.sync m16n8k16 bf16 (kernels/simt/mma.cpp): c (16 x 8 f32, this lane's 4) +=
// a (16 x 16 bf16, 4 registers) b (16 x 8 bf16, 2 registers); every lane of the warp must call it.
inline void mma_sync_m16n8k16_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  warp_mma(c, a, b0, b1);
}

}  // namespace tessera::simt

template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || size_t(value) > ::tessera::simt::kMaxSmemPerBlock) {
      ::tessera::simt::set_last_error(cudaErrorInvalidValue,
                                      "cudaFuncSetAttribute: " + std::to_string(value) +
                                          " bytes of dynamic shared memory exceed sm_90's 232448 (227 KB)");
      return cudaErrorInvalidValue;
    }
    ::tessera::simt::KernelAttributes::get().set_max_dynamic_smem(reinterpret_cast<const void*>(kernel),
                                                                   size_t(value));
  }
  return cudaSuccess;
}
