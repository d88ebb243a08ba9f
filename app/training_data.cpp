// open_training_data: one function per data task.
#include "app/training_data.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "data/blend.h"
#include "data/hf_bpe_tokenizer.h"
#include "data/image_text.h"
#include "data/indexed_dataset.h"
#include "data/token_dataset.h"
#include "kernels/check.h"

namespace tessera {

namespace {
// The synthetic task's training set: far more samples than any run reads, so none repeats.
constexpr int64_t kSyntheticTrainSamples = int64_t(1) << 40;

TrainingData open_addition(const Config& cfg) {
  TrainingData d;
  auto task = std::make_shared<AdditionTask>(static_cast<int>(cfg.data.digits), static_cast<uint64_t>(cfg.data.seed));
  // The datasets keep a reference to the task; the shared_ptr in TrainingData keeps it alive.
  d.train = std::make_shared<AdditionDataset>(*task, false, cfg.train.seq_len, kSyntheticTrainSamples);
  d.valid = std::make_shared<AdditionDataset>(*task, true, cfg.train.seq_len,
                                              cfg.train.eval_batches * cfg.train.micro_batch);
  d.vocab_size = task->tokenizer().vocab_size();
  d.task = task;
  return d;
}

// Synthetic scenes (model.kind = "vlm"): each image takes (image_size / patch_size)^2 placeholders.
TrainingData open_scenes(const Config& cfg) {
  TrainingData d;
  auto task = std::make_shared<SceneTask>(cfg.vision.image_size, static_cast<uint64_t>(cfg.data.seed));
  const int64_t P = cfg.vision.num_patches();
  d.train = std::make_shared<SceneDataset>(*task, false, cfg.train.seq_len, kSyntheticTrainSamples, P);
  d.valid = std::make_shared<SceneDataset>(*task, true, cfg.train.seq_len,
                                           cfg.train.eval_batches * cfg.train.micro_batch, P);
  d.vocab_size = task->tokenizer().vocab_size();
  d.scenes = task;
  return d;
}

// An image-text HDF5 file (data/image_text.h), read whole; data.valid another one.
TrainingData open_image_text(const Config& cfg) {
  const auto& sources = cfg.data.train;
  TESSERA_CHECK(sources.size() == 1, "data.task = \"image_text\" reads one file: give exactly one [[data.train]] "
                "table with its path (got ", sources.size(), ")");
  TrainingData d;
  auto train = std::make_shared<ImageTextDataset>(read_image_text(sources[0].path), cfg.train.seq_len, sources[0].path);
  // A file from `tessera prepare --images` names the tokenizer of data.tokenizer's list; the
  // config's must be the same (`tessera generate` decodes with it). Other names (files written
  // by code, e.g. the scenes' words) are not checked.
  const std::string& file_tok = train->data().tokenizer;
  TESSERA_CHECK((file_tok != "byte" && file_tok != "gpt2") || file_tok == cfg.data.tokenizer, sources[0].path,
                " was tokenized with the ", file_tok, " tokenizer but data.tokenizer = \"", cfg.data.tokenizer,
                "\"; set data.tokenizer = \"", file_tok, "\"");
  d.vocab_size = train->vocab_size();
  d.train = train;
  if (!cfg.data.valid.empty()) {
    auto valid = std::make_shared<ImageTextDataset>(read_image_text(cfg.data.valid), cfg.train.seq_len, cfg.data.valid);
    TESSERA_CHECK(valid->placeholder_id() == train->placeholder_id() && valid->vocab_size() == train->vocab_size() &&
                      valid->data().tokenizer == train->data().tokenizer,
                  cfg.data.valid, ": its tokenizer, vocab_size or placeholder_id differ from ", sources[0].path, "'s");
    d.valid = valid;
    d.captions = valid;
    if (file_tok == "byte" || file_tok == "gpt2") d.caption_tokenizer = make_tokenizer(file_tok, cfg.data.vocab_dir);
  }
  return d;
}
}  // namespace

namespace {
// data.tokenizer's vocabulary and end-of-document id; GPT-2's and the byte tokenizer's are known
// without loading files, a tokenizer.json's are read from it.
int64_t tokenizer_vocab(const Config& cfg) {
  if (cfg.data.tokenizer == "gpt2") return kGpt2VocabSize;
  if (is_tokenizer_json_path(cfg.data.tokenizer)) return HfBpeTokenizer(cfg.data.tokenizer).vocab_size();
  return ByteTokenizer().vocab_size();
}
int32_t tokenizer_eot(const Config& cfg) {
  if (cfg.data.tokenizer == "gpt2") return static_cast<int32_t>(kGpt2VocabSize - 1);  // <|endoftext|>
  if (is_tokenizer_json_path(cfg.data.tokenizer)) return HfBpeTokenizer(cfg.data.tokenizer).eot_id();
  return ByteTokenizer().eot_id();
}
}  // namespace

int64_t data_vocab_size(const Config& cfg) {
  if (cfg.data.task == "addition") return CharTokenizer().vocab_size();
  if (cfg.data.task == "scenes") return SceneTokenizer().vocab_size();
  if (cfg.data.task == "image_text" && cfg.data.train.size() == 1) return read_image_text(cfg.data.train[0].path).vocab_size;
  return tokenizer_vocab(cfg);
}

namespace {
// The vocabulary the token ids are checked against: the model's (which may pad the tokenizer's).
int64_t token_vocab(const Config& cfg) {
  if (cfg.model.vocab_size > 0) return cfg.model.vocab_size;
  return tokenizer_vocab(cfg);
}

// Token files blended by weight; the validation set is data.valid, or the last data.val_fraction
// of the first dataset's documents (which training then does not see).
TrainingData open_tokens(const Config& cfg) {
  const auto& sources = cfg.data.train;
  TESSERA_CHECK(!sources.empty(), "data.task = \"tokens\" needs at least one [[data.train]] table with a path");
  const int64_t T = cfg.train.seq_len, V = token_vocab(cfg);
  const bool hold_out = cfg.data.valid.empty() && cfg.data.val_fraction > 0;
  TrainingData d;
  d.vocab_size = data_vocab_size(cfg);
  std::vector<std::shared_ptr<const Dataset>> parts;
  std::vector<double> weights;
  for (size_t i = 0; i < sources.size(); ++i) {
    std::vector<TokenSegment> segments = open_token_segments({sources[i].path});
    if (i == 0 && hold_out) {
      TESSERA_CHECK(segments.size() == 1 && detect_token_format(sources[0].path) == TokenFileFormat::kIndexed,
                    "data.val_fraction holds out documents of an indexed dataset, but ", sources[0].path,
                    " is not one; set data.valid to a validation dataset instead");
      const auto ds = std::static_pointer_cast<const IndexedDataset>(segments[0].owner);
      TrainValSegments split = split_documents(ds, cfg.data.val_fraction);
      segments = {split.train};
      d.valid = std::make_shared<TokenWindowDataset>(std::vector<TokenSegment>{split.val}, T, V);
    }
    parts.push_back(std::make_shared<TokenWindowDataset>(std::move(segments), T, V));
    weights.push_back(sources[i].weight);
  }
  d.train = parts.size() == 1 ? parts[0] : std::make_shared<BlendedDataset>(parts, weights);
  if (!cfg.data.valid.empty()) d.valid = open_token_dataset({cfg.data.valid}, T, V);
  if (cfg.data.document_mask || cfg.data.batching == "tokens") d.document_eot = tokenizer_eot(cfg);
  return d;
}

// Test hook (tests/app/test_signals.cpp): TESSERA_TEST_SAMPLE_DELAY_MS = "ms" makes every sample
// read take that long longer, as on cold or remote storage, so that tests can signal a run while
// it waits for data (a huge first batch) or evaluates.
class DelayedDataset : public Dataset {
 public:
  DelayedDataset(std::shared_ptr<const Dataset> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  int64_t num_samples() const override { return inner_->num_samples(); }
  int64_t seq_len() const override { return inner_->seq_len(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  void get(int64_t index, int32_t* out, uint8_t* loss_mask) const override {
    std::this_thread::sleep_for(delay_);
    inner_->get(index, out, loss_mask);
  }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::shared_ptr<const Dataset> inner_;
  std::chrono::milliseconds delay_;
};

void delay_samples_if_asked(TrainingData& d) {
  const char* hook = std::getenv("TESSERA_TEST_SAMPLE_DELAY_MS");
  if (!hook) return;
  const std::chrono::milliseconds delay(std::atol(hook));
  d.train = std::make_shared<DelayedDataset>(d.train, delay);
  if (d.valid) d.valid = std::make_shared<DelayedDataset>(d.valid, delay);
}
}  // namespace

TrainingData open_training_data(const Config& cfg) {
  TESSERA_CHECK(!cfg.data.document_mask || cfg.data.task == "tokens", "data.document_mask = true needs documents: "
                "data.task = \"", cfg.data.task, "\" has no end-of-text ids");
  const bool image_text = cfg.data.task == "scenes" || cfg.data.task == "image_text";
  TESSERA_CHECK(image_text == (cfg.model.kind == "vlm"), "data.task = \"", cfg.data.task, "\" with model.kind = \"",
                cfg.model.kind, "\": ",
                cfg.model.kind == "vlm"
                    ? "a vision-language model trains on image-text data (data.task = \"scenes\" or \"image_text\")"
                    : "image-text data needs model.kind = \"vlm\"");
  TrainingData d = cfg.data.task == "addition"     ? open_addition(cfg)
                   : cfg.data.task == "scenes"     ? open_scenes(cfg)
                   : cfg.data.task == "image_text" ? open_image_text(cfg)
                                                   : open_tokens(cfg);
  delay_samples_if_asked(d);
  return d;
}

}  // namespace tessera
