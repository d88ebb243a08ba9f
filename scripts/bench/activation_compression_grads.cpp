// The gradient error of model.activation_compression on real text (docs/performance.md,
// "Compressed saved activations"; scripts/bench/activation_compression.py runs it): a GPT-2 model
// of the Shakespeare config's shape at its seeded initialization, one batch of GPT-2 token ids read
// from a little-endian uint16 file (shared/data's tinyshakespeare_gpt2_u16le.bin), one forward and
// backward without compression and one per method; prints, as one JSON object, each method's
// relative error |g - g_exact| / |g_exact| per parameter group (a layer's name across the blocks,
// e.g. "attn.q.weight"), for the groups whose gradients differ (the others are bitwise equal).
//
//   build/bench/activation_compression_grads TOKENS.bin [n_layer n_head n_embd batch seq_len rank vocab]
// (vocab: 50257 for GPT-2 ids, 257 for byte ids)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kernels/allocator.h"
#include "model/compression_policy.h"
#include "model/gpt.h"

using namespace tessera;

namespace {

std::map<std::string, std::vector<float>> gradients(const ModelConfig& cfg, const std::vector<int32_t>& ids,
                                                    int64_t B, int64_t T, const ActivationCompression& c) {
  Allocator alloc;
  ParameterStore ps(alloc, DType::F32);
  Gpt gpt(cfg, ps, {}, {}, {}, {}, std::vector<ActivationCompression>(static_cast<size_t>(cfg.n_layer), c));
  ps.finalize();
  const Exec ex = Exec::cpu();
  ps.initialize(ex, 1337);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      tokens[static_cast<size_t>(b * T + t)] = ids[static_cast<size_t>(b * (T + 1) + t)];
      targets[static_cast<size_t>(b * T + t)] = ids[static_cast<size_t>(b * (T + 1) + t + 1)];
    }
  GptCtx ctx;
  gpt.forward(ex, ctx, alloc, Tensor(tokens.data(), DType::I32, {B, T}), Tensor(targets.data(), DType::I32, {B, T}));
  gpt.backward(ex, ctx, alloc, 1.0 / static_cast<double>(B * T));
  std::map<std::string, std::vector<float>> out;
  for (int id = 0; id < ps.size(); ++id) {
    const Tensor g = ps.grad(id);
    out[ps.entry(id).spec.name].assign(g.ptr<float>(), g.ptr<float>() + g.numel());
  }
  return out;
}

std::string group_of(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return name;
  return name.substr(name.find('.', 7) + 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TOKENS.bin [n_layer n_head n_embd batch seq_len rank vocab]\n", argv[0]);
    return 2;
  }
  const auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  ModelConfig cfg;
  cfg.preset = "gpt2";
  cfg.vocab_size = arg(8, 50257);
  cfg.n_layer = arg(2, 4);
  cfg.n_head = arg(3, 4);
  cfg.n_embd = arg(4, 128);
  const int64_t B = arg(5, 16), T = arg(6, 128), rank = arg(7, kDefaultCompressionRank);
  cfg.max_seq_len = T;
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<int32_t> ids;
  for (uint16_t v = 0; ids.size() < static_cast<size_t>(B * (T + 1)) && in.read(reinterpret_cast<char*>(&v), 2);)
    ids.push_back(v);
  if (ids.size() < static_cast<size_t>(B * (T + 1))) {
    std::fprintf(stderr, "%s holds fewer than %lld tokens\n", argv[1], static_cast<long long>(B * (T + 1)));
    return 1;
  }
  const auto exact = gradients(cfg, ids, B, T, {});
  std::printf("{");
  bool first_method = true;
  for (CompressionMethod m : {CompressionMethod::Bf16, CompressionMethod::Int8, CompressionMethod::LowRank}) {
    const auto got = gradients(cfg, ids, B, T, {m, rank});
    std::map<std::string, std::pair<double, double>> sums;
    for (const auto& [name, w] : exact) {
      auto& [num, den] = sums[group_of(name)];
      const std::vector<float>& g = got.at(name);
      for (size_t i = 0; i < w.size(); ++i) {
        num += (static_cast<double>(g[i]) - w[i]) * (static_cast<double>(g[i]) - w[i]);
        den += static_cast<double>(w[i]) * w[i];
      }
    }
    std::printf("%s\"%s\": {", first_method ? "" : ", ", compression_name(m));
    first_method = false;
    bool first = true;
    for (const auto& [group, s] : sums) {
      if (s.first == 0) continue;
      std::printf("%s\"%s\": %.3e", first ? "" : ", ", group.c_str(), std::sqrt(s.first / s.second));
      first = false;
    }
    std::printf("}");
  }
  std::printf("}\n");
  return 0;
}
