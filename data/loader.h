// DataLoader: builds this rank's micro-batches, in training order, on a background thread that
// stays up to `depth` micro-batches ahead. Which samples go where is the Sampler's pure function
// of (consumed samples, micro-batch, rank), so the loader's only state is the sample position it
// starts at (a checkpoint stores it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "data/dataset.h"
#include "data/sampler.h"

namespace tessera {

class DataLoader {
 public:
  // Delivers the micro-batches (micro_batches() per step) of the steps that start at global sample
  // positions first_sample, first_sample + global_batch, ...
  DataLoader(const Dataset& dataset, const Sampler& sampler, const BatchLayout& layout, int64_t first_sample,
             int depth = 4);
  ~DataLoader();  // stops and joins the thread
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next micro-batch; blocks until ready. An error in the thread (bad data) is rethrown here.
  Batch next();

 private:
  void run();
  const Dataset& dataset_;
  const Sampler& sampler_;
  BatchLayout layout_;
  int64_t next_step_start_, next_micro_ = 0;  // producer position
  size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera
