// data.batching = "tokens": checks naming the keys, the packer for the run's layout, the cursor record.
#include "app/token_batching.h"

#include <algorithm>

#include "kernels/check.h"

namespace tessera {

void check_token_batching(const Config& c) {
  if (c.data.batching != "tokens") {
    TESSERA_CHECK(c.train.tokens_per_micro_batch == 0, "train.tokens_per_micro_batch = ",
                  c.train.tokens_per_micro_batch, " is the budget of variable-length batches, but data.batching = \"",
                  c.data.batching, "\": set data.batching = \"tokens\" or remove it");
    return;
  }
  TESSERA_CHECK(c.data.task == "tokens", "data.batching = \"tokens\" packs documents of token files, but data.task = \"",
                c.data.task, "\": use data.task = \"tokens\" or data.batching = \"windows\"");
  TESSERA_CHECK(c.data.train.size() <= 1, "data.batching = \"tokens\" reads one training dataset, but [[data.train]] "
                "lists ", c.data.train.size(), " (a blend): list one, or use data.batching = \"windows\"");
  const int64_t L = c.train.seq_len, budget = c.train.tokens_per_micro_batch;
  TESSERA_CHECK(budget > 0 && budget % L == 0, "data.batching = \"tokens\" needs train.tokens_per_micro_batch, a "
                "positive multiple of train.seq_len = ", L, " (the micro-batch's rows), got ", budget);
  TESSERA_CHECK(c.train.micro_batch == 0 || c.train.micro_batch == budget / L, "train.micro_batch = ",
                c.train.micro_batch, " with data.batching = \"tokens\": the micro-batch has train.tokens_per_micro_batch "
                "/ train.seq_len = ", budget / L, " rows; set train.micro_batch = 0 or ", budget / L);
  TESSERA_CHECK(c.upscale.method.empty(), "data.batching = \"tokens\" does not follow an in-run re-layout: "
                "upscale.method = \"", c.upscale.method, "\" is set; grow with `tessera upscale` between runs instead");
  TESSERA_CHECK(c.train.device == "cpu", "data.batching = \"tokens\" needs the document mask, which runs on the CPU "
                "only, but train.device = \"", c.train.device, "\"");
}

Config with_token_micro_batch(Config cfg) {
  if (cfg.data.batching == "tokens" && cfg.train.seq_len > 0)
    cfg.train.micro_batch = cfg.train.tokens_per_micro_batch / cfg.train.seq_len;
  return cfg;
}

std::unique_ptr<TokenBatching> TokenBatching::open(const Config& cfg, const TrainingData& data, int64_t dp_size,
                                                   int64_t micro_batches) {
  if (cfg.data.batching != "tokens") return nullptr;
  check_token_batching(cfg);
  auto tb = std::make_unique<TokenBatching>();
  tb->dataset_ = std::dynamic_pointer_cast<const TokenWindowDataset>(data.train);
  TESSERA_CHECK(tb->dataset_ != nullptr, "data.batching = \"tokens\": the training data (", data.train->describe(),
                ") is not one token stream");
  TESSERA_CHECK(data.document_eot >= 0, "data.batching = \"tokens\": no end-of-text id for data.tokenizer = \"",
                cfg.data.tokenizer, "\"");
  tb->pad_ = data.document_eot;
  PackingShape shape;
  shape.seq_len = cfg.train.seq_len;
  shape.rows = cfg.train.tokens_per_micro_batch / cfg.train.seq_len;
  shape.micro_batches = micro_batches;
  shape.dp_size = dp_size;
  const int64_t positions = cfg.model.max_seq_len > 0 ? cfg.model.max_seq_len : cfg.train.seq_len;
  shape.position_period = positions / cfg.train.seq_len * cfg.train.seq_len;
  tb->packer_ = std::make_shared<const TokenPacker>(find_documents(*tb->dataset_, data.document_eot),
                                                    static_cast<uint64_t>(cfg.train.seed), true, shape);
  return tb;
}

std::unique_ptr<DataLoader> TokenBatching::loader(int64_t dp_rank) const {
  return std::make_unique<DataLoader>(packed_batches(dataset_, packer_, cursor_, dp_rank, pad_));
}

void TokenBatching::advance() {
  const StepPlan plan = packer_->plan_step(cursor_);
  cursor_ = plan.next;
  ++window_steps_;
  window_tokens_ += plan.tokens();
  window_imbalance_sum_ += plan.imbalance();
  window_imbalance_max_ = std::max(window_imbalance_max_, plan.imbalance());
}

TokenBatching::Window TokenBatching::take_window() {
  Window w;
  if (window_steps_ > 0) {
    const auto n = static_cast<double>(window_steps_);
    w = {static_cast<double>(window_tokens_) / n, window_imbalance_sum_ / n, window_imbalance_max_};
  }
  window_steps_ = window_tokens_ = 0;
  window_imbalance_sum_ = window_imbalance_max_ = 0;
  return w;
}

AttrMap TokenBatching::record() const { return {{"document", cursor_.document}, {"piece", cursor_.piece}}; }

PackCursor TokenBatching::cursor_of(const GroupAttributes& groups, const std::string& path) {
  const auto it = groups.find(kTokenBatchingGroup);
  TESSERA_CHECK(it != groups.end(), path, " has no ", kTokenBatchingGroup, " record: it was saved with "
                "data.batching = \"windows\", and its data position means nothing to variable-length batches; "
                "resume it with data.batching = \"windows\"");
  PackCursor c;
  for (const auto& [key, into] : {std::pair<const char*, int64_t*>{"document", &c.document}, {"piece", &c.piece}}) {
    const auto a = it->second.find(key);
    TESSERA_CHECK(a != it->second.end() && std::holds_alternative<int64_t>(a->second), path, ": ",
                  kTokenBatchingGroup, " has no integer attribute ", key);
    *into = std::get<int64_t>(a->second);
  }
  return c;
}

}  // namespace tessera
