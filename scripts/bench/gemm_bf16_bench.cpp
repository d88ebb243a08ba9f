// bf16 GEMM benchmark (docs/performance.md, "bf16 GEMM"): at the Linear shapes of a model's
// training step, the three GEMMs of each layer as kernels/cpu/matmul.cpp issues them
//   fwd  y (N, Out)   = x (N, In) w^T       (w's bf16 copy, x fp32 rounded while packing)
//   dx   dx (N, In)   = dy (N, Out) w
//   dw   dw (Out, In) += dy^T x             (both fp32, rounded while packing)
// timed for: fp32 OpenBLAS (cpu::sgemm, what train.dtype = "fp32" runs), tessera's bf16 GEMM
// (kernels/cpu/gemm_bf16.h, AVX512_BF16 and the portable fallback), and, where the build found
// oneDNN (Debian's libdnnl-dev), oneDNN's bf16 matmul with both inputs already bf16 and its
// primitive created outside the timing (its best case: training would add a conversion pass of
// the fp32 operand), and tessera's default kernel as training calls it (it rounds the fp32 operand
// itself, here into a heap buffer: "training"). GFLOP/s = 2 M N K / median CPU time per thread
// (--clock cpu, the default: for one thread on a shared machine) or median wall time (--clock wall:
// several threads on a quiet machine; CPU time would count OpenMP's spinning, not its sleeping).
//
//   build/bench/gemm_bf16_bench --embd 384 --tokens 1024     # the 6-layer configuration
//   build/bench/gemm_bf16_bench --embd 768 --tokens 256      # GPT-2 124M, B 4 x T 64
#include <omp.h>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#ifdef GEMM_BF16_BENCH_DNNL
#include <dnnl.hpp>
#endif

#include "kernels/cpu/blas.h"
#include "kernels/cpu/blas_select.h"
#include "kernels/cpu/gemm_bf16.h"

namespace {
using namespace tessera;

// The process's CPU time: on a machine shared with other processes, time spent descheduled does
// not count (wall time there varied 10x between runs). Per core: run with OMP_NUM_THREADS=1 (with
// more threads, OpenMP's spinning at barriers counts too).
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double wall_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// --clock wall: wall time (for several threads on a quiet machine: CPU time would count OpenMP's
// spinning and not its sleeping); --clock cpu (default): CPU time per thread.
bool use_wall = false;

double median_seconds(const std::function<void()>& f, int reps) {
  f();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = use_wall ? wall_seconds() : cpu_seconds();
    f();
    t.push_back(use_wall ? wall_seconds() - t0 : (cpu_seconds() - t0) / omp_get_max_threads());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Gemm {
  std::string name;
  int64_t m, n, k;
  bool ta, tb;
  bool a_is_weight, b_is_weight;  // which operand is the weights (stored bf16 under mixed precision)
  float beta;
};

#ifdef GEMM_BF16_BENCH_DNNL
// oneDNN matmul: src (m, k), weights (k, n) bf16 with strides for the transposes, dst (m, n) f32.
struct DnnlMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  DnnlMatmul(const Gemm& g, void* pa, void* pb, float* pc) {
    using dt = dnnl::memory::data_type;
    const dnnl::memory::dims a_strides = g.ta ? dnnl::memory::dims{1, g.m} : dnnl::memory::dims{g.k, 1};
    const dnnl::memory::dims b_strides = g.tb ? dnnl::memory::dims{1, g.k} : dnnl::memory::dims{g.n, 1};
    dnnl::memory::desc ad({g.m, g.k}, dt::bf16, a_strides), bd({g.k, g.n}, dt::bf16, b_strides),
        cd({g.m, g.n}, dt::f32, dnnl::memory::dims{g.n, 1});
    dnnl::primitive_attr attr;
    if (g.beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(g.beta);
      attr.set_post_ops(po);
    }
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), attr, eng));
    a = dnnl::memory(ad, eng, pa);
    b = dnnl::memory(bd, eng, pb);
    c = dnnl::memory(cd, eng, pc);
  }
  void run() {
    prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    strm.wait();
  }
};
#endif

