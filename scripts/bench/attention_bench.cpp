// Causal attention kernel throughput (fp32, the training path), to set beside PyTorch's
// scaled_dot_product_attention on the same shapes (attention_compare.py runs both): milliseconds and GFLOP/s of
// forward and backward, median of --reps after --warmup, at the attention shapes of the
// train_bench.py configurations plus a long sequence.
//   build/bench/attention_bench [--reps 20] [--warmup 3]        (threads: OMP_NUM_THREADS)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"

using namespace tessera;

namespace {

struct Shape4 {
  const char* name;
  int64_t B, T, H, KV, D;
};
// The attention of each train_bench.py configuration (one layer), and long sequences (GPT-2 124M's
// heads; the LLaMA configuration's grouped heads).
constexpr Shape4 kShapes[] = {
    {"gpt2-124m", 4, 64, 12, 12, 64},
    {"gpt2-6l-384", 4, 256, 6, 6, 64},
    {"llama-6l-384", 4, 256, 6, 2, 64},
    {"gpt2 T=1024", 1, 1024, 12, 12, 64},
    {"llama T=1024", 1, 1024, 6, 2, 64},
};

// Multiply-adds of the causal products, counting only visible (query, key) pairs: T (T + 1) / 2
// per head, D each, 2 flops. Forward: q k^T and P v; backward: q k^T again, dout v^T, dS k, dS^T q,
// P^T dout.
double causal_flops(const Shape4& s, int products) {
  return 2.0 * products * s.B * s.H * s.D * (s.T * (s.T + 1) / 2.0);
}

template <typename F>
double median_ms(F&& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, warmup = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--warmup") warmup = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  std::printf("tessera attention (fp32), %d OpenMP threads, median of %d\n", omp_get_max_threads(), reps);
  std::printf("%-14s %5s %5s %5s %5s %5s | %9s %9s | %9s %9s\n", "shape", "B", "T", "H", "KV", "D", "fwd ms", "GFLOP/s",
              "bwd ms", "GFLOP/s");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape4& s : kShapes) {
    auto make = [&](int64_t heads) {
      std::vector<float> v(static_cast<size_t>(s.B * s.T * heads * s.D));
      for (float& x : v) x = normal(rng);
      return v;
    };
    std::vector<float> q = make(s.H), k = make(s.KV), v = make(s.KV), dout = make(s.H);
    std::vector<float> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
    std::vector<float> lse(static_cast<size_t>(s.B * s.H * s.T));
    const Tensor tq(q.data(), DType::F32, {s.B, s.T, s.H, s.D}), tk(k.data(), DType::F32, {s.B, s.T, s.KV, s.D}),
        tv(v.data(), DType::F32, {s.B, s.T, s.KV, s.D}), tout(out.data(), DType::F32, {s.B, s.T, s.H, s.D}),
        tlse(lse.data(), DType::F32, {s.B, s.H, s.T}), tdout(dout.data(), DType::F32, {s.B, s.T, s.H, s.D}),
        tdq(dq.data(), DType::F32, {s.B, s.T, s.H, s.D}), tdk(dk.data(), DType::F32, {s.B, s.T, s.KV, s.D}),
        tdv(dv.data(), DType::F32, {s.B, s.T, s.KV, s.D});
    const double fwd = median_ms([&] { attention_forward(Exec::cpu(), tout, tlse, tq, tk, tv, 0, 0); }, warmup, reps);
    const double bwd = median_ms(
        [&] {
          std::fill(dq.begin(), dq.end(), 0.0f);
          std::fill(dk.begin(), dk.end(), 0.0f);
          std::fill(dv.begin(), dv.end(), 0.0f);
          attention_backward(Exec::cpu(), tdq, tdk, tdv, tdout, tq, tk, tv, tout, tlse, 0, 0);
        },
        warmup, reps);
    std::printf("%-14s %5ld %5ld %5ld %5ld %5ld | %9.3f %9.1f | %9.3f %9.1f\n", s.name, long(s.B), long(s.T),
                long(s.H), long(s.KV), long(s.D), fwd, causal_flops(s, 2) / fwd / 1e6, bwd, causal_flops(s, 5) / bwd / 1e6);
  }
  return 0;
}
