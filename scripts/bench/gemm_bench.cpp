// GEMM benchmark that picks tessera's CPU BLAS by measurement: times cblas_sgemm on a GPT-2 124M
// step's Linear shapes in the three forms training uses, and the machine's AVX2-FMA peak.
// The same source is built once per library (GEMM_BENCH_OPENBLAS or GEMM_BENCH_BLIS) so the
// libraries run the identical harness; results go to docs/performance.md "GEMM library choice".
#include <cblas.h>
#include <immintrin.h>
#include <unistd.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#if defined(GEMM_BENCH_BLIS)
#include <blis.h>
#endif

#include "kernels/cpu/blas_select.h"

namespace {

struct Options {
  int threads = 2;
  int warmup = 1;
  int reps = 5;
  std::vector<long> tokens = {256, 1024};  // N = B*T
  bool peak = true;
  bool gemm = true;
  bool mixed = true;
  double idle_wait = 0;  // > 0: before each measurement wait up to this many seconds for an idle machine
  bool select = true;     // tessera's kernel selection (kernels/cpu/blas_select.h), as `tessera` runs
};

// One Linear layer of GPT-2 124M: w (out, in).
struct Layer {
  const char* name;
  long in, out;
};
constexpr Layer kLayers[] = {
    {"attn.proj", 768, 768}, {"attn.qkv", 768, 2304}, {"mlp.fc", 768, 3072},
    {"mlp.proj", 3072, 768}, {"lm_head", 768, 50257},
};

// The three GEMMs of a Linear, as kernels/cpu/matmul.cpp issues them (row-major, tokens n):
//   forward     NT: y (n, out)   = x (n, in)   · w (out, in)^T
//   backward-dx NN: dx (n, in)   = dy (n, out) · w (out, in)
//   backward-dw TN: dw (out, in) += dy^T        · x (n, in)       (beta = 1)
enum class Form { NT, NN, TN };
const char* form_name(Form f) { return f == Form::NT ? "NT fwd" : f == Form::NN ? "NN bwd-dx" : "TN bwd-dw"; }

const char* library_name() {
#if defined(GEMM_BENCH_OPENBLAS)
  return "OpenBLAS";
#elif defined(GEMM_BENCH_BLIS)
  return "BLIS";
#else
  return "unknown";
#endif
}

void set_blas_threads(int n) {
#if defined(GEMM_BENCH_OPENBLAS)
  openblas_set_num_threads(n);
#elif defined(GEMM_BENCH_BLIS)
  bli_thread_set_num_threads(n);
#endif
  omp_set_num_threads(n);
}

void print_library() {
#if defined(GEMM_BENCH_OPENBLAS)
  std::printf("library: OpenBLAS, core %s, config: %s\n", openblas_get_corename(), openblas_get_config());
#elif defined(GEMM_BENCH_BLIS)
  std::printf("library: BLIS %s, arch %s, threading: %s\n", bli_info_get_version_str(),
              bli_arch_string(bli_arch_query_id()), bli_info_get_enable_openmp() ? "OpenMP" : "not OpenMP");
#endif
  for (const char* var : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                          "BLIS_NUM_THREADS"}) {
    const char* v = std::getenv(var);
    std::printf("env %s: %s\n", var, v ? v : "(unset)");
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds used by all of this process's threads (spin-waiting included).
double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The machine is shared: the load average tells how much the numbers may be disturbed.
void print_loadavg(const char* when) {
  char buf[128] = "?";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (!std::fgets(buf, sizeof buf, f)) std::strcpy(buf, "?\n");
    std::fclose(f);
  }
  std::printf("load average %s: %s", when, buf);
}

// Fraction of all CPUs' time not used by other processes over the window: idle time from
// /proc/stat's first line (user nice system idle iowait irq softirq steal, in clock ticks) plus
// this process's own time (BLAS threads may still spin after a call).
double others_idle_fraction(double window_s) {
  auto sample = [](double& idle, double& total) {
    idle = total = 0;
    FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return;
    double v[8] = {};
    if (std::fscanf(f, "cpu %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                    &v[7]) == 8) {
      idle = v[3];
      for (double x : v) total += x;
    }
    std::fclose(f);
  };
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  double i0, t0, i1, t1;
  double own0 = process_cpu_seconds();
  sample(i0, t0);
  std::this_thread::sleep_for(std::chrono::duration<double>(window_s));
  sample(i1, t1);
  double own = (process_cpu_seconds() - own0) * ticks;
  return t1 > t0 ? std::min(1.0, (i1 - i0 + own) / (t1 - t0)) : 1.0;
}

// On a shared machine, waits (at most o.idle_wait seconds) until others leave the CPUs nearly idle.
void wait_for_idle(const Options& o) {
  if (o.idle_wait <= 0) return;
  auto t0 = std::chrono::steady_clock::now();
  while (others_idle_fraction(0.5) < 0.9 && seconds_since(t0) < o.idle_wait) {
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Buffers sized for the largest layer, filled once with small values (no denormals, no NaN).
// Only dw is accumulated into and nothing reads it, so values stay bounded across repetitions.
struct Buffers {
  std::vector<float> x, w, y, dw;
  Buffers(long n, long max_in, long max_out)
      : x(n * std::max(max_in, max_out)), w(max_in * max_out), y(n * std::max(max_in, max_out)),
        dw(max_in * max_out, 0.0f) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.001f * static_cast<float>(i % 997) - 0.5f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.0001f * static_cast<float>(i % 1009) - 0.05f;
    std::fill(y.begin(), y.end(), 0.0f);
  }
};

void run_form(Form f, long n, const Layer& l, Buffers& b) {
  const auto R = CblasRowMajor;
  const auto N = CblasNoTrans, T = CblasTrans;
  switch (f) {
    case Form::NT:  // y (n, out) = x (n, in) · w^T
      cblas_sgemm(R, N, T, n, l.out, l.in, 1.0f, b.x.data(), l.in, b.w.data(), l.in, 0.0f, b.y.data(), l.out);
      break;
    case Form::NN:  // dx (n, in) = dy (n, out) · w (out, in)
      cblas_sgemm(R, N, N, n, l.in, l.out, 1.0f, b.x.data(), l.out, b.w.data(), l.in, 0.0f, b.y.data(), l.in);
      break;
    case Form::TN:  // dw (out, in) += dy^T (out, n) · x (n, in)
      cblas_sgemm(R, T, N, l.out, l.in, n, 1.0f, b.x.data(), l.out, b.y.data(), l.in, 1.0f, b.dw.data(), l.in);
      break;
  }
}

struct Timing {
  double gflops;  // from the median wall time
  double best;    // from the fastest run: the least disturbed one on a shared machine
  double cpu;     // CPU seconds / (wall seconds * threads): below ~0.9 the threads lacked a core
};

// Median GFLOP/s of one (form, shape) after warm-up.
Timing time_gemm(Form f, long n, const Layer& l, Buffers& b, const Options& o) {
  for (int i = 0; i < o.warmup; ++i) run_form(f, n, l, b);
  std::vector<double> times;
  double cpu0 = process_cpu_seconds();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    run_form(f, n, l, b);
    times.push_back(seconds_since(t0));
  }
  double cpu = (process_cpu_seconds() - cpu0) / (seconds_since(start) * o.threads);
  double flop = 2.0 * n * l.in * l.out;
  return {flop / median(times) * 1e-9, flop / *std::min_element(times.begin(), times.end()) * 1e-9, cpu};
}

void bench_gemm(const Options& o) {
  long max_n = *std::max_element(o.tokens.begin(), o.tokens.end());
  Buffers b(max_n, 3072, 50257);
  std::printf("\n%-10s %-6s %-10s %10s %8s %6s\n", "layer", "N", "form", "GFLOP/s", "best", "cpu");
  for (long n : o.tokens) {
    double flops = 0, secs = 0;  // whole-step aggregate: sum of flops / sum of times
    for (const Layer& l : kLayers) {
      for (Form f : {Form::NT, Form::NN, Form::TN}) {
        // With --idle-wait, a run whose threads lacked a core (cpu < 0.9) is retried, twice at most.
        Timing t{};
        for (int attempt = 0; attempt < (o.idle_wait > 0 ? 3 : 1) && t.cpu < 0.9; ++attempt) {
          wait_for_idle(o);
          Timing u = time_gemm(f, n, l, b, o);
          if (u.cpu > t.cpu) t = u;
        }
        double fl = 2.0 * n * l.in * l.out;
        flops += fl;
        secs += fl / (t.gflops * 1e9);
        std::printf("%-10s %-6ld %-10s %10.1f %8.1f %6.2f\n", l.name, n, form_name(f), t.gflops, t.best, t.cpu);
        std::fflush(stdout);
      }
    }
    std::printf("%-10s %-6ld %-10s %10.1f   (all 15 GEMMs: total flops / total median time)\n", "ALL", n, "",
                flops / secs * 1e-9);
  }
}

// A training step alternates BLAS calls with tessera's own OpenMP loops. A BLAS with its own thread
// pool (OpenBLAS pthreads) can fight the OpenMP threads for the cores while either side spin-waits;
// one built on OpenMP (BLIS here) shares the pool. Times GEMM + elementwise pairs against each alone.
void elementwise_pass(float* y, long n) {
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) y[i] = y[i] * 0.5f + 0.25f;
}

void bench_mixed(const Options& o) {
  const long n = o.tokens.back();
  const Layer l = kLayers[2];  // mlp.fc: y (n, 3072)
  Buffers b(n, l.in, l.out);
  const long ny = n * l.out;
  const int rounds = 3 * o.reps;
  // Median milliseconds per round, and the CPU share the threads got (as in Timing::cpu).
  auto timed = [&](bool gemm, bool loop, double& cpu) {
    wait_for_idle(o);
    for (int i = 0; i < 2; ++i) {
      if (gemm) run_form(Form::NT, n, l, b);
      if (loop) elementwise_pass(b.y.data(), ny);
    }
    std::vector<double> ms;
    double cpu0 = process_cpu_seconds();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      if (gemm) run_form(Form::NT, n, l, b);
      if (loop) elementwise_pass(b.y.data(), ny);
      ms.push_back(seconds_since(t0) * 1e3);
    }
    cpu = (process_cpu_seconds() - cpu0) / (seconds_since(start) * o.threads);
    return median(ms);
  };
  double cg, ce, cb;
  double g = timed(true, false, cg), e = timed(false, true, ce), both = timed(true, true, cb);
  std::printf("\nmixed (mlp.fc NT, N=%ld, then an OpenMP pass over y; median of %d rounds): gemm %.2f ms + loop %.2f ms"
              " = %.2f ms alone, %.2f ms interleaved (%+.0f%%); cpu %.2f %.2f %.2f\n",
              n, rounds, g, e, g + e, both, 100.0 * (both / (g + e) - 1.0), cg, ce, cb);
}

