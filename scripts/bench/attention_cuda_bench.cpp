// CUDA causal attention throughput (kernels/cuda/attention.cu, bf16 tensor-core path): forward and
// backward time (CUDA events, median of --reps after --warmup) and TFLOP/s, at FlashAttention-2's
// benchmark shapes (16k tokens per batch, hidden 2048: B 4, T 4096, H 16 at D 128; H 32 at D 64).
// scripts/gpu_check.sh runs it beside PyTorch's scaled_dot_product_attention on the same shapes
// (attention_cuda_torch.py) and prints both in one table.
//   build/bench/attention_cuda_bench [--reps 20] [--warmup 3] [--T 4096] [--B 4]
//   build/bench/attention_cuda_bench --probe   (prints the visible devices; exit 3 when none)
// FLOPs follow FlashAttention's convention so the numbers compare with its published ones:
// forward 4 B H T^2 D / 2 (two products, causal half), backward 2.5x the forward (five products;
// this kernel computes seven, see attention.cu, but is credited with the five useful ones).
// Each line "RESULT name D fwd_ms bwd_ms fwd_tflops bwd_tflops fwdbwd_tflops" is for the summary.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/check.h"

using namespace tessera;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "attention_cuda_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// One device buffer, filled with bf16 values uniform in [-1, 1) (or zero).
struct DeviceBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuf(size_t n, size_t elem, uint64_t seed, bool random) : bytes(n * elem) {
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    if (!random) {
      check(cudaMemset(p, 0, bytes), "cudaMemset");
      return;
    }
    std::vector<uint16_t> h(n);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    for (auto& x : h) x = to_bf16(d(rng));
    check(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~DeviceBuf() { cudaFree(p); }
};

template <typename F>
double median_ms(F&& fn, int warmup, int reps, cudaStream_t st) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < warmup; ++i) fn(nullptr, nullptr);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    fn(a, b);
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, warmup = 3;
  int64_t T = 4096, B = 4;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (argc == 2 && std::string(argv[1]) == "--probe") {
    for (int d = 0; d < n; ++d) {
      cudaDeviceProp p{};
      if (cudaGetDeviceProperties(&p, d) == cudaSuccess)
        std::printf("cuda:%d %s (sm_%d%d, %.0f GiB)\n", d, p.name, p.major, p.minor, p.totalGlobalMem / 1073741824.0);
    }
    std::printf("%d CUDA device(s) visible\n", n);
    return n > 0 ? 0 : 3;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--warmup") warmup = std::atoi(argv[i + 1]);
    else if (a == "--T") T = std::atoll(argv[i + 1]);
    else if (a == "--B") B = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: attention_cuda_bench [--reps N] [--warmup N] [--T N] [--B N]\n");
      return 2;
    }
  }
  if (n == 0) {
    std::printf("attention_cuda_bench: no CUDA device visible\n");
    return 3;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t st;
  check(cudaStreamCreate(&st), "cudaStreamCreate");
  const Exec ex = Exec::cuda(0, st);

  struct Cfg {
    int64_t H, D;
  };
  for (const Cfg c : {Cfg{16, 128}, Cfg{32, 64}}) {
    const int64_t H = c.H, D = c.D, KV = H;
    const size_t nq = size_t(B * T * H * D);
    DeviceBuf q(nq, 2, 1, true), k(nq, 2, 2, true), v(nq, 2, 3, true), dout(nq, 2, 4, true);
    DeviceBuf out(nq, 2, 0, false), dq(nq, 4, 0, false), dk(nq, 4, 0, false), dv(nq, 4, 0, false);  // f32 grads
    DeviceBuf lse(size_t(B * H * T), 4, 0, false);
    const Shape qs{B, T, H, D}, ks{B, T, KV, D};
    auto bf = [&](const DeviceBuf& b, const Shape& s) { return Tensor(b.p, DType::BF16, s, Device::cuda(0)); };
    const Tensor tq = bf(q, qs), tk = bf(k, ks), tv = bf(v, ks), tout = bf(out, qs), tdout = bf(dout, qs);
    auto f32 = [&](const DeviceBuf& b, const Shape& s) { return Tensor(b.p, DType::F32, s, Device::cuda(0)); };
    const Tensor tdq = f32(dq, qs), tdk = f32(dk, ks), tdv = f32(dv, ks);
    const Tensor tlse(lse.p, DType::F32, {B, H, T}, Device::cuda(0));
    try {
      const double fwd = median_ms(
          [&](cudaEvent_t a, cudaEvent_t b) {
            if (a) cudaEventRecord(a, st);
            attention_forward(ex, tout, tlse, tq, tk, tv, 0, 0);
            if (b) cudaEventRecord(b, st);
          },
          warmup, reps, st);
      const double bwd = median_ms(
          [&](cudaEvent_t a, cudaEvent_t b) {
            // The gradients accumulate: zero them outside the timed span.
            cudaMemsetAsync(dq.p, 0, dq.bytes, st);
            cudaMemsetAsync(dk.p, 0, dk.bytes, st);
            cudaMemsetAsync(dv.p, 0, dv.bytes, st);
            if (a) cudaEventRecord(a, st);
            attention_backward(ex, tdq, tdk, tdv, tdout, tq, tk, tv, tout, tlse, 0, 0);
            if (b) cudaEventRecord(b, st);
          },
          warmup, reps, st);
      check(cudaStreamSynchronize(st), "attention kernels");
      const double f_flops = 4.0 * B * H * double(T) * T * D / 2.0;
      const double b_flops = 2.5 * f_flops;
      std::printf("tessera  B=%lld T=%lld H=%lld D=%lld bf16 causal: fwd %.3f ms (%.1f TFLOP/s), bwd %.3f ms (%.1f TFLOP/s), "
                  "fwd+bwd %.1f TFLOP/s\n",
                  (long long)B, (long long)T, (long long)H, (long long)D, fwd, f_flops / fwd * 1e-9, bwd,
                  b_flops / bwd * 1e-9, (f_flops + b_flops) / (fwd + bwd) * 1e-9);
      std::printf("RESULT tessera %lld %.4f %.4f %.1f %.1f %.1f\n", (long long)D, fwd, bwd, f_flops / fwd * 1e-9,
                  b_flops / bwd * 1e-9, (f_flops + b_flops) / (fwd + bwd) * 1e-9);
    } catch (const Error& e) {
      std::printf("attention_cuda_bench: %s\n", e.what());
      return 1;
    }
  }
  cudaStreamDestroy(st);
  return 0;
}
