// Causal attention kernel throughput (fp32, the training path), to set beside PyTorch's
// scaled_dot_product_attention on the same shapes (attention_compare.py runs both): milliseconds and GFLOP/s of
// forward and backward, median of --reps after --warmup, at the attention shapes of the
// train_bench.py configurations plus a long sequence.
// --doc-len N (packed documents, data.document_mask): each shape again with the window cut into
// documents of N tokens, and long windows (T = 4096) as well; "vs causal" is the full causal
// window's time over the masked one's (the saving of skipping masked key tiles), "pairs" the share
// of the causal (query, key) pairs the mask leaves visible (the ideal saving's inverse).
//   build/bench/attention_bench [--reps 20] [--warmup 3] [--doc-len N]   (threads: OMP_NUM_THREADS)
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
constexpr Shape4 kLongShapes[] = {
    {"gpt2 T=4096", 1, 4096, 12, 12, 64},
    {"llama T=4096", 1, 4096, 6, 2, 64},
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

// Each position's document start for documents of doc_len tokens packed into B windows of T.
std::vector<int32_t> packed_documents(const Shape4& s, int64_t doc_len) {
  std::vector<int32_t> d(static_cast<size_t>(s.B * s.T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.T; ++t) d[static_cast<size_t>(b * s.T + t)] = static_cast<int32_t>(t / doc_len * doc_len);
  return d;
}

// Visible (query, key) pairs of one head and sequence under the document mask, over the causal ones.
double visible_share(const Shape4& s, int64_t doc_len) {
  double pairs = 0;
  for (int64_t t = 0; t < s.T; ++t) pairs += static_cast<double>(t - t / doc_len * doc_len + 1);
  return pairs / (s.T * (s.T + 1) / 2.0);
}

struct Timing {
  double fwd, bwd;
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 20, warmup = 3;
  int64_t doc_len = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--warmup") warmup = std::atoi(argv[i + 1]);
    else if (a == "--doc-len") doc_len = std::atoll(argv[i + 1]);
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
  std::vector<Shape4> shapes(std::begin(kShapes), std::end(kShapes));
  if (doc_len > 0) shapes.insert(shapes.end(), std::begin(kLongShapes), std::end(kLongShapes));
  for (const Shape4& s : shapes) {
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
    const auto time = [&](const Tensor& docs) {
      const double fwd =
          median_ms([&] { attention_forward(Exec::cpu(), tout, tlse, tq, tk, tv, 0, 0, docs); }, warmup, reps);
      const double bwd = median_ms(
          [&] {
            std::fill(dq.begin(), dq.end(), 0.0f);
            std::fill(dk.begin(), dk.end(), 0.0f);
            std::fill(dv.begin(), dv.end(), 0.0f);
            attention_backward(Exec::cpu(), tdq, tdk, tdv, tdout, tq, tk, tv, tout, tlse, 0, 0, docs);
          },
          warmup, reps);
      return Timing{fwd, bwd};
    };
    const Timing causal = time(Tensor());
    std::printf("%-14s %5ld %5ld %5ld %5ld %5ld | %9.3f %9.1f | %9.3f %9.1f\n", s.name, long(s.B), long(s.T),
                long(s.H), long(s.KV), long(s.D), causal.fwd, causal_flops(s, 2) / causal.fwd / 1e6, causal.bwd,
                causal_flops(s, 5) / causal.bwd / 1e6);
    if (doc_len > 0) {
      std::vector<int32_t> docs = packed_documents(s, doc_len);
      const Timing masked = time(Tensor(docs.data(), DType::I32, {s.B, s.T}));
      std::printf("%-14s docs of %5ld tokens: pairs %5.1f%% | fwd %9.3f ms (%5.2fx vs causal) | bwd %9.3f ms "
                  "(%5.2fx vs causal)\n",
                  s.name, long(doc_len), 100 * visible_share(s, doc_len), masked.fwd, causal.fwd / masked.fwd, masked.bwd,
                  causal.bwd / masked.bwd);
    }
  }
  return 0;
}