void bench(const char* layer, const Gemm& g, int reps) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(g.m * g.k)), b(static_cast<size_t>(g.k * g.n)), c(static_cast<size_t>(g.m * g.n));
  for (float& v : a) v = nd(rng);
  for (float& v : b) v = nd(rng);
  std::vector<uint16_t> ah(a.size()), bh(b.size());
  cpu::f32_to_bf16(ah.data(), a.data(), static_cast<int64_t>(a.size()));
  cpu::f32_to_bf16(bh.data(), b.data(), static_cast<int64_t>(b.size()));
  const int64_t lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
  const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  auto gf = [&](double s) { return flops / s / 1e9; };
  const double t32 = median_seconds(
      [&] { cpu::sgemm("bench", g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, g.beta, c.data(), g.n); },
      reps);
  // Training's operands: the weight operand from the bf16 copy, the other fp32.
  const cpu::GemmOperand oa{g.a_is_weight ? static_cast<const void*>(ah.data()) : a.data(),
                            g.a_is_weight ? DType::BF16 : DType::F32, lda, g.ta};
  const cpu::GemmOperand ob{g.b_is_weight ? static_cast<const void*>(bh.data()) : b.data(),
                            g.b_is_weight ? DType::BF16 : DType::F32, ldb, g.tb};
  std::string avx = "-";
  if (cpu::cpu_has_avx512_bf16()) {
    const double t = median_seconds(
        [&] { cpu::gemm_bf16("bench", g.m, g.n, g.k, 1.0f, oa, ob, g.beta, c.data(), g.n, cpu::Bf16Kernel::Avx512Bf16); },
        reps);
    avx = std::to_string(static_cast<int>(gf(t)));
  }
  const double tp = median_seconds(
      [&] { cpu::gemm_bf16("bench", g.m, g.n, g.k, 1.0f, oa, ob, g.beta, c.data(), g.n, cpu::Bf16Kernel::Portable); },
      std::max(1, reps / 2));
  std::string dnnl = "-", dnnl_cvt = "-";
#ifdef GEMM_BF16_BENCH_DNNL
  DnnlMatmul mm(g, ah.data(), bh.data(), c.data());
  dnnl = std::to_string(static_cast<int>(gf(median_seconds([&] { mm.run(); }, reps))));
  // As training would call it: the fp32 operands (activations, gradients) converted first.
  dnnl_cvt = std::to_string(static_cast<int>(gf(median_seconds(
      [&] {
        if (!g.a_is_weight) cpu::f32_to_bf16(ah.data(), a.data(), static_cast<int64_t>(a.size()));
        if (!g.b_is_weight) cpu::f32_to_bf16(bh.data(), b.data(), static_cast<int64_t>(b.size()));
        mm.run();
      },
      reps))));
#endif
  // As training calls it (kernels/cpu/matmul.cpp): the default kernel, rounding its fp32 operand.
  const std::string train = std::to_string(static_cast<int>(gf(median_seconds(
      [&] { cpu::gemm_bf16("bench", g.m, g.n, g.k, 1.0f, oa, ob, g.beta, c.data(), g.n); }, reps))));
  std::printf("%-10s %-4s %6ld %6ld %6ld  %8d  %10s  %8d  %8s  %10s  %8s\n", layer, g.name.c_str(), static_cast<long>(g.m),
              static_cast<long>(g.n), static_cast<long>(g.k), static_cast<int>(gf(t32)), avx.c_str(),
              static_cast<int>(gf(tp)), dnnl.c_str(), dnnl_cvt.c_str(), train.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int64_t embd = 384, tokens = 1024, vocab = 50257;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (k == "--embd") embd = v;
    else if (k == "--tokens") tokens = v;
    else if (k == "--vocab") vocab = v;
    else if (k == "--reps") reps = static_cast<int>(v);
    else if (k == "--clock" && (std::string(argv[i + 1]) == "wall" || std::string(argv[i + 1]) == "cpu"))
      use_wall = std::string(argv[i + 1]) == "wall";
    else {
      std::fprintf(stderr, "usage: %s [--embd C] [--tokens N] [--vocab V] [--reps R] [--clock cpu|wall]\n", argv[0]);
      return 2;
    }
  }
  // The fp32 column runs the OpenBLAS core tessera runs (kernels/cpu/blas_select.h), as `tessera` does.
  const cpu::BlasSelection& blas = cpu::blas_selection();
  std::printf("blas: %s\n", cpu::describe(blas).c_str());
  std::printf("bf16 GEMM at a GPT-2 step's Linear shapes: C %ld, N %ld tokens, V %ld; %d OpenMP threads; GFLOP/s\n",
              static_cast<long>(embd), static_cast<long>(tokens), static_cast<long>(vocab), omp_get_max_threads());
  std::printf("%-10s %-4s %6s %6s %6s  %8s  %10s  %8s  %8s  %10s  %8s\n", "layer", "gemm", "M", "N", "K", "fp32",
              "avx512bf16", "portable", "onednn", "onednn+cvt", "training");
  struct Layer {
    const char* name;
    int64_t in, out;
  };
  const Layer layers[] = {{"attn.qkv", embd, 3 * embd}, {"attn.proj", embd, embd}, {"mlp.fc", embd, 4 * embd},
                          {"mlp.proj", 4 * embd, embd}, {"lm_head", embd, vocab}};
  for (const Layer& l : layers) {
    bench(l.name, {"fwd", tokens, l.out, l.in, false, true, false, true, 0.0f}, reps);
    bench(l.name, {"dx", tokens, l.in, l.out, false, false, false, true, 0.0f}, reps);
    bench(l.name, {"dw", l.out, l.in, tokens, true, false, false, false, 1.0f}, reps);
  }
  return 0;
}
