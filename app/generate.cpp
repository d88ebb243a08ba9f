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

#include "app/checkpoint/adapter_checkpoint.h"
#include "app/checkpoint/checkpoint_io.h"
#include "app/config.h"
#include "app/checkpoint/hf_export.h"
#include "app/evaluate.h"
#include "data/addition.h"
#include "data/image_decode.h"
#include "data/image_text.h"
#include "data/scenes.h"
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

// The scenes task's words as a Tokenizer; its end-of-text is <eos>.
class SceneTokenizerAdapter : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool) const override { return tok_.encode(std::string(text)); }
  std::string decode(const std::vector<int32_t>& ids) const override { return tok_.decode(ids); }
  int64_t vocab_size() const override { return tok_.vocab_size(); }
  int32_t eot_id() const override { return tok_.eos_id(); }
  std::string name() const override { return "scene words"; }

 private:
  SceneTokenizer tok_;
};

std::unique_ptr<Tokenizer> tokenizer_for(const Config& cfg, const std::string& vocab_dir_arg,
                                         const std::string& tokenizer_arg) {
  if (cfg.data.task == "addition") return std::make_unique<CharTokenizerAdapter>();
  if (cfg.data.task == "scenes") return std::make_unique<SceneTokenizerAdapter>();
  if (!tokenizer_arg.empty()) return make_tokenizer(tokenizer_arg, vocab_dir_arg);  // --tokenizer
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

// cfg: the stored config, whose model.kind and [vision] make a vision-language model's encoder.
void load_model(LoadedModel& m, const CheckpointReader& r, const Config& cfg) {
  ModelConfig mc = model_config_of(r);
  if (cfg.model.kind == "vlm") {
    mc.kind = cfg.model.kind;
    mc.vision = cfg.vision;
    mc = resolve(mc);
  }
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

namespace {

// The ids of a caption decoded for printing: the placeholder (never in a tokenizer's vocabulary)
// as "<image>", the rest through the tokenizer.
std::string decode_ids(const Tokenizer& tok, const std::vector<int32_t>& ids, int32_t placeholder) {
  std::string out;
  std::vector<int32_t> run;
  for (int32_t id : ids) {
    if (id != placeholder) {
      run.push_back(id);
      continue;
    }
    out += tok.decode(run) + "<image>";
    run.clear();
  }
  return out + tok.decode(run);
}

// The image file as the model reads it: decoded, resized to vision.image_size, as the trainer's
// batches hold it ((1, S, S, 3) uint8, its P placeholders at positions [0, P) of sample 0).
DeviceImages load_image(LoadedModel& m, const std::string& path) {
  const ModelConfig& mc = m.model->config();
  TESSERA_CHECK(mc.vision.channels == 3, "generate --image: the checkpoint's encoder reads ", mc.vision.channels,
                "-channel images (vision.channels); image files decode to RGB (3)");
  Batch b;
  b.image_shape = {mc.vision.image_size, mc.vision.image_size, 3};
  b.image_tokens = mc.vision.num_patches();
  b.images = resize_rgb(decode_image_file(path), mc.vision.image_size);
  b.image_sample = {0};
  b.image_start = {0};
  return upload_images(m.ex, m.alloc, b, mc, m.model->dtype());
}


// --held-out: the samples scored, from --data or the checkpoint's own held-out data.
ImageTextData held_out_data(const GenerateArgs& a, const Config& cfg, const ModelConfig& mc) {
  if (!a.data.empty()) return read_image_text(a.data);
  if (cfg.data.task == "scenes") {
    const SceneTask task(cfg.vision.image_size, static_cast<uint64_t>(cfg.data.seed));
    return scenes_as_image_text(task, /*validation=*/true, a.held_out, mc.vision.num_patches());
  }
  TESSERA_CHECK(!cfg.data.valid.empty(), "generate --held-out: the checkpoint's run had no data.valid; give the "
                "image-text file to score with --data FILE.h5");
  return read_image_text(cfg.data.valid);
}

int run_held_out(const GenerateArgs& a, const Config& cfg, LoadedModel& m, const Tokenizer& tok) {
  const Gpt& gpt = *m.model;
  ImageTextData data = held_out_data(a, cfg, gpt.config());
  const std::string name = a.data.empty() && cfg.data.task == "scenes" ? "held-out scenes" : (a.data.empty() ? cfg.data.valid : a.data);
  const ImageTextDataset ds(data, gpt.config().max_seq_len, name);
  const AccuracyResult r =
      *image_text_caption_accuracy(m.ex, gpt, m.alloc, ds, a.held_out, 32, known_ids_decoder(tok));
  std::cout << "sample\tresult\tgenerated\texpected\n";
  for (const CaptionOutcome& o : r.outcomes)
    std::cout << o.sample << "\t" << (o.right ? "right" : "wrong") << "\t" << o.generated << "\t" << o.expected << "\n";
  char buf[128];
  std::snprintf(buf, sizeof buf, "caption accuracy %.1f%% (%lld/%lld) on %s\n", 100.0 * r.accuracy(),
                static_cast<long long>(r.correct), static_cast<long long>(r.total), name.c_str());
  std::cout << buf;
  if (!a.dump.empty()) {
    // The scored samples as an image-text file: their images as the model saw them, their tokens.
    ImageTextData d;
    d.image_shape = data.image_shape;
    d.tokenizer = data.tokenizer;
    d.vocab_size = data.vocab_size;
    d.placeholder_id = data.placeholder_id;
    d.pad_id = data.pad_id;
    d.offsets = {0};
    const int64_t n = data.image_shape.numel();
    for (const CaptionOutcome& o : r.outcomes) {
      const int64_t img = data.image_index[o.sample];
      d.images.insert(d.images.end(), data.images.begin() + img * n, data.images.begin() + (img + 1) * n);
      d.tokens.insert(d.tokens.end(), data.tokens.begin() + data.offsets[o.sample],
                      data.tokens.begin() + data.offsets[o.sample + 1]);
      d.offsets.push_back(static_cast<int64_t>(d.tokens.size()));
      d.image_index.push_back(d.num_samples());
    }
    write_image_text(a.dump, d);
  }
  return 0;
}

}  // namespace

int run_generate_command(const GenerateArgs& a) {
  check_generate_args(a);
  // An adapters-only LoRA checkpoint with its base (app/checkpoint/adapter_checkpoint.h).
  const std::unique_ptr<CheckpointReader> opened = open_model_checkpoint(a.ckpt, MPI_COMM_SELF);
  const CheckpointReader& reader = *opened;
  const Config cfg = parse_config_string(reader.meta().config_toml, a.ckpt + " (stored config)");
  const bool vlm = cfg.model.kind == "vlm";
  TESSERA_CHECK(a.image.empty() || vlm, "generate: --image needs a vision-language checkpoint; ", a.ckpt,
                " holds a text-only model (model.kind = \"", cfg.model.kind, "\")");
  TESSERA_CHECK(a.held_out == 0 || vlm, "generate: --held-out scores captions of a vision-language checkpoint; ",
                a.ckpt, " holds a text-only model (model.kind = \"", cfg.model.kind, "\")");
  TESSERA_CHECK(a.held_out == 0 || (a.image.empty() && a.prompt.empty()),
                "generate: --held-out captions the held-out images; it takes no --image or --prompt");
  TESSERA_CHECK(a.held_out > 0 || (a.data.empty() && a.dump.empty()), "generate: --data and --dump go with --held-out N");
  const auto tok = tokenizer_for(cfg, a.vocab_dir, a.tokenizer);
  LoadedModel m;
  load_model(m, reader, cfg);
  if (a.held_out > 0) return run_held_out(a, cfg, m, *tok);
  const Gpt& gpt = *m.model;
  const int64_t context = gpt.config().max_seq_len;
  const int32_t placeholder = vlm ? static_cast<int32_t>(gpt.config().vision.placeholder_id >= 0
                                                             ? gpt.config().vision.placeholder_id
                                                             : gpt.config().vocab_size - 1)
                                  : -1;

  // With an image: its P placeholders, then the prompt (possibly empty), as the training samples.
  const DeviceImages images = a.image.empty() ? DeviceImages{} : load_image(m, a.image);
  std::vector<int32_t> ids;
  if (!a.image.empty()) ids.assign(static_cast<size_t>(gpt.config().vision.num_patches()), placeholder);
  const std::vector<int32_t> prompt_ids = tok->encode(a.prompt, false);
  ids.insert(ids.end(), prompt_ids.begin(), prompt_ids.end());
  TESSERA_CHECK(!ids.empty(), "the prompt is empty", vlm ? " (give --image FILE to caption an image)" : "");
  const int64_t prompt_length = static_cast<int64_t>(ids.size());
  TESSERA_CHECK(prompt_length < context, "the prompt has ", prompt_length, " tokens",
                a.image.empty() ? "" : " (the image's placeholders included)", "; the model's context is ", context);
  const int64_t room = context - prompt_length;
  TESSERA_CHECK(a.max_tokens <= room || !a.max_tokens_given, "generate: --max-tokens ", a.max_tokens,
                " does not fit: the prompt has ", prompt_length, " tokens and the model's context is ", context,
                ", so at most ", room, " new tokens fit; lower --max-tokens");
  const int64_t max_tokens = std::min(a.max_tokens, room);
  const int64_t capacity = prompt_length + max_tokens;
  // A caption ends at the end-of-text id (the samples' last token); the text models' output runs on.
  const bool stop_at_eot = vlm;
  const bool full_forward = a.no_cache || !a.image.empty();  // no KV-cached decoding with an image yet
  // Printed as it comes: the new end of the decoded text (a word tokenizer's words need their
  // spaces, so the whole text after the placeholders is decoded each time; it is short).
  const size_t text_start = a.image.empty() ? 0 : static_cast<size_t>(gpt.config().vision.num_patches());
  auto text_of = [&] { return decode_ids(*tok, std::vector<int32_t>(ids.begin() + text_start, ids.end()), placeholder); };
  std::string printed = text_of();
  std::cout << printed << std::flush;

  std::mt19937_64 rng(a.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  KvCache cache = gpt.make_cache(m.alloc, capacity);
  std::vector<int32_t> pending = ids;  // positions not yet in the cache
  std::vector<int32_t> generated_ids;
  const auto t0 = std::chrono::steady_clock::now();
  while (static_cast<int64_t>(generated_ids.size()) < max_tokens) {
    const Buffer tokens = device_ids(m, full_forward ? ids : pending);
    GptCtx ctx;
    if (full_forward)
      gpt.forward(m.ex, ctx, m.alloc, tokens, Tensor(), {}, images.get());
    else
      gpt.forward_cached(m.ex, ctx, m.alloc, tokens, cache);
    const int32_t next = sample_token(last_row(m.ex, ctx.logits), a.temperature, a.top_k, uniform(rng));
    if (stop_at_eot && next == tok->eot_id()) break;
    ids.push_back(next);
    generated_ids.push_back(next);
    pending = {next};
    const std::string text = text_of();
    std::cout << (text.compare(0, printed.size(), printed) == 0 ? text.substr(printed.size())
                                                                 : decode_ids(*tok, {next}, placeholder))
              << std::flush;
    printed = text;
    if (a.stop_at_newline && tok->decode({next}) == "\n") break;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t generated = static_cast<int64_t>(generated_ids.size());
  if (!a.stop_at_newline || generated == 0 || tok->decode({ids.back()}) != "\n") {
    std::cout << "\n";
  }
  std::fprintf(stderr, "%ld tokens in %.3f s: %.1f tokens/s (%s)\n", static_cast<long>(generated), s,
               s > 0 ? generated / s : 0.0, full_forward ? (a.no_cache ? "no cache" : "full forward per token: an image")
                                                         : "KV cache");
  return 0;
}

}  // namespace tessera
