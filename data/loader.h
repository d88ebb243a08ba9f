// DataLoader: builds this rank's micro-batches, in training order, on a background thread that
// stays up to `depth` micro-batches ahead. Which samples go where is the Sampler's pure function
// of (consumed samples, micro-batch, rank), so the loader's only state is the sample position it
// starts at (a checkpoint stores it). Both sides can give up early: the consumer's wait polls a
// give-up test (a stop signal), and the producer stops between samples when the loader is destroyed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "data/dataset.h"
#include "data/sampler.h"

namespace tessera {

// Makes the next micro-batch in training order, or nothing once `cancel` is set (checked between reads).
using BatchProducer = std::function<std::optional<Batch>(const std::atomic<bool>& cancel)>;

class DataLoader {
 public:
  // Delivers the micro-batches (micro_batches() per step) of the steps that start at global sample
  // positions first_sample, first_sample + global_batch, ...
  DataLoader(const Dataset& dataset, const Sampler& sampler, const BatchLayout& layout, int64_t first_sample,
             int depth = 4);
  // Delivers what `produce` makes, in order (variable-length batches: data/token_batching.h).
  explicit DataLoader(BatchProducer produce, int depth = 4);
  ~DataLoader();  // stops and joins the thread
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next micro-batch; blocks until ready. An error in the thread (bad data, a file truncated
  // under it) is rethrown here, after the batches made before it.
  Batch next();
  // The same, but returns nothing as soon as give_up() is true while no batch is ready, asked
  // every kPollInterval (a signal handler cannot wake a condition variable, so the wait polls;
  // give_up runs under the loader's lock: keep it to a flag read).
  // The micro-batch being made is not lost: a later next() still returns it.
  std::optional<Batch> next(const std::function<bool()>& give_up);
  static constexpr std::chrono::milliseconds kPollInterval{20};

 private:
  void run();
  BatchProducer produce_;
  size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};  // set under mu_ (for the waits); also read between samples
  std::thread thread_;
};

}  // namespace tessera
