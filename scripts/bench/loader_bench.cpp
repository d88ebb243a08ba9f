// How fast the data loader delivers tokens, to compare with what training consumes (the tok/s of
// a training log). Reads the addition task, or token files when --data is given.
//   build/bench/loader_bench [--data PREFIX_OR_GLOB --vocab V] [--seq-len T] [--micro-batch B] [--batches N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "data/addition.h"
#include "data/loader.h"
#include "data/token_dataset.h"

using namespace tessera;

int main(int argc, char** argv) {
  std::string data;
  int64_t vocab = 50257, T = 1024, B = 8, N = 400;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--data") data = argv[i + 1];
    else if (a == "--vocab") vocab = std::atoll(argv[i + 1]);
    else if (a == "--seq-len") T = std::atoll(argv[i + 1]);
    else if (a == "--micro-batch") B = std::atoll(argv[i + 1]);
    else if (a == "--batches") N = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  AdditionTask task(2, 1);
  std::unique_ptr<Dataset> ds;
  if (data.empty())
    ds = std::make_unique<AdditionDataset>(task, false, T, int64_t(1) << 40);
  else
    ds = open_token_dataset({data}, T, vocab);
  Sampler sampler(ds->num_samples(), 1);
  DataLoader loader(*ds, sampler, {B, B, 1, 0}, 0);
  loader.next();  // warm up: thread started, first pages mapped
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens = 0;
  for (int64_t i = 0; i < N; ++i) tokens += static_cast<int64_t>(loader.next().tokens.size());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %ld micro-batches of %ld x %ld tokens in %.3f s: %.2fM tokens/s\n", ds->describe().c_str(),
              static_cast<long>(N), static_cast<long>(B), static_cast<long>(T), s, tokens / s / 1e6);
  return 0;
}
