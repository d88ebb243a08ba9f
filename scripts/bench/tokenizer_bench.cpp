// GPT-2 tokenizer throughput: encodes Tiny Shakespeare and Alice (from shared/data) with 1 and 2
// OpenMP threads, and Tiny Shakespeare as ~1 KB documents one call each (as `tessera prepare` does
// for small documents), and prints wall-clock MB/s and MB per CPU-second (what one core does, robust
// to a busy machine), medians of 5 runs after one warm-up; each call starts with a cold per-call
// cache. Usage: tokenizer_bench [data_dir, default ../shared/data]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "tokenizer_bench: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// CPU seconds used by the process so far, all threads together.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double wall_s, cpu_s;  // medians
  size_t tokens;
};

// The ids of all documents, one encode call each.
size_t encode_all(const tessera::Gpt2Tokenizer& tok, const std::vector<std::string_view>& docs) {
  size_t n = 0;
  for (std::string_view d : docs) n += tok.encode(d).size();
  return n;
}

// text cut after the first "\n\n" past every `bytes` bytes.
std::vector<std::string_view> split_documents(const std::string& text, size_t bytes) {
  std::vector<std::string_view> docs;
  for (size_t p = 0; p < text.size();) {
    size_t q = text.find("\n\n", std::min(text.size(), p + bytes));
    q = q == std::string::npos ? text.size() : q + 2;
    docs.push_back(std::string_view(text).substr(p, q - p));
    p = q;
  }
  return docs;
}

// 5 encodes of the documents on `threads` threads, after a warm-up.
Timing time_encode(const tessera::Gpt2Tokenizer& tok, const std::vector<std::string_view>& docs, int threads) {
  omp_set_num_threads(threads);
  Timing t{0, 0, encode_all(tok, docs)};
  std::vector<double> wall, cpu;
  for (int run = 0; run < 5; ++run) {
    Clock::time_point t0 = Clock::now();
    double c0 = cpu_seconds();
    size_t n = encode_all(tok, docs);
    cpu.push_back(cpu_seconds() - c0);
    wall.push_back(seconds_since(t0));
    if (n != t.tokens) std::fprintf(stderr, "tokenizer_bench: token count changed between runs\n");
  }
  t.wall_s = median(wall);
  t.cpu_s = median(cpu);
  return t;
}

// CPUs that 2 busy OpenMP threads actually get right now (2.0 on an idle 2-core machine): a
// busy machine caps what 2 threads can gain, so this is printed next to the numbers.
double cpus_for_two_threads() {
  Clock::time_point t0 = Clock::now();
  double c0 = cpu_seconds();
#pragma omp parallel num_threads(2)
  {
    volatile double x = 0;
    while (seconds_since(t0) < 0.3) x = x + 1;
  }
  return (cpu_seconds() - c0) / seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "../shared/data";
  Clock::time_point t0 = Clock::now();
  tessera::Gpt2Tokenizer tok(dir + "/gpt2");
  std::printf("loaded encoder.json + vocab.bpe in %.0f ms; 2 busy threads get %.2f CPUs now\n",
              1e3 * seconds_since(t0), cpus_for_two_threads());
  std::printf("%-36s %9s %8s %7s %8s %10s\n", "input", "bytes", "tokens", "threads", "MB/s", "MB/cpu-s");
  auto report = [&](const std::string& label, const std::string& text, const std::vector<std::string_view>& docs,
                    int threads) {
    Timing t = time_encode(tok, docs, threads);
    double mb = text.size() / 1e6;
    std::printf("%-36s %9zu %8zu %7d %8.1f %10.1f\n", label.c_str(), text.size(), t.tokens, threads,
                mb / t.wall_s, mb / t.cpu_s);
  };
  for (const char* name : {"tinyshakespeare.txt", "alice_in_wonderland_pg11.txt"}) {
    const std::string text = read_file(dir + "/" + name);
    for (int threads : {1, 2}) report(name, text, {text}, threads);
  }
  const std::string text = read_file(dir + "/tinyshakespeare.txt");
  std::vector<std::string_view> docs = split_documents(text, 1000);
  report("tinyshakespeare.txt, " + std::to_string(docs.size()) + " docs", text, docs, 1);
  return 0;
}
