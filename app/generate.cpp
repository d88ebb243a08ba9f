// Generation: checkpoint -> model, prompt -> ids, a prefill then one token per forward through
// the KV cache, ids -> text as they come.
#include "app/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>

#include "app/checkpoint/checkpoint_io.h"
#include "app/config.h"
#include "app/checkpoint/hf_export.h"
#include "data/addition.h"
#include "data/tokenizer.h"
#include "kernels/allocator.h"
#include "kernels/elementwise.h"
#include "model/gpt.h"

namespace tessera {

namespace {

// The addition task's characters as a Tokenizer.
class CharTokenizerAdapter : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool) const override { return tok_.encode(std::string(text)); }
  std::string decode(const std::vector<int32_t>& ids) const override { return tok_.decode(ids); }
  int64_t vocab_size() const override { return tok_.vocab_size(); }
  int32_t eot_id() const override { return 12; }  // '\n' ends an answer
  std::string name() const override { return "addition characters"; }

 private:
  CharTokenizer tok_;
};

std::unique_ptr<Tokenizer> tokenizer_for(const Config& cfg, const std::string& vocab_dir_arg) {
  if (cfg.data.task == "addition") return std::make_unique<CharTokenizerAdapter>();
  // No directory: make_tokenizer looks in the default one (the repository's data/gpt2).
  return make_tokenizer(cfg.data.tokenizer, !vocab_dir_arg.empty() ? vocab_dir_arg : cfg.data.vocab_dir);
}

// Parameters of the checkpoint's /model, loaded into a fresh f32 model.
struct LoadedModel {
  Allocator alloc;
  Exec ex;  // the model's device: the CPU
  std::unique_ptr<ParameterStore> params;
  std::unique_ptr<Gpt> model;
};

void load_model(LoadedModel& m, const CheckpointReader& r) {
  const ModelConfig mc = model_config_of(r);
  m.params = std::make_unique<ParameterStore>(m.alloc, DType::F32);
  m.model = std::make_unique<Gpt>(mc, *m.params);
  m.params->finalize();
  check_shapes(r, model_tensor_shapes(mc));
  for (int id = 0; id < m.params->size(); ++id) {
    const ParamEntry& e = m.params->entry(id);
    r.read("/model/" + e.spec.name, -1, 0, e.local_shape, m.params->param(id).ptr<float>());
  }
}

// The last row of logits (rows, V) on ex's device, read to the host.
std::vector<float> last_row(const Exec& ex, const Tensor& logits) {
  const int64_t V = logits.dim(1), rows = logits.dim(0);
  std::vector<float> row(static_cast<size_t>(V));
  copy(ex, Tensor(row.data(), DType::F32, {1, V}), logits.slice_rows(rows - 1, rows));
  synchronize(ex);
  return row;
}

// Host ids as a (1, T) tensor on the model's device.
Buffer device_ids(LoadedModel& m, std::vector<int32_t>& ids) {
  return upload(m.ex, m.alloc, Tensor(ids.data(), DType::I32, {1, static_cast<int64_t>(ids.size())}),
                MemCategory::Activations);
}

}  // namespace

int32_t sample_token(const std::vector<float>& logits, double temperature, int64_t top_k, double u) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> p(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += p[i] = std::exp((logits[order[i]] - logits[order[0]]) / temperature);
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[i] / total;
    if (u < acc) return order[i];
  }
  return order[k - 1];
}

void check_generate_args(const GenerateArgs& a) {
  TESSERA_CHECK(a.max_tokens >= 0, "generate: --max-tokens must be >= 0, got ", a.max_tokens);
  TESSERA_CHECK(std::isfinite(a.temperature) && a.temperature >= 0, "generate: --temperature must be a finite number ",
                ">= 0 (0 = greedy), got ", a.temperature);
  TESSERA_CHECK(a.top_k >= 0, "generate: --top-k must be >= 0 (0 = the whole vocabulary), got ", a.top_k);
}

int run_generate_command(const GenerateArgs& a) {
  check_generate_args(a);
  CheckpointReader reader(a.ckpt, MPI_COMM_SELF);
  const Config cfg = parse_config_string(reader.meta().config_toml, a.ckpt + " (stored config)");
  const auto tok = tokenizer_for(cfg, a.vocab_dir);
  LoadedModel m;
  load_model(m, reader);
  const Gpt& gpt = *m.model;

  std::vector<int32_t> ids = tok->encode(a.prompt, false);
  TESSERA_CHECK(!ids.empty(), "the prompt is empty");
  const int64_t capacity = std::min<int64_t>(gpt.config().max_seq_len, static_cast<int64_t>(ids.size()) + a.max_tokens);
  TESSERA_CHECK(static_cast<int64_t>(ids.size()) < gpt.config().max_seq_len, "the prompt has ", ids.size(),
                " tokens; the model's context is ", gpt.config().max_seq_len);
  const int64_t room = gpt.config().max_seq_len - static_cast<int64_t>(ids.size());
  TESSERA_CHECK(a.max_tokens <= room, "generate: --max-tokens ", a.max_tokens, " does not fit: the prompt has ", ids.size(),
                " tokens and the model's context is ", gpt.config().max_seq_len, ", so at most ", room,
                " new tokens fit; lower --max-tokens");
  std::cout << a.prompt << std::flush;

  std::mt19937_64 rng(a.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  KvCache cache = gpt.make_cache(m.alloc, capacity);
  std::vector<int32_t> pending = ids;  // positions not yet in the cache
  int64_t generated = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (generated < a.max_tokens && static_cast<int64_t>(ids.size()) < capacity) {
    const Buffer tokens = device_ids(m, a.no_cache ? ids : pending);
    GptCtx ctx;
    if (a.no_cache)
      gpt.forward(m.ex, ctx, m.alloc, tokens, Tensor());
    else
      gpt.forward_cached(m.ex, ctx, m.alloc, tokens, cache);
    const int32_t next = sample_token(last_row(m.ex, ctx.logits), a.temperature, a.top_k, uniform(rng));
    ids.push_back(next);
    pending = {next};
    ++generated;
    std::cout << tok->decode({next}) << std::flush;
    if (a.stop_at_newline && tok->decode({next}) == "\n") break;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.stop_at_newline || ids.empty() || tok->decode({ids.back()}) != "\n") std::cout << "\n";
  std::fprintf(stderr, "%ld tokens in %.3f s: %.1f tokens/s (%s)\n", static_cast<long>(generated), s,
               s > 0 ? generated / s : 0.0, a.no_cache ? "no cache" : "KV cache");
  return 0;
}

}  // namespace tessera
