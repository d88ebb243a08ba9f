// The SIMT emulator's cost per emulated thread (docs/performance.md, "SIMT emulator"): grids of
// 1536 blocks of 256 threads, as LayerNorm launches for quickstart's 32 x 48 rows, running
//   none:    no barrier or shuffle (each thread is switched to once, runs and exits)
//   reduce:  twice a block sum as kernels/cuda/common.cuh's block_sum (5 shuffles, 2 barriers)
// Prints the median of 5 runs and the time per context switch it implies. -DTESSERA_SIMT=ON only.
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

using namespace tessera::simt;

namespace {

double median_seconds(const std::function<void()>& run) {
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

}  // namespace

int main() {
  constexpr unsigned kBlocks = 1536, kThreads = 256;
  const LaunchShape shape{kBlocks, kThreads, 0, kDefaultDynamicSmem};
  std::vector<float> out(kBlocks * kThreads);
  const double none = median_seconds([&] {
    run_grid("none", shape, [&] { out[blockIdx.x * kThreads + threadIdx.x] = float(threadIdx.x); });
  });
  const double reduce = median_seconds([&] {
    run_grid("reduce", shape, [&] {
      static const char key = 0;
      float(&shared)[32] = shared_array<float[32]>(&key);
      float v = float(threadIdx.x);
      for (int rep = 0; rep < 2; ++rep) {
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
        __syncthreads();
        float total = 0;
        for (int w = 0; w < int(kThreads / 32); ++w) total += shared[w];
        __syncthreads();
        v = total;
      }
      out[blockIdx.x * kThreads + threadIdx.x] = v;
    });
  });
  const double threads = double(kBlocks) * kThreads;
  // A waiting thread hands the OS thread straight to the next one (kernels/simt/executor.cpp): none
  // switches to each thread once; reduce once more at each of its 10 shuffles and 4 barriers.
  std::printf("grid %u x %u threads, median of 5\n", kBlocks, kThreads);
  std::printf("none:   %.3f s  %.1f ns per thread  %.1f ns per switch\n", none, none / threads * 1e9,
              none / threads * 1e9);
  std::printf("reduce: %.3f s  %.1f ns per thread  %.1f ns per switch\n", reduce, reduce / threads * 1e9,
              reduce / (threads * 15) * 1e9);
}
