// open_training_data: one function per data task.
#include "app/training_data.h"

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
}  // namespace

TrainingData open_training_data(const Config& cfg) {
  if (cfg.data.task == "addition") return open_addition(cfg);
  TESSERA_CHECK(false, "data.task = \"", cfg.data.task, "\" is not available in this build");
}

}  // namespace tessera