// Practical fp32 FMA peak: kChains independent 8-wide FMA chains per thread, enough to cover the
// FMA latency (4-5 cycles) times the FMA ports (2) of current x86 cores.
constexpr int kChains = 12;
float fma_chains(long iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * c);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  for (long i = 0; i < iters; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  float out[8], s = 0;
  for (int c = 0; c < kChains; ++c) {
    _mm256_storeu_ps(out, acc[c]);
    for (float v : out) s += v;
  }
  return s;
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Peak {
  double wall;      // GFLOP/s of all threads together, by wall time
  double per_core;  // GFLOP per CPU-second of one thread: unaffected by time spent descheduled
};

// Best of 3 runs of `threads` threads each running the FMA chains.
Peak peak_gflops(int threads, const Options& o) {
  const long iters = 100'000'000 / kChains;
  const double flop_per_thread = 2.0 * 8 * kChains * iters;
  Peak best{0, 0};
  for (int rep = 0; rep < 3; ++rep) {
    wait_for_idle(o);
    std::vector<std::thread> pool;
    std::vector<float> sink(threads);
    std::vector<double> cpu(threads);
    auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        double c0 = thread_cpu_seconds();
        sink[t] = fma_chains(iters);
        cpu[t] = thread_cpu_seconds() - c0;
      });
    for (auto& th : pool) th.join();
    double s = seconds_since(t0);
    if (sink[0] == 12345.0f) std::printf(" ");  // keeps the result observable
    best.wall = std::max(best.wall, flop_per_thread * threads / s * 1e-9);
    best.per_core = std::max(best.per_core, flop_per_thread / *std::max_element(cpu.begin(), cpu.end()) * 1e-9);
  }
  return best;
}

