// DataLoader: one producer thread, a bounded queue, errors carried to the consumer, waits that poll.
#include "data/loader.h"

#include "kernels/check.h"

namespace tessera {

DataLoader::DataLoader(const Dataset& dataset, const Sampler& sampler, const BatchLayout& layout, int64_t first_sample,
                       int depth)
    : dataset_(dataset),
      sampler_(sampler),
      layout_(layout),
      next_step_start_(first_sample),
      depth_(static_cast<size_t>(depth)) {
  validate(layout_);
  TESSERA_CHECK(depth >= 1, "loader depth must be at least 1");
  thread_ = std::thread([this] { run(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DataLoader::run() {
  try {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || ready_.size() < depth_; });
        if (stop_) return;
      }
      std::optional<Batch> b = make_batch(dataset_, sampler_.micro_batch(next_step_start_, next_micro_, layout_), stop_);
      if (!b) return;  // destroyed while making it
      if (++next_micro_ == layout_.micro_batches()) next_micro_ = 0, next_step_start_ += layout_.global_batch;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.push_back(std::move(*b));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

Batch DataLoader::next() { return *next([] { return false; }); }

std::optional<Batch> DataLoader::next(const std::function<bool()>& give_up) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, kPollInterval, [&] { return !ready_.empty() || error_; }))
    if (give_up()) return std::nullopt;
  if (ready_.empty()) std::rethrow_exception(error_);
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  lock.unlock();
  cv_.notify_all();
  return b;
}

}  // namespace tessera
