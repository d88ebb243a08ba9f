// DataLoader: one producer thread, a bounded queue, errors carried to the consumer, waits that poll.
#include "data/loader.h"

#include "kernels/check.h"

namespace tessera {

namespace {
// The windows' micro-batches: the Sampler's rows of each step, from the producer's position on.
BatchProducer window_batches(const Dataset& dataset, const Sampler& sampler, const BatchLayout& layout,
                             int64_t first_sample) {
  validate(layout);
  int64_t step_start = first_sample, micro = 0;  // producer position
  return [&dataset, &sampler, layout, step_start, micro](const std::atomic<bool>& cancel) mutable {
    std::optional<Batch> b = make_batch(dataset, sampler.micro_batch(step_start, micro, layout), cancel);
    if (b && ++micro == layout.micro_batches()) micro = 0, step_start += layout.global_batch;
    return b;
  };
}
}  // namespace

DataLoader::DataLoader(const Dataset& dataset, const Sampler& sampler, const BatchLayout& layout, int64_t first_sample,
                       int depth)
    : DataLoader(window_batches(dataset, sampler, layout, first_sample), depth) {}

DataLoader::DataLoader(BatchProducer produce, int depth) : produce_(std::move(produce)), depth_(static_cast<size_t>(depth)) {
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
      std::optional<Batch> b = produce_(stop_);
      if (!b) return;  // destroyed while making it
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