void usage() {
  std::printf(
      "usage: gemm_bench [--threads N] [--reps N] [--warmup N] [--tokens 256,1024] [--no-peak] [--no-gemm]"
      " [--no-mixed] [--idle-wait SECONDS] [--library-core]\n"
      "--library-core: keep the OpenBLAS core the library picked (default: tessera's choice, as tessera runs)\n");
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) { usage(); std::exit(2); }
      return argv[++i];
    };
    if (a == "--threads") o.threads = std::atoi(next());
    else if (a == "--reps") o.reps = std::atoi(next());
    else if (a == "--warmup") o.warmup = std::atoi(next());
    else if (a == "--no-peak") o.peak = false;
    else if (a == "--no-gemm") o.gemm = false;
    else if (a == "--no-mixed") o.mixed = false;
    else if (a == "--idle-wait") o.idle_wait = std::atof(next());
    else if (a == "--library-core") o.select = false;
    else if (a == "--tokens") {
      o.tokens.clear();
      for (char* s = std::strtok(const_cast<char*>(next()), ","); s; s = std::strtok(nullptr, ","))
        o.tokens.push_back(std::atol(s));
    } else { usage(); std::exit(a == "--help" ? 0 : 2); }
  }
  if (o.threads < 1 || o.reps < 1 || o.tokens.empty()) { usage(); std::exit(2); }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  // Before any BLAS call, as tessera's main() does.
  if (o.select) std::printf("blas: %s\n", tessera::cpu::describe(tessera::cpu::blas_selection()).c_str());
  set_blas_threads(o.threads);
  std::printf("gemm_bench (%s): %d threads, %d warm-up + median of %d runs, hardware threads %u\n", library_name(),
              o.threads, o.warmup, o.reps, std::thread::hardware_concurrency());
  print_library();
  print_loadavg("at start");
  if (o.peak) {
    Peak one = peak_gflops(1, o), all = peak_gflops(o.threads, o);
    std::printf("\nAVX2-FMA peak (%d chains x 8 lanes, best of 3): 1 thread %.1f GFLOP/s; %d threads %.1f GFLOP/s"
                " (wall), %.1f GFLOP per CPU-second per thread\n",
                kChains, one.wall, o.threads, all.wall, all.per_core);
  }
  if (o.gemm) bench_gemm(o);
  if (o.mixed) bench_mixed(o);
  print_loadavg("at end");
  return 0;
}
